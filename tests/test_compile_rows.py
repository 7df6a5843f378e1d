"""torch.compile(backend="neuron"): row kernels (compile/rows.py).

Last-dim reductions with their prologue and epilogue (softmax, log_softmax, layer norm, RMS
norm, cross-entropy), broadcasting operands (bias, norm affine, attention masks) and matmul
epilogues each run as one kernel. Every case is compared, forward and backward, with neuron
eager and with a float64 CPU reference, within bounds derived from the dtype and the row
length; and the case must really have used row kernels (the counters say so).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import eager_neuron
from eager_neuron.compile import stats as cstats

torch._dynamo.config.cache_size_limit = 64
N = "neuron"


pytestmark = pytest.mark.usefixtures("dynamo_reset")   # (tests/conftest.py)


def _close(a, b, dtype, scale):
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    assert a.shape == b.shape
    tol = 16 * torch.finfo(dtype).eps * scale * (1 + b.abs())
    bad = ~((a - b).abs() <= tol) & ~(a.isnan() & b.isnan())
    assert not bad.any(), f"max error {(a - b).abs().max().item()} (bound {tol.max().item()})"


def _run(fn, inputs, dtype, scale, grad=True):
    """compiled vs eager (neuron) vs float64 CPU; forward and, with grad, input gradients."""
    xs_c = [x.detach().clone().requires_grad_(grad and x.is_floating_point()) for x in inputs]
    xs_e = [x.detach().clone().requires_grad_(grad and x.is_floating_point()) for x in inputs]
    xs_r = [x.detach().cpu().double().requires_grad_(grad and x.is_floating_point())
            if x.is_floating_point() else x.detach().cpu() for x in inputs]
    out = torch.compile(fn, backend="neuron")(*xs_c)
    ref = fn(*xs_e)
    ref64 = fn(*xs_r)
    _close(out, ref, dtype, scale)
    _close(out, ref64, dtype, scale)
    if grad:
        g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(9)).to(dtype)
        out.backward(g.to(N))
        ref.backward(g.to(N))
        ref64.backward(g.double())
        for a, b, c in zip(xs_c, xs_e, xs_r):
            if a.grad is not None:
                _close(a.grad, b.grad, dtype, 4 * scale)
                _close(a.grad, c.grad, dtype, 4 * scale)
    return cstats()


def _rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       dtype=dtype).to(N)


_CASES = {
    "softmax": (lambda x, w, b: torch.softmax(x * 1.5, -1), "amax"),
    "log_softmax": (lambda x, w, b: torch.log_softmax(x + 0.5, dim=1), "amax"),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), "mean"),
    "rms_norm": (lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, 1e-6), "mean"),
    "bias_gelu": (lambda x, w, b: F.gelu(x * w + b), None),
    "sum_mean": (lambda x, w, b: (x * x).sum(-1) + x.mean(-1, keepdim=True).squeeze(-1),
                 "sum"),
}


@pytest.mark.parametrize("name,dtype", [(n, torch.float32) for n in sorted(_CASES)] + [
    ("layer_norm", torch.float64)], ids=str)
def test_row_case_compiled_equals_eager_and_float64(name, dtype):
    fn, red = _CASES[name]
    x, w, b = _rand(5, 37, dtype=dtype), _rand(37, dtype=dtype, seed=1), _rand(
        37, dtype=dtype, seed=2)
    s = _run(fn, [x, w, b], dtype, scale=37)
    assert s["row_kernel_launches"] >= 1 and s["graph_fallbacks"] == {}
    eager = s["graph_eager_ops"]
    # the reduction and the elementwise ops around it never ran as their own eager calls
    if red is not None:
        assert not any(k.startswith(f"aten::{red}") for k in eager), eager
    assert not any(k in eager for k in ("aten::_softmax", "aten::_log_softmax", "aten::exp",
                                        "aten::native_layer_norm", "aten::rsqrt")), eager
    assert s["group_fallbacks"] == {}


def test_cross_entropy_training_matches_eager():
    x, t = _rand(6, 11), torch.tensor([0, 3, 10, 2, 2, 7], device=N)
    s = _run(lambda x, t: F.cross_entropy(x * 2, t), [x, t], torch.float32, scale=11)
    assert s["row_kernel_launches"] >= 2       # log_softmax forward and its backward


def test_masked_attention_softmax_with_a_broadcast_mask():
    # a [1, 1, T, T] mask over [B, H, T, T] scores needs two row strides (a 3-D view)
    q, k = _rand(2, 3, 7, 4), _rand(2, 3, 7, 4, seed=1)
    mask = torch.ones(7, 7, dtype=torch.bool).tril().view(1, 1, 7, 7).to(N)

    def attn(q, k, mask):
        s = (q @ k.transpose(-1, -2)) * 0.5
        return torch.softmax(s.masked_fill(~mask, float("-inf")), -1)

    s = _run(attn, [q, k, mask], torch.float32, scale=16)
    assert s["row_kernel_launches"] >= 2 and s["group_fallbacks"] == {}


@pytest.mark.parametrize("case", ["addmm_beta_alpha", "gelu_residual"])
def test_matmul_epilogues_are_one_kernel(case):
    x, w, b, r = _rand(9, 12), _rand(20, 12, seed=1), _rand(20, seed=2), _rand(9, 20, seed=3)
    fns = {
        "addmm_beta_alpha": lambda x, w, b, r: torch.addmm(b, x, w.t(), beta=0.5, alpha=2.0),
        "gelu_residual": lambda x, w, b, r: F.gelu(x @ w.t() + b) * 0.5 + r,
    }
    s = _run(fns[case], [x, w, b, r], torch.float32, scale=12)
    eager = s["graph_eager_ops"]
    assert not any(k in eager for k in ("aten::mm", "aten::addmm", "aten::relu", "aten::gelu")), \
        eager
    assert s["row_kernel_launches"] >= 1


def test_nan_and_inf_rows_propagate_like_eager():
    x = _rand(4, 9)
    x[1, 3] = float("nan")
    x[2] = float("-inf")
    x[3, 0] = float("inf")
    fn = torch.compile(lambda x: torch.softmax(x, -1) + torch.log_softmax(x, -1).exp(),
                       backend="neuron")
    out, ref = fn(x).cpu(), (torch.softmax(x, -1) + torch.log_softmax(x, -1).exp()).cpu()
    assert torch.equal(out.isnan(), ref.isnan())
    _close(out.nan_to_num(), ref.nan_to_num(), torch.float32, 9)
    assert cstats()["row_kernel_launches"] >= 1


def test_new_row_count_and_length_compile_no_numba_kernel():
    def f(x, w):
        return F.layer_norm(x, (x.shape[-1],), w, None) * 2

    fc = torch.compile(f, backend="neuron", dynamic=True)
    w = _rand(16)
    _close(fc(_rand(4, 16), w), f(_rand(4, 16), w), torch.float32, 16)
    for rows in (9, 33):
        x = _rand(rows, 16, seed=rows)
        before = eager_neuron.stats()["compiles"]
        out = fc(x, w)
        assert eager_neuron.stats()["compiles"] == before, f"{rows} rows compiled Numba kernels"
        _close(out, f(x, w), torch.float32, 16)


def test_other_dims_and_empty_rows_stay_correct():
    x = _rand(6, 5)
    # softmax over dim 0 is not a row kernel: the op stays whole and runs in neuron eager
    out = torch.compile(lambda x: torch.softmax(x, 0), backend="neuron")(x)
    _close(out, torch.softmax(x, 0), torch.float32, 6)
    assert "aten::_softmax" in cstats()["graph_eager_ops"]
    # zero rows: the nodes run eagerly (same results and errors as eager)
    e = torch.empty(0, 5, device=N)
    out = torch.compile(lambda x: torch.softmax(x, -1) * 2, backend="neuron")(e)
    assert out.shape == (0, 5)


def _lstm_cell(gates, c):
    i, f, g, o = gates.chunk(4, 1)            # four (B, H) views with row stride 4H
    c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return (torch.sigmoid(o) * torch.tanh(c2)) * 2 + c2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_strided_chunks_are_row_kernels(dtype):
    """An elementwise chain over chunks of a wider tensor (an LSTM cell's gates) reads them
    through strided views in one row kernel (the flat groups take contiguous operands only:
    it used to run op by op)."""
    g = torch.Generator().manual_seed(3)
    gates = torch.randn(5, 4 * 24, generator=g, dtype=dtype).to(N)
    c = torch.randn(5, 24, generator=g, dtype=dtype).to(N)
    s = _run(_lstm_cell, [gates, c], dtype, 4)
    assert s["row_kernel_launches"] >= 1
    assert not {"aten::sigmoid", "aten::tanh", "aten::mul.Tensor"} & set(s["graph_eager_ops"])
    assert not s["group_fallbacks"]


# -- per-step costs of a compiled training step (issue 17) ----------------------------------------

class _Proj(torch.nn.Module):
    """Llama's attention shapes in small: projections viewed into heads and transposed, a
    rotate_half (slices, cat: its backward is slice_backward), a SiLU gate (its backward builds
    `1 - sigmoid` from empty_like + fill)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.q = torch.nn.Linear(16, 16, bias=False)
        self.up = torch.nn.Linear(16, 32, bias=False)
        self.down = torch.nn.Linear(32, 16, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, 2, 8).transpose(1, 2)          # (B, heads, T, 8)
        rot = torch.cat((-q[..., 4:], q[..., :4]), dim=-1)
        h = (q * 0.5 + rot).transpose(1, 2).reshape(B, T, 16)
        return self.down(torch.nn.functional.silu(self.up(h)) * 2)


def _proj_step(compiled: bool):
    torch.manual_seed(0)
    m = _Proj().to(N)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(6)).to(N)

    def step(x):
        out = m(x)
        out.square().mean().backward()
        return out.detach()

    f = torch.compile(step, backend="neuron") if compiled else step
    return m, f, x


