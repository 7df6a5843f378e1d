"""0-d CPU arithmetic inside compiled graphs (an optimizer's bias corrections) runs as numpy
scalar math on the host (eager_neuron/compile/hostscalar.py): no torch dispatch per node, the
IEEE result of the tensor's dtype, tensors kept where torch code reads the value."""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pytest
import torch

import eager_neuron
from eager_neuron.compile import hostscalar

_SCALAR_MATH = {"aten::pow.Scalar", "aten::pow.Tensor_Scalar", "aten::sub.Tensor",
                "aten::add.Tensor", "aten::neg", "aten::div.Tensor", "aten::reciprocal",
                "aten::sqrt", "aten::mul.Tensor", "aten::rsub.Scalar"}


def _train(model, opt_cls, device, compiled, steps=3, **opt_kw):
    m = copy.deepcopy(model).to(device)
    opt = opt_cls(m.parameters(), lr=1e-2, **opt_kw)

    def step(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    if compiled:
        step = torch.compile(step, backend="neuron")
    g = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
        losses.append(step(x.to(device), y.to(device)).cpu())
    return torch.stack(losses), [p.detach().cpu() for p in m.parameters()]


@pytest.mark.parametrize("opt_cls,kw", [(torch.optim.AdamW, {}),
                                        (torch.optim.Adam, {"amsgrad": True})])
def test_compiled_optimizer_bias_corrections_run_on_the_host(opt_cls, kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    le, pe = _train(model, opt_cls, "neuron", False, **kw)
    torch._dynamo.reset()
    eager_neuron.compile.reset_stats()
    lc, pc = _train(model, opt_cls, "neuron", True, **kw)
    s = eager_neuron.compile.stats()
    # every bias-correction node of the 4 parameters ran as host math, none through torch
    assert s["host_scalar_ops"] >= 4 * 6, s
    assert not _SCALAR_MATH & set(s["graph_eager_ops"]), s["graph_eager_ops"]
    assert s["graph_fallbacks"] == {} and s["group_fallbacks"] == {}, s
    # the same updates as neuron eager's (its bias corrections run in torch on the CPU)
    eps = torch.finfo(torch.float32).eps
    torch.testing.assert_close(lc, le, rtol=64 * eps, atol=64 * eps)
    for a, b in zip(pc, pe):
        torch.testing.assert_close(a, b, rtol=64 * eps, atol=64 * eps)


def _ulps(a: np.floating, ref: float) -> float:
    return abs(float(a) - ref) / float(np.spacing(np.float32(abs(ref))))


def test_host_ops_are_the_dtype_rounded_results():
    """Each operation, on float32 operands, is the float64 result rounded once (exact for the
    correctly rounded operations; pow within one unit in the last place of the C library's)."""
    rng = np.random.default_rng(0)
    f32 = np.float32
    for _ in range(200):
        a, b = f32(rng.uniform(0.01, 4)), f32(rng.uniform(0.01, 4))
        da, db = float(a), float(b)
        ops = hostscalar._OPS
        assert ops["add"](a, b) == f32(da + db)
        assert ops["sub"](a, b) == f32(da - db)
        assert ops["rsub"](a, b) == f32(db - da)
        assert ops["mul"](a, b) == f32(da * db)
        assert ops["div"](a, b) == f32(da / db)
        assert ops["reciprocal"](a) == f32(1 / da)
        assert ops["sqrt"](a) == f32(math.sqrt(da))
        assert ops["neg"](a) == f32(-da)
        p = ops["pow"](a, b)
        assert type(p) is np.float32 and _ulps(p, da ** db) <= 1.0


def test_a_value_read_by_torch_code_stays_a_tensor():
    def f(x, s):
        t = (s * 2 + 1).sqrt()          # 0-d CPU math
        return x * t, t, torch.stack([t, t])   # a kernel scalar, an output, an eager operand

    x = torch.randn(5, device="neuron")
    s = torch.tensor(1.5)
    eager_neuron.compile.reset_stats()
    out, t, st = torch.compile(f, backend="neuron")(x, s)
    assert eager_neuron.compile.stats()["host_scalar_ops"] >= 2
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.device.type == "cpu"
    assert t.item() == np.float32(math.sqrt(4.0)) and st.tolist() == [2.0, 2.0]
    torch.testing.assert_close(out.cpu(), x.cpu() * 2)


def test_division_by_zero_is_inf_without_a_warning():
    def f(x, s):
        return x * (1 / s), x * s.reciprocal()

    x = torch.ones(3, device="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        a, b = torch.compile(f, backend="neuron")(x, torch.tensor(0.0))
    assert a.cpu().tolist() == [math.inf] * 3 and b.cpu().tolist() == [math.inf] * 3


def test_other_dtypes_and_alpha_stay_torch_nodes():
    """Only float32/float64 0-d CPU values of one dtype, alpha 1: anything else keeps torch."""
    def f(x, s, i):
        return x * torch.add(s, s, alpha=3) + (i * 2)

    x = torch.ones(2, device="neuron")
    eager_neuron.compile.reset_stats()
    out = torch.compile(f, backend="neuron")(x, torch.tensor(0.5), torch.tensor(3))
    ops = eager_neuron.compile.stats()["graph_eager_ops"]
    assert ops.get("aten::add.Tensor", 0) >= 1, ops     # alpha=3
    assert out.cpu().tolist() == [8.0, 8.0]


def _adamw_run(model, steps=4, blocks=True, host_copy=True):
    """A compiled AdamW training step's losses, parameters and optimizer state (planned from
    its second call), with host blocks / host copies switched as asked."""
    from eager_neuron.compile import planned

    old = planned.HOST_BLOCKS[0], hostscalar.HOST_COPY[0]
    planned.HOST_BLOCKS[0], hostscalar.HOST_COPY[0] = blocks, host_copy
    try:
        torch._dynamo.reset()
        m = copy.deepcopy(model).to("neuron")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)

        def step(x, y):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        cstep = torch.compile(step, backend="neuron")
        g = torch.Generator().manual_seed(5)
        losses = []
        for _ in range(steps):
            x, y = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
            losses.append(cstep(x.to("neuron"), y.to("neuron")).cpu())
        states = [opt.state[p]["step"] for p in m.parameters()]
        return torch.stack(losses), [p.detach().cpu() for p in m.parameters()], states
    finally:
        planned.HOST_BLOCKS[0], hostscalar.HOST_COPY[0] = old


def test_planned_host_steps_run_as_one_block_with_the_same_values():
    """A plan runs consecutive host steps as one generated function (hostscalar.block): the
    optimizer's bias corrections are the values the one-by-one steps compute, bit for bit."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    ref = _adamw_run(model, blocks=False)
    built = hostscalar.BLOCKS[0]
    eager_neuron.compile.reset_stats()
    got = _adamw_run(model, blocks=True)
    s = eager_neuron.compile.stats()
    assert s["planned_runs"] >= 3 and s["host_scalar_ops"] >= 4 * 9 * 4, s
    assert hostscalar.BLOCKS[0] > built       # the AdamW plan's host steps: one block
    assert torch.equal(got[0], ref[0])
    for a, b in zip(got[1], ref[1]):
        assert torch.equal(a, b)


def test_block_source_is_each_steps_operation():
    """A block over a chain of every host operation: its values are HostScalar.run's."""
    g = torch.fx.Graph()
    s = g.placeholder("s")
    s.meta["val"] = torch.tensor(2.5)
    nodes, prev = [], s
    aten = torch.ops.aten
    chain = [(aten.add.Tensor, (None, 1)), (aten.pow.Scalar, (0.9, None)),
             (aten.sub.Tensor, (None, 1)), (aten.neg.default, (None,)),
             (aten.sqrt.default, (None,)), (aten.rsub.Scalar, (None, 3)),
             (aten.div.Tensor, (None, 0.01)), (aten.reciprocal.default, (None,)),
             (aten.mul.Tensor, (None, None))]
    for target, args in chain:
        n = g.call_function(target, tuple(prev if a is None else a for a in args))
        n.meta["val"] = torch.tensor(1.0)
        nodes.append(n)
        prev = n
    hosts = [hostscalar.HostScalar(n, hostscalar.plan(n), n is nodes[0]) for n in nodes]
    assert all(h.fn is not None for h in hosts) and None not in [hostscalar.plan(n) for n in nodes]
    for step_val in (torch.tensor(2.0), torch.tensor(7.0), np.float32(3.0)):
        ref, env = {s: step_val}, {s: step_val}
        with np.errstate(all="ignore"):
            for h in hosts:
                h.run(ref)
            hostscalar.block(hosts)(env)
        assert isinstance(env[nodes[0]], torch.Tensor) and env[nodes[0]].item() == \
            ref[nodes[0]].item()
        for n in nodes[1:]:
            assert type(env[n]) is type(ref[n]) is np.float32 and env[n] == ref[n], n


def test_step_counter_written_back_from_the_host_value():
    """`step + 1` written back into the optimizer's 0-d CPU `step` tensors (copy_) takes the
    host value (fill_): no 0-d tensor is made for it; counted, the same tensors, the same
    values and version bumps as copy_ through torch."""
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    eager_neuron.compile.reset_stats()
    ref = _adamw_run(model, host_copy=False)
    r = eager_neuron.compile.stats()
    assert r["host_copies"] == 0
    eager_neuron.compile.reset_stats()
    got = _adamw_run(model, host_copy=True)
    s = eager_neuron.compile.stats()
    # 4 parameters, 4 steps: each write-back counted as the copy_ it is; the first call runs
    # under a dispatch mode (the copy goes through torch, its value made a tensor), steps 2-4
    # took the host value (interpreted, then planned)
    assert s["graph_eager_ops"]["aten::copy_"] == r["graph_eager_ops"]["aten::copy_"] == 16
    assert s["host_copies"] == 12, s
    assert torch.equal(got[0], ref[0])
    for a, b in zip(got[1], ref[1]):
        assert torch.equal(a, b)
    for st in got[2]:
        assert type(st) is torch.Tensor and st.dtype == torch.float32 and st.dim() == 0
        assert st.item() == 4.0
    # one version bump per write-back, as copy_ through torch (planned calls write through
    # numpy and bump them together: hostscalar.copies)
    assert [st._version for st in got[2]] == [st._version for st in ref[2]]
    assert [st.item() for st in ref[2]] == [4.0] * 4
