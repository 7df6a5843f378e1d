"""The numerics debugger (eager_neuron.numerics): finds a deliberately wrong kernel and names its
op and line; finds the first op making a NaN/Inf, forward and backward; changes no result."""

from __future__ import annotations

import contextlib
import inspect
import os
import warnings

import pytest
import torch

import eager_neuron
from eager_neuron.dispatch import _PLANS
from eager_neuron.numerics import Checker, NumericsError, check_numerics, install_from_env
from eager_neuron.plan import _plan

DEV = "neuron"
HERE = os.path.basename(__file__)


@contextlib.contextmanager
def wrong_kernel(func, delta=0.01):
    """func's neuron kernel, made wrong by `delta` in every element of its first output."""
    plan = _PLANS.get(func) or _plan(func)
    _PLANS[func] = plan
    orig = plan.lower

    def wrong(f, a, outs):
        orig(f, a, outs)
        outs[0].numpy()[...] += delta

    # dispatch's hot path (plan.prepare) hands back the launch without calling plan.lower, and
    # the fast path (eager_neuron/fastpath.py) replays calls it has seen without either: both
    # are bypassed while the wrong kernel is in place
    from eager_neuron import fastpath

    prepare = getattr(plan, "prepare", None)
    plan.lower = wrong
    if prepare is not None:
        plan.prepare = None
    fastpath.reset()
    try:
        yield
    finally:
        plan.lower = orig
        if prepare is not None:
            plan.prepare = prepare
        fastpath.reset()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def _line() -> int:
    return inspect.currentframe().f_back.f_lineno + 1


def test_clean_training_step_has_no_finding_and_same_results():
    x = torch.randn(4, 8)
    ref = _model().to(DEV)
    ref(x.to(DEV)).pow(2).mean().backward()
    m = _model().to(DEV)
    with check_numerics() as chk:
        m(x.to(DEV)).pow(2).mean().backward()
    assert chk.findings == [] and chk.ops_checked > 10
    for p, q in zip(m.parameters(), ref.parameters()):
        assert torch.equal(p.grad.cpu(), q.grad.cpu())


@pytest.mark.parametrize("adaptive", [False, True], ids=["plain", "adaptive"])
def test_wrong_forward_kernel_is_found_with_its_line(adaptive):
    m = _model().to(DEV)
    x = torch.randn(4, 8, device=DEV)
    ctx = eager_neuron.adaptive() if adaptive else contextlib.nullcontext()
    with wrong_kernel(torch.ops.aten.tanh.default), ctx:
        with pytest.raises(NumericsError) as info:
            with check_numerics():
                line = _line()
                m(x).sum()
    msg = str(info.value)
    assert "aten::tanh" in msg and "(forward)" in msg
    assert f"{HERE}:{line}" in msg
    assert "f32[4, 16]@neuron:0" in msg and "max abs error 0.01" in msg


def test_wrong_backward_kernel_is_found_in_backward():
    m = _model().to(DEV)
    x = torch.randn(4, 8, device=DEV)
    with wrong_kernel(torch.ops.aten.tanh_backward.default):
        with pytest.raises(NumericsError) as info:
            with check_numerics():
                line = _line()
                loss = m(x).pow(2).sum()
                loss.backward()
    msg = str(info.value)
    assert "aten::tanh_backward" in msg and "(backward)" in msg
    assert "TanhBackward0" in msg and f"{HERE}:{line}" in msg   # the forward op's line


def test_tolerance_is_the_callers():
    x = torch.randn(64, device=DEV)
    with wrong_kernel(torch.ops.aten.exp.default, delta=1e-3):
        with check_numerics(rtol=0, atol=1e-2) as chk:
            x.exp()
        assert chk.findings == []
        with check_numerics(rtol=0, atol=1e-4, action="warn") as chk:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                x.exp()
        assert len(chk.findings) == 1 and chk.findings[0].op == "aten::exp"
        assert any("aten::exp" in str(x.message) for x in w)


def test_nan_mode_names_the_op_that_makes_it_forward_and_backward():
    w = torch.zeros(3, device=DEV, requires_grad=True)
    with pytest.raises(NumericsError) as info:
        with check_numerics(mode="nan"):
            y = w.exp()                      # finite
            line = _line()
            z = (y - 1).log()                # log(0) = -inf: made here
            z.sum()                          # -inf propagates: not reported again
    msg = str(info.value)
    assert "aten::log" in msg and "Inf" in msg and f"{HERE}:{line}" in msg
    with pytest.raises(NumericsError) as info:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # anomaly mode's own report of the failed node
            with check_numerics(mode="nan"):
                line = _line()
                s = w.sqrt().sum()           # d sqrt(0) = inf: made in backward
                s.backward()
    msg = str(info.value)
    assert "(backward)" in msg and "SqrtBackward0" in msg and f"{HERE}:{line}" in msg
    assert w.grad is None


def test_nan_mode_ignores_intended_infinities_and_propagation():
    x = torch.zeros(4, device=DEV)
    mask = torch.tensor([True, False, True, False], device=DEV)
    with check_numerics(mode="nan") as chk:
        t = x.masked_fill(mask, float("-inf"))   # the -inf comes from the caller
        t.softmax(0)
        (t * 2).sum()
    assert chk.findings == []


def test_random_ops_are_not_rerun():
    torch.manual_seed(5)
    want = [torch.rand(4, device=DEV).cpu() for _ in range(2)]
    torch.manual_seed(5)
    with check_numerics():
        got = [torch.rand(4, device=DEV).cpu() for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_environment_switch():
    assert install_from_env({}) is None
    assert install_from_env({"EAGER_NEURON_CHECK": "0"}) is None
    with pytest.raises(ValueError, match="EAGER_NEURON_CHECK"):
        install_from_env({"EAGER_NEURON_CHECK": "maybe"})
    chk = install_from_env({"EAGER_NEURON_CHECK": "nan"})
    try:
        assert isinstance(chk, Checker) and chk.mode == "nan"
        torch.ones(2, device=DEV).add(1)
        assert chk.ops_checked >= 1
    finally:
        chk.__exit__(None, None, None)
