"""Bad input gets a clear error naming the op, its arguments and the user's line; never a crash."""

import re

import pytest
import torch

import eager_neuron
from eager_neuron import ops


def test_kernel_error_in_backward_reaches_the_caller(monkeypatch):
    # torch 2.13 kills the process when a Python backend raises on autograd's device thread;
    # dispatch stashes the error and re-raises it after backward returns.
    def broken(func, a, outs):
        raise RuntimeError("boom in kernel")

    monkeypatch.setitem(ops.KERNELS, "aten::threshold_backward", broken)
    from eager_neuron import dispatch

    monkeypatch.setattr(dispatch, "_PLANS", {})
    x = torch.randn(4, device="neuron", requires_grad=True)
    with pytest.raises(eager_neuron.KernelError, match="threshold_backward.*boom in kernel"):
        x.relu().sum().backward()
    # the process goes on and the next backward works
    monkeypatch.setattr(dispatch, "_PLANS", {})
    monkeypatch.undo()
    y = torch.randn(4, device="neuron", requires_grad=True)
    y.relu().sum().backward()
    torch.testing.assert_close(y.grad.cpu(), (y.detach().cpu() > 0).float())


def test_error_type_is_kept_and_names_the_op_and_line():
    x = torch.randn(3, 4, device="neuron")
    with pytest.raises(IndexError) as info:
        torch.nn.functional.nll_loss(x.log_softmax(1), torch.tensor([0, 9, 1], device="neuron"))
    text = str(info.value)
    assert "nll_loss" in text and "test_errors.py" in text


# an op with a CPU kernel only and no decomposition: the fallback path, whatever kernels land
_LIB = torch.library.Library("eager_neuron_test", "DEF")
_LIB.define("cpu_only_twice(Tensor x) -> Tensor")
_LIB.impl("cpu_only_twice", lambda x: x * 2, "CPU")


def test_strict_fallback_names_op_args_and_line(monkeypatch):
    monkeypatch.setattr(eager_neuron.config, "fallback", "error")
    x = torch.randn(8, 16, device="neuron")
    with pytest.raises(eager_neuron.UnsupportedOpError) as info:
        torch.ops.eager_neuron_test.cpu_only_twice(x)  # the line the error must point at
    text = str(info.value)
    assert "eager_neuron_test::cpu_only_twice" in text
    assert "f32[8, 16]@neuron:0" in text
    assert "test_errors.py" in text and "cpu_only_twice(x)" in text
    assert "EAGER_NEURON_FALLBACK=cpu" in text


def test_default_fallback_runs_on_cpu_counted_and_warned():
    x = torch.randn(8, 16, device="neuron")
    before = eager_neuron.stats()["fallbacks"].get("eager_neuron_test::cpu_only_twice", 0)
    with pytest.warns(UserWarning, match="cpu_only_twice"):
        y = torch.ops.eager_neuron_test.cpu_only_twice(x)
    assert y.device.type == "neuron"
    torch.testing.assert_close(y.cpu(), x.cpu() * 2)
    assert eager_neuron.stats()["fallbacks"]["eager_neuron_test::cpu_only_twice"] == before + 1


def test_complex32_tensors_get_a_clear_error():
    z = torch.zeros(3, dtype=torch.complex32)   # complex64/complex128 are supported
    with pytest.raises((eager_neuron.UnsupportedTensorError, RuntimeError), match="complex32"):
        z.to("neuron") + 1


# -- errors as PyTorch's CPU gives them (issue 13) ------------------------------------------------

def _cpu_and_neuron(fn):
    """(exception the CPU raises, exception neuron raises) for fn(device)."""
    got = []
    for dev in ("cpu", "neuron"):
        try:
            r = fn(dev)
            if isinstance(r, torch.Tensor):
                r.cpu()
            got.append(None)
        except Exception as exc:   # noqa: BLE001 - the type is what is compared
            got.append(exc)
    return got