def test_training_step_costs_views_slice_backward_fill():
    """The views a kernel reads are absorbed (no tensor made), slice_backward runs as zeros and
    a strided copy (not torch's reference decomposition), fill(empty_like) is a constant in a
    fused kernel; compiled equals neuron eager and a float64 CPU reference."""
    mc, fc, x = _proj_step(True)
    me, fe, _ = _proj_step(False)
    eager_neuron.reset_stats()
    out_c = fc(x)
    s, st = cstats(), eager_neuron.stats()
    out_e = fe(x)
    _close(out_c, out_e, torch.float32, 64)
    for pc, pe in zip(mc.parameters(), me.parameters()):
        _close(pc.grad, pe.grad, torch.float32, 256)
    assert s["views_absorbed"] >= 4, s["views_absorbed"]
    assert s["graph_eager_ops"].get("aten::slice_backward", 0) >= 1
    assert st["decompositions"].get("aten::slice_backward", 0) == 0, st["decompositions"]
    assert not {"aten::empty_like", "aten::fill.Scalar"} & set(s["graph_eager_ops"])
    assert not s["group_fallbacks"] and not s["graph_fallbacks"]
    # a float64 CPU reference of the same step
    m64 = _Proj().double()
    x64 = x.cpu().double()
    out64 = m64(x64)
    out64.square().mean().backward()
    _close(out_c, out64, torch.float32, 64)
    for pc, p64 in zip(mc.parameters(), m64.parameters()):
        _close(pc.grad, p64.grad, torch.float32, 256)


