"""NeuronMode: the door for code that must stay on CPU tensors.

>>> import torch, eager_neuron
>>> with eager_neuron.NeuronMode():
...     y = torch.ones(3) * 2
>>> y
tensor([2., 2., 2.])
"""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

from .dispatch import dispatch


class NeuronMode(TorchDispatchMode):
    """Every aten op on CPU tensors inside the block runs through neuron kernels; CPU in/out."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return dispatch(func, args, kwargs or {}, mode=self)
