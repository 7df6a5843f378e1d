"""Device registration: PrivateUse1 renamed `neuron`, the `torch.neuron` module, accelerator hooks.

>>> import torch, eager_neuron
>>> torch.neuron.is_available(), torch.accelerator.current_accelerator()
(True, device(type='neuron'))
"""

from __future__ import annotations

import itertools
import threading
import types

import torch

from .config import config
from .simulator import SIM

_state = threading.local()


def _current() -> int:
    return getattr(_state, "index", 0)


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    # NOTE: the autograd engine asks the guard's type about five times per op (forward and
    # backward); a builtin returning the constant spares each call a Python frame (measured:
    # a 100-op forward + backward 3.5 % faster)
    type_ = staticmethod(itertools.repeat(torch._C._autograd.DeviceType.PrivateUse1).__next__)


class _DeviceContext:
    """torch.neuron.device(i): make core i current inside the block."""

    def __init__(self, device) -> None:
        self.index = _index(device)

    def __enter__(self):
        self.prev = _current()
        set_device(self.index)

    def __exit__(self, *exc) -> None:
        set_device(self.prev)


def _index(device) -> int:
    if isinstance(device, int):
        return device
    if device is None:
        return _current()
    device = torch.device(device)
    return device.index if device.index is not None else _current()


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return len(SIM.cores)


def current_device() -> int:
    return _current()


def set_device(device) -> None:
    index = _index(device)
    SIM.core(index)  # raises a clear error for a core that does not exist
    _state.index = index


def get_device_name(device=None) -> str:
    index = _index(device)
    return f"Simulated {SIM.profile.name} NeuronCore {index} (eager_neuron)"


def get_device_capability(device=None) -> tuple[int, int]:
    """(major, minor) of the simulated NeuronCore generation: NeuronCore-v3 (trn2) is (3, 0)."""
    SIM.core(_index(device))
    core = SIM.profile.core_name                       # "NeuronCore-v3"
    digits = "".join(c for c in core.rsplit("-v", 1)[-1] if c.isdigit()) or "0"
    return int(digits), 0


def get_device_properties(device=None):
    """The simulated core's figures (a namespace, like torch.cuda.get_device_properties)."""
    index = _index(device)
    core = SIM.core(index)
    p = SIM.profile
    major, minor = get_device_capability(index)
    # NOTE: the fields libraries read from torch.cuda.get_device_properties (accelerate,
    # transformers, vLLM-style checks) alongside the simulator's own figures
    return types.SimpleNamespace(
        major=major, minor=minor, multi_processor_count=1, is_integrated=False,
        is_multi_gpu_board=len(SIM.cores) > 1, uuid=f"neuron-{p.name}-{index}",
        L2_cache_size=p.sbuf_bytes, warp_size=1, max_threads_per_multi_processor=1,
        gcnArchName=p.core_name,
        name=get_device_name(index), type=p.name, core=p.core_name, total_memory=core.capacity,
        hbm_bytes_per_s=p.hbm_bytes_per_s / p.cores_per_chip, tensor_flops=dict(p.tensor_flops),
        vector_flops=dict(p.vector_flops), scalar_flops=dict(p.scalar_flops),
        sbuf_bytes=p.sbuf_bytes, psum_bytes=p.psum_bytes, dma_bytes_per_s=p.dma_bytes_per_s,
        launch_overhead_us=p.launch_overhead_us)


def synchronize(device=None) -> None:
    """The host waits for all work queued on core `device` (the current core if None).

    Adaptive groups are flushed first; the simulated host clock moves to the core's makespan.

    >>> import torch, eager_neuron
    >>> torch.neuron.synchronize(); torch.neuron.current_stream().query()
    True
    """
    from .dispatch import flush

    flush("synchronize")
    SIM.synchronize(_index(device))


# -- RNG: the CPU generator, so a seed gives the same numbers on cpu and neuron --------------------
# NOTE: torch.manual_seed(s) calls our manual_seed_all(s) after seeding the CPU generator, so
# these seed the CPU generator directly (never through torch.manual_seed: that would recurse).
def manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def seed() -> None:
    torch.default_generator.seed()


def seed_all() -> None:
    torch.default_generator.seed()


def initial_seed() -> int:
    return torch.initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(state, device=None) -> None:
    torch.set_rng_state(state)


def get_rng_state_all():
    return [torch.get_rng_state()]


def set_rng_state_all(states) -> None:
    torch.set_rng_state(states[0])


# -- memory: live device buffers per core (see simulator.Core) ----------------------------------
def memory_allocated(device=None) -> int:
    """Bytes held by live tensors on core `device` (views share their base's bytes)."""
    return SIM.core(_index(device)).allocated


def max_memory_allocated(device=None) -> int:
    return SIM.core(_index(device)).peak


def memory_reserved(device=None) -> int:
    """Bytes allocated plus bytes cached in the pool for reuse (empty_cache() returns them)."""
    core = SIM.core(_index(device))
    core.drain()
    return core.reserved


def max_memory_reserved(device=None) -> int:
    return SIM.core(_index(device)).peak_reserved