def test_absorbed_views_are_made_when_a_kernel_falls_back(monkeypatch):
    """A row kernel that cannot run (here: every launch fails) reruns its nodes eagerly; the
    views it absorbed are made first, so the result is the same."""
    from eager_neuron.compile import rowstep

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel today")

    monkeypatch.setattr(rowstep, "launch", broken)
    mc, fc, x = _proj_step(True)
    me, fe, _ = _proj_step(False)
    out_c = fc(x)
    s = cstats()
    assert s["views_absorbed"] >= 4
    assert s["group_fallbacks"].get("row kernel failed: RuntimeError", 0) >= 1
    _close(out_c, fe(x), torch.float32, 64)
    for pc, pe in zip(mc.parameters(), me.parameters()):
        _close(pc.grad, pe.grad, torch.float32, 256)


def test_strided_operand_views_are_as_strided_views():
    """rowstep._view3d's (A, B, C) view of a C-contiguous operand is made by the ndarray
    constructor over the operand's own memory (~0.3 us, not as_strided's ~5): the same data
    pointer, shape, strides, flags and values as as_strided's view, for broadcasts of every
    shape into several frames and each mode; a non-contiguous operand keeps as_strided."""
    import itertools

    import numpy as np

    from eager_neuron.compile import rowstep as R

    rng = np.random.default_rng(0)
    made = 0
    for frame in [(2, 8, 64), (16, 64), (2, 1, 8, 8), (3, 4, 5), (1, 6, 7)]:
        rows = int(np.prod(frame[:-1]))
        shapes = {tuple(f if k else 1 for f, k in zip(frame, keep))
                  for keep in itertools.product([0, 1], repeat=len(frame))}
        for shp in shapes:
            for drop in range(len(shp)):
                for mode in ("full", "row", "rowflat"):
                    a = rng.standard_normal(shp[drop:]).astype(np.float32)
                    if mode == "rowflat":
                        a = a[..., 0]
                    cands = [a]
                    if a.ndim >= 2:
                        cands.append(np.ascontiguousarray(a.swapaxes(-1, -2)).swapaxes(-1, -2))
                    for b in cands:
                        old = R.STRIDED_NDARRAY[0]
                        try:
                            R.STRIDED_NDARRAY[0] = False
                            ref = R._view3d(b, mode, frame, rows)
                            R.STRIDED_NDARRAY[0] = True
                            v = R._view3d(b, mode, frame, rows)
                        finally:
                            R.STRIDED_NDARRAY[0] = old
                        if ref is None:
                            assert v is None
                            continue
                        assert (v.shape, v.strides, v.dtype) == (ref.shape, ref.strides, ref.dtype)
                        assert v.__array_interface__["data"] == ref.__array_interface__["data"]
                        for flag in ("writeable", "c_contiguous", "f_contiguous", "aligned"):
                            assert getattr(v.flags, flag) == getattr(ref.flags, flag)
                        assert np.array_equal(v, ref)
                        if b.flags.c_contiguous and not ref.flags.c_contiguous:
                            # (the constructor's view of b's memory, no as_strided)
                            assert v.base is (b if b.base is None else b.base)
                            made += 1
    assert made > 20


