"""DDP on neuron: refuse, at construction, the one option the C++ reducer cannot serve here.

`DistributedDataParallel(find_unused_parameters=True)` (and `static_graph=True`) make the C++
reducer copy its used-parameter map to the device through *pinned* host memory on every
backward; for a PrivateUse1 device that allocation asks PrivateUse1HooksInterface for a pinned
allocator, which torch 2.13's Python hooks cannot provide. The failure would surface inside
backward as a hooks NotImplementedError; this says what and why where the user chose it.

>>> from eager_neuron.distributed import ddp
>>> ddp.install()   # idempotent; done when a neuron process group is created
"""

from __future__ import annotations

import functools
import inspect

_installed = False


def _check(bound) -> None:
    args = bound.arguments
    unused = args.get("find_unused_parameters", False)
    static = args.get("static_graph", False)
    if not (unused or static):
        return
    module = args.get("module")
    if module is None or not any(p.device.type == "neuron" for p in module.parameters()):
        return
    from .. import errors

    option = "find_unused_parameters=True" if unused else "static_graph=True"
    raise NotImplementedError(
        f"DistributedDataParallel({option}) is not supported on neuron: PyTorch's reducer then "
        "copies its used-parameter map through pinned host memory, which a Python PrivateUse1 "
        f"backend cannot allocate in torch 2.13\n{errors.where()}\n  fix: let every parameter "
        "take part in the loss (or freeze the unused ones with requires_grad_(False)) and drop "
        "the option")


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    from torch.nn.parallel import DistributedDataParallel as DDP

    orig = DDP.__init__
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        try:
            bound = sig.bind(self, *args, **kwargs)
        except TypeError:
            bound = None        # let DDP report its own argument error
        if bound is not None:
            _check(bound)
        orig(self, *args, **kwargs)

    DDP.__init__ = __init__