ERROR_CASES = {
    "int_floor_divide_by_zero": lambda d: torch.tensor([1, 2], device=d) // torch.tensor(
        [0, 1], device=d),
    "int_remainder_by_zero": lambda d: torch.tensor([1, 2], device=d) % torch.tensor(
        [0, 1], device=d),
    "gather_out_of_range": lambda d: torch.ones(2, device=d).gather(
        0, torch.tensor([5], device=d)),
    "scatter_out_of_range": lambda d: torch.zeros(3, device=d).scatter(
        0, torch.tensor([5], device=d), torch.ones(1, device=d)),
    "scatter_add_negative": lambda d: torch.zeros(3, device=d).scatter_add(
        0, torch.tensor([-9], device=d), torch.ones(1, device=d)),
    "max_of_empty": lambda d: torch.tensor([], device=d).max(),
    "min_of_empty": lambda d: torch.tensor([], device=d).min(),
    "amax_of_empty": lambda d: torch.tensor([], device=d).amax(),
    "argmax_of_empty": lambda d: torch.tensor([], device=d).argmax(),
    "argmin_of_empty": lambda d: torch.tensor([], device=d).argmin(),
    "max_over_empty_dim": lambda d: torch.zeros(0, 3, device=d).max(0),
    "index_select_out_of_range": lambda d: torch.zeros(3, device=d).index_select(
        0, torch.tensor([5], device=d)),
    "index_select_bad_dim_0d": lambda d: torch.tensor(1.0, device=d).index_select(
        99, torch.tensor([0], device=d)),
    "nll_loss_target_out_of_range": lambda d: torch.nn.functional.nll_loss(
        torch.zeros(3, 4, device=d), torch.tensor([0, 9, 1], device=d)),
    "one_hot_too_large": lambda d: torch.nn.functional.one_hot(
        torch.tensor([0, 5], device=d), 3),
    "one_hot_negative": lambda d: torch.nn.functional.one_hot(
        torch.tensor([0, -1], device=d), 3),
    "float_bitwise_and": lambda d: torch.ones(2, device=d) & torch.ones(2, device=d),
    "float_gcd": lambda d: torch.gcd(torch.ones(2, device=d), torch.ones(2, device=d)),
    "half_bitwise_or": lambda d: torch.ones(2, device=d).half() | torch.ones(2, device=d).half(),
    "bool_gcd": lambda d: torch.gcd(torch.ones(2, device=d).bool(), torch.ones(2, device=d).bool()),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_error_type_is_the_cpus(case):
    """The CPU's exception type: an `except RuntimeError` written for the CPU still catches it
    (and an IndexError where the CPU raises one)."""
    cpu, ours = _cpu_and_neuron(ERROR_CASES[case])
    assert cpu is not None, "the case must be an error on the CPU"
    assert ours is not None, f"neuron returned a result where the CPU raises {cpu!r}"
    assert isinstance(ours, type(cpu)), f"CPU: {type(cpu).__name__}, neuron: {ours!r}"
    if isinstance(cpu, RuntimeError):
        assert not isinstance(ours, (IndexError, ZeroDivisionError))


def test_integer_division_by_zero_keeps_context():
    x = torch.tensor([1, 2], device="neuron")
    with pytest.raises(RuntimeError) as info:
        x // torch.tensor([0, 1], device="neuron")
    text = str(info.value)
    assert "ZeroDivisionError" in text and "floor_divide" in text and "test_errors.py" in text


def test_float_bitwise_refused_before_any_compile():
    """The CPU's message, at once: no kernel compiled, no Numba typing dump."""
    eager_neuron.reset_stats()
    for dt in (torch.float32, torch.float64):
        a = torch.ones(3, device="neuron", dtype=dt)
        name = "Float" if dt == torch.float32 else "Double"
        with pytest.raises(NotImplementedError,
                           match=f'"bitwise_and_cpu" not implemented for \'{name}\''):
            a & a
        with pytest.raises(NotImplementedError, match=f'"gcd_cpu" not implemented for \'{name}\''):
            torch.gcd(a, a)
    st = eager_neuron.stats()
    assert st["compiles"] == 0
    with pytest.raises(NotImplementedError) as info:
        torch.ones(3, device="neuron") ^ torch.ones(3, device="neuron")
    assert "numba" not in str(info.value).lower() and len(str(info.value)) < 600


