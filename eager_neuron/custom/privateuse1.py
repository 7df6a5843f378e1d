"""Honouring `Library.impl(..., "PrivateUse1")`: find a Python kernel registered for the device.

Imports only torch, so dispatch's classification (eager_neuron/plan.py) can call it without an
import cycle.
"""

from __future__ import annotations

import torch


def privateuse1_impl(func):
    """For dispatch's classification of an op with no neuron kernel: a kernel registered for
    PrivateUse1 from Python (`torch.library.Library(ns, ...).impl(name, fn, "PrivateUse1")`) on a
    non-aten op, as a callable that runs it with the neuron tensors, or None.

    >>> import torch
    >>> privateuse1_impl(torch.ops.aten.add.Tensor) is None
    True
    """
    name = func._schema.name
    if name.startswith(("aten::", "prims::", "_")):
        return None
    if not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "PrivateUse1"):
        return None
    key = torch._C.DispatchKey.PrivateUse1

    def run(*args, **kwargs):
        return func._op_dk(key, *args, **kwargs)

    return run
