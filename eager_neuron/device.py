"""Device registration: PrivateUse1 renamed `neuron`, the `torch.neuron` module, accelerator hooks.

>>> import torch, eager_neuron
>>> torch.neuron.is_available(), torch.accelerator.current_accelerator()
(True, device(type='neuron'))
"""

from __future__ import annotations

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
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


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


def get_device_properties(device=None):
    index = _index(device)
    core = SIM.core(index)
    return types.SimpleNamespace(
        name=get_device_name(index), type=SIM.profile.name, total_memory=core.capacity,
        launch_overhead_us=SIM.profile.launch_overhead_us)


def synchronize(device=None) -> None:
    """Wait for all queued work (adaptive groups are flushed; the simulated clock is settled)."""
    from .dispatch import flush

    flush("synchronize")


# -- RNG: the CPU generator, so a seed gives the same numbers on cpu and neuron ---------------------
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


# -- memory --------------------------------------------------------------------------------------
def memory_allocated(device=None) -> int:
    return SIM.core(_index(device)).allocated


def max_memory_allocated(device=None) -> int:
    return SIM.core(_index(device)).peak


def memory_reserved(device=None) -> int:
    return SIM.core(_index(device)).reserved


def max_memory_reserved(device=None) -> int:
    return SIM.core(_index(device)).peak_reserved


def reset_peak_memory_stats(device=None) -> None:
    core = SIM.core(_index(device))
    core.peak = core.allocated
    core.peak_reserved = core.reserved


def empty_cache() -> None:
    for core in SIM.cores:
        core.empty_cache()


def mem_get_info(device=None) -> tuple[int, int]:
    core = SIM.core(_index(device))
    return core.capacity - core.reserved, core.capacity


def memory_stats(device=None) -> dict:
    core = SIM.core(_index(device))
    return {
        "allocated_bytes.all.current": core.allocated,
        "allocated_bytes.all.peak": core.peak,
        "reserved_bytes.all.current": core.reserved,
        "reserved_bytes.all.peak": core.peak_reserved,
        "num_alloc_retries": 0,
        "num_ooms": core.oom_count,
        "allocation.all.allocated": core.alloc_count,
        "allocation.all.freed": core.free_count,
    }


def memory_summary(device=None, abbreviated: bool = False) -> str:
    from .simulator import _fmt

    core = SIM.core(_index(device))
    rows = [
        f"eager_neuron memory summary: neuron:{core.index} ({SIM.profile.name})",
        f"  allocated      {_fmt(core.allocated):>12}   peak {_fmt(core.peak)}",
        f"  reserved       {_fmt(core.reserved):>12}   peak {_fmt(core.peak_reserved)}",
        f"  capacity       {_fmt(core.capacity):>12}",
        f"  allocs/frees   {core.alloc_count}/{core.free_count}   OOMs {core.oom_count}",
    ]
    return "\n".join(rows)


device = _DeviceContext


def _build_module() -> types.ModuleType:
    mod = types.ModuleType("torch.neuron")
    for name in (
        "is_available", "is_initialized", "_is_in_bad_fork", "device_count", "current_device",
        "set_device", "get_device_name", "get_device_properties", "synchronize", "manual_seed",
        "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state",
        "get_rng_state_all", "set_rng_state_all", "memory_allocated", "max_memory_allocated",
        "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats", "empty_cache",
        "mem_get_info", "memory_stats", "memory_summary", "device",
    ):
        setattr(mod, name, globals()[name])
    return mod


_registered = False


def register() -> None:
    """Rename PrivateUse1 to `neuron` and install torch.neuron, hooks, guard and the fallback."""
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


_lib = None


def _install_fallback() -> None:
    """Factories with device='neuron' (no tensor argument) arrive here: the third door."""
    global _lib
    from .dispatch import dispatch

    _lib = torch.library.Library("_", "IMPL")

    def fallback(op, *args, **kwargs):
        return dispatch(op, args, kwargs)

    _lib.fallback(fallback, "PrivateUse1")


__all__ = ["register", "config"]
