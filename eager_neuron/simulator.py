"""Simulated NeuronCores: HBM allocator with capacity and OOM, a per-core clock, engine busy time.

A core exposes a handful of verbs: alloc, free (by the block's death), launch, transfer.
Device buffers are host memory (torch CPU storages) standing in for HBM; this module decides
whether an allocation fits and charges every launch and transfer to the simulated clock.

>>> from eager_neuron.simulator import SIM
>>> block = SIM.alloc(0, 4096); SIM.core(0).allocated >= 4096
True
"""

from __future__ import annotations

import threading
from collections import defaultdict

import torch

from . import cost
from .config import config
from .stats import STATS

_POOL_MIN_BYTES = 1 << 16   # below this, torch's own CPU allocator is cheap enough


def _round(nbytes: int) -> int:
    # NOTE: 512-byte granules, as a device allocator would; also makes pool reuse likely.
    return max(512, (nbytes + 511) // 512 * 512)


class Block:
    """One device allocation. Dies (and returns its bytes) when no tensor refers to it."""

    __slots__ = ("core", "nbytes", "storage", "__weakref__")

    def __init__(self, core: "Core", nbytes: int, storage: torch.UntypedStorage) -> None:
        self.core = core
        self.nbytes = nbytes
        self.storage = storage

    def __del__(self) -> None:
        try:
            self.core._release(self)
        except Exception:  # interpreter shutdown: nothing left to account
            pass


class Core:
    """One NeuronCore: its share of HBM, its clock and its engines' busy time."""

    def __init__(self, index: int, profile: cost.DeviceProfile, capacity: int) -> None:
        self.index = index
        self.profile = profile
        self.capacity = capacity
        self.allocated = 0
        self.peak = 0
        self.reserved = 0           # allocated + cached in the pool
        self.peak_reserved = 0
        self.alloc_count = 0
        self.free_count = 0
        self.oom_count = 0
        self.pool: dict[int, list[torch.UntypedStorage]] = defaultdict(list)
        self.clock_us = 0.0         # simulated device time on this core
        self.busy_us: dict[str, float] = defaultdict(float)   # engine -> busy time
        self.launch_overhead_us = 0.0
        self.launches = 0
        self.hbm_bytes = 0          # bytes moved between HBM and the engines
        self.lock = threading.Lock()

    # -- memory ---------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Block:
        size = _round(nbytes)
        with self.lock:
            storage = None
            if size >= _POOL_MIN_BYTES and self.pool.get(size):
                storage = self.pool[size].pop()
            else:
                if self.reserved + size > self.capacity and self.pool:
                    self._empty_pool()
                if self.reserved + size > self.capacity:
                    self.oom_count += 1
                    free = self.capacity - self.allocated
                    raise torch.OutOfMemoryError(
                        f"neuron:{self.index} out of memory: tried to allocate {_fmt(size)} "
                        f"({size} bytes); {_fmt(self.allocated)} allocated, {_fmt(free)} free of "
                        f"{_fmt(self.capacity)} total HBM on this core. Free tensors you no "
                        "longer need (del), use a smaller batch, or raise EAGER_NEURON_HBM_BYTES."
                    )
                self.reserved += size
                self.peak_reserved = max(self.peak_reserved, self.reserved)
            self.allocated += size
            self.peak = max(self.peak, self.allocated)
            self.alloc_count += 1
        if storage is None:
            storage = torch.UntypedStorage(size)
        return Block(self, size, storage)

    def _release(self, block: Block) -> None:
        with self.lock:
            self.allocated -= block.nbytes
            self.free_count += 1
            if block.nbytes >= _POOL_MIN_BYTES:
                self.pool[block.nbytes].append(block.storage)
            else:
                self.reserved -= block.nbytes

    def _empty_pool(self) -> None:
        for size, storages in self.pool.items():
            self.reserved -= size * len(storages)
        self.pool.clear()

    def empty_cache(self) -> None:
        with self.lock:
            self._empty_pool()

    # -- time -----------------------------------------------------------------------------------
    def launch(self, flops: float, bytes_moved: float, engine: str, dtype_class: str = "fp32"
               ) -> float:
        """Charge one kernel launch to this core's clock; returns its simulated duration (us)."""
        body = cost.kernel_time_us(self.profile, flops, bytes_moved, engine, dtype_class)
        total = self.profile.launch_overhead_us + body
        self.clock_us += total
        self.busy_us[engine] += body
        self.launch_overhead_us += self.profile.launch_overhead_us
        self.launches += 1
        self.hbm_bytes += int(bytes_moved)
        return total

    def transfer(self, nbytes: int) -> float:
        """Charge a host <-> device copy; returns its simulated duration (us)."""
        t = cost.transfer_time_us(self.profile, nbytes)
        self.clock_us += t
        self.busy_us["dma"] += t
        STATS.transfers += 1
        STATS.transfer_bytes += nbytes
        return t


def _fmt(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{nbytes:.2f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    return f"{nbytes:.2f} GiB"


class Simulator:
    """The simulated chip: a device profile and its cores."""

    def __init__(self) -> None:
        self.configure(config.device, config.cores, config.hbm_bytes)

    def configure(self, device: str, cores: int, hbm_bytes: int | None = None) -> None:
        if device not in cost.PROFILES:
            raise ValueError(
                f"EAGER_NEURON_DEVICE={device!r} is not a known device profile; "
                f"choose one of {sorted(cost.PROFILES)}")
        self.profile = cost.PROFILES[device]
        if cores < 1:
            raise ValueError(f"EAGER_NEURON_CORES={cores}: need at least one core")
        per_core = hbm_bytes if hbm_bytes else self.profile.hbm_bytes // self.profile.cores_per_chip
        self.cores = [Core(i, self.profile, per_core) for i in range(cores)]

    def core(self, index: int) -> Core:
        try:
            return self.cores[index]
        except IndexError:
            raise RuntimeError(
                f"neuron:{index} does not exist: this simulated device has {len(self.cores)} "
                "cores (set EAGER_NEURON_CORES to change it)") from None

    def alloc(self, index: int, nbytes: int) -> Block:
        return self.core(index).alloc(nbytes)

    def device_time_us(self) -> float:
        return max(c.clock_us for c in self.cores)


SIM = Simulator()
