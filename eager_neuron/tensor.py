"""NeuronTensor: a wrapper subclass on device `neuron:i` holding a handle to its device buffer.

The buffer is a host-backed view (`_data`, a CPU tensor with the same sizes, strides and offset)
into a simulated HBM block (`_block`); views share the block, so aliasing is real.

>>> import torch, eager_neuron
>>> t = torch.arange(3, device="neuron")
>>> t
tensor([0, 1, 2], device='neuron:0')
"""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler

import torch

DEVICES = [torch.device("neuron", i) for i in range(64)]
_MAKE = torch.Tensor._make_wrapper_subclass
_STRIDED = torch.strided
_MODES = torch._C._len_torch_dispatch_stack


def _no_modes():
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


class NeuronTensor(torch.Tensor):
    _data: torch.Tensor
    _block: object
    _index: int   # the device index (device.index costs a torch.device per read)
    # (host view, its numpy view, its flat numpy view or None) cached by the fast path
    # (fastpath.flat_np): valid while `_data` is that same object, which is never changed in
    # place (in-place view ops give the wrapper a fresh alias: inplace.run_inplace_view)
    _npc = None
    _sgc = None   # (host view, its fast-path signature part): fastpath.signature

    @staticmethod
    def __new__(cls, data: torch.Tensor, block, index: int = 0, requires_grad: bool = False):
        # NOTE: positional (size, strides, storage_offset, memory_format, dtype, layout, device,
        # pin_memory, requires_grad): the keyword form costs ~0.4 us more in the argument parser
        r = _MAKE(cls, data.shape, data.stride(), data.storage_offset(), None, data.dtype,
                  _STRIDED, DEVICES[index], False, requires_grad)
        r._data = data
        r._block = block
        r._index = index
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # another tensor subclass among the operands (AsyncCollectiveTensor, ...) goes first: it
        # unwraps itself and calls again with plain neuron tensors (the subclass convention)
        if len(types) > 1 or types[0] is not cls:
            for t in types:
                if not issubclass(cls, t):
                    return NotImplemented
        if _MODES():
            # a dispatch mode on the stack passed this op on (returned NotImplemented: a
            # logging or fake-tensor mode that does not handle neuron tensors). The op runs
            # here without it: our kernels' host-side ops (allocations, numpy views, copies)
            # are the device's own work, not the user's program, and a mode that rewrote them
            # (FakeTensorMode made host buffers meta, a tracer copied them) broke the op and
            # the fast-path runner learned from it, for the rest of the process
            with _no_modes():
                return _dispatch(func, args, kwargs or {})
        return _dispatch(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents=None) -> str:
        from .buffers import to_host

        host = to_host(self, reason="print")
        user = getattr(type(self), "_neuron_user_class", None)   # x.as_subclass(MyT): subclass.py
        if user is not None:   # printed as the CPU prints it: MyT([...])
            with torch._C.DisableTorchFunctionSubclass():
                text = torch._tensor_str._str(host.as_subclass(user))[:-1]
        else:
            text = torch._tensor_str._str(host)[:-1]
        # NOTE: as CUDA prints it: data, then device, then dtype/size, then autograd info
        device = f", device='{self.device}'"
        cut = min((i for i in (text.rfind(", dtype="), text.rfind(", size=")) if i >= 0),
                  default=len(text))
        text = text[:cut] + device + text[cut:]
        if self.requires_grad and self.grad_fn is None:
            text += ", requires_grad=True"
        elif self.grad_fn is not None:
            text += f", grad_fn=<{type(self.grad_fn).__name__}>"
        return text + ")"

    def __format__(self, format_spec: str) -> str:
        # torch's Tensor.__format__ formats a 0-d tensor's item() only for exact Tensors (a
        # subclass got object.__format__: f"{loss:.4f}" raised); a CUDA tensor formats its item
        if self.dim() == 0 and not self.is_meta:
            return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)

    # NOTE: these read memory directly in C++ and a wrapper has no storage: go through the host.
    def tolist(self):
        from .buffers import to_host

        return to_host(self, reason="tolist").tolist()

    def numpy(self, *, force: bool = False):
        if not force:
            raise TypeError(
                f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to "
                "copy the tensor to host memory first.")
        from .buffers import to_host

        return to_host(self, reason="numpy").numpy()

    def __array__(self, dtype=None, copy=None):
        return self.numpy()  # raises, as a CUDA tensor does: copy with .cpu() first

    # NOTE: a traceable wrapper subclass, so nn.Module.to("neuron") swaps each parameter in place
    # (torch.utils.swap_tensors) instead of making a new Parameter per module that holds it:
    # tied weights (GPT-2's wte and lm_head) stay one parameter, as `.data =` keeps them on CUDA.
    def __tensor_flatten__(self):
        return ["_data"], (self._block, self.device.index)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        block, index = ctx
        return NeuronTensor(inner["_data"], block, index)

    def __deepcopy__(self, memo):
        # NOTE: Tensor.__deepcopy__ ends by deep-copying __dict__, i.e. the device buffer and its
        # HBM block (which holds a lock): clone on the device, copy only the other attributes.
        if id(self) in memo:
            return memo[id(self)]
        if not self.is_leaf:
            raise RuntimeError("deepcopy of a neuron tensor that is not a graph leaf: only leaves "
                               "(parameters, buffers, detached tensors) support deepcopy")
        import copy

        with torch.no_grad():
            new = self.clone()
        if self.requires_grad:
            new.requires_grad_()
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        rest = {k: v for k, v in self.__dict__.items() if k not in _NOT_COPIED}
        new.__dict__.update(copy.deepcopy(rest, memo))
        memo[id(self)] = new
        return new

    def __reduce_ex__(self, protocol):
        from collections import OrderedDict

        from .adaptive import flush

        flush("serialize")
        if getattr(self, "_is_param", False):
            # a parameter (nn.Parameter of a wrapper subclass is the tensor itself, marked
            # `_is_param`): rebuilt as one, as a CPU/CUDA Parameter's reduction does (torch.save
            # of a whole module, torch.export.save: a loaded weight was a plain tensor,
            # isinstance(w, nn.Parameter) False); its data is a plain alias of this buffer
            return (torch._utils._rebuild_parameter,
                    (self.detach(), self.requires_grad, OrderedDict()))
        # NOTE: PyTorch's own storage-based rebuild, as for a CUDA tensor: views of one buffer
        # share one storage, so torch.save writes it once and torch.load gives views back; it
        # honours map_location (a neuron checkpoint loads on a CPU-only machine with
        # map_location="cpu") and is on the weights_only allowlist.
        return (torch._utils._rebuild_tensor_v2,
                (self._typed_storage(), self.storage_offset(), tuple(self.size()),
                 self.stride(), self.requires_grad, OrderedDict()))

    # NOTE: a wrapper has no storage of its own (data_ptr() 0, untyped_storage() invalid); its
    # memory is the host-backed device buffer, so answer with that: real, distinct addresses
    # (safetensors, Hugging Face and torch.save find shared tensors by them).
    def untyped_storage(self):
        from .storage import neuron_storage

        return neuron_storage(self._data.untyped_storage(), self.device.index, self._block)

    def data_ptr(self) -> int:
        return self._data.data_ptr()

    # DLPack (storage.py NO_DLPACK): the protocol's own exception types, as torch raises them
    # for a device DLPack cannot name
    def __dlpack__(self, *args, **kwargs):
        from .storage import NO_DLPACK

        raise BufferError(f"__dlpack__: {NO_DLPACK}")

    def __dlpack_device__(self):
        from .storage import NO_DLPACK

        raise ValueError(f"__dlpack_device__: {NO_DLPACK}")

    # NOTE: `t.data = other` swaps the wrapper's sizes/strides in C++ (set_data) but not its
    # device buffer, which lives in Python attributes: move those too, so `w.data = w.data * 0.5`
    # and `lin.weight.data = torch.zeros(..., device="neuron")` change what forward reads.
    @property
    def data(self):
        return _DATA.__get__(self)

    @data.setter
    def data(self, new) -> None:
        if not isinstance(new, NeuronTensor):
            raise RuntimeError(
                f"data set to a tensor on {getattr(new, 'device', type(new).__name__)}, but this "
                f"tensor is on {self.device}: a neuron tensor's .data must be a neuron tensor "
                "(CUDA can swap devices through .data; the neuron wrapper cannot).\n"
                "  fix: t.data = new.to(t.device), or rebuild the parameter with "
                "torch.nn.Parameter(new)")
        from .adaptive import flush

        flush("set data")
        _DATA.__set__(self, new)
        self._data = new._data
        self._block = new._block
        self._index = new._index


