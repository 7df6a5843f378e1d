"""FSDP2 on neuron: free and re-allocate the unsharded parameters' memory around forward/backward.

FSDP2 frees an unsharded parameter after forward with `tensor.untyped_storage().resize_(0)` and
re-allocates it before the next all-gather with `resize_(nbytes)`. A neuron tensor is a wrapper
whose own storage has no data (resizing it needs a C++ PrivateUse1 hook that Python cannot
register in torch 2.13); its memory is the host-backed storage behind `_data`, which every view
of the buffer shares. So for neuron tensors FSDP's two helpers resize that storage instead: the
host memory really goes away and comes back, and views stay valid, as on CUDA.

Buffers that a kernel has touched are shared with numpy, whose export pins the storage's size:
those stay allocated (results are unchanged; only the memory saving is lost). See SKIPPED.

A pooled device block whose storage is freed when the block dies gets its bytes back first (a
weakref finalizer), so the simulator's pool never hands out a zero-byte storage.

>>> from eager_neuron.distributed import fsdp
>>> fsdp.install()   # idempotent; done when a neuron process group is created
"""

from __future__ import annotations

import weakref

import torch

_installed = False
_guarded: set = set()
SKIPPED = [0]   # frees that kept the memory (storage pinned by a numpy view)


def _restore(storage, nbytes: int) -> None:
    if storage.size() != nbytes:
        storage.resize_(nbytes)


def free_storage(tensor: torch.Tensor, _orig=None) -> None:
    from ..tensor import NeuronTensor

    if type(tensor) is not NeuronTensor:
        return _orig(tensor)
    from ..dispatch import flush

    flush("fsdp free")
    storage = tensor._data.untyped_storage()
    if storage.size() == 0:
        return None
    if not storage.resizable():
        # NOTE: a buffer a kernel has read is shared with numpy, which pins its storage's size;
        # the memory then stays allocated (correct results, no saving). Counted for the docs.
        SKIPPED[0] += 1
        return None
    block = tensor._block
    if block is not None and getattr(block, "storage", None) is not None and \
            id(block) not in _guarded:
        _guarded.add(id(block))
        weakref.finalize(block, _restore, block.storage, block.storage.size())
        weakref.finalize(block, _guarded.discard, id(block))
    storage.resize_(0)
    return None


def alloc_storage(tensor: torch.Tensor, _orig=None) -> None:
    from ..tensor import NeuronTensor

    if type(tensor) is not NeuronTensor:
        return _orig(tensor)
    data = tensor._data
    storage = data.untyped_storage()
    block = tensor._block
    nbytes = getattr(block, "storage", None) is not None and block.storage.size() or 0
    want = max(nbytes, (data.storage_offset() + data.numel()) * data.element_size())
    if storage.size() < want:
        storage.resize_(want)
    return None


def install() -> None:
    """Point FSDP2's free/alloc helpers at the versions above (neuron tensors only)."""
    global _installed
    if _installed:
        return
    _installed = True
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    orig_free, orig_alloc = _fsdp_param.free_storage, _fsdp_param.alloc_storage

    def _free(tensor):
        return free_storage(tensor, orig_free)

    def _alloc(tensor):
        return alloc_storage(tensor, orig_alloc)

    _fsdp_param.free_storage = _free
    _fsdp_param.alloc_storage = _alloc
    _fsdp_param_group.alloc_storage = _alloc
    _install_copy_ops()


def _install_copy_ops() -> None:
    """FSDP2's copy-in/copy-out ops (fsdp::all_gather_copy_in, split_with_sizes_copy, chunk_cat)
    have device-agnostic PrivateUse1 implementations written in torch ops; a neuron tensor's
    Python key reaches the dispatch funnel first, so route them to those implementations there
    (each torch op inside then runs as a device kernel, not as a CPU fallback)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as fc

    from .. import ops
    from ..plan import _PLANS

    impls = {
        "fsdp::all_gather_copy_in": fc.all_gather_copy_in_cuda,
        "fsdp::split_with_sizes_copy": fc.split_with_sizes_copy,
        "fsdp::chunk_cat": fc.chunk_cat,
    }
    for name, impl in impls.items():
        def run(func, args, kwargs, mode, _impl=impl):
            if mode is not None:
                return func(*args, **kwargs)
            return _impl(*args, **kwargs)

        ops.HOST.setdefault(name, run)
        packet = getattr(torch.ops.fsdp, name.split("::")[1])
        for overload in packet.overloads():
            _PLANS.pop(getattr(packet, overload), None)   # planned before install: re-plan
