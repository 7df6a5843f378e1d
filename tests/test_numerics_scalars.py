"""Python numbers at the edges of int64, and the CPU's refusals, on neuron.

References are exact: Python integers reduced modulo 2**64 (what ATen's cast of a uint64 Scalar to
int64 does), IEEE float32 sums computed by numpy, math.modf in float64. Nothing is compared bit
for bit with a torch CPU kernel.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import eager_neuron  # noqa: F401 -- registers the device

I64 = 2 ** 63


def _wrap(v: int) -> int:
    """v as a two's-complement int64 (ATen's uint64 -> int64 cast)."""
    return (v + I64) % 2 ** 64 - I64


VALUES = [1, -5, 2 ** 62, -(2 ** 62) - 3, 0, I64 - 1, -I64]


@pytest.mark.parametrize("order", ["big_first", "small_first"])
def test_int64_add_beyond_int64_does_not_depend_on_first_kernel(order):
    """int64 + 2**63 wraps like the CPU whichever scalar the kernel was first compiled for (a
    kernel typed for 2**63 as uint64 used to refuse -2**63 later, and back)."""
    x = torch.tensor(VALUES, dtype=torch.int64)
    xn = x.to("neuron")
    scalars = [I64, I64 + 7, 2 ** 64 - 1, -I64, I64 - 1, 3]
    if order == "small_first":
        scalars = scalars[::-1]
    for s in scalars:
        for name, op, ref in (("add", lambda t, s=s: t + s, lambda a, s=s: a + s),
                              ("sub", lambda t, s=s: t - s, lambda a, s=s: a - s),
                              ("mul", lambda t, s=s: t * s, lambda a, s=s: a * _wrap(s)),
                              ("rsub", lambda t, s=s: s - t, lambda a, s=s: _wrap(s) - a)):
            got = op(xn).cpu()
            assert got.dtype == torch.int64, (name, s)
            want = [_wrap(ref(a)) for a in VALUES]
            assert got.tolist() == want, (name, s)


def test_small_int_tensors_and_comparisons_beyond_int64():
    """int32/uint8/int16 with a number beyond int64: the number wraps to the tensor's dtype."""
    vals = [1, 2, 0, 100]
    for dt, bits, signed in ((torch.int32, 32, True), (torch.uint8, 8, False),
                             (torch.int16, 16, True)):
        xn = torch.tensor(vals, dtype=dt).to("neuron")
        for s in (I64, I64 + 3, 2 ** 64 - 1):
            got = (xn + s).cpu().tolist()
            m = 2 ** bits
            want = [(a + s) % m for a in vals]
            if signed:
                want = [w - m if w >= m // 2 else w for w in want]
            assert got == want, (dt, s)
            # eq compares against the number cast to the tensor's dtype
            sw = s % m
            sw = sw - m if signed and sw >= m // 2 else sw
            assert (xn == s).cpu().tolist() == [a == sw for a in vals], (dt, s)


def test_float_tensor_plus_number_beyond_int64():
    """float32 + 2**63: the number converts to float (it used to be able to wrap negative)."""
    x = np.array([1.5, -3.0, 1e19, -9.3e18], dtype=np.float32)
    xn = torch.from_numpy(x).to("neuron")
    for s in (I64, I64 + 1, 2 ** 64 - 1):
        want = x + np.float32(float(s))   # IEEE float32 addition, correctly rounded
        assert np.array_equal((xn + s).cpu().numpy(), want), s
        want64 = x.astype(np.float64) * float(s)
        got64 = (xn.double() * s).cpu().numpy()
        assert np.array_equal(got64, want64), s


@pytest.mark.parametrize("dt,name", [(torch.int32, "int"), (torch.uint8, "uint8_t"),
                                     (torch.int64, "int64_t"), (torch.int16, "int16_t")])
def test_clamp_number_out_of_range_raises(dt, name):
    """clamp converts its Scalar bounds with a range check (the CPU's RuntimeError), where add
    wraps them: a silent wrap would clamp to a wrong bound."""
    xn = torch.tensor([1, 2, 3], dtype=dt).to("neuron")
    big = {torch.int32: 2 ** 40, torch.uint8: 300, torch.int64: I64 + 5, torch.int16: -I64}[dt]
    with pytest.raises(RuntimeError, match=f"cannot be converted to type {name} without overflow"):
        torch.clamp(xn, max=big)
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.clamp(xn, min=big)
    # in range: clamps (exact integers)
    assert torch.clamp(xn, min=2).cpu().tolist() == [2, 2, 3]


@pytest.mark.parametrize("dt,name", [(torch.bool, "Bool"), (torch.int64, "Long"),
                                     (torch.uint8, "Byte"), (torch.complex64, "ComplexFloat")])
def test_frac_refuses_non_float_like_the_cpu(dt, name):
    """frac of a bool/integer/complex tensor: NotImplementedError as on the CPU (it was
    RuntimeError for bool, and zeros for integers)."""
    x = torch.tensor([1, 0, 1]).to(dt).to("neuron")
    msg = f'"frac_cpu" not implemented for \'{name}\''
    for call in (lambda: torch.frac(x), lambda: x.clone().frac_(),
                 lambda: torch.frac(x, out=torch.empty_like(x))):
        with pytest.raises(NotImplementedError, match=msg):
            call()


def test_frac_float_exact():
    """frac is exact in binary floating point: compared with math.modf in float64."""
    vals = [1.5, -2.25, 0.0, 3.0, 1e-30, -7.875, 2.0 ** 40 + 0.5, 1e30, float("inf")]
    x = torch.tensor(vals, dtype=torch.float32)
    got = torch.frac(x.to("neuron")).cpu().double().tolist()
    want = [math.modf(float(np.float32(v)))[0] if math.isfinite(v) else float("nan")
            for v in vals]
    for g, w in zip(got, want):
        assert (g == w) or (math.isnan(g) and math.isnan(w)), (g, w)
    xb = x[:6].bfloat16()
    gotb = torch.frac(xb.to("neuron")).cpu().double().tolist()
    wantb = [math.modf(v)[0] for v in xb.double().tolist()]
    assert gotb == wantb


def test_round_of_an_int64_beyond_2_53_is_itself():
    # an integer's round is the identity (it went through np.rint: float64, then back; the
    # int64 maximum came back as the minimum, 2**53 + 1 as 2**53)
    vals = [-2 ** 63, -(2 ** 53) - 1, 2 ** 53 + 1, 2 ** 63 - 1, 7]
    for adaptive in (False, True):
        with eager_neuron.adaptive(adaptive):
            got = torch.round(torch.tensor(vals, device="neuron"))
        assert got.dtype == torch.int64 and got.cpu().tolist() == vals, adaptive
