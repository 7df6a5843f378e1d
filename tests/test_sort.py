"""Sort family on `neuron` against the CPU: sort/argsort (stable and not: the indices of ties
must be the CPU's), topk, kthvalue, median/nanmedian, mode, unique, searchsorted/bucketize,
cummax/cummin/logcumsumexp; NaN placement, bool and bfloat16, and counters (no CPU fallback,
no recompile for a new row length).

Inputs are small integers so that ties are everywhere: a sort that is merely correct, not the
CPU's own algorithm, gives other indices and fails here.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import eager_neuron

DEV = "neuron"


def _ties(shape, dtype, nan=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 4, shape, generator=g).to(dtype)
    if nan and dtype.is_floating_point and x.numel() > 3:
        x.view(-1)[::5] = float("nan")
    return x


def _same(got, want):
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.device.type == DEV
        torch.testing.assert_close(g.cpu(), w, equal_nan=True, rtol=0, atol=0)


def run(fn, *xs):
    eager_neuron.reset_stats()
    got = fn(*(x.to(DEV) for x in xs))
    _same(got, fn(*xs))
    assert eager_neuron.stats()["fallbacks"] == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
@pytest.mark.parametrize("stable,desc", list(itertools.product([False, True], [False, True])))
def test_sort_ties_match_cpu(dtype, stable, desc):
    # 300 elements per row: the introsort partitions (not only its insertion pass) decide ties
    x = _ties((3, 300), dtype)
    for dim in (0, 1):
        run(lambda t: torch.sort(t, dim=dim, descending=desc, stable=stable), x)
    run(lambda t: torch.argsort(t, dim=-1, descending=desc, stable=stable), x)


def test_sort_cpu_stable_paths():
    # a stride-0 sort dim and a long 1-D ascending integer row take ATen's stable paths
    run(lambda t: torch.sort(t.expand(4, 50), dim=0), torch.arange(50.0))
    run(lambda t: torch.sort(t), _ties((40000,), torch.int64))


def test_sort_new_length_does_not_recompile():
    torch.sort(_ties((64,), torch.float32).to(DEV))
    eager_neuron.reset_stats()
    run(lambda t: torch.sort(t), _ties((1000,), torch.float32, seed=1))
    assert eager_neuron.stats()["compiles"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_topk(dtype):
    x = _ties((4, 200), dtype)
    for k, largest, srt in itertools.product((1, 3, 150), (True, False), (True, False)):
        run(lambda t: torch.topk(t, k, dim=1, largest=largest, sorted=srt), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_order_statistics(dtype):
    x = _ties((5, 33), dtype)
    for k in (1, 7, 33):
        run(lambda t: torch.kthvalue(t, k, dim=1), x)
    for keepdim in (False, True):
        run(lambda t: torch.median(t, dim=0, keepdim=keepdim), x)
        run(lambda t: torch.nanmedian(t, dim=1, keepdim=keepdim), x)
        run(lambda t: torch.mode(t, dim=1, keepdim=keepdim), x)
    run(torch.median, x)
    run(torch.nanmedian, x)


def test_nanmedian_all_nan_row():
    x = torch.full((2, 5), float("nan"))
    x[1, 2] = 1.0
    run(lambda t: torch.nanmedian(t, dim=1), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_unique(dtype):
    x = _ties((4, 6), dtype)
    for srt, inv, cnt in itertools.product((False, True), repeat=3):
        run(lambda t: torch.unique(t, sorted=srt, return_inverse=inv, return_counts=cnt), x)
    for inv, cnt in itertools.product((False, True), repeat=2):
        run(lambda t: torch.unique_consecutive(t, return_inverse=inv, return_counts=cnt), x)


def test_searchsorted_bucketize():
    bd = torch.sort(_ties((3, 8), torch.float32, nan=False), dim=-1)[0]
    x = _ties((3, 5), torch.float32, nan=False, seed=2)
    for right in (False, True):
        run(lambda b, t: torch.searchsorted(b, t, right=right), bd, x)
        run(lambda b, t: torch.searchsorted(b, t, right=right, out_int32=True), bd[0], x)
        run(lambda t, b: torch.bucketize(t, b, right=right), x, bd[0])
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0)).expand(3, 8)
    unsorted = torch.gather(bd, 1, torch.argsort(perm, 1))
    run(lambda b, t, s: torch.searchsorted(b, t, sorter=s), unsorted, x, perm.contiguous())
    run(lambda a, b: torch.isin(a, b), _ties((30,), torch.int64), _ties((6,), torch.int64, seed=3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_cummax_cummin(dtype):
    x = _ties((3, 40), dtype)
    for dim in (0, 1):
        run(lambda t: torch.cummax(t, dim), x)
        run(lambda t: torch.cummin(t, dim), x)


def test_logcumsumexp():
    x = torch.randn(4, 30)
    x[0, 3] = float("-inf")
    x[1, :4] = float("-inf")
    x[2, 5] = float("inf")
    eager_neuron.reset_stats()
    got = torch.logcumsumexp(x.to(DEV), 1)
    torch.testing.assert_close(got.cpu(), torch.logcumsumexp(x, 1), equal_nan=True)
    assert eager_neuron.stats()["fallbacks"] == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_histc(dtype):
    # 1200 elements: the CPU splits them over its threads, bfloat16 counts saturate per thread
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(30, 40, generator=g) * 5).to(dtype)
    for bins, lo, hi in [(100, 0, 0), (1, 0, 10), (3, 0, 10), (7, -3, 2), (10, 1, 1)]:
        run(lambda t: torch.histc(t, bins, lo, hi), x)
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(x.to(DEV), 4, 3, 1)


def test_histc_float64_bounds_in_float64():
    # float64 bins and bounds stay float64 (float64 was a CPU fallback): 0.1 is inside
    # [0.1, 0.7] only when the bound is not rounded to float32 (0.10000000149)
    x = torch.tensor([0.1, 0.3, 0.7, 0.7000000001, 0.09999999], dtype=torch.float64)
    run(lambda t: torch.histc(t, 3, 0.1, 0.7), x)
    assert torch.histc(x.to(DEV), 3, 0.1, 0.7).tolist() == [1.0, 1.0, 1.0]


def test_bincount():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 10, (20,), generator=g)
    w = torch.randn(20, generator=g)
    for minlength in (0, 30):
        run(lambda t: torch.bincount(t, minlength=minlength), x)
        for wt in (w, w.double(), torch.randint(0, 3, (20,), generator=g)):
            run(lambda t, u: torch.bincount(t, u, minlength), x, wt)
    run(lambda t: torch.bincount(t, minlength=3), torch.tensor([], dtype=torch.int64))


def test_histogram():
    # edges may differ from ATen's vectorized linspace by an ulp: compare at float32 tolerance
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 40, generator=g) * 3
    w = torch.rand(30, 40, generator=g)
    cases = [(7, None), (5, (-3.0, 2.0)), (3, (1.0, 1.0))]
    for (bins, rng), wt, density in itertools.product(cases, (None, w), (False, True)):
        want = torch.histogram(x, bins, range=rng, weight=wt, density=density)
        got = torch.histogram(x.to(DEV), bins, range=rng,
                              weight=None if wt is None else wt.to(DEV), density=density)
        for gg, ww in zip(got, want):
            torch.testing.assert_close(gg.cpu(), ww)
    edges = torch.tensor([-2.0, 0.0, 0.5, 3.0])
    run(lambda t, e: torch.histogram(t, e), x, edges)


def test_histogram_float64():
    # float64 input, weights and edges on the device (float64 was a CPU fallback)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 40, generator=g, dtype=torch.float64) * 3
    w = torch.rand(30, 40, generator=g, dtype=torch.float64)
    for (bins, rng), wt, density in itertools.product([(7, None), (5, (-3.0, 2.0))],
                                                      (None, w), (False, True)):
        eager_neuron.reset_stats()
        want = torch.histogram(x, bins, range=rng, weight=wt, density=density)
        got = torch.histogram(x.to(DEV), bins, range=rng,
                              weight=None if wt is None else wt.to(DEV), density=density)
        for gg, ww in zip(got, want):
            assert gg.dtype == torch.float64
            torch.testing.assert_close(gg.cpu(), ww)
        assert eager_neuron.stats()["fallbacks"] == {}
    # 0.1 sits on an edge that float32 would move
    run(lambda t, e: torch.histogram(t, e),
        torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64),
        torch.tensor([0.0, 0.1, 0.3], dtype=torch.float64))