def reset_peak_memory_stats(device=None) -> None:
    SIM.core(_index(device)).reset_peak()


def reset_max_memory_allocated(device=None) -> None:
    SIM.core(_index(device)).reset_peak()


def reset_accumulated_memory_stats(device=None) -> None:
    core = SIM.core(_index(device))
    core.drain()
    core.alloc_count = core.free_count = core.oom_count = core.retries = 0
    core.alloc_bytes_total = core.freed_bytes_total = 0


def empty_cache() -> None:
    """Return every cached (pooled, unused) block on every core to the simulated HBM."""
    for core in SIM.cores:
        core.empty_cache()


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) HBM bytes of core `device`."""
    core = SIM.core(_index(device))
    core.drain()
    return core.capacity - core.reserved, core.capacity


def memory_stats(device=None) -> dict:
    """torch.cuda.memory_stats-style counters for core `device`."""
    core = SIM.core(_index(device))
    allocated = core.allocated
    return {
        "allocated_bytes.all.current": allocated,
        "allocated_bytes.all.peak": core.peak,
        "allocated_bytes.all.allocated": core.alloc_bytes_total,
        "allocated_bytes.all.freed": core.freed_bytes_total,
        "active_bytes.all.current": allocated,
        "reserved_bytes.all.current": core.reserved,
        "reserved_bytes.all.peak": core.peak_reserved,
        "inactive_split_bytes.all.current": core.reserved - allocated,
        "allocation.all.current": core.alloc_count - core.free_count,
        "allocation.all.allocated": core.alloc_count,
        "allocation.all.freed": core.free_count,
        "num_alloc_retries": core.retries,
        "num_ooms": core.oom_count,
        "hbm_capacity_bytes": core.capacity,
    }


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A few lines on core `device`'s HBM: allocated, reserved, capacity, counts, OOMs."""
    from .simulator import _fmt

    core = SIM.core(_index(device))
    allocated = core.allocated
    rows = [
        f"eager_neuron memory summary: neuron:{core.index} ({SIM.profile.name})",
        f"  allocated      {_fmt(allocated):>12}   peak {_fmt(core.peak)}",
        f"  reserved       {_fmt(core.reserved):>12}   peak {_fmt(core.peak_reserved)}",
        f"  free           {_fmt(core.capacity - core.reserved):>12}",
        f"  capacity       {_fmt(core.capacity):>12}",
        (f"  allocs/frees   {core.alloc_count}/{core.free_count}   retries {core.retries}   "
         f"OOMs {core.oom_count}"),
    ]
    return "\n".join(rows)


device = _DeviceContext


def _build_module() -> types.ModuleType:
    from . import streams

    mod = types.ModuleType("torch.neuron")
    for name in (
        "is_available", "is_initialized", "_is_in_bad_fork", "device_count", "current_device",
        "set_device", "get_device_name", "get_device_properties", "synchronize", "manual_seed",
        "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state",
        "get_rng_state_all", "set_rng_state_all", "memory_allocated", "max_memory_allocated",
        "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
        "reset_max_memory_allocated", "reset_accumulated_memory_stats", "empty_cache",
        "mem_get_info", "memory_stats", "memory_summary", "device",
    ):
        setattr(mod, name, globals()[name])
    for name in ("Stream", "Event", "StreamContext", "stream", "current_stream",
                 "default_stream", "set_stream"):
        setattr(mod, name, getattr(streams, name))
    return mod


# -- torch.accelerator -----------------------------------------------------------------------------
# PyTorch 2.13's Python device guard (torch._C._acc.DeviceGuard) forwards only type_() to Python:
# its getDevice/setDevice/getStream/record/synchronize are C++ no-ops or raise, and the generic
# memory functions need a C++ caching allocator. So torch.accelerator.current_device_index()
# would always say 0, set_device_index() would be ignored and synchronize() would raise. Those
# generic functions are Python wrappers in torch/accelerator/__init__.py; we point the ones
# PyTorch cannot route to their torch.neuron twins. torch.Stream(...)/torch.Event(...) built
# directly are C++ objects we cannot reach: use torch.neuron.Stream/Event (docs/SIMULATOR.md).
class _AcceleratorDeviceIndex:
    """torch.accelerator.device_index(i): core i is current inside the block; None: no change."""

    def __init__(self, device, /) -> None:
        self.idx = device

    def __enter__(self) -> None:
        if self.idx is not None:
            self.prev = _current()
            set_device(self.idx)

    def __exit__(self, *exc) -> None:
        if self.idx is not None:
            set_device(self.prev)


def _accelerator_set_stream(stream) -> None:
    from . import streams

    s = streams._as_stream(stream)
    set_device(s.device_index)
    streams.set_stream(s)


def _accelerator_get_memory_info(device_index=None, /) -> tuple[int, int]:
    return mem_get_info(device_index)


_ACCELERATOR_ORIGINALS: dict = {}


