"""Pinned host memory for the `neuron` device: `t.pin_memory()`, `t.is_pinned()`,
`pin_memory=True` on every torch factory that takes it, `DataLoader(pin_memory=True)`.

PyTorch asks the accelerator's C++ hooks for a pinned allocator, which a Python backend cannot
provide, so once eager_neuron was imported `pin_memory()` raised (getPinnedMemoryAllocator).
The simulated device DMAs from any host memory, so a pinned tensor here is a CPU copy that is
remembered as pinned (by its storage) until it dies: `is_pinned()` says True for it and only it,
and `.to("neuron", non_blocking=True)` accepts it as on CUDA.

>>> import torch, eager_neuron
>>> p = torch.arange(3.0).pin_memory()
>>> p.is_pinned(), torch.arange(3.0).is_pinned(), p.to("neuron", non_blocking=True).device.type
(True, False, 'neuron')
"""

from __future__ import annotations

import weakref

import torch

_PINNED: dict = {}    # storage data_ptr -> weakref to that pinned UntypedStorage


def _pin_memory(self: torch.Tensor, device=None) -> torch.Tensor:
    out = torch.empty_strided(self.size(), self.stride(), dtype=self.dtype)
    out.copy_(self)
    storage = out.untyped_storage()
    ptr = storage.data_ptr()
    if ptr:
        _PINNED[ptr] = weakref.ref(storage)
        weakref.finalize(storage, _PINNED.pop, ptr, None)
    return out


def _is_pinned(self: torch.Tensor, device=None) -> bool:
    storage = self.untyped_storage()
    ref = _PINNED.get(storage.data_ptr())
    return ref is not None and ref() is storage


def empty_host_cache() -> None:
    """Pinned buffers are freed when their tensors die: there is no host cache to empty."""


def _mark_pinned(out: torch.Tensor) -> torch.Tensor:
    """A fresh factory result becomes pinned in place (nothing else refers to its memory)."""
    if out.device.type != "cpu" or out.layout != torch.strided:
        # CUDA's words: a device tensor cannot be pinned host memory
        raise RuntimeError(f"Only dense CPU tensors can be pinned (got a {out.layout} tensor on "
                           f"{out.device}): drop pin_memory=True or create it on the CPU")
    storage = out.untyped_storage()
    ptr = storage.data_ptr()
    if ptr and not _is_pinned(out):
        _PINNED[ptr] = weakref.ref(storage)
        weakref.finalize(storage, _PINNED.pop, ptr, None)
    return out


# NOTE: factories given pin_memory=True reach PyTorch's C++ pinned allocator (which asks the
# accelerator's C++ hooks) before any kernel we could register, so every torch factory that takes
# pin_memory is wrapped: without it, it is the original call plus one dict lookup (about 0.3 us;
# torch.empty(4) 2.8 -> 3.4 us on a loaded machine); with it, the factory runs unpinned and its
# fresh result is marked pinned (no copy; the RNG factories draw the same numbers). C++ warnings
# raised inside a wrapped factory name this file as their origin.
_FACTORIES = ("empty", "zeros", "ones", "full", "empty_strided", "empty_permuted", "empty_like",
              "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like",
              "tensor", "scalar_tensor", "rand", "randn", "randint", "randperm", "normal",
              "arange", "range", "linspace", "logspace", "eye", "tril_indices", "triu_indices",
              "bartlett_window", "blackman_window", "hamming_window", "hann_window",
              "kaiser_window")
_FFT_FACTORIES = ("fftfreq", "rfftfreq")
_METHODS = ("new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full")


def _pinning_factory(fn, module: str, qualname: str):
    def factory(*args, **kwargs):
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
            return _mark_pinned(fn(*args, **kwargs))
        return fn(*args, **kwargs)

    factory.__name__, factory.__doc__ = fn.__name__, fn.__doc__
    # NOTE: named where it is installed (torch.zeros, torch.Tensor.new_zeros): a dynamo graph
    # that calls it pickles it by that name, and inductor's AOTAutograd cache counts a public
    # `torch.*` function as cacheable (named eager_neuron.pinned, every CPU graph that called a
    # factory bypassed that cache once eager_neuron was imported)
    factory.__module__, factory.__qualname__ = module, qualname
    factory.__wrapped__ = fn
    factory._pinning_wrapper = True   # (compile/artifact.py puts the builtin back in graphs)
    return factory


_LIB = None


def install() -> None:
    global _LIB
    if _LIB is not None:
        return
    _LIB = torch.library.Library("aten", "IMPL")
    _LIB.impl("_pin_memory", _pin_memory, "CPU")
    _LIB.impl("is_pinned", _is_pinned, "CPU")
    from torch.jit import _builtins
    from torch.utils import _device

    # NOTE: `with torch.device(d):` applies d to the factories in _device_constructors(), an
    # lru_cache of torch.<factory> *objects* matched by identity against the C++ function a call
    # reaches; filled after the wrapping it would hold the wrappers, and the context would stop
    # placing anything (transformers' meta-device init then loaded garbage into BERT's
    # position_ids). Fill it with the originals first.
    _device._device_constructors()
    for owner, module, prefix, names in ((torch, "torch", "", _FACTORIES),
                                         (torch.fft, "torch.fft", "", _FFT_FACTORIES),
                                         (torch.Tensor, "torch", "Tensor.", _METHODS)):
        for name in names:
            fn = getattr(owner, name, None)
            if fn is None or hasattr(fn, "__wrapped__"):
                continue
            wrapper = _pinning_factory(fn, module, prefix + name)
            setattr(owner, name, wrapper)
            # TorchScript resolves torch.empty & co. as builtins by identity and cannot compile
            # the wrapper (scripted code such as torch.distributed.optim failed to import)
            op = _builtins._get_builtin_table().get(id(fn))
            if op is not None:
                _builtins._register_builtin(wrapper, op)
