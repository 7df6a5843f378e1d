"""Neuron storages: `untyped_storage()` of a neuron tensor, `torch.UntypedStorage(n, device=...)`.

PyTorch's C++ has no allocator for the `neuron` device, so anything that asked it for device
memory (`torch.UntypedStorage(8, device="neuron")`, `storage.to("neuron")` inside
`torch.load(map_location="neuron")`, DataLoader workers' `_new_shared`) dereferenced a null
allocator and the process died. A neuron storage here is an UntypedStorage on the device whose
pointer is the device buffer's host-backed memory (the simulator's HBM is host memory); it keeps
that memory alive through two Python attributes (`_neuron_host`, the host storage, and
`_neuron_block`, the simulator block). Every view of one buffer gets the same storage object, so
`torch.save` writes shared storage once and `torch.load` brings views back as views.

This module sits below tensor.py in the import graph (NeuronTensor.untyped_storage() calls it);
sending a neuron tensor to another process is NeuronTensor's own pickling (tensor.py).

>>> import torch, eager_neuron
>>> x = torch.arange(4.0, device="neuron")
>>> x.untyped_storage().data_ptr() == x[1:].untyped_storage().data_ptr() != 0
True
>>> torch.UntypedStorage(8, device="neuron").device
device(type='neuron', index=0)
"""

from __future__ import annotations

import weakref

import torch

# host storage _cdata -> its neuron storage (alive while some user holds it or a tensor uses it)
_BY_HOST: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def neuron_storage(host: torch.UntypedStorage, index: int, block,
                   nbytes: int | None = None) -> torch.UntypedStorage:
    """The neuron UntypedStorage over `host` (one object per host storage while it lives)."""
    key = host._cdata
    s = _BY_HOST.get(key)
    if s is not None and s._neuron_host is host and s.device.index == index:
        return s
    size = host.nbytes() if nbytes is None else nbytes
    s = torch._C._construct_storage_from_data_pointer(host.data_ptr(),
                                                      torch.device("neuron", index), size)
    s._neuron_host = host        # the memory s points into stays alive as long as s does
    s._neuron_block = block      # and stays accounted on the simulated core
    _BY_HOST[key] = s
    return s


def host_of(storage):
    """(host UntypedStorage, block, neuron UntypedStorage) for a neuron storage made here, or
    None for any other storage."""
    if isinstance(storage, torch.TypedStorage):
        storage = storage._untyped_storage
    host = getattr(storage, "_neuron_host", None)
    if host is None:
        return None
    return host, storage._neuron_block, storage


def host_alias(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the memory of `t`, a plain tensor PyTorch's C++ made on the neuron
    device from a neuron storage (legacy serialization's storage writer wraps the storage in
    one and copies it to the CPU). That memory is host memory: the alias reads it in place,
    for as long as `t`'s storage lives."""
    st = t.untyped_storage()
    cpu = torch._C._construct_storage_from_data_pointer(st.data_ptr(), torch.device("cpu"),
                                                        st.nbytes())
    return torch.empty(0, dtype=t.dtype).set_(cpu, t.storage_offset(), t.shape, t.stride())


def new_storage(nbytes: int, device) -> torch.UntypedStorage:
    """A fresh neuron storage of `nbytes` bytes on `device` (uninitialized, as on CUDA)."""
    from .buffers import alloc, device_index

    index = device_index(device)
    data, block = alloc(index, (int(nbytes),), (1,), torch.uint8)
    return neuron_storage(data.untyped_storage(), index, block, int(nbytes))


def _is_neuron(device) -> bool:
    if device is None:
        return False
    if isinstance(device, int):
        return False
    return torch.device(device).type == "neuron"


_ORIGINAL_NEW = None


def _untyped_storage_new(cls, *args, device=None, **kwargs):
    if _is_neuron(device):
        if kwargs or len(args) != 1 or not isinstance(args[0], int):
            # UntypedStorage(sequence, device=...) and friends: build on the CPU, then copy
            host = _ORIGINAL_NEW(cls, *args, **kwargs)
            out = new_storage(host.nbytes(), device)
            out.copy_(host)
            return out
        return new_storage(args[0], device)
    if device is None:
        return _ORIGINAL_NEW(cls, *args, **kwargs)
    return _ORIGINAL_NEW(cls, *args, device=device, **kwargs)


_ORIGINAL_RESIZE = torch._C.StorageBase.resize_


def _untyped_storage_resize_(self, size):
    """UntypedStorage.resize_: a neuron storage is its buffer's fixed span (PyTorch's C++ asked
    the PrivateUse1 hooks, which Python cannot provide, and raised about registering them)."""
    if host_of(self) is not None:
        if size == self.nbytes():
            return self   # (as the CPU's: nothing to do)
        from .errors import where

        raise NotImplementedError(
            f"UntypedStorage.resize_({size}): a neuron storage of {self.nbytes()} bytes cannot "
            f"be resized in place (it is a device buffer's fixed span)\n{where()}\n"
            "  fix: resize the tensor instead (t.resize_(...), which moves it to a new buffer), "
            "or make a new tensor; FSDP2's own parameter freeing works (docs/DISTRIBUTED.md)")
    return _ORIGINAL_RESIZE(self, size)


def install() -> None:
    """Route `torch.UntypedStorage(..., device="neuron")` here instead of PyTorch's C++, which
    has no allocator for the device (a segfault); a neuron storage's resize_ says what to do."""
    global _ORIGINAL_NEW
    if _ORIGINAL_NEW is not None:
        return
    _ORIGINAL_NEW = torch.UntypedStorage.__new__
    torch.UntypedStorage.__new__ = _untyped_storage_new
    torch.UntypedStorage.resize_ = _untyped_storage_resize_
    from torch.utils import dlpack

    legacy = _refusing_neuron(dlpack.to_dlpack)
    dlpack.to_dlpack = legacy
    if getattr(torch, "to_dlpack", None) is not None:
        torch.to_dlpack = legacy


# DLPack names no device type for neuron: PyTorch's C++ exported a neuron tensor as kDLExtDev
# with the host-backed buffer's address, and from_dlpack of that capsule made a plain
# torch.Tensor on "neuron:0" that no op could run on (each recursed until RecursionError)
NO_DLPACK = ("neuron tensors cannot be exported through DLPack (it has no device type for "
             "neuron; a consumer would take the buffer for another device's memory).\n"
             "  fix: export a CPU copy: torch.utils.dlpack.to_dlpack(t.cpu()), "
             "np.from_dlpack(t.cpu())")


def _refusing_neuron(original):
    def to_dlpack(tensor):
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "neuron":
            raise RuntimeError(f"to_dlpack: {NO_DLPACK}")
        return original(tensor)

    to_dlpack.__doc__ = original.__doc__
    to_dlpack.__wrapped__ = original
    return to_dlpack
