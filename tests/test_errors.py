"""Bad input gets a clear error naming the op, its arguments and the user's line; never a crash."""

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
