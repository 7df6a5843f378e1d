"""The half route in one kernel (lower/elementwise.py prepare_half): a bfloat16/float16
elementwise op reads its operands as half bits, computes the float32 op's expression and stores
the rounded bits, in one launch instead of three or four (casts up, the float32 op, the cast
down). It must give the same bits as the three kernels, and the CPU's wherever the float32 op
does; the fast path replays it. Also: float16 <-> float32 casts over every float16 pattern, and
integer tensor operands of a half op rounded to the half type first, as the CPU does."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import eager_neuron  # noqa: F401
from eager_neuron import fastpath
from eager_neuron.lower import elementwise as ew
from eager_neuron.stats import STATS

HALF = (torch.bfloat16, torch.float16)


def _values(dtype, n=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 3
    x[:10] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, 6e-8,
                           65504.0, 7e4, -3e-5])
    return x.to(dtype)


OPS = {
    "add": lambda x, y: x + y,
    "sub alpha": lambda x, y: torch.sub(x, y, alpha=0.3),
    "mul number": lambda x, y: x * 0.1,
    "add number": lambda x, y: x + 0.1,
    "div": lambda x, y: x / y,
    "silu": lambda x, y: F.silu(x),
    "sigmoid": lambda x, y: torch.sigmoid(x),
    "exp": lambda x, y: x.exp(),
    "compare": lambda x, y: x > y,
    "where": lambda x, y: torch.where(x > 0, x, y),
    "masked_fill": lambda x, y: x.masked_fill(y > 0, -1e4),
    "broadcast": lambda x, y: x.view(16, 32) + y[:32],
    "strided": lambda x, y: x.view(16, 32).t() * y.view(32, 16),
    "nan_to_num": lambda x, y: torch.nan_to_num(x),
    "addcmul": lambda x, y: torch.addcmul(x, x, y, value=0.5),
    "clamp": lambda x, y: x.clamp(-1, 1),
    "in-place": lambda x, y: x.clone().mul_(y),
    "in-place number": lambda x, y: x.clone().add_(0.7),
    "out=": lambda x, y: torch.add(x, y, out=torch.empty_like(x)),
    "one element": lambda x, y: x * y[:1],
    "0-d": lambda x, y: x * y[3],
}


def _bits(t):
    """t's bits, every NaN as one pattern (a NaN's payload is not observable: the CPU's own
    vectorized and scalar conversions write different ones)."""
    t = t.cpu().reshape(-1)
    if t.dtype not in HALF:
        return t
    return torch.where(torch.isnan(t), torch.tensor(float("nan"), dtype=t.dtype), t
                       ).view(torch.int16)


@pytest.mark.parametrize("dtype", HALF)
def test_one_kernel_gives_the_three_kernels_bits(dtype):
    a, b = _values(dtype), _values(dtype, seed=1)
    x, y = a.to("neuron"), b.to("neuron")
    try:
        for name, op in OPS.items():
            got = {}
            for one in (True, False):
                ew.ONE_KERNEL[0] = one
                fastpath.reset()
                for _ in range(3):   # the slow path, then the fast path's replays
                    got[one] = _bits(op(x, y))
            assert torch.equal(got[True], got[False]), name
            # and the CPU's where the float32 op is one correctly rounded operation (not our
            # transcendentals; not sub's alpha or addcmul, which the CPU fuses or not by ISA)
            if name not in ("silu", "sigmoid", "exp", "div", "sub alpha", "addcmul"):
                assert torch.equal(got[True], _bits(op(a, b))), name
    finally:
        ew.ONE_KERNEL[0] = True


def test_a_half_op_is_one_launch_and_its_repeat_replays():
    x = _values(torch.bfloat16).to("neuron")
    y = _values(torch.bfloat16, seed=1).to("neuron")
    fastpath.reset()
    x + y
    hits = fastpath.STATS_FAST["hits"]
    launches = STATS.launches
    x + y
    assert STATS.launches - launches == 1
    assert fastpath.STATS_FAST["hits"] == hits + 1


@pytest.mark.parametrize("dtype", HALF)
def test_integer_operands_round_to_the_half_type_first(dtype):
    """bf16 * int64 tensor: the CPU casts 257 to bfloat16 (256) before multiplying; the half
    route multiplied the exact integer in float32 (a silent difference in 19% of elements)."""
    h = (torch.arange(300) * 0.37 - 2).to(dtype)
    ints = (torch.arange(300) * 37 + 100, torch.tensor(257), torch.tensor([257]),
            torch.arange(300, dtype=torch.int32) * 301, torch.tensor(-1001))
    ops = (lambda p, q: p * q, lambda p, q: p + q, lambda p, q: p - q, lambda p, q: p / q,
           lambda p, q: torch.where(p > 0, q, p), lambda p, q: torch.maximum(p * 300, q))
    for n in ints:   # a one-element one: mul and div read it as it is, the others round it
        for i, op in enumerate(ops):
            want = op(h, n)
            got = op(h.to("neuron"), n.to("neuron")).cpu()
            assert got.dtype == want.dtype and torch.equal(_bits(got), _bits(want)), (i, n)


def test_float16_casts_over_every_pattern():
    patterns = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    h = patterns.view(torch.float16)
    up = h.to("neuron").float().cpu()
    want = h.float()
    assert torch.equal(up.view(torch.int32), want.view(torch.int32))   # NaN payloads too
    # float32 -> float16 around every float16 (halfway points and their neighbours), signed
    f = want[torch.isfinite(want)].double()
    step = torch.nextafter(f, torch.full_like(f, float("inf"))) - f
    probes = torch.cat([f, f + step / 2, f - step / 2, f + step / 3]).float()
    probes = torch.cat([probes, torch.tensor([float("nan"), float("inf"), 65520.0, 65519.99])])
    down = probes.to("neuron").half().cpu()
    ref = probes.half()
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(down), nan)
    assert torch.equal(down[~nan].view(torch.int16), ref[~nan].view(torch.int16))
    assert np.isnan(down[nan].float().numpy()).all()


@pytest.mark.parametrize("dtype", HALF)
def test_numbers_rounded_to_the_half_type_replay_from_runners(dtype):
    """`h + 0.3` rounds 0.3 to the half type (as the CPU does) before the kernel: its repeats
    used to take the slow path every call (~200 us in an autocast Llama step); a runner now
    rounds each call's number the same way. An int the half type cannot hold goes back to the
    slow path (its result is inf)."""
    xc = (torch.randn(64, generator=torch.Generator().manual_seed(3)) * 100).to(dtype)
    x = xc.to("neuron")
    cases = [(lambda t, v: t + v, [1, 257, 3, 1001, -7, 2 ** 40, 65521]),
             (lambda t, v: t + v, [0.1, 0.3, 1e-3, -2.7, 7e4, float("inf")]),
             (lambda t, v: torch.sub(t, 1.5, alpha=v), [0.3, 0.1, 7.0]),
             (lambda t, v: v - t, [0.3, 1, 257]),
             (lambda t, v: t > v, [0.3, 10.1, 257]),
             (lambda t, v: t.clone().add_(v), [0.1, 0.7, 3])]
    for op, numbers in cases:
        fastpath.reset()
        for rep in range(2):
            hits = fastpath.STATS_FAST["hits"]
            for v in numbers:
                got, want = op(x, v).cpu(), op(xc, v)
                assert got.dtype == want.dtype and torch.equal(_bits(got), _bits(want)), v
            if rep:
                assert fastpath.STATS_FAST["hits"] > hits


# -- matrix products (lower/matmul.py _gemm_half) ---------------------------------------------

def _mm_cases(dtype, seed=0):
    """(name, op, CPU operands): op(*operands) on one device; products bounded below."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    a, b, bt, c, wide, b20 = r(37, 19), r(19, 23), r(23, 19), r(23), r(37, 40), r(20, 23)
    a3, b3, b3t, c3 = r(3, 7, 9), r(3, 9, 5), r(3, 5, 9), r(7, 5)
    return [
        ("mm", lambda x, y: x @ y, (a, b)),
        ("mm, transposed weight", lambda x, y: x @ y.t(), (a, bt)),
        ("mm, strided operand", lambda x, y: x[:, ::2] @ y, (wide, b20)),
        ("addmm beta alpha", lambda z, x, y: torch.addmm(z, x, y, beta=0.5, alpha=2.0),
         (c, a, b)),
        ("addmm_", lambda z, x, y: z.addmm_(x, y), (r(37, 23), a, b)),
        ("bmm", torch.bmm, (a3, b3)),
        ("bmm, transposed", lambda x, y: torch.bmm(x, y.transpose(1, 2)), (a3, b3t)),
        ("bmm, expanded", lambda x, y: torch.bmm(x, y.expand(3, 9, 5)), (a3, b3[0])),
        ("baddbmm", lambda z, x, y: torch.baddbmm(z, x, y, alpha=0.5), (c3, a3, b3)),
    ]


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "f16"])
def test_half_matmuls_are_one_launch_rounded_once_from_float32_sums(dtype):
    """A half mm/addmm/bmm/baddbmm is one kernel (was casts up, the float32 product and a cast
    down: four launches). Its result is the float32-accumulated product rounded once, as the
    CPU's: within half an ulp of the float64 result on the same half values plus float32's
    accumulation error (a bound that holds on every CPU), and repeat calls replay it."""
    eps = torch.finfo(dtype).eps
    for name, op, operands in _mm_cases(dtype):
        dev = [t.to("neuron") for t in operands]
        before = STATS.launches
        got = op(*dev)
        assert STATS.launches - before == 1, name
        assert got.dtype == dtype, name
        got = got.cpu().double()
        exact = op(*(t.double() for t in operands))
        # |each product term| summed: what float32 accumulation error scales with
        mag = op(*(t.double().abs() for t in operands)).abs()
        k = operands[-1].shape[-2]
        bound = 0.5 * eps * exact.abs() + (k + 2) * 2.0 ** -24 * mag * 4
        assert ((got - exact).abs() <= bound).all(), (name, ((got - exact).abs() - bound).max())
    # the fast path replays the kernel: same bits, one launch
    a = torch.randn(16, 8).to(dtype).to("neuron")
    b = torch.randn(8, 4).to(dtype).to("neuron")
    first = (a @ b).cpu()
    hits, launches = fastpath.STATS_FAST["hits"], STATS.launches
    again = a @ b
    assert fastpath.STATS_FAST["hits"] == hits + 1 and STATS.launches == launches + 1
    assert torch.equal(first.view(torch.int16), again.cpu().view(torch.int16))
