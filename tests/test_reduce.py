"""Reductions and scans on `neuron` against the CPU: values, NaN rules, dtypes, odd layouts,
gradients, and counters (no CPU fallback, no recompile for a new batch size).

Cases are chosen to reuse kernels (a kernel is keyed on op, dtypes, rank and layout), so the file
compiles a few dozen kernels in total.
"""

from __future__ import annotations

import math

import pytest
import torch

import eager_neuron
from eager_neuron.lower import reduce as lred

DEV = "neuron"


def _same(got, want, **kw):
    if isinstance(want, (tuple, list)):
        for g, w in zip(got, want):
            _same(g, w, **kw)
        return
    torch.testing.assert_close(got.cpu() if isinstance(got, torch.Tensor) else got, want,
                               equal_nan=True, **kw)


def _no_fallback():
    st = eager_neuron.stats()
    assert st["fallbacks"] == {}, st["fallbacks"]
    ours = {k for k in st["decompositions"] if k in lred.LOWERINGS}
    assert not ours, f"declined to decompositions: {ours}"


def run(fn, x, **kw):
    """fn on a neuron copy of x and on x; compare; no fallback, no decomposition of our ops."""
    eager_neuron.reset_stats()
    got = fn(x.to(DEV))
    _same(got, fn(x), **kw)
    _no_fallback()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# layouts: contiguous, transposed, sliced (strided), broadcast (stride 0), 0-d, empty
def _layouts():
    base = torch.randn(4, 6, 5)
    return {
        "contig": base,
        "transposed": base.transpose(0, 2),
        "sliced": base[:, ::2],
        "expanded": torch.randn(1, 6, 1).expand(4, 6, 5),
    }


# (layout, dim): every dim on the contiguous input, one or two on each odd layout
LAYOUT_DIMS = [("contig", None), ("contig", 1), ("contig", -1), ("contig", (0, 2)),
               ("contig", 0), ("transposed", None), ("transposed", 1), ("sliced", -1),
               ("sliced", (0, 2)), ("expanded", 0)]


@pytest.mark.parametrize("layout,dim", LAYOUT_DIMS)
def test_sum_layouts(layout, dim):
    x = _layouts()[layout]
    if dim is None:
        run(lambda t: t.sum(), x)
    else:
        run(lambda t: t.sum(dim), x)
        run(lambda t: t.sum(dim, keepdim=True), x)


@pytest.mark.parametrize("dim", [None, -1, (0, 2)])
def test_mean(dim):
    x = torch.randn(4, 6, 5)
    run(lambda t: t.mean() if dim is None else t.mean(dim, keepdim=True), x)


def test_odd_shapes():
    run(lambda t: t.sum(), torch.tensor(3.5))                  # 0-d
    run(lambda t: t.sum(0), torch.tensor(3.5))
    run(lambda t: t.mean(), torch.tensor(3.5))
    run(lambda t: t.sum(0), torch.randn(0, 3))                 # empty reduction: zeros
    run(lambda t: t.mean(0), torch.randn(0, 3))                # 0 / 0: NaN like torch
    run(lambda t: t.sum(0), torch.randn(3, 0))                 # empty output
    run(lambda t: t.prod(0), torch.randn(0, 3))                # empty product: ones
    run(lambda t: t.sum((0, 1)), torch.randn(1, 1, 3))         # size-1 dims


def test_sum_dtypes():
    ints = torch.randint(-50, 50, (4, 6, 5))
    run(lambda t: t.sum(1), ints)
    run(lambda t: t.sum(), ints.to(torch.int32))              # ints promote to int64
    run(lambda t: t.sum(-1), ints > 0)                         # bool counts
    run(lambda t: t.sum(-1), torch.randn(4, 6, 5, dtype=torch.float64))
    run(lambda t: t.sum(-1, dtype=torch.float32), ints)       # cast first, then sum


def test_int_sum_wraps_like_torch():
    run(lambda t: t.sum(), torch.full((4,), 2 ** 62, dtype=torch.int64))


def test_extremes_and_nan():
    x = torch.randn(5, 7)
    x[1, 3] = float("nan")
    x[1, 5] = float("nan")
    x[2, 2] = x[2, 4] = 10.0                                   # ties: the first index wins
    for fn in (lambda t: t.amax(1), lambda t: t.amin(0), lambda t: t.max(), lambda t: t.min(),
               lambda t: t.max(1), lambda t: t.min(1, keepdim=True), lambda t: t.argmax(),
               lambda t: t.argmax(1), lambda t: t.argmin(-1), lambda t: t.amax((0, 1)),
               lambda t: t.t().max(0), lambda t: t.t().argmax()):
        run(fn, x)


def test_extremes_int():
    x = torch.randint(-3, 3, (5, 7))
    run(lambda t: t.amax(1), x)
    run(lambda t: t.argmin(), x)                               # many ties: the first wins
    run(lambda t: t.max(1), x > 0)