_DATA = torch._C.TensorBase.data
# the device buffer (cloned instead) and the fast path's caches of its host view
_NOT_COPIED = ("_data", "_block", "_npc", "_sgc")


def wrap(data: torch.Tensor, block, index: int | None):
    """The tensor an op returns for a buffer from buffers.alloc: a NeuronTensor on core
    `index`, or `data` itself when index is None (NeuronMode: CPU in, CPU out)."""
    if index is None:
        return data
    return NeuronTensor(data, block, index)


def _rebuild_neuron(host: torch.Tensor, index: int, requires_grad: bool):
    t = host.to(DEVICES[index])
    if requires_grad:
        t.requires_grad_(True)
    return t


def _reduce_for_process(t):
    """Sending a neuron tensor to another process (DataLoader workers, mp.Queue): its bytes go
    through CPU shared memory and the receiver puts them on its own simulated device. (A
    neuron storage cannot be shared by file descriptor: that is CPU-only in PyTorch.)"""
    from .buffers import to_host

    return (_rebuild_neuron, (to_host(t, reason="send to another process"), t._index,
                              t.requires_grad))


def _dispatch(func, args, kwargs):  # the funnel until dispatch.py registers itself
    raise RuntimeError("eager_neuron.dispatch was not imported")


def set_dispatcher(fn) -> None:
    """Install the funnel every neuron op goes to: dispatch.py calls this at import (this module
    sits below dispatch in the import graph, so it is handed the function instead of importing
    it; __torch_dispatch__ reads it as one module global)."""
    global _dispatch
    _dispatch = fn


torch.serialization.add_safe_globals([_rebuild_neuron])
# `import torch` already installed PyTorch's own reducers (torch.multiprocessing does at import)
ForkingPickler.register(NeuronTensor, _reduce_for_process)
