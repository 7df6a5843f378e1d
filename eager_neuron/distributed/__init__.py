"""Distributed training on neuron through torch.distributed (DDP, FSDP2, DTensor, TP, ...).

Importing eager_neuron registers the c10d backend "neuron" (gloo on the device's host-backed
memory), routes every c10d / functional-collective op on neuron tensors to it, and adds the
collective counters to eager_neuron.stats(). docs/DISTRIBUTED.md has the details.

>>> import eager_neuron
>>> sorted(k for k in eager_neuron.stats() if k.startswith("collective"))
['collective_bytes', 'collective_staged', 'collective_us', 'collectives']
"""

from __future__ import annotations

from . import backend, collectives, cost  # noqa: F401 -- API
from .collectives import COUNTERS

_installed = False


def install() -> None:
    """Register the backend, the collective handlers and the stats entries (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    from .. import ops
    from ..stats import add_counters

    backend.register()
    collectives.install(ops.HOST)
    _jit_builtin_factories()
    add_counters(COUNTERS)   # eager_neuron.stats() shows them, reset_stats() resets them


def _jit_builtin_factories() -> None:
    """TorchScript resolves torch.tensor & co. as builtins by object identity; eager_neuron's
    pin_memory wrappers (pinned.py) are Python functions it cannot compile, which broke
    `import torch.distributed.optim` (its functional optimizers are scripted; ZeroRedundancy-
    Optimizer lives there). Register each wrapper as the aten builtin it stands for.
    NOTE: belongs in pinned.py beside the wrapping; here until its owner moves it."""
    import torch
    from torch.jit import _builtins

    for name in dir(torch):
        fn = getattr(torch, name, None)
        wrapped = getattr(fn, "__wrapped__", None)
        if type(fn).__name__ == "function" and wrapped is not None and \
                type(wrapped).__name__ == "builtin_function_or_method":
            op = _builtins._get_builtin_table().get(id(wrapped))
            if op is not None:
                _builtins._register_builtin(fn, op)


install()