def test_extremes_empty_raise():
    with pytest.raises((IndexError, RuntimeError), match="numel\\(\\) == 0"):
        torch.randn(0, 3, device=DEV).max()
    with pytest.raises((IndexError, RuntimeError), match="dim 0 to have non-zero size"):
        torch.randn(0, 3, device=DEV).argmax(0)


def test_any_all():
    x = torch.randn(4, 6, 5)
    x[x.abs() < 0.5] = 0
    b = x > 0
    for fn in (lambda t: t.any(), lambda t: t.any(-1, keepdim=True), lambda t: t.any(1),
               lambda t: t.all(dim=()), lambda t: t.all(dim=(0, 2))):
        run(fn, b)
    run(lambda t: t.any(), x)
    run(lambda t: t.all(), torch.tensor([1.0, float("nan")]))  # NaN is true


@pytest.mark.parametrize("fn", [
    lambda t: t.var(), lambda t: t.std(-1, correction=2), lambda t: t.var(1, correction=0),
    lambda t: torch.var_mean(t, (0, 2), keepdim=True), lambda t: torch.std_mean(t, -1),
    lambda t: t.transpose(0, 2).var(1),
], ids=range(6))
def test_var_std(fn):
    run(fn, torch.randn(4, 6, 5) * 3 + 100)                    # a large mean: two-pass matters


@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0")
def test_var_degenerate():
    run(lambda t: t.var(0), torch.randn(1, 3))                 # 0 / 0 -> NaN
    run(lambda t: t.var(0, correction=2), torch.randn(1, 3))   # dof < 0 -> inf / NaN as torch
    run(lambda t: t.var(), torch.randn(5, dtype=torch.float64))


def test_logsumexp():
    x = torch.randn(4, 6, 5) * 30
    x[0, :, 0] = -math.inf                                     # all -inf: -inf, not NaN
    x[1, 2, 1] = math.inf
    x[2, 3, 2] = math.nan
    run(lambda t: t.logsumexp(-1), x)
    run(lambda t: t.logsumexp((0, 2), keepdim=True), x)


@pytest.mark.parametrize("ord", [2, 1, math.inf, -math.inf, 0, 3, 0.5])
def test_vector_norm(ord):
    x = torch.randn(4, 6, 5)
    x[0, 0, 0] = 0
    run(lambda t: torch.linalg.vector_norm(t, ord, dim=-1, keepdim=True), x)


def test_norm_variants():
    x = torch.randn(6, 5)
    run(lambda t: t.norm(), x)
    run(lambda t: t.norm(dim=1), x)


def test_scans():
    x = torch.randn(4, 6, 5) * 0.5 + 1
    run(lambda t: t.cumsum(1), x)
    run(lambda t: t.cumsum(-1), x)
    run(lambda t: t.cumprod(1), x)
    run(lambda t: t.transpose(0, 2).cumsum(1), x)


def test_scan_dtypes():
    run(lambda t: t.cumsum(-1), torch.randint(-5, 5, (4, 3), dtype=torch.int32))  # -> int64
    run(lambda t: t.cumsum(0), torch.tensor(2.0))


@pytest.mark.parametrize("fn", [
    lambda t: t.sum(), lambda t: t.mean(1), lambda t: t.amax(1), lambda t: t.var(0),
    lambda t: t.norm(), lambda t: t.logsumexp(-1), lambda t: t.cumsum(1),
    lambda t: t.prod(1), lambda t: t.std(),
], ids=range(9))
def test_backward(fn):
    x = torch.randn(4, 6) * 0.5 + 1
    xc = x.clone().requires_grad_()
    xn = x.to(DEV).requires_grad_()
    eager_neuron.reset_stats()
    yn = fn(xn)
    yc = fn(xc)
    g = torch.randn_like(yc)
    yc.backward(g)
    yn.backward(g.to(DEV))
    _same(yn, yc.detach())
    _same(xn.grad, xc.grad)
    assert eager_neuron.stats()["fallbacks"] == {}


def test_no_recompile_for_new_batch():
    fns = (lambda t: t.sum(1), lambda t: t.sum(0), lambda t: t.amax(-1), lambda t: t.var(1),
           lambda t: t.argmax(1), lambda t: t.cumsum(1), lambda t: t.norm(dim=1),
           lambda t: t.sum())
    for f in fns:
        f(torch.randn(3, 17, device=DEV))
    eager_neuron.reset_stats()
    for batch in (5, 64):
        x = torch.randn(batch, 17)
        for f in fns:
            _same(f(x.to(DEV)), f(x))
    assert eager_neuron.stats()["compiles"] == 0
    _no_fallback()


