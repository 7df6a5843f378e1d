"""The rest of the device API libraries read: capability, snapshots, torch.accelerator.memory.

PyTorch's generic `torch.accelerator.memory.*` functions call a C++ caching allocator that a
Python backend does not have (an internal assert), and `empty_host_cache()` dereferenced a null
host allocator (a segfault once a tensor existed): they are pointed at the simulator's figures.

>>> import torch, eager_neuron
>>> torch.neuron.get_device_capability(), torch.neuron.is_bf16_supported()
((3, 0), True)
>>> torch.accelerator.memory.memory_allocated() >= 0
True
"""

from __future__ import annotations

import sys
import time
import traceback
import types

import torch

from . import device as _dev
from .simulator import SIM

get_device_capability = _dev.get_device_capability   # device.py: get_device_properties reads it


def _accelerator_capability(device=None, /) -> dict:
    from .lower.common import DEVICE_DTYPES

    _dev.SIM.core(_dev._index(device))
    return {"supported_dtypes": set(DEVICE_DTYPES)}


# -- memory history and snapshots (torch.cuda.memory's names) ----------------------------------
_HISTORY: dict = {"enabled": None, "max_entries": 0, "events": [], "stacks": "python"}
_ORIGINAL_ALLOC: dict = {}


def _record_memory_history(enabled="all", context="all", stacks="all",
                           max_entries: int = sys.maxsize, device=None, **_ignored) -> None:
    """Record each device allocation (address, size, core, time, Python stack) until called
    with enabled=None; memory_snapshot()["device_traces"] returns them.

    >>> import torch, eager_neuron
    >>> torch.neuron.memory._record_memory_history(max_entries=10)
    >>> x = torch.ones(100000, device="neuron")
    >>> any(e["size"] >= 400000 for e in torch.neuron.memory._snapshot()["device_traces"][0])
    True
    >>> torch.neuron.memory._record_memory_history(enabled=None)
    """
    if enabled in (None, False):
        _HISTORY["enabled"] = None
        for core, alloc in _ORIGINAL_ALLOC.items():
            core.alloc = alloc
        _ORIGINAL_ALLOC.clear()
        return
    _HISTORY.update(enabled=enabled, max_entries=max_entries, stacks=stacks)
    _HISTORY["events"] = []
    for core in SIM.cores:
        if core in _ORIGINAL_ALLOC:
            continue
        _ORIGINAL_ALLOC[core] = core.alloc

        def traced(nbytes, want_storage=True, _core=core, _alloc=core.alloc):
            block = _alloc(nbytes, want_storage)
            events = _HISTORY["events"]
            if len(events) >= _HISTORY["max_entries"]:
                del events[: len(events) - _HISTORY["max_entries"] + 1]
            if _HISTORY["max_entries"] > 0:
                frames = [{"filename": f.filename, "line": f.lineno, "name": f.name}
                          for f in traceback.extract_stack(limit=12)[:-2]]
                events.append({"action": "alloc", "addr": id(block), "size": int(nbytes),
                               "device": _core.index, "time_us": time.perf_counter_ns() // 1000,
                               "frames": frames})
            return block

        core.alloc = traced


def memory_snapshot() -> dict:
    """torch.cuda.memory_snapshot's shape: one segment per core (reserved bytes, allocated
    bytes) and, while history is recorded, each core's allocation trace."""
    segments, traces = [], []
    for core in SIM.cores:
        core.drain()
        segments.append({"device": core.index, "address": 0, "total_size": core.reserved,
                         "allocated_size": core.allocated, "active_size": core.allocated,
                         "segment_type": "large", "stream": 0, "blocks": []})
        traces.append([e for e in _HISTORY["events"] if e["device"] == core.index])
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {"PYTORCH_NO_NEURON_MEMORY_CACHING": False}}


def _snapshot(device=None) -> dict:
    return memory_snapshot()


def _memory_module() -> types.ModuleType:
    mod = types.ModuleType("torch.neuron.memory")
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "reset_peak_memory_stats", "reset_max_memory_allocated",
                 "reset_accumulated_memory_stats", "empty_cache", "mem_get_info", "memory_stats",
                 "memory_summary"):
        setattr(mod, name, getattr(_dev, name))
    mod.memory_snapshot = memory_snapshot
    mod._snapshot = _snapshot
    mod._record_memory_history = _record_memory_history
    return mod


