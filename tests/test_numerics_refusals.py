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


def _b(device):
    return torch.tensor([True, False, True, True], device=device)


DTYPE_REFUSALS = {   # name -> (fn(device), the CPU's exception type, its words)
    "kthvalue(bool)": (lambda d: _b(d).kthvalue(1), NotImplementedError, '"kthvalue_cpu"'),
    "median(bool)": (lambda d: _b(d).median(), NotImplementedError, '"median_cpu"'),
    "median(bool, 0)": (lambda d: _b(d).median(0), NotImplementedError, '"median_out"'),
    "nanmedian(bool, 0)": (lambda d: _b(d).nanmedian(0), NotImplementedError, '"median_out"'),
    "searchsorted(bool, bool)": (lambda d: torch.searchsorted(_b(d), _b(d)),
                                 NotImplementedError, '"searchsorted_out_cpu"'),
    "bucketize(bool, bool)": (lambda d: torch.bucketize(_b(d), _b(d)), NotImplementedError,
                              '"searchsorted_out_cpu"'),
    "argmax(bool)": (lambda d: _b(d).argmax(), RuntimeError, r"argmax\(\): does not support bool"),
    "argmin(bool, 0)": (lambda d: _b(d).argmin(0), RuntimeError,
                        r"argmin\(\): does not support bool"),
    "dot(bool)": (lambda d: _b(d).dot(_b(d)), NotImplementedError, '"dot" not implemented'),
    "cross(bool)": (lambda d: torch.linalg.cross(_b(d)[:3], _b(d)[1:]), NotImplementedError,
                    '"cross" not implemented'),
    "bincount(float)": (lambda d: torch.bincount(torch.tensor([1.0, 2.0], device=d)),
                        NotImplementedError, '"bincount_cpu" not implemented for \'Float\''),
    "bincount(bool)": (lambda d: torch.bincount(_b(d)), NotImplementedError,
                       '"bincount_cpu" not implemented for \'Bool\''),
    "softmax(int64, -1)": (lambda d: torch.softmax(torch.ones(2, 3, dtype=torch.int64,
                                                              device=d), -1),
                           NotImplementedError, '"softmax_lastdim_kernel_impl"'),
    "softmax(int32, 0)": (lambda d: torch.softmax(torch.ones(2, 3, dtype=torch.int32,
                                                             device=d), 0),
                          NotImplementedError, '"softmax_kernel_impl" not implemented for \'Int\''),
    "log_softmax(int64, 1)": (lambda d: torch.log_softmax(torch.ones(2, 3, dtype=torch.int64,
                                                                     device=d), 1),
                              NotImplementedError, '"log_softmax_lastdim_kernel_impl"'),
    "softmax(bool 0-d)": (lambda d: torch.softmax(_b(d)[0], 0), NotImplementedError,
                          '"softmax_lastdim_kernel_impl" not implemented for \'Bool\''),
    "hypot(bool, int32)": (lambda d: torch.hypot(_b(d), _b(d).int()), NotImplementedError,
                           '"hypot_cpu" not implemented for \'Int\''),
    "nextafter(int64)": (lambda d: torch.nextafter(_b(d).long(), _b(d).long()),
                         NotImplementedError, '"nextafter_cpu" not implemented for \'Long\''),
    "igamma(uint8, bool)": (lambda d: torch.igamma(_b(d).to(torch.uint8), _b(d)),
                            NotImplementedError, '"igamma_cpu" not implemented for \'Byte\''),
    "igammac(bool)": (lambda d: torch.igammac(_b(d), _b(d)), NotImplementedError,
                      '"igammac_cpu" not implemented for \'Bool\''),
    "remainder(bool, True)": (lambda d: _b(d) % True, NotImplementedError, '"remainder_cpu"'),
    "fmod(bool)": (lambda d: torch.fmod(_b(d), _b(d)), NotImplementedError, '"fmod_cpu"'),
    "div(bool, trunc)": (lambda d: torch.div(_b(d), _b(d), rounding_mode="trunc"),
                         NotImplementedError, '"div_trunc_cpu"'),
    "lerp(bool, 0.5)": (lambda d: torch.lerp(_b(d), _b(d), 0.5), NotImplementedError,
                        '"lerp_kernel_scalar" not implemented for \'Bool\''),
    "mask ** mask": (lambda d: _b(d) ** _b(d), NotImplementedError,
                     '"pow" not implemented for \'Bool\''),
    "True ** mask": (lambda d: True ** _b(d), NotImplementedError,
                     '"pow" not implemented for \'Bool\''),
    "logaddexp(int64)": (lambda d: torch.logaddexp(_b(d).long(), _b(d).long()),
                         NotImplementedError, '"logaddexp_cpu" not implemented for \'Long\''),
    "logaddexp2(int32)": (lambda d: torch.logaddexp2(_b(d).int(), _b(d).int()),
                          NotImplementedError, '"logaddexp2_cpu" not implemented for \'Int\''),
    "heaviside(int64, float)": (lambda d: torch.heaviside(_b(d).long(), _b(d).float()),
                                RuntimeError, "heaviside is not yet implemented for tensors "
                                "with different dtypes"),
    "round(int64, decimals=1)": (lambda d: _b(d).long().round(decimals=1), NotImplementedError,
                                 '"round_cpu" not implemented for \'Long\''),
    "round(int64, decimals=0)": (lambda d: _b(d).long().round(decimals=0), NotImplementedError,
                                 '"round_vml_cpu" not implemented for \'Long\''),
    "round(bool, decimals=-1)": (lambda d: _b(d).round(decimals=-1), NotImplementedError,
                                 '"round_cpu" not implemented for \'Bool\''),
    "addcmul(bool)": (lambda d: torch.addcmul(_b(d), _b(d), _b(d), value=True),
                      NotImplementedError, '"addcmul_cpu_out" not implemented for \'Bool\''),
}


