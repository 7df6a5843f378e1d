"""What the CPU says about a call: run on copies of its operands, for error paths only.

A call that fails on neuron (a lowering's assertion, a decomposition's check, a meta function's
own wording) should fail as it fails on the CPU: the CPU's exception type and words, followed
by the op and the user's line. And an out= call whose written tensor shares memory with an
operand (`torch.gather(x, 0, i, out=x)`) is refused by some CPU kernels ("unsupported
operation: some elements of the input tensor and the written-to tensor refer to a single memory
location"): the device refuses exactly those, by asking the CPU.

The CPU runs on copies that keep the operands' aliasing (one copy per storage, views of it
rebuilt with their offsets and strides), so nothing of the caller's is written, and not at all
for random ops (they would draw from the generator) or more than 64 MB of operands.

>>> import torch
>>> exc = cpu_raises(torch.ops.aten.mm.default, (torch.ones(4, 3), torch.ones(4, 3)), {})
>>> type(exc).__name__, str(exc)
('RuntimeError', 'mat1 and mat2 shapes cannot be multiplied (4x3 and 4x3)')
>>> cpu_raises(torch.ops.aten.mm.default, (torch.ones(4, 3), torch.ones(3, 4)), {}) is None
True
"""

from __future__ import annotations

import warnings

import torch
from torch.utils._pytree import tree_flatten

from .tensor import NeuronTensor

_LIMIT_BYTES = 1 << 26


def _host(x):
    return x._data if type(x) is NeuronTensor else x


def cpu_raises(func, args, kwargs) -> BaseException | None:
    """The exception the CPU raises for this call (neuron tensors read through their host
    buffers), or None when it raises nothing or cannot be asked."""
    # only ATen's own ops: another namespace's op may act beyond its operands (c10d's
    # collectives would wait for peers; a failed one means a peer is gone)
    if getattr(func, "namespace", None) != "aten" or \
            torch.Tag.nondeterministic_seeded in func.tags:
        return None
    flat, _ = tree_flatten((args, kwargs))
    tensors = [_host(x) for x in flat if isinstance(x, torch.Tensor)]
    storages = {}
    try:
        for t in tensors:
            if t.device.type != "cpu" or t.is_nested or t.layout != torch.strided or \
                    t.is_quantized:
                return None
            st = t.untyped_storage()
            storages.setdefault(st.data_ptr(), st)
    except (RuntimeError, NotImplementedError):
        return None
    if sum(st.nbytes() for st in storages.values()) > _LIMIT_BYTES:
        return None
    copies = {ptr: torch.UntypedStorage(st.nbytes()) for ptr, st in storages.items()}
    for ptr, st in storages.items():
        copies[ptr].copy_(st)

    def copy(x):
        if isinstance(x, torch.Tensor):
            h = _host(x)
            return torch.empty(0, dtype=h.dtype).set_(copies[h.untyped_storage().data_ptr()],
                                                      h.storage_offset(), h.shape, h.stride())
        if isinstance(x, (list, tuple)):
            return type(x)(copy(v) for v in x)
        if isinstance(x, torch.device) or (isinstance(x, str) and x.startswith("neuron")):
            return torch.device("cpu")
        return x

    cargs = copy(args)
    ckw = {k: copy(v) for k, v in kwargs.items()}
    try:
        # (silent: the probe's warnings are not the user's; neuron's kernels warn as the
        # CPU's do, once, at the user's line)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            func(*cargs, **ckw)
    except Exception as exc:   # noqa: BLE001 -- whatever the CPU raises is the answer
        return exc
    return None


def shares_written(func, plan, args, kwargs) -> bool:
    """Does an out= tensor of this call share a device buffer with another operand, or with
    itself (an expanded out=)?"""
    from .lower.common import schema_args

    outs = set(plan.out_args)
    written, others = [], []
    for i, (name, _d, _k) in enumerate(schema_args(func)):
        v = args[i] if i < len(args) else kwargs.get(name)
        (written if name in outs else others).append(v)
    written = [w for w in written if type(w) is NeuronTensor and w._block is not None]
    if not written:
        return False
    for w in written:
        if any(st == 0 and n > 1 for st, n in zip(w.stride(), w.shape)):
            return True
    flat, _ = tree_flatten(others)
    return any(type(x) is NeuronTensor and any(x._block is w._block for w in written)
               for x in flat)
