"""Throughput kernels (docs/THROUGHPUT.md): the loop shapes that make reductions and softmax run at
memory speed stay correct at their edges, and their hot loops stay vectorized.

Speed itself is printed by `make bench` (tools/bench.py throughput()), never asserted here.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import eager_neuron  # noqa: F401
from eager_neuron.kernels import norm as kn
from eager_neuron.kernels import reduce as kr
from eager_neuron.kernels.compile import compile_kernel
from eager_neuron.lower import reduce as lred

DEV = "neuron"
NAN = float("nan")


def _check(fn, x, **tol):
    got = fn(x.to(DEV)).cpu()
    want = fn(x.double()).to(got.dtype) if x.is_floating_point() else fn(x)
    torch.testing.assert_close(got, want, equal_nan=True, **tol)


@pytest.mark.parametrize("rows", [1, 3, 6, 9])
def test_col_mode_blocks_and_row_tails(rows):
    """x.sum(0)-style ("col" mode): 1024 outputs per accumulator block (2500 = two full blocks
    and a partial one), the reduced rows 4 per sweep (rows % 4 is the tail), NaN of either sign
    in a swept row and in a tail row, integers summed exactly, a view whose rows are not
    contiguous with each other."""
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 2500, generator=g)
    x[0, 5] = NAN
    x[rows - 1, 2400] = -NAN
    x[rows // 2, 1024] = float("inf")
    for fn in (lambda t: t.sum(0), lambda t: t.mean(0), lambda t: t.amax(0),
               lambda t: t.amin(0), lambda t: t.abs().sum(0)):
        _check(fn, x, atol=1e-6, rtol=2e-6)
    i = torch.randint(-2**31, 2**31 - 1, (rows, 2500), generator=g, dtype=torch.int32)
    torch.testing.assert_close(i.to(DEV).sum(0).cpu(), i.sum(0))   # int64 accumulator: exact
    b = torch.randn(rows, 4000, generator=g)[:, 300:2800]           # rows strided by 4000
    _check(lambda t: t.sum(0), b, atol=1e-6, rtol=2e-6)
    _check(lambda t: t.amax(0), b)


def test_chunk_mode_extremes_and_nan():
    """One float output over a long row ("chunk" mode: prange over 64 slices): the extreme in the
    last slice's last element, a NaN of either sign in any slice wins."""
    n = 2 * lred.PARALLEL_MIN + 13
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=g)
    x[-1] = 99.0
    x[n // 3] = -98.0
    _check(lambda t: t.amax(), x)
    _check(lambda t: t.amin(), x)
    for pos in (0, n // 64 + 1, n - 1):
        for nan in (NAN, -NAN):
            y = x.clone()
            y[pos] = nan
            assert torch.isnan(y.to(DEV).amax().cpu()) and torch.isnan(y.to(DEV).amin().cpu())
    _check(lambda t: t.double().sum(), x, atol=1e-9, rtol=1e-12)   # float64 chunk sum


def test_float32_sum_within_one_rounding():
    """float32 sum of one contiguous row (float64 partials) is the float64 sum rounded once (at
    least as accurate as torch's float32 cascade sum), across block edges."""
    g = torch.Generator().manual_seed(1)
    for n in (1, 15, 16, 17, 511, 512, 1025, 1 << 20):
        x = torch.randn(n, generator=g) * 10 + 3
        exact = x.double().sum()
        got = x.to(DEV).sum().cpu().double()
        assert abs(got - exact) <= 0.5001 * abs(float(exact.float()) - float(
            torch.nextafter(exact.float(), torch.tensor(float("inf"))))) + 1e-12, (n, got, exact)


def _llvm(src: str, name: str, *args) -> str:
    k = compile_kernel(src, name)
    k(*args)
    return "\n".join(k.inspect_llvm().values())


def test_hot_loops_vectorize():
    """The reduction and softmax loops keep vector IR (a loop that indexes from a possibly
    negative base keeps Numba's wraparound select and loses it; a scalar float64 chain without
    reassoc never had it)."""
    vec = re.compile(r"<(4|8|16) x (float|double|i32)>")
    a = np.random.default_rng(0).standard_normal((1, 5000)).astype(np.float32)
    out = np.empty(1, np.float32)
    for op, mode, acc, load in (("sum", "block", "np.float64", "np.float32"),
                                ("kmax32", "chunk", "np.int32", "")):
        src, name = kr.render_reduce(op, 1, 1, acc, load, ("np.float32",), 0, mode=mode,
                                     fastmath=op == "sum")
        assert vec.search(_llvm(src, name, out, a)), (op, mode)
    col = np.asfortranarray(np.random.default_rng(1).standard_normal((300, 7)).astype(np.float32))
    src, name = kr.render_reduce("sum", 1, 1, "np.float64", "np.float32", ("np.float32",), 0,
                                 mode="col", fastmath=True)
    assert vec.search(_llvm(src, name, np.empty(300, np.float32), col))
    # the float extremes' integer keys vectorize in their own width, in every mode: a NaN key
    # at the type's extreme let LLVM fold the max into a select it did not vectorize (int32
    # keys then ran in int64 lanes, the float64 ones scalar)
    for bits, dt in ((32, np.float32), (64, np.float64)):
        x = np.random.default_rng(3).standard_normal((40, 300)).astype(dt)
        for op in ("kmax", "kmin"):
            for mode, arr in (("chunk", x[:1]), ("row", x), ("col", np.asfortranarray(x))):
                src, name = kr.render_reduce(f"{op}{bits}", 1, 1, f"np.int{bits}", "",
                                             (f"np.float{bits}",), 0, mode=mode)
                ir = _llvm(src, name, np.empty(arr.shape[0], dt), arr)
                assert re.search(rf"llvm\.s{op[1:]}\.v\d+i{bits}\b", ir), (op, bits, mode)
    src, name = kn.render_softmax(False, 1, "np.float64", "np.float32")
    rows = np.random.default_rng(2).standard_normal((3, 100)).astype(np.float32)
    res = np.empty_like(rows)
    ir = _llvm(src, name, res, rows)
    assert re.search(r"fadd reassoc <\d+ x double>", ir), "softmax row sum not vectorized"
    assert re.search(r"llvm\.maxnum\.v\d+f32", ir), "softmax row max not vectorized"
    want = torch.softmax(torch.from_numpy(rows).double(), -1).float().numpy()
    # exp(x - max) carries the float32 rounding of x - max (|x - max| ulp, as torch's kernel)
    np.testing.assert_allclose(res, want, rtol=2e-6, atol=0)


def test_exp_neg_is_vexp_bit_for_bit():
    """softmax's exp(x - max) runs `_v_exp_neg` (x <= 0 or NaN), which must equal `_vexp` bit for
    bit there (checked once on all 2^31 non-positive floats; here every 4099th one, the edges and
    NaNs), denormal results included."""
    from eager_neuron.kernels.vmath import VMATH_PRELUDE

    src = VMATH_PRELUDE + (
        '\n@njit(error_model="numpy", nogil=True)\n'
        "def k_exp_neg(a, b, x):\n"
        "    for i in range(x.shape[0]):\n"
        "        a[i] = _vexp(x[i])\n"
        "        b[i] = _v_exp_neg(x[i])\n")
    k = compile_kernel(src, "k_exp_neg")
    bits = np.arange(0x80000000, 0x100000000, 4099, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0.0, -0.0, -1e-45, -87.3, -88.0, -103.9, -104.0, -104.1, -150.0, -np.inf,
                      np.nan, -np.nan], np.float32)
    x = np.concatenate([bits.view(np.float32), edges])
    a, b = np.empty_like(x), np.empty_like(x)
    k(a, b, x)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    ok = ~np.isnan(x)
    assert (b[ok] >= 0).all() and np.isnan(b[~ok]).all() and b[-3] == 0.0


@pytest.mark.parametrize("expr,kinds,loads,store,dtype", [
    ("x0 + c0 * x1", ("flat", "flat"), ("np.float32", "np.float32"), "np.float32({})",
     np.float32),
    ("x0 * c0 + x1", ("flat", "one"), ("np.float64", "np.float64"), "np.float64({})",
     np.float64),
    ("x0 > x1", ("flat", "flat"), ("np.float32", "np.float32"), "np.bool_({})", np.bool_),
])
def test_streamed_elementwise_equals_plain_loop(monkeypatch, expr, kinds, loads, store, dtype):
    """The streaming-store path of a parallel flat kernel (kernels/elementwise.py `_streamed`,
    forced on for any size here) writes exactly what the plain serial loop writes: every output
    offset against the 64-byte boundary (its serial head), sizes below, at and past a block with
    a tail, an output aliasing its first input (in-place op); nothing outside the output. An
    output sharing memory with an operand takes plain stores (the kernel returns 0, else 1)."""
    from eager_neuron.elementwise_base import PRELUDE
    from eager_neuron.kernels import elementwise as kew

    monkeypatch.setattr(kew, "NT_MIN_BYTES", 0)
    if not kew.streams(expr, kinds, 1):
        pytest.skip("no streaming stores on this architecture")
    src, name = kew.render(expr, kinds, 1, loads, ("np.float64",), store, parallel=True)
    assert "_nt_store64(out" in src
    streamed = compile_kernel(PRELUDE + src, name)
    src, name = kew.render(expr, kinds, 1, loads, ("np.float64",), store, parallel=False)
    plain = compile_kernel(PRELUDE + src, name)
    rng = np.random.default_rng(0)
    for n in (1, 17, kew.NT_BLOCK - 1, kew.NT_BLOCK + 16, 3 * kew.NT_BLOCK + 37):
        for off in range(0, 16, 3):
            xs = [rng.standard_normal(n + 16).astype(np.float32)[off:off + n] if k == "flat"
                  else np.array([1.5], np.float32) for k in kinds]
            want = np.empty(n, dtype)
            plain(want, *xs, 0.75)
            buf = np.zeros(n + 32, dtype)
            got = buf[off:off + n]
            assert streamed(got, *xs, 0.75) == 1, (n, off)   # it streamed
            assert np.array_equal(got, want), (n, off)
            assert not buf[:off].any() and not buf[off + n:].any(), (n, off)
            if dtype is np.float32:
                # in place (out is its first input) and out= overlapping an operand: plain
                # stores (the lines are in cache already: streaming would only evict them)
                x0 = xs[0].copy()
                assert streamed(x0, x0, *xs[1:], 0.75) == 0, (n, off)
                assert np.array_equal(x0, want), (n, off)
                if n > 1 and kinds[-1] == "flat":
                    big = np.concatenate([xs[0], xs[-1]])
                    x1 = big[n - 1:2 * n - 1]   # shares one element with the output
                    o = big[:n]
                    assert streamed(o, *xs[:-1], x1, 0.75) == 0, (n, off)
    assert not kew.streams("_vgelu_as(x0)", ("flat",), 1)   # compute-bound: plain stores


def test_two_stream_reductions_edges():
    """Block-mode sums read a row as two interleaved halves plus a tail, paired chunks walk two
    slices of unequal length side by side, row pairs walk rows i and i + rows/2 (the odd row
    alone): each within the float64-referenced bound, NaN anywhere propagating."""
    g = torch.Generator().manual_seed(3)
    for n in (1023, 1024, 1025, 2048 + 3, 4096 * 3 + 511):
        x = torch.randn(n, generator=g) * 10 + 3
        exact = x.double().sum()
        got = x.to(DEV).sum().cpu().double()
        ulp = abs(float(exact.float()) - float(torch.nextafter(exact.float(),
                                                                torch.tensor(float("inf")))))
        assert abs(got - exact) <= 0.5001 * ulp + 1e-12, (n, got, exact)
        _check(lambda t: t.mean(), x, atol=0, rtol=2e-7)
    m = 2 * lred.PARALLEL_MIN + 63     # chunks of unequal length
    x = torch.randn(m, generator=g)
    for pos in (m // 2 + 5, m - 2):
        y = x.clone()
        y[pos] = 123.0
        _check(lambda t: t.amax(), y)
        y[pos] = -NAN
        assert torch.isnan(y.to(DEV).amin().cpu())
    for rows in (1, 2, 5):
        x = torch.randn(rows, 700, generator=g)
        x[rows - 1, 3] = NAN
        for fn in (lambda t: t.sum(1), lambda t: t.amax(1), lambda t: t.abs().mean(1),
                   lambda t: (t > 1).any(1)):
            _check(fn, x, atol=1e-6, rtol=2e-6)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_rows_with_nan_and_inf(log):
    """The float32 softmax row max is a vectorized maxnum that ignores NaN: a NaN anywhere in a
    row must still make the whole row NaN (through the row's sum), an all -inf row and a +inf
    row NaN as torch's, the other rows within float64-referenced bounds."""
    src, name = kn.render_softmax(log, 1, "np.float64", "np.float32")
    k = compile_kernel(src, name)
    rows = np.random.default_rng(4).standard_normal((8, 300)).astype(np.float32)
    rows[1, 5] = np.nan
    rows[2, 299] = -np.nan
    rows[3, :] = -np.inf
    rows[4, 7] = np.inf
    rows[5, :150] = -np.inf
    rows[6, :] = 0.0
    rows[6, 3] = -0.0
    res = np.empty_like(rows)
    k(res, rows)
    fn = torch.log_softmax if log else torch.softmax
    want = fn(torch.from_numpy(rows).double(), -1).float().numpy()
    assert np.array_equal(np.isnan(res), np.isnan(fn(torch.from_numpy(rows), -1).numpy()))
    assert np.isnan(res[1:5]).all() and not np.isnan(res[[0, 5, 6, 7]]).any()
    np.testing.assert_allclose(res, want, rtol=2e-6, atol=1e-7 if log else 0)


IN_PLACE = {
    "add_": (lambda x, y, h: x.add_(y, alpha=0.5), lambda x, y, h: torch.add(x, y, alpha=0.5)),
    "mul_": (lambda x, y, h: x.mul_(0.9), lambda x, y, h: torch.mul(x, 0.9)),
    "addcdiv_": (lambda x, y, h: x.addcdiv_(y, h, value=0.1),
                 lambda x, y, h: torch.addcdiv(x, y, h, value=0.1)),
    "addcmul_": (lambda x, y, h: x.addcmul_(y, y, value=0.01),
                 lambda x, y, h: torch.addcmul(x, y, y, value=0.01)),
    "lerp_": (lambda x, y, h: x.lerp_(y, 0.3), lambda x, y, h: torch.lerp(x, y, 0.3)),
    "clamp_": (lambda x, y, h: x.clamp_(min=-0.5), lambda x, y, h: torch.clamp(x, min=-0.5)),
}


@pytest.mark.parametrize("op, n", [(op, 4096) for op in IN_PLACE] +   # the serial loop
                         [("add_", 300_000), ("addcdiv_", 300_000)])   # the parallel one
def test_in_place_elementwise_reads_its_output(op, n):
    """An in-place op's kernel has a loop reading x0 from the output (LLVM's overlap check sent
    the general loop to its scalar path when out is a0): the same bits as the out-of-place op,
    the CPU's values within rounding."""
    inplace, outofplace = IN_PLACE[op]
    g = torch.Generator().manual_seed(n)
    x, y = torch.randn(n, generator=g), torch.randn(n, generator=g)
    h = torch.rand(n, generator=g) + 0.5
    xn, yn, hn = x.to("neuron"), y.to("neuron"), h.to("neuron")
    want = outofplace(xn, yn, hn).cpu()
    got = inplace(xn, yn, hn)
    assert got is xn
    assert torch.equal(got.cpu(), want)
    torch.testing.assert_close(want, outofplace(x, y, h), rtol=2e-6, atol=1e-6)


def test_in_place_kernel_key_and_aliasing_outputs():
    from eager_neuron.cache import families

    key = ("elementwise", "aten::add", "x0 + c0 * x1", ("flat", "flat"), 1,
           ("np.float32", "np.float32"), ("np.float32",), "np.float32({})", False, "p", True)
    src, _ = families.ELEMENTWISE.render(key)
    assert "out.ctypes.data == a0.ctypes.data" in src
    src, _ = families.ELEMENTWISE.render(key[:-1] + (False,))
    assert "out.ctypes.data" not in src
    # out= aliasing the second operand (the general loop), and the first one reinterpreted
    # as another dtype (the dtype guard keeps the general loop: x0 is read as int64)
    a, b = torch.randn(64), torch.randn(64)
    an, bn = a.to("neuron"), b.to("neuron")
    torch.add(an, bn, alpha=2.0, out=bn)
    assert torch.equal(bn.cpu(), torch.add(a, b, alpha=2.0))
    i = torch.arange(64, dtype=torch.int64)
    i_n = i.to("neuron")
    torch.add(i, 3, out=i.view(torch.float64))
    torch.add(i_n, 3, out=i_n.view(torch.float64))
    assert torch.equal(i_n.cpu(), i)