@pytest.mark.parametrize("case", list(DTYPE_REFUSALS))
def test_dtype_the_cpu_kernel_lacks_is_refused(case):
    fn, kind, words = DTYPE_REFUSALS[case]
    for device in ("cpu", "neuron"):
        with pytest.raises(kind, match=words):
            fn(device)


def test_refused_ops_still_exact_for_their_dtypes():
    """The neighbours of each refusal keep working (exact integer references)."""
    x = torch.tensor([3, -1, 0, 2], device="neuron")
    b = _b("neuron")
    assert x.kthvalue(2).values.item() == 0
    assert x.median().item() == 0
    assert int(x.argmax()) == 0 and int(x.argmin()) == 1
    assert int(x.dot(x)) == 14
    (a0, a1, a2), (b0, b1, b2) = [3, -1, 0], [-1, 0, 2]
    assert torch.linalg.cross(x[:3], x[1:]).cpu().tolist() == [a1 * b2 - a2 * b1,
                                                               a2 * b0 - a0 * b2,
                                                               a0 * b1 - a1 * b0]
    # mixed dtypes compare in their common type, as on the CPU
    assert torch.searchsorted(b.long().sort().values, b).cpu().tolist() == [1, 0, 1, 1]
    assert torch.searchsorted(b.sort().values, x).cpu().tolist() == [4, 0, 0, 4]
    assert torch.bincount(x.clamp(min=0)).cpu().tolist() == [2, 0, 1, 1]
    assert b.max().item() is True and b.sort().values.cpu().tolist() == [False, True, True, True]
    assert torch.softmax(torch.ones(0, 3, dtype=torch.int64, device="neuron"), 1).shape == (0, 3)
    # the common dtype decides: a float operand (or a Python number that promotes) is served
    assert (b ** True).cpu().tolist() == [True, False, True, True]   # pow(Tensor, Scalar)
    assert (b ** 2).cpu().tolist() == [1, 0, 1, 1]
    assert torch.hypot(b, torch.tensor([0.0, 4.0, 0.0, 0.0], device="neuron")).cpu().tolist() \
        == [1.0, 4.0, 1.0, 1.0]
    assert (b // 1).cpu().tolist() == [1, 0, 1, 1] and (x % 2).cpu().tolist() == [1, 1, 0, 0]
    assert torch.div(x, 2, rounding_mode="floor").cpu().tolist() == [1, -1, 0, 1]
    assert torch.nextafter(x.float(), torch.zeros(4, device="neuron")).cpu().tolist()[2] == 0.0
    assert x.round().cpu().tolist() == [3, -1, 0, 2]   # round.default copies integers
    assert torch.addcmul(b, b, x, value=2).cpu().tolist() == [1 + 2 * 3, 0, 1 + 0, 1 + 2 * 2]


def test_logaddexp_and_heaviside_kernels_against_float64():
    """logaddexp/logaddexp2 (kernels now, so integer operands can be refused) within a few
    float32 ulps of the float64 result; infinities and NaN as ATen's kernel; heaviside exact."""
    inf, nan = float("inf"), float("nan")
    torch.manual_seed(0)
    a = torch.cat([torch.tensor([1.0, -inf, inf, nan, 0.0, -3.0, 50.0, inf, -inf, 2.0, -0.0]),
                   torch.randn(500) * 30])
    b = torch.cat([torch.tensor([2.0, -inf, inf, 1.0, 0.0, 100.0, -50.0, -inf, 3.0, nan, 0.0]),
                   torch.randn(500) * 30])
    eps = torch.finfo(torch.float32).eps
    for fn in (torch.logaddexp, torch.logaddexp2):
        ref = fn(a.double(), b.double())
        got = fn(a.to("neuron"), b.to("neuron")).cpu()
        assert got.dtype == torch.float32
        assert torch.equal(got.isnan(), ref.isnan())
        fin = ref.isfinite()
        assert torch.equal(got[~fin & ~ref.isnan()], ref[~fin & ~ref.isnan()].float())
        err = (got[fin].double() - ref[fin]).abs()
        assert bool((err <= 4 * eps * (ref[fin].abs() + 1)).all()), float(err.max())
    x = torch.tensor([-1.0, 0.0, 2.0, nan, -0.0, inf, -inf])
    v = torch.tensor([5.0, 7.0, 9.0, 3.0, 4.0, 6.0, 8.0])
    got = torch.heaviside(x.to("neuron"), v.to("neuron")).cpu().tolist()
    assert got == [0.0, 7.0, 1.0, 0.0, 4.0, 1.0, 0.0]   # NaN gives 0, as ATen's kernel
    xi = torch.tensor([-1, 0, 2], device="neuron")
    assert torch.heaviside(xi, xi + 5).cpu().tolist() == [0, 5, 1]



# refused before any kernel (eager_neuron/refusals.py): the decomposition or meta function
# would otherwise answer with a number or an AssertionError
_EARLY = {
    "trace of bool": (lambda d: torch.trace(torch.ones(3, 3, dtype=torch.bool, device=d)),
                      NotImplementedError, "\"trace\" not implemented for 'Bool'"),
    "bool // bool": (lambda d: torch.ones(3, dtype=torch.bool, device=d)
                     // torch.ones(3, dtype=torch.bool, device=d),
                     NotImplementedError, "\"div_floor_cpu\" not implemented for 'Bool'"),
    "bool //= True": (lambda d: torch.ones(3, dtype=torch.bool, device=d).floor_divide_(True),
                      NotImplementedError, "\"div_floor_cpu\" not implemented for 'Bool'"),
    "complex of int64": (lambda d: torch.complex(torch.ones(2, dtype=torch.int64, device=d),
                                                 torch.ones(2, dtype=torch.int64, device=d)),
                         RuntimeError, "Expected both inputs to be Half, Float or Double tensors "
                         "but got Long and Long"),
    "polar of float and double": (
        lambda d: torch.polar(torch.ones(2, device=d), torch.ones(2, dtype=torch.float64,
                                                                 device=d)),
        RuntimeError, "Expected object of scalar type Float but got scalar type Double for "
        "second argument"),
}


@pytest.mark.parametrize("name", sorted(_EARLY))
def test_refused_before_any_kernel_as_on_the_cpu(name):
    fn, kind, words = _EARLY[name]
    for device in ("cpu", "neuron"):   # the CPU's own words are the reference
        with pytest.raises(kind) as info:
            fn(device)
        assert str(info.value).startswith(words), (device, str(info.value))


def test_what_the_cpu_accepts_still_runs():
    # the neighbours of the refusals: bool // int64, int64 trace, float complex
    x = torch.tensor([1, 0, 1], dtype=torch.bool)
    assert (x.to("neuron") // torch.tensor([1, 1, 1], device="neuron")).cpu().tolist() == [1, 0, 1]
    assert torch.trace(torch.eye(3, dtype=torch.int64, device="neuron")).item() == 3
    z = torch.complex(torch.tensor([1.0], device="neuron"), torch.tensor([2.0], device="neuron"))
    assert z.cpu().tolist() == [1 + 2j]
