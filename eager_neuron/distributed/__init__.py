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
    import eager_neuron

    from .. import ops

    backend.register()
    collectives.install(ops.HOST)
    _jit_builtin_factories()
    # NOTE: eager_neuron.stats()/reset_stats() live in eager_neuron/__init__.py (not ours): they
    # are wrapped here, so the collective counters show and reset with the rest
    base_stats, base_reset = eager_neuron.stats, eager_neuron.reset_stats

    def stats() -> dict:
        out = base_stats()
        out.update(COUNTERS.snapshot())
        return out

    def reset_stats() -> None:
        base_reset()
        COUNTERS.reset()

    stats.__doc__, reset_stats.__doc__ = base_stats.__doc__, base_reset.__doc__
    eager_neuron.stats, eager_neuron.reset_stats = stats, reset_stats


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