def test_one_hot_in_range_matches_cpu():
    x = torch.tensor([[0, 2], [1, 1]])
    assert torch.equal(torch.nn.functional.one_hot(x.to("neuron"), 3).cpu(),
                       torch.nn.functional.one_hot(x, 3))
    assert torch.equal(torch.nn.functional.one_hot(x.to("neuron")).cpu(),
                       torch.nn.functional.one_hot(x))


# -- silent wrong values ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8])
def test_int_min_floor_divided_by_minus_one_wraps_as_cpu(dtype):
    lo = torch.iinfo(dtype).min
    x = torch.tensor([lo, 7, -7, lo + 1], dtype=dtype)
    m1 = torch.tensor([-1, -1, -1, -1], dtype=dtype)
    xd, m1d = x.to("neuron"), m1.to("neuron")
    want = x // m1                                  # the CPU: MIN // -1 == MIN (two's complement)
    assert int(want[0]) == lo
    assert torch.equal((xd // m1d).cpu(), want)
    assert torch.equal((xd // -1).cpu(), want)
    assert torch.equal(torch.div(xd, m1d, rounding_mode="floor").cpu(), want)
    # trunc: the CPU's int64 kernel dies of SIGFPE here; ours wraps as floor does
    assert torch.equal(torch.div(xd, m1d, rounding_mode="trunc").cpu(),
                       torch.tensor([lo, -7, 7, -(lo + 1)], dtype=dtype))
    assert torch.equal((xd % m1d).cpu(), torch.zeros(4, dtype=dtype))


def test_relu_keeps_negative_zero_and_nan():
    x = torch.tensor([-0.0, 0.0, -1.0, 2.0, float("nan")])
    want = torch.relu(x)
    assert bool(want[0].signbit())                  # what the CPU actually returns
    for got in (torch.relu(x.to("neuron")), torch.nn.functional.relu(x.to("neuron")),
                x.to("neuron").relu_()):
        got = got.cpu()
        torch.testing.assert_close(got, want, equal_nan=True)
        assert torch.equal(got.signbit(), want.signbit())


# -- sparse and quantized tensors ------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["coo", "csr", "csc", "quantized"])
def test_sparse_and_quantized_to_neuron_name_the_fix(kind):
    x = torch.eye(3)
    t = {"coo": x.to_sparse(), "csr": x.to_sparse_csr(), "csc": x.to_sparse_csc(),
         "quantized": torch.quantize_per_tensor(x, 0.1, 0, torch.quint8)}[kind]
    with pytest.raises(eager_neuron.UnsupportedTensorError) as info:
        t.to("neuron")
    text = str(info.value)
    assert "not supported on neuron" in text and "fix:" in text and "test_errors.py" in text
    assert ("dequantize()" if kind == "quantized" else "to_dense()") in text
    # and the fix works
    fixed = t.dequantize() if kind == "quantized" else t.to_dense()
    torch.testing.assert_close(fixed.to("neuron").cpu(), fixed)


@pytest.mark.parametrize("make", ["to_sparse", "to_sparse_csr", "nested"])
def test_sparse_or_nested_results_of_neuron_tensors_name_the_op_and_the_fix(make):
    # the op runs on the CPU (a fallback) but its result cannot come back: a clear error, not
    # an internal one, and nothing is left on the device
    x = torch.randn(4, 3).to("neuron")
    call = {"to_sparse": lambda: x.to_sparse(), "to_sparse_csr": lambda: x.to_sparse_csr(),
            "nested": lambda: torch.nested.nested_tensor([x, x[:2]])}[make]
    with pytest.raises(eager_neuron.UnsupportedTensorError) as info:
        call()
    text = str(info.value)
    assert "aten::" in text and "test_errors.py" in text and "fix:" in text
    if make == "nested":
        # the fix works: the jagged layout holds neuron values
        nt = torch.nested.nested_tensor([x, x[:2]], layout=torch.jagged)
        assert nt.values().device.type == "neuron"
        # against float64 (the CPU's own float32 sin rounds per ISA)
        want = torch.cat([x.cpu(), x[:2].cpu()]).double().sin()
        eps = torch.finfo(torch.float32).eps
        torch.testing.assert_close(nt.sin().values().cpu().double(), want, atol=4 * eps,
                                   rtol=4 * eps)


SHAPE_ERRORS = {
    "mm": lambda t: t @ t,
    "addmm": lambda t: torch.addmm(t, t, t),
    "linear": lambda t: torch.nn.functional.linear(t, t[:, :2]),
    "bmm": lambda t: torch.bmm(t[None], t[None]),
    "dot": lambda t: torch.dot(t[0], t[:, 0]),
    "add_ broadcast": lambda t: t.add_(torch.ones_like(t)[:, :1].expand(4, 3).reshape(3, 4)),
    "cat": lambda t: torch.cat([t, t.T]),
}


@pytest.mark.parametrize("name", list(SHAPE_ERRORS))
def test_shape_errors_are_the_cpus_own_words(name):
    # where torch's meta function words a check its own way (mm: "a and b must have same
    # reduction dim"), the user still reads the CPU's message; the operands are not written
    x = torch.arange(12.0).reshape(4, 3)
    xn = x.to("neuron")
    with pytest.raises(Exception) as cpu:
        SHAPE_ERRORS[name](x.clone())
    with pytest.raises(type(cpu.value)) as dev:
        SHAPE_ERRORS[name](xn)
    assert str(dev.value).splitlines()[0] == str(cpu.value).splitlines()[0]
    assert torch.equal(xn.cpu(), x)


def test_a_python_number_of_another_type_is_not_served_the_first_ones_result_dtype():
    """The meta run's cache keyed a Python number by value alone: 2 == 2.0 == True hash alike,
    so int64 * 2.0 (float32) made a later int64 * 2 float32, and bool + 1.5 a later bool + 1
    (found by tools/fuzz_compile.py, seed 3000, programs 3155 and 3220)."""
    x = torch.arange(24).view(4, 6)
    b = torch.ones(1, 6, dtype=torch.bool).expand(4, 6)
    xn, bn = x.to("neuron"), b.to("neuron")
    cases = [(lambda t: t * 2.0, lambda t: t * 2), (lambda t: torch.add(t, 1.0), lambda t: t + 1),
             (lambda t: t - 1, lambda t: t - True)]
    for first, then in cases:
        for src, dev in ((x, xn), (b, bn)):
            try:
                want = [f(src) for f in (first, then)]
            except RuntimeError:   # bool - bool: the CPU refuses; so must neuron
                continue
            got = [f(dev) for f in (first, then)]
            for w, g in zip(want, got):
                assert g.dtype == w.dtype, (w.dtype, g.dtype)
                assert torch.equal(g.cpu(), w)


def test_fill_values_out_of_the_dtypes_range_refused_as_on_the_cpu():
    # c10's overflow check on the number (uint8 fill_(256) filled 0, fill_(-1.0) 255, float16
    # fill_(1e6) inf); an int wraps into an unsigned type down to -max, floats take inf/NaN
    msg = "value cannot be converted to type {} without overflow"
    refused = [(torch.uint8, 256, "uint8_t"), (torch.uint8, -1.0, "uint8_t"),
               (torch.int8, 200, "int8_t"), (torch.int64, float("inf"), "int64_t"),
               (torch.float16, 1e6, "c10::Half"), (torch.bfloat16, 1e39, "c10::BFloat16")]
    mask = torch.tensor([True, False])
    for dtype, v, name in refused:
        for dev in ("cpu", "neuron"):
            x = torch.zeros(2, dtype=dtype, device=dev)
            x.fill_(0)                                  # (a runner learned for fill_)
            m = mask.to(dev)
            for call in (lambda x=x, v=v: x.fill_(v), lambda x=x, v=v, m=m: x.masked_fill(m, v),
                         lambda x=x, v=v: torch.full_like(x, v)):
                with pytest.raises(RuntimeError, match=re.escape(msg.format(name))):
                    call()
    for dtype, v, want in [(torch.uint8, -1, 255), (torch.float16, float("inf"), float("inf")),
                           (torch.uint8, 255.0, 255)]:
        x = torch.zeros(2, dtype=dtype, device="neuron")
        assert x.fill_(v).cpu().tolist() == [want, want]