def _accelerator_memory_shims() -> dict:
    from . import pinned

    return {
        "empty_cache": _dev.empty_cache, "empty_host_cache": pinned.empty_host_cache,
        "memory_stats": _dev.memory_stats, "memory_allocated": _dev.memory_allocated,
        "max_memory_allocated": _dev.max_memory_allocated,
        "memory_reserved": _dev.memory_reserved, "max_memory_reserved": _dev.max_memory_reserved,
        "reset_peak_memory_stats": _dev.reset_peak_memory_stats,
        "reset_accumulated_memory_stats": _dev.reset_accumulated_memory_stats,
        "get_memory_info": _dev._accelerator_get_memory_info, "_snapshot": _snapshot,
    }


# -- torch.Generator(device="neuron") ------------------------------------------------------------
# NOTE: the C++ Generator constructor asks PrivateUse1HooksInterface::getNewGenerator, which
# torch 2.13's Python hooks class (torch._C._acc.PrivateUse1Hooks) does not forward: it raises
# NotImplementedError. The device draws every random number from a CPU generator (lower/host.py),
# so a neuron generator *is* a CPU generator that reports device neuron:i: its stream equals the
# CPU's for the same seed, and ATen's CPU kernels accept it. torch.Generator becomes a subclass
# of torch._C.Generator whose metaclass routes device="neuron" here and everything else to the C++
# class; isinstance(g, torch.Generator) stays true for every generator.
_CGenerator = torch._C.Generator


class NeuronGenerator(_CGenerator):
    """A generator on `neuron:i` with the CPU's mt19937 stream: a seed gives the CPU's numbers.

    >>> import torch, eager_neuron
    >>> g = torch.Generator(device="neuron").manual_seed(7)
    >>> x = torch.randn(3, generator=g, device="neuron")
    >>> torch.equal(x.cpu(), torch.randn(3, generator=torch.Generator().manual_seed(7)))
    True
    """

    def __new__(cls, device=None):
        return _CGenerator.__new__(cls)        # a CPU generator underneath (see the NOTE above)

    def __init__(self, device=None) -> None:
        self._neuron_index = _dev._index(device if device is not None else "neuron")
        _dev.SIM.core(self._neuron_index)      # a core that does not exist raises here

    @property
    def device(self) -> torch.device:
        return torch.device(torch._C._get_privateuse1_backend_name(), self._neuron_index)

    def __repr__(self) -> str:
        return f"<torch.Generator object on {self.device}>"

    def __reduce__(self):
        return (_new_neuron_generator, (self._neuron_index,), _CGenerator.__reduce__(self)[2])

    def __deepcopy__(self, memo):
        g = NeuronGenerator(self._neuron_index)
        g.set_state(self.get_state())
        return g


def _new_neuron_generator(index: int) -> NeuronGenerator:
    return NeuronGenerator(index)


class _GeneratorMeta(type(_CGenerator)):
    def __call__(cls, device=None):
        if cls is _Generator and device is not None:
            d = torch.device(device)
            if d.type == torch._C._get_privateuse1_backend_name():
                return NeuronGenerator(d)
            return _CGenerator(d)
        if cls is _Generator:
            return _CGenerator()
        return super().__call__(device)

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _CGenerator)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, _CGenerator)


class _Generator(_CGenerator, metaclass=_GeneratorMeta):
    __doc__ = _CGenerator.__doc__


_Generator.__name__ = _Generator.__qualname__ = "Generator"
_Generator.__module__ = "torch"


# -- Lazy modules (nn.LazyLinear(...).to("neuron")) ------------------------------------------------
# NOTE: on CUDA, Module.to() moves an UninitializedParameter with `param.data = ...` and it stays
# uninitialized until the first forward materializes it on the new device. A neuron tensor cannot
# be assigned to a CPU tensor's .data (a wrapper subclass), so Module._apply swapped in a plain
# neuron Parameter and the module believed it was initialized (0-element weights). Instead, an
# uninitialized tensor moved to neuron stays itself on the CPU and remembers the device;
# materialize() then makes the real neuron tensor and swaps it in (torch.utils.swap_tensors, as
# Module._apply does for device tensors), so reset_parameters() runs on the device.
_Uninit = torch.nn.parameter.UninitializedTensorMixin
_UNINIT_TO, _UNINIT_CPU = torch.Tensor.to, torch.Tensor.cpu
_UNINIT_MATERIALIZE = _Uninit.materialize