def _accelerator_shims() -> dict:
    from . import streams

    return {
        "current_device_index": current_device, "current_device_idx": current_device,
        "set_device_index": set_device, "set_device_idx": set_device,
        "device_index": _AcceleratorDeviceIndex, "current_stream": streams.current_stream,
        "set_stream": _accelerator_set_stream, "synchronize": synchronize,
        "empty_cache": empty_cache, "memory_stats": memory_stats,
        "memory_allocated": memory_allocated, "max_memory_allocated": max_memory_allocated,
        "memory_reserved": memory_reserved, "max_memory_reserved": max_memory_reserved,
        "reset_peak_memory_stats": reset_peak_memory_stats,
        "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
        "get_memory_info": _accelerator_get_memory_info,
    }


def install_accelerator_shims() -> None:
    """Point the torch.accelerator functions PyTorch cannot route to a Python backend at ours."""
    acc = torch.accelerator
    for name, fn in _accelerator_shims().items():
        if hasattr(acc, name):
            _ACCELERATOR_ORIGINALS.setdefault(name, getattr(acc, name))
            setattr(acc, name, fn)


def uninstall_accelerator_shims() -> None:
    """Restore PyTorch's own torch.accelerator functions."""
    for name, fn in _ACCELERATOR_ORIGINALS.items():
        if isinstance(name, tuple):          # ("memory", name): torch.accelerator.memory.name
            setattr(getattr(torch.accelerator, name[0]), name[1], fn)
        else:
            setattr(torch.accelerator, name, fn)
    _ACCELERATOR_ORIGINALS.clear()


_registered = False


def register() -> None:
    """Rename PrivateUse1 to `neuron` and install torch.neuron, hooks, guard and the fallback.
    The conventions built on torch.neuron (conventions.py: storages, amp, devapi, ...) sit above
    this module: eager_neuron/__init__.py installs them right after."""
    global _registered
    if _registered:
        return
    _registered = True
    torch.utils.rename_privateuse1_backend("neuron")
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=False)
    module = _build_module()
    torch._register_device_module("neuron", module)
    torch._C._acc.register_python_privateuseone_hook(_Hooks())
    torch._C._acc.register_python_privateuseone_device_guard(_Guard())
    _install_fallback()
    install_accelerator_shims()
    _install_multicore_backward()


# -- backward on the caller's thread ---------------------------------------------------------------
# The autograd engine runs the nodes of a non-CPU device on a worker thread of that device, and
# the caller waits: every backward call hands its graph to the neuron worker and back, and the
# GIL with it (our kernels' dispatch is Python). With multithreading off for the call (a
# thread-local switch: other threads' backward calls keep theirs), the engine runs every node on
# the calling thread's CPU ready queue instead (engine.cpp: multithreading_disabled ->
# cpu_ready_queue), as a CPU graph runs: same nodes, same order rules, no handoff. Measured
# (tools/ab_backward.py, alternating per step in one process): process CPU per training step
# 0.89-0.98x, more under load, where each wake-up of the worker waits for a core.
# It also keeps backward on neuron:1 and above working: torch 2.13's Python device guard
# reports deviceCount() == 1 (torch/csrc/acc/Module.cpp), so the engine starts one worker queue
# for PrivateUse1 and its ready_queue() asserts for neuron:1.
# A graph rooted on CPU tensors only (a loss moved to the CPU) keeps the engine's default.
BACKWARD_ON_CALLER = [True]   # False: the engine's device worker for neuron:0 (A/B switch)


def _on_caller(roots) -> bool:
    if _current() > 0:
        return True
    if isinstance(roots, torch.Tensor):
        roots = (roots,)
    for t in roots or ():
        if isinstance(t, torch.Tensor) and t.device.type == "neuron" and (
                t.device.index or BACKWARD_ON_CALLER[0]):
            return True
    return False


def _multicore_run(run):
    def _engine_run_backward(t_outputs, *args, **kwargs):
        if _on_caller(t_outputs) and torch._C._is_multithreading_enabled():
            with torch.autograd.set_multithreading_enabled(False):
                return run(t_outputs, *args, **kwargs)
        return run(t_outputs, *args, **kwargs)

    _engine_run_backward.__wrapped__ = run
    return _engine_run_backward


def _install_multicore_backward() -> None:
    """Backward of graphs rooted on neuron runs on the caller's thread (see the note above)."""
    import torch.autograd.graph

    torch.autograd._engine_run_backward = _multicore_run(torch.autograd._engine_run_backward)
    torch.autograd.graph._engine_run_backward = _multicore_run(
        torch.autograd.graph._engine_run_backward)


_lib = None


def _install_fallback() -> None:
    """Factories with device='neuron' (no tensor argument) arrive here: the third door."""
    global _lib
    from .dispatch import dispatch
    from .errors import refuse_foreign

    _lib = torch.library.Library("_", "IMPL")

    def fallback(op, *args, **kwargs):
        refuse_foreign(op, args, kwargs)
        return dispatch(op, args, kwargs)

    _lib.fallback(fallback, "PrivateUse1")


__all__ = ["config", "register"]


# placement checks live in placement.py (dispatch calls them; no dispatch import there)
from .placement import check_placement  # noqa: E402,F401 -- API
