"""NeuronMode: the door for code that must stay on CPU tensors.

>>> import torch, eager_neuron
>>> with eager_neuron.NeuronMode():
...     y = torch.ones(3) * 2
>>> y
tensor([2., 2., 2.])
"""

from __future__ import annotations

from torch._ops import HigherOrderOperator
from torch.utils._python_dispatch import TorchDispatchMode

from .dispatch import dispatch
from .hops import run_under_mode


class NeuronMode(TorchDispatchMode):
    """Every aten op on CPU tensors inside the block runs through neuron kernels; CPU in/out."""

    # torch.cond, while_loop, scan, map, ... inside the block: run on neuron (hops.py)
    supports_higher_order_operators = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if isinstance(func, HigherOrderOperator):
            return run_under_mode(func, args, kwargs or {})
        return dispatch(func, args, kwargs or {}, mode=self)
