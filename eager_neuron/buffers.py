"""Device buffers: allocate one on a simulated core, copy one back to the host.

A device buffer is a pair (data, block): `data` a CPU tensor whose memory *is* the device memory
(host-backed), `block` the simulated HBM allocation that accounts for it. The funnel allocates
every op's outputs here; lowerings whose output sizes depend on the data (DYNAMIC) allocate here
too, after counting. `wrap` (the NeuronTensor around a buffer) lives next to the type, in
tensor.py: this module sits below it, so that tensor.py can read buffers back (`to_host`).

>>> import torch, eager_neuron
>>> from eager_neuron.buffers import alloc
>>> data, block = alloc(0, (2, 3), (3, 1), torch.float32)
>>> data.shape, block.nbytes >= 2 * 3 * 4   # rounded up to the allocator's granule
(torch.Size([2, 3]), True)
"""

from __future__ import annotations

import sys

import torch

from . import errors
from .adaptive import MODULE as _adaptive
from .lower.common import DEVICE_DTYPES
from .simulator import SIM

# torch's own factory, not the pin_memory wrapper pinned.py installs as torch.empty_strided
_EMPTY_STRIDED = torch._C._VariableFunctions.empty_strided
_ITEMSIZE: dict = {}
_POOLED_BYTES = 1 << 16   # from here up, buffers come from the core's caching pool


def alloc(index: int | None, shape, stride, dtype) -> tuple[torch.Tensor, object]:
    """A fresh device buffer: (host-backed view, block). index None means plain CPU (the mode)."""
    if index is None:
        return _EMPTY_STRIDED(shape, stride, dtype=dtype), None
    if dtype not in DEVICE_DTYPES:
        raise errors.UnsupportedTensorError(
            f"{dtype} tensors are not supported on neuron (supported: float32, float64, "
            f"bfloat16, float16, int64, int32, int16, int8, uint8, bool, complex64, "
            f"complex128; uint16/uint32/uint64 as storage)\n{errors.where()}\n"
            "  fix: keep this tensor on the CPU, or convert it (e.g. complex32 -> "
            "x.to(torch.complex64)) before moving it to neuron")
    numel = 1
    for s in shape:
        numel *= s
    if numel == 0:
        extent = 0
    else:
        extent = 1 + sum((sz - 1) * st for sz, st in zip(shape, stride))
    itemsize = _ITEMSIZE.get(dtype) or _ITEMSIZE.setdefault(dtype, dtype.itemsize)
    nbytes = extent * itemsize
    if nbytes < _POOLED_BYTES:
        # small: the host allocator is cheap; the block only accounts the bytes
        block = SIM.core(index).alloc(nbytes, want_storage=False)
        return _EMPTY_STRIDED(shape, stride, dtype=dtype), block
    try:
        block = SIM.core(index).alloc(nbytes)
    except torch.OutOfMemoryError:
        if not _adaptive.PENDING:
            raise
        # pending groups pin the blocks they touch (dead temporaries included): launch them,
        # which frees those, and try once more
        _adaptive.flush_all("memory pressure")
        block = SIM.core(index).alloc(nbytes)
    return _host_view(block, shape, stride, dtype), block


def _new_view(storage, shape, stride, dtype) -> torch.Tensor:
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, stride)


def _host_view(block, shape, stride, dtype) -> torch.Tensor:
    """The host view (shape, stride, dtype) over a pooled block's storage: the one made the last
    time the storage was handed out with that metadata, when nothing but the core's cache holds
    it any more (its Python references and tensor use count are those of a cached view alone,
    measured in _VIEW_CHECK); else a new one, cached. Making it (torch.empty + set_) cost ~19 us
    of a large op's host path right after the op before streamed 16+ MiB through the caches.
    Views of the storage made from the old one, or numpy arrays of it, share its memory as any
    reused pool storage's old views do; none of them changes this tensor's metadata (in-place
    view ops act on an alias, inplace.py)."""
    storage = block.storage
    views = block.core.views
    meta = (shape, stride, dtype)
    hit = views.get(id(storage))
    if hit is not None and hit[0] is storage and hit[2] == meta:
        v = hit[1]
        if _RC(v) == _VIEW_CHECK[0] and _UC(v) == _VIEW_CHECK[1]:
            VIEW_STATS["reused"] += 1
            return v
    v = _new_view(storage, shape, stride, dtype)
    views[id(storage)] = (storage, v, meta, None)
    return v