def _uninit_to(self, *args, **kwargs):
    device, dtype, _non_blocking, _fmt = torch._C._nn._parse_to(*args, **kwargs)
    if device is not None and device.type == torch._C._get_privateuse1_backend_name():
        self._neuron_device = torch.device(device.type, _dev._index(device))
        if dtype is not None and dtype != self.dtype:
            self.data = self.data.to(dtype)
        return self
    if device is not None:
        self.__dict__.pop("_neuron_device", None)
    return _UNINIT_TO(self, *args, **kwargs)


def _uninit_cpu(self, *args, **kwargs):
    self.__dict__.pop("_neuron_device", None)
    return _UNINIT_CPU(self, *args, **kwargs)


def _uninit_materialize(self, shape, device=None, dtype=None) -> None:
    target = self.__dict__.get("_neuron_device") if device is None else torch.device(device)
    if target is None or target.type != torch._C._get_privateuse1_backend_name():
        return _UNINIT_MATERIALIZE(self, shape, device=device, dtype=dtype)
    made = torch.empty(shape, device=target, dtype=dtype if dtype is not None else self.dtype)
    if self.cls_to_become is torch.nn.Parameter:
        made = torch.nn.Parameter(made, requires_grad=self.requires_grad)
    self.__dict__.pop("_neuron_device", None)
    torch.utils.swap_tensors(self, made)     # this object becomes the neuron tensor


def _neuron_target(device):
    """torch.device(neuron:i) when `device` names the neuron device, else None."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type != torch._C._get_privateuse1_backend_name():
        return None
    return torch.device(device.type, _dev._index(device))


def _uninit_new(original):
    """UninitializedParameter/UninitializedBuffer(device="neuron") (a lazy module's factory
    kwargs, nn.LazyLinear(4, device="neuron")): torch makes `torch.empty(0, device=...)` and
    `_make_subclass`es it, which a neuron tensor (a wrapper subclass) refuses. Made on the CPU
    instead, remembering the device as .to("neuron") does (materialize() makes it there)."""
    def __new__(cls, *args, **kwargs):
        names = ("requires_grad", "device", "dtype", "persistent")
        bound = dict(zip(names, args), **kwargs)
        target = _neuron_target(bound.get("device"))
        if target is None:
            return original(cls, *args, **kwargs)
        bound["device"] = None
        made = original(cls, **bound)
        made._neuron_device = target
        return made
    return __new__


def _uninit_deepcopy(self, memo):
    # torch's copies self.data.device: the CPU for one bound for neuron
    if id(self) in memo:
        return memo[id(self)]
    made = _UNINIT_DEEPCOPY(self, memo)
    if "_neuron_device" in self.__dict__:
        made._neuron_device = self._neuron_device
    return made


_UNINIT_DEEPCOPY = torch.nn.UninitializedParameter.__deepcopy__


def install() -> None:
    """Add these to torch.neuron and point torch.accelerator(.memory) at them."""
    from . import pinned

    _Uninit.to, _Uninit.cpu, _Uninit.materialize = _uninit_to, _uninit_cpu, _uninit_materialize
    for cls in (torch.nn.UninitializedParameter, torch.nn.UninitializedBuffer):
        if not getattr(cls.__new__, "neuron_uninit", False):
            cls.__new__ = _uninit_new(cls.__new__)
            cls.__new__.neuron_uninit = True
    torch.nn.UninitializedParameter.__deepcopy__ = _uninit_deepcopy

    if torch.Generator is _CGenerator:
        torch.Generator = _Generator
    torch.neuron.Generator = NeuronGenerator

    mod = torch.neuron
    mod.get_device_capability = get_device_capability
    mod.OutOfMemoryError = torch.OutOfMemoryError
    mod.memory = _memory_module()
    mod.memory_snapshot = memory_snapshot
    mod._record_memory_history = _record_memory_history
    mod.empty_host_cache = pinned.empty_host_cache
    sys.modules["torch.neuron.memory"] = mod.memory
    acc = torch.accelerator
    originals = _dev._ACCELERATOR_ORIGINALS
    for name, fn in _accelerator_memory_shims().items():
        if hasattr(acc.memory, name):
            originals.setdefault(("memory", name), getattr(acc.memory, name))
            setattr(acc.memory, name, fn)
    for name, fn in (("empty_host_cache", pinned.empty_host_cache),
                     ("get_device_capability", _accelerator_capability)):
        if hasattr(acc, name):
            originals.setdefault(name, getattr(acc, name))
            setattr(acc, name, fn)
