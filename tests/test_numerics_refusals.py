"""The CPU's refusals of bool and beyond-int64 operands, on neuron: what the CPU rejects must be
rejected (a RuntimeError with the CPU's words), never answered with a number.

- subtraction with a bool operand (ATen's sub_check): `mask - 1`, `1 - mask`, `x - mask`;
- a Python int in [2**63, 2**64) (a uint64 Scalar) against bool tensors only: promoteTypes(Bool,
  UInt64) raises, while an integer tensor takes the value modulo 2**64;
- an integer pow's exponent beyond int64 (c10's range check).

The accepted neighbours of each refusal are checked against exact Python-integer references, so
a fix that refuses too much fails too.
"""

from __future__ import annotations

import pytest
import torch

import eager_neuron  # noqa: F401 -- registers the device

U64 = 2 ** 63          # the smallest Python int ATen receives as a uint64 Scalar
TWO_BOOLS = "with two bool tensors is not supported"
ONE_BOOL = "with a bool tensor is not supported"
PROMOTION = "attempted to promote Bool and UInt64"


def _mask(device):
    return torch.tensor([True, False, True], device=device)


SUB_CASES = {   # name -> (fn(mask, ints, floats), the CPU's words)
    "mask - 1": (lambda m, i, f: m - 1, ONE_BOOL),
    "1 - mask": (lambda m, i, f: 1 - m, ONE_BOOL),
    "mask - 1.5": (lambda m, i, f: m - 1.5, ONE_BOOL),
    "ints - mask": (lambda m, i, f: i - m, ONE_BOOL),
    "floats - mask": (lambda m, i, f: f - m, ONE_BOOL),
    "mask - ints": (lambda m, i, f: m - i, ONE_BOOL),
    "rsub(mask, ints)": (lambda m, i, f: torch.rsub(m, i), ONE_BOOL),
    "mask - True": (lambda m, i, f: m - True, TWO_BOOLS),
    "mask - mask": (lambda m, i, f: m - m, TWO_BOOLS),
    "torch.sub(mask, mask, alpha=1)": (lambda m, i, f: torch.sub(m, m, alpha=1), TWO_BOOLS),
    "mask - 2**63": (lambda m, i, f: m - U64, ONE_BOOL),
    "ints.sub_(mask)": (lambda m, i, f: i.clone().sub_(m), ONE_BOOL),
}


@pytest.mark.parametrize("case", list(SUB_CASES))
def test_subtraction_with_bool_is_refused(case):
    fn, words = SUB_CASES[case]
    for device in ("cpu", "neuron"):   # the CPU refuses it too (else the case is wrong)
        m = _mask(device)
        i = torch.tensor([3, 4, 5], device=device)
        f = torch.tensor([0.5, 1.5, 2.5], device=device)
        with pytest.raises(RuntimeError, match=words.replace("`", ".")):
            fn(m, i, f)


def test_subtraction_without_bool_still_exact():
    i = torch.tensor([3, -4, 2 ** 62], device="neuron")
    assert (i - 1).cpu().tolist() == [2, -5, 2 ** 62 - 1]
    assert (1 - i).cpu().tolist() == [-2, 5, 1 - 2 ** 62]
    assert torch.rsub(i, 10, alpha=2).cpu().tolist() == [4, 18, 10 - 2 ** 63]
    # the usual ways to invert a mask stay available
    m = _mask("neuron")
    assert (~m).cpu().tolist() == [False, True, False]
    assert (m ^ True).cpu().tolist() == [False, True, False]
    assert (m.long() - 1).cpu().tolist() == [0, -1, 0]


PROMO_CASES = {
    "mask + 2**63": lambda m: m + U64,
    "2**63 + mask": lambda m: U64 + m,
    "mask * (2**64 - 1)": lambda m: m * (2 ** 64 - 1),
    "mask / 2**63": lambda m: m / U64,
    "mask // 2**63": lambda m: m // U64,
    "mask % 2**63": lambda m: m % U64,
    "fmod(mask, 2**63)": lambda m: torch.fmod(m, U64),
    "2**63 ** mask": lambda m: U64 ** m,
    "mask & 2**63": lambda m: m & U64,
    "mask ^ 2**63": lambda m: m ^ U64,
    "mask[0] + 2**63": lambda m: m[0] + U64,
}


@pytest.mark.parametrize("case", list(PROMO_CASES))
def test_bool_with_uint64_scalar_is_refused(case):
    fn = PROMO_CASES[case]
    for device in ("cpu", "neuron"):
        with pytest.raises(RuntimeError, match=PROMOTION):
            fn(_mask(device))


def _wrap(v: int) -> int:
    return (v + 2 ** 63) % 2 ** 64 - 2 ** 63


def test_uint64_scalar_with_integer_tensors_still_wraps():
    """The refusal is Bool's only: an integer tensor (or any non-bool operand) takes the value
    modulo 2**64, a float tensor rounds it."""
    vals = [1, 0, -7, 2 ** 62]
    x = torch.tensor(vals, device="neuron")
    for s in (U64, U64 + 5, 2 ** 64 - 1):
        assert (x + s).cpu().tolist() == [_wrap(v + s) for v in vals]
        assert (x * s).cpu().tolist() == [_wrap(v * s) for v in vals]
    m = _mask("neuron")
    # a bool tensor with an int64 tensor first: int64 + uint64 scalar, no Bool promotion
    assert (m + x[:3] + U64).cpu().tolist() == [_wrap(a + b + U64) for a, b in
                                                zip([1, 0, 1], vals[:3])]
    assert (m.float() + U64).cpu().tolist() == [float(2 ** 63)] * 3
    # alpha does not take part in promotion
    assert torch.add(m, m, alpha=U64).cpu().tolist() == [True, False, True]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_pow_exponent_beyond_int64_is_refused(dtype):
    for device in ("cpu", "neuron"):
        x = torch.tensor([1, 0, 1], device=device).to(dtype)
        for e in (U64, 2 ** 64 - 1):
            with pytest.raises(RuntimeError, match="cannot be converted to type int64_t"):
                x ** e
    # in range: exact, and a float base takes any exponent
    x = torch.tensor([1, 0, -1, 2], device="neuron")
    assert (x ** (2 ** 62)).cpu().tolist() == [1, 0, 1, 0]   # 2**(2**62) wraps to 0 in int64
    assert (x.float() ** U64).cpu().tolist() == [1.0, 0.0, 1.0, float("inf")]
