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
    assert torch.equal(y.cpu(), (x * 2 + 1).exp())


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
