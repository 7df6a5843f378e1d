"""A user's TorchDispatchMode that passes neuron tensors on sees the user's ops only."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import eager_neuron  # noqa: F401
from eager_neuron.tensor import NeuronTensor


class _Passes(TorchDispatchMode):
    """Logs every op it is shown; handles CPU ops, returns NotImplemented for neuron ones."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        if any(issubclass(t, NeuronTensor) for t in types):
            return NotImplemented
        return func(*args, **(kwargs or {}))


def test_a_mode_that_passes_neuron_ops_on_sees_no_internal_op():
    aten = torch.ops.aten
    x = torch.randn(5)
    xn = x.to("neuron")
    for _ in range(2):
        (xn * 2 + 1).exp().cpu()          # the kernels and runners exist
    mode = _Passes()
    with mode:
        y = (xn * 2 + 1).exp()
    # only the program's ops: before, the mode saw the funnel's allocations, numpy views and
    # host copies (empty_strided, detach, _to_copy, lift_fresh, ...) between them
    assert mode.ops == [aten.mul.Tensor, aten.add.Tensor, aten.exp.default], mode.ops
    # against float64 (exp's last bit is the kernel's and the CPU ISA's, not a fixed value)
    torch.testing.assert_close(y.cpu(), (x.double() * 2 + 1).exp().float())


def test_fake_tensor_mode_leaves_no_poisoned_runner():
    # FakeTensorMode passes a real neuron tensor's op on: the op runs for real; its host
    # buffers are not turned into meta tensors, and the runner it leaves is a sound one
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(6)
    xn = x.to("neuron")
    with FakeTensorMode():
        z = xn.cos()
    assert torch.equal(z.cpu(), xn.cos().cpu())
    for _ in range(3):
        assert torch.allclose(xn.cos().cpu(), x.cos(), rtol=1e-6, atol=1e-6)


_RAISES_IN_BACKWARD = r"""
import sys, torch, eager_neuron
from torch.utils._python_dispatch import TorchDispatchMode

class Boom(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mul.Tensor and torch._C._current_autograd_node() is not None:
            raise ValueError("raised by the mode")
        return func(*args, **(kwargs or {}))

class Log(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))

for device in ("cpu", "neuron"):
    x = torch.ones(3, device=device, requires_grad=True)
    y = (x * x).sum()
    try:
        with Boom():
            y.backward(retain_graph=True)
        print(device, "no error")
    except ValueError as exc:
        print(device, "ValueError", exc, x.grad)
    y.backward()                     # the graph still runs, the mode gone
    log = Log()
    with log:
        (x * 3).sum().backward()
    print(device, "grad", x.grad.tolist(), "mul seen", "aten.mul.Tensor" in log.ops)
"""


def test_a_mode_raising_in_a_neuron_backward_raises_as_on_the_cpu():
    """A user's TorchDispatchMode raising for an op of a neuron backward aborted the process
    (exit 134, "terminate called without an active exception": the device guard's noexcept
    callback met the pending Python error, see backward.py); on the CPU it raises. Now it
    raises the mode's exception from backward(), nothing written to .grad, and the graph and
    other modes work after it. Run in a subprocess: an abort must fail this test, not pytest."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _RAISES_IN_BACKWARD], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, (res.returncode, res.stderr[-2000:])
    lines = res.stdout.splitlines()
    assert lines[0] == "cpu ValueError raised by the mode None"
    assert lines[2] == "neuron ValueError raised by the mode None"
    assert lines[1] == lines[3].replace("neuron", "cpu") == \
        "cpu grad [5.0, 5.0, 5.0] mul seen True"