def alloc_np(index: int, shape, stride, dtype) -> tuple:
    """alloc() of a large output for a fast-path runner that hands it to its kernel as numpy:
    (data, block, data.numpy()), the array cached with the storage's view (making one cost ~6 us
    and freeing it ~5 right after a big kernel). The cached array is handed out again only with
    its view and when nothing but the cache holds it. It stays valid: a storage shared with
    numpy can no longer be resized (torch pins it), so its memory never moves.

    >>> import torch
    >>> data, block, arr = alloc_np(0, (1 << 15,), (1,), torch.float32)
    >>> arr.shape, arr.ctypes.data == data.data_ptr()
    ((32768,), True)
    """
    data, block = alloc(index, shape, stride, dtype)
    views = block.core.views if block is not None and block.storage is not None else None
    hit = None if views is None else views.get(id(block.storage))
    if hit is None or hit[1] is not data:
        return data, block, data.numpy()   # not a pooled view (a small output)
    arr = hit[3]
    if arr is not None and _RC(arr) == _NP_CHECK:
        VIEW_STATS["arrays_reused"] += 1
        return data, block, arr
    arr = data.numpy()
    views[id(block.storage)] = (hit[0], data, hit[2], arr)
    return data, block, arr


def _view_check() -> tuple:
    # the counts _host_view reads for a cached view nothing else holds (measured, not assumed:
    # torch's PyObject preservation adds references of its own)
    st = torch.UntypedStorage(64)
    v0 = _new_view(st, (16,), (1,), torch.float32)
    views = {0: (st, v0, None, v0.numpy())}
    del v0
    v = views[0][1]   # held as in _host_view: the entry, a local, the call's argument
    arr = views[0][3]   # as in alloc_np: the entry, a local, the call's argument
    return _RC(v), _UC(v), _RC(arr)


_RC = sys.getrefcount
_UC = torch.Tensor._use_count
*_VIEW_CHECK, _NP_CHECK = _view_check()
# reused: large outputs placed in their storage's cached host view; arrays_reused: its cached
# numpy array handed to a runner's kernel again (alloc_np)
VIEW_STATS = {"reused": 0, "arrays_reused": 0}


def device_index(device) -> int | None:
    """The core a factory's `device=` argument names (None: the current core; None back for a
    device that is not neuron)."""
    if device is None:
        return torch.neuron.current_device() if hasattr(torch, "neuron") else 0
    device = torch.device(device)
    if device.type != "neuron":
        return None
    return device.index if device.index is not None else torch.neuron.current_device()


def to_host(t, reason: str = "host read") -> torch.Tensor:
    """Copy a neuron tensor to a fresh CPU tensor (a DMA transfer on the simulated device)."""
    if _adaptive.PENDING:
        _adaptive.flush_others([_span(t._data)])
        _adaptive.flush(reason)
    host = t._data.clone()
    SIM.cores[t.device.index].transfer(host.numel() * host.element_size())
    return host


def _span(t: torch.Tensor) -> tuple:
    """The byte span (lo, hi) a buffer view touches (its extent, not nbytes)."""
    lo = t.data_ptr()
    if t.numel() == 0:
        return lo, lo
    return lo, lo + (1 + sum((sz - 1) * st for sz, st in zip(t.shape, t.stride())
                             if sz > 1)) * t.element_size()