def test_large_uses_parallel_and_matches():
    # above PARALLEL_MIN: prange over rows, chunked full reduction, column blocks
    x = torch.randn(64, lred.PARALLEL_MIN // 64 + 8)
    run(lambda t: t.sum(), x, rtol=1e-5, atol=1e-3)
    run(lambda t: t.sum(1), x, rtol=1e-5, atol=1e-4)
    run(lambda t: t.sum(0), x, rtol=1e-5, atol=1e-4)


def test_float32_sum_block_mode_accuracy():
    # one contiguous float32 row ("block" mode): the result must stay within a float32 rounding
    # of the exact sum (lengths around the 512-element block edges)
    g = torch.Generator().manual_seed(0)
    for n in (1, 511, 512, 513, 5000, 300001):
        x = torch.rand(n, generator=g) * 100 - 20
        exact, scale = float(x.double().sum()), float(x.double().abs().sum())
        assert abs(float(x.to(DEV).sum().cpu()) - exact) <= 6e-8 * abs(exact) + 1e-12 * scale
        mean = float(x.to(DEV).mean().cpu())
        assert abs(mean - exact / n) <= 6e-8 * abs(exact / n) + 1e-12 * scale / n


@pytest.mark.parametrize("red", ["sum", "mean", "max", "min", "prod"])
def test_segment_reduce_forward_backward(red):
    # ties, a zero (prod's exclusive product) and an empty segment; bfloat16 forward rounds
    # every step as the CPU does
    g = torch.Generator().manual_seed(0)
    lens = torch.tensor([1, 2, 0, 3])
    offs = torch.tensor([0, 1, 3, 3, 6])
    for dtype in (torch.float32, torch.bfloat16):
        d = torch.randn(6, 3, generator=g).to(dtype)
        d[2] = d[1]
        d[4, 0] = 0
        for init in (None, 2.5):
            want = torch.ops.aten.segment_reduce(d, red, lengths=lens, initial=init)
            got = torch.ops.aten.segment_reduce(d.to(DEV), red, offsets=offs.to(DEV),
                                                initial=init)
            assert torch.equal(got.cpu().nan_to_num(), want.nan_to_num())
    dc = d.float().requires_grad_()
    dn = d.float().to(DEV).requires_grad_()
    gout = torch.randn(4, 3, generator=g)
    want, = torch.autograd.grad(torch.ops.aten.segment_reduce(dc, red, lengths=lens), dc, gout)
    got, = torch.autograd.grad(torch.ops.aten.segment_reduce(dn, red, lengths=lens.to(DEV)), dn,
                               gout.to(DEV))
    _same(got, want)
    _no_fallback()


def test_float32_softmax_rows_vs_float64():
    """float32 softmax/log_softmax (kernels/norm.py _softmax_f32: integer-key row max, _vexp,
    float64 sum in four lanes) against float64 rounded to float32: NaN rows, +-inf, -0, huge
    magnitudes, rows of 1..9 elements (the lane tails) and a strided (transposed) view."""
    nan, inf = float("nan"), float("inf")
    rows = [[1.0, nan, 2.0], [-inf, -inf, -inf], [inf, 1.0, 2.0], [-0.0, 0.0, 1.0],
            [-1e30, 1e30, 5.0], [-inf, 0.0, 1.0]]
    g = torch.Generator().manual_seed(0)
    xs = [torch.tensor([r]) for r in rows]
    xs += [torch.randn(3, n, generator=g) * 10 for n in range(1, 10)]
    xs.append(torch.randn(33, 17, generator=g).t())
    for x in xs:
        for fn in (lambda t: t.softmax(-1), lambda t: t.log_softmax(-1)):
            got = fn(x.to(DEV)).cpu()
            want = fn(x.double()).float()
            torch.testing.assert_close(got, want, equal_nan=True, atol=1e-6, rtol=2e-6)


def test_float_extremes_by_integer_keys():
    """float amax/amin/max/min run as integer max/min over order-preserving keys
    (kernels/reduce.py _key_extreme): NaN (either sign) wins, +-inf, huge and denormal values,
    float64, a reduced middle dim, and -0.0/0.0 ties resolved as IEEE maximum/minimum."""
    nan, inf = float("nan"), float("inf")
    rows = [[1.0, nan, 2.0], [-inf, -inf], [inf, 1.0], [-1e30, 1e30, 5.0], [-nan, 1.0],
            [1e-45, -1e-45, 0.0], [-5.0, -7.0]]
    for dt in (torch.float32, torch.float64):
        for r in rows:
            x = torch.tensor(r, dtype=dt)
            for fn in (lambda t: t.amax(), lambda t: t.amin(), lambda t: t.max(),
                       lambda t: t.view(1, -1).amin(1), lambda t: t.view(-1, 1).amax(0)):
                run(fn, x)
        x = torch.randn(3, 70, 5, dtype=dt)
        x[1, 7, 2] = nan
        run(lambda t: t.amax(1), x)
        run(lambda t: t.amin((0, 2)), x)
    ties = torch.tensor([-0.0, 0.0]).to(DEV)
    assert not torch.signbit(ties.amax().cpu()) and torch.signbit(ties.amin().cpu())