COLS = {
    # a bias gradient: sum over the rows of [R, C]; a norm weight's: over [B, T] of [B, T, C]
    "sum0": lambda x, w: (x * w).sum(0),
    "sum01_keepdim": lambda x, w: torch.nn.functional.gelu(x + w).sum([0, 1], keepdim=True),
    "mean_leading": lambda x, w: (x * x + w).mean(tuple(range(x.dim() - 1))),
    "neg_dims": lambda x, w: (x - w).sum([-3, -2]),
}


# ([0] leads a 2-d frame only, [-3, -2] a 3-d one)
_COL_CASES = [(n, sh) for n in sorted(COLS) for sh in [(6, 5), (2, 7, 9), (512, 128)]
              if not (n == "sum0" and len(sh) == 3) and not (n == "neg_dims" and len(sh) == 2)]


@pytest.mark.parametrize("name,shape", _COL_CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_column_totals_are_row_kernels(name, shape, dtype):
    # a sum/mean over every leading dim is one row kernel (float64 totals, serial for every
    # size: (512, 128) is past the parallel threshold), with its elementwise prologue
    fn = COLS[name]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=g).to(dtype).to(N)
    w = torch.randn(shape[-1], generator=g).to(dtype).to(N)
    eager_neuron.compile.reset_stats()
    _run(fn, [x, w], dtype, shape[0] * (shape[1] if len(shape) == 3 else 1))
    s = cstats()
    assert s["row_kernel_launches"] >= 1
    assert "aten::sum.dim_IntList" not in s["graph_eager_ops"], s["graph_eager_ops"]
    assert "aten::mean.dim" not in s["graph_eager_ops"], s["graph_eager_ops"]


def test_partial_leading_sums_stay_eager_and_right():
    # sum over dim 0 only of a 3-d value is not a column total: neuron eager's own kernel
    x = torch.randn(3, 4, 5, device=N)
    eager_neuron.compile.reset_stats()
    _run(lambda x: (x * 2).sum(0), [x], torch.float32, 3)
    assert cstats()["graph_eager_ops"].get("aten::sum.dim_IntList", 0) >= 1


def test_bias_gradients_of_a_training_step_are_row_kernels():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    ref = [p.detach().clone() for p in m.parameters()]
    mc = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for p, q in zip(mc.parameters(), ref):
            p.copy_(q)
    m64, mc = m.double(), mc.to(N)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))

    def step(model, x):
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    step(m64, x.double())
    eager_neuron.compile.reset_stats()
    torch.compile(step, backend="neuron")(mc, x.to(N))
    for p, q in zip(mc.parameters(), m64.parameters()):
        _close(p.grad, q.grad, torch.float32, 64)
    assert "aten::sum.dim_IntList" not in cstats()["graph_eager_ops"], cstats()["graph_eager_ops"]
