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
