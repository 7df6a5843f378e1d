"""Simulated NeuronCores: HBM allocator with capacity and OOM, queues (streams), a simulated clock.

A core exposes a handful of verbs: alloc, free (by the block's death), launch, transfer; the
simulator adds the timeline verbs that streams and events need (record, wait, synchronize).
Device buffers are host memory (torch CPU storages) standing in for HBM; this module decides
whether an allocation fits and charges every launch and copy to the simulated clock.

Timeline (all times in simulated microseconds since import):
- the host has one clock, `host_us`, that moves only when the host waits: a synchronize, an
  event/stream synchronize, a blocking host <-> device copy, or every launch under
  NEURON_LAUNCH_BLOCKING=1;
- a launch is enqueued on its core's current queue and starts at
  max(queue tail, core's engines free, host_us); the core runs one kernel at a time;
- host <-> device copies use the core's DMA engine, so a copy on one queue overlaps compute on
  another; they are blocking for the host (as PyTorch's default copies from pageable memory are).

>>> from eager_neuron.simulator import SIM
>>> block = SIM.alloc(0, 4096); SIM.core(0).allocated >= 4096
True
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict, deque
from dataclasses import replace

import torch

from . import cost
from .config import config
from .stats import STATS

_POOL_MIN_BYTES = 1 << 16   # below this, torch's own CPU allocator is cheap enough


def _round(nbytes: int) -> int:
    # NOTE: 512-byte granules, as a device allocator would; also makes pool reuse likely.
    return max(512, (nbytes + 511) // 512 * 512)


def _fmt(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{nbytes:.2f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    return f"{nbytes:.2f} GiB"


class Block:
    """One device allocation. Dies (and returns its bytes) when no tensor refers to it."""

    __slots__ = ("__weakref__", "core", "nbytes", "storage")

    def __init__(self, core: Core, nbytes: int, storage: torch.UntypedStorage) -> None:
        self.core = core
        self.nbytes = nbytes
        self.storage = storage

    def __del__(self) -> None:
        # NOTE: no lock here. __del__ may run from the garbage collector in the middle of any
        # allocation, including one inside Core.alloc's critical section; the core drains this
        # queue under its lock before it next reads or changes its counters.
        try:
            self.core._freed.append((self.nbytes, self.storage))
        except Exception:  # noqa: BLE001, S110 -- interpreter shutdown: nothing left to account
            pass


class HostBlock(Block):
    """A small block (below the pool) whose host buffer a fast-path runner reuses.

    When the block dies its bytes are freed as any block's (the same queue, the same counters),
    and `host` (the buffer: its host tensor, numpy views, storage) goes onto `free`, the
    runner's list. It is only a candidate there: the runner takes it again only if nothing but
    the list still reaches its memory (fastpath._RECYCLE_CHECK counts every holder), so a view,
    an escaped storage or DLPack capsule, a pending adaptive group's array or a saved tensor
    keeps it from ever being handed out twice.
    """

    __slots__ = ("free", "host")

    def __init__(self, core: Core, nbytes: int, host: tuple, free: list) -> None:
        self.core = core
        self.nbytes = nbytes
        self.storage = None
        self.host = host
        self.free = free

    def __del__(self) -> None:
        try:
            self.core._freed.append((self.nbytes, None))
            free = self.free
            if len(free) < HOST_RECYCLE_DEPTH:
                free.append(self.host)
        except Exception:  # noqa: BLE001, S110 -- interpreter shutdown: nothing left to account
            pass


HOST_RECYCLE_DEPTH = 4   # dead host buffers a runner keeps for reuse (a loop needs one or two)


class Queue:
    """One stream's timeline on one core: the time its last enqueued work completes."""

    __slots__ = ("core", "handle", "id", "priority", "tail_us")

    def __init__(self, core: int, id: int, priority: int = 0) -> None:
        self.core = core
        self.id = id
        self.priority = priority
        self.tail_us = 0.0
        self.handle = None      # the torch.neuron.Stream wrapping this queue, made on demand

    def __repr__(self) -> str:
        return f"Queue(neuron:{self.core}, id={self.id}, tail={self.tail_us:.3f} us)"


class Core:
    """One NeuronCore: its share of HBM, its queues and clock, its engines' busy time."""

    def __init__(self, sim: Simulator, index: int, profile: cost.DeviceProfile,
                 capacity: int) -> None:
        self.sim = sim
        self.index = index
        self.profile = profile
        self.capacity = capacity
        # memory
        self._allocated = 0
        self.peak = 0
        self.reserved = 0           # allocated + cached in the pool
        self.peak_reserved = 0
        self.alloc_count = 0
        self.free_count = 0
        self.alloc_bytes_total = 0
        self.freed_bytes_total = 0
        self.oom_count = 0
        self.retries = 0            # pool emptied to make room
        self.pool: dict[int, list[torch.UntypedStorage]] = defaultdict(list)
        # id(storage) -> (storage, the host view buffers.alloc last made over it, its metadata):
        # a pooled storage's view is reused (buffers._host_view); emptied with the pool
        self.views: dict[int, tuple] = {}
        self._freed: deque = deque()
        self.lock = threading.Lock()
        # time
        self._queue_ids = itertools.count(1)
        self.default_queue = Queue(index, 0)
        self.queue = self.default_queue   # the current stream (process-wide, see streams.py)
        self.compute_free_us = 0.0  # the engines finish their last kernel
        self.dma_free_us = 0.0      # the DMA engine finishes its last copy
        self.clock_us = 0.0         # everything enqueued on this core completes
        self._rates = None          # (profile, {(engine, dtype class): divisors}), see launch
        self.reset_counters()

    def reset_counters(self) -> None:
        self.busy_us: dict[str, float] = defaultdict(float)   # engine -> busy time
        self.launch_overhead_us = 0.0
        self.launches = 0
        self.hbm_bytes = 0          # bytes moved between HBM and the engines (as reported)
        self.transfer_bytes = 0     # bytes this core received or sent to the host

    # -- memory ---------------------------------------------------------------------------------
    @property
    def allocated(self) -> int:
        """Bytes held by live blocks (frees queued by Block.__del__ are applied first)."""
        self.drain()
        return self._allocated

    def drain(self) -> None:
        """Apply the frees queued by dead blocks."""
        if self._freed:
            with self.lock:
                self._drain()

    def _drain(self) -> None:
        freed = self._freed
        while freed:
            nbytes, storage = freed.popleft()
            self._allocated -= nbytes
            self.free_count += 1
            self.freed_bytes_total += nbytes
            if nbytes >= _POOL_MIN_BYTES:
                self.pool[nbytes].append(storage)
            else:
                self.reserved -= nbytes

    def alloc(self, nbytes: int, want_storage: bool = True) -> Block:
        """A block of at least nbytes, from the pool or fresh; OutOfMemoryError if it cannot fit.

        On OOM nothing changes except the OOM counter: existing tensors stay intact.
        """
        size = _round(nbytes)
        with self.lock:
            self._drain()
            storage = None
            if size >= _POOL_MIN_BYTES and self.pool.get(size):
                storage = self.pool[size].pop()
            else:
                if self.reserved + size > self.capacity and self.reserved > self._allocated:
                    self.retries += 1
                    self._empty_pool()
                if self.reserved + size > self.capacity:
                    self.oom_count += 1
                    free = self.capacity - self._allocated
                    raise torch.OutOfMemoryError(
                        f"neuron:{self.index} out of memory: tried to allocate {_fmt(size)} "
                        f"({size} bytes); {_fmt(self._allocated)} allocated, {_fmt(free)} "
                        f"({free} bytes) free of {_fmt(self.capacity)} ({self.capacity} bytes) "
                        f"total HBM on this core ({self.profile.name}). Free tensors you no "
                        "longer need (del), use a smaller batch, or raise EAGER_NEURON_HBM_BYTES."
                    )
                self.reserved += size
                self.peak_reserved = max(self.peak_reserved, self.reserved)
            self._allocated += size
            self.peak = max(self.peak, self._allocated)
            self.alloc_count += 1
            self.alloc_bytes_total += size
        if storage is None and (want_storage or size >= _POOL_MIN_BYTES):
            storage = torch.UntypedStorage(size)
        return Block(self, size, storage)

    def alloc_small(self, size: int, host: tuple | None = None, free: list | None = None
                    ) -> Block:
        """alloc(size, want_storage=False) for a size already rounded and below the pool's
        threshold (the fast path's outputs): the same accounting in fewer steps. With `host`
        and `free`, a HostBlock: its host buffer goes onto `free` when it dies."""
        with self.lock:
            if self._freed:
                self._drain()
            reserved = self.reserved + size
            if reserved <= self.capacity:
                self.reserved = reserved
                if reserved > self.peak_reserved:
                    self.peak_reserved = reserved
                allocated = self._allocated + size
                self._allocated = allocated
                if allocated > self.peak:
                    self.peak = allocated
                self.alloc_count += 1
                self.alloc_bytes_total += size
                if host is None:
                    return Block(self, size, None)
                return HostBlock(self, size, host, free)
        # the full path (pool retry, OOM error); its block's host buffer is not reused
        return self.alloc(size, want_storage=False)

    def _empty_pool(self) -> None:
        for size, storages in self.pool.items():
            self.reserved -= size * len(storages)
        self.pool.clear()
        self.views.clear()   # (live blocks' views are remade on their storage's next use)

    def empty_cache(self) -> None:
        with self.lock:
            self._drain()
            self._empty_pool()

    def reset_peak(self) -> None:
        with self.lock:
            self._drain()
            self.peak = self._allocated
            self.peak_reserved = self.reserved

    # -- time -----------------------------------------------------------------------------------
    def launch(self, flops: float, bytes_moved: float, engine: str, dtype_class: str = "fp32"
               ) -> float:
        """Enqueue one kernel on this core's current queue; returns its simulated duration (us)."""
        # NOTE: the hot path (once per kernel): no lock. Launches come from one thread at a time
        # (autograd's device thread runs while the caller waits); the GIL keeps each update whole.
        profile = self.profile
        overhead = profile.launch_overhead_us
        # NOTE: cost.kernel_time_us with its two divisors (engine FLOP/s, core bandwidth)
        # cached per (engine, dtype class) for this profile: same floats, no lookups per launch
        rates = self._rates
        if rates is None or rates[0] is not profile:
            rates = self._rates = (profile, {})
        div = rates[1].get((engine, dtype_class))
        if div is None:
            div = rates[1][(engine, dtype_class)] = (
                cost.engine_flops(profile, engine, dtype_class), cost.core_bandwidth(profile))
        compute_s = flops / div[0] if flops else 0.0
        memory_s = bytes_moved / div[1] if bytes_moved else 0.0
        body = max(compute_s, memory_s) * 1e6
        return self.charge(overhead, body, engine, bytes_moved)

    def charge(self, overhead: float, body: float, engine: str, bytes_moved: float) -> float:
        """The queue and counter updates of launch() for a kernel whose cost under this core's
        current profile is known (the fast path's runners compute it once per signature)."""
        sim = self.sim
        q = self.queue
        start = q.tail_us
        free = self.compute_free_us
        if free > start:
            start = free
        host = sim.host_us
        if host > start:
            start = host
        end = start + overhead + body
        q.tail_us = self.compute_free_us = end
        if end > self.clock_us:
            self.clock_us = end
        if config.launch_blocking:
            sim.host_us = end
        self.busy_us[engine] += body
        self.launch_overhead_us += overhead
        self.launches += 1
        self.hbm_bytes += bytes_moved
        return overhead + body

    def charge_many(self, overhead: float, bodies: tuple, engine: str, nbytes: tuple) -> float:
        """len(bodies) kernels charged back to back, as that many charge() calls (a foreach
        runner's elements); returns their total duration (us)."""
        charge = self.charge
        total = 0.0
        for body, n in zip(bodies, nbytes):
            total += charge(overhead, body, engine, n)
        return total

    def cost_of(self, flops: float, bytes_moved: float, engine: str, dtype_class: str = "fp32"
                ) -> tuple:
        """(profile, launch overhead us, body us) launch() charges for this kernel now."""
        profile = self.profile
        compute_s = flops / cost.engine_flops(profile, engine, dtype_class) if flops else 0.0
        memory_s = bytes_moved / cost.core_bandwidth(profile) if bytes_moved else 0.0
        return profile, profile.launch_overhead_us, max(compute_s, memory_s) * 1e6

    def transfer(self, nbytes: int) -> float:
        """A blocking host <-> device copy on the current queue; returns its duration (us)."""
        t = cost.transfer_time_us(self.profile, nbytes)
        sim = self.sim
        with sim.lock:
            q = self.queue
            start = max(q.tail_us, self.dma_free_us, sim.host_us)
            end = start + t
            q.tail_us = self.dma_free_us = end
            self.clock_us = max(self.clock_us, end)
            sim.host_us = end     # the host waits for its copy
            self.busy_us["dma"] += t
            self.transfer_bytes += nbytes
        STATS.transfers += 1
        STATS.transfer_bytes += nbytes
        return t


class Simulator:
    """The simulated chip: a device profile, its cores, and the host's clock."""

    def __init__(self) -> None:
        # NOTE: a plain Lock: nothing that runs under it (including Block.__del__ from the
        # garbage collector) takes it again.
        self.lock = threading.Lock()
        self.on_configure: list = []   # callbacks: what caches a core forgets it
        self.configure(config.device, config.cores, config.hbm_bytes)

    def configure(self, device: str, cores: int, hbm_bytes: int | None = None,
                  launch_overhead_us: float | None = None) -> None:
        """(Re)build the chip. Tensors made before keep their old cores' accounting.

        >>> from eager_neuron.simulator import Simulator
        >>> s = Simulator(); s.configure("trn3", 4, hbm_bytes=1 << 20); len(s.cores)
        4
        """
        if device not in cost.PROFILES:
            raise ValueError(
                f"EAGER_NEURON_DEVICE={device!r} is not a known device profile; "
                f"choose one of {sorted(cost.PROFILES)}")
        if cores < 1:
            raise ValueError(f"EAGER_NEURON_CORES={cores}: need at least one core")
        profile = cost.PROFILES[device]
        if launch_overhead_us is not None:
            profile = replace(profile, launch_overhead_us=float(launch_overhead_us))
        self.profile = profile
        per_core = hbm_bytes if hbm_bytes else cost.core_hbm_bytes(profile)
        self.host_us = 0.0
        self.epoch_us = 0.0
        self.cores = [Core(self, i, profile, per_core) for i in range(cores)]
        for callback in self.on_configure:
            callback()

    def core(self, index: int) -> Core:
        try:
            return self.cores[index]
        except (IndexError, TypeError):
            raise RuntimeError(
                f"neuron:{index} does not exist: this simulated device has {len(self.cores)} "
                "cores (set EAGER_NEURON_CORES to change it)") from None

    def alloc(self, index: int, nbytes: int) -> Block:
        return self.core(index).alloc(nbytes)

    # -- queues, events, synchronization ------------------------------------------------------
    def new_queue(self, index: int, priority: int = 0) -> Queue:
        core = self.core(index)
        return Queue(index, next(core._queue_ids), priority)

    def record(self, q: Queue) -> float:
        """An event marker at the end of q's work: the time it completes."""
        with self.lock:
            t = max(self.host_us, q.tail_us)
            q.tail_us = t
            return t

    def wait(self, q: Queue, t: float) -> None:
        """Work enqueued on q after this starts no earlier than t (a device-side wait)."""
        with self.lock:
            q.tail_us = max(q.tail_us, t)

    def host_wait(self, t: float) -> None:
        """The host blocks until simulated time t."""
        with self.lock:
            self.host_us = max(self.host_us, t)

    def done(self, t: float) -> bool:
        """Has the work that completes at t finished, as far as the host can tell?"""
        return t <= self.host_us

    def synchronize(self, index: int | None = None) -> None:
        """The host waits for every queue of core `index` (all cores if None)."""
        cores = self.cores if index is None else [self.core(index)]
        self.host_wait(max(c.clock_us for c in cores))

    def copy_between(self, src: int, dst: int, nbytes: int) -> float:
        """A core -> core copy on one chip, ordered after both cores' current queues.

        Asynchronous for the host (like a device-to-device copy); returns its duration (us).
        """
        a, b = self.core(src), self.core(dst)
        t = cost.cross_core_time_us(self.profile, nbytes)
        with self.lock:
            start = max(a.queue.tail_us, b.queue.tail_us, a.dma_free_us, b.dma_free_us,
                        self.host_us)
            end = start + t
            for c in (a, b):
                c.queue.tail_us = c.dma_free_us = end
                c.clock_us = max(c.clock_us, end)
            b.transfer_bytes += nbytes     # counted once, on the receiving core
            b.busy_us["dma"] += t
        STATS.transfers += 1
        STATS.transfer_bytes += nbytes
        return t

    # -- counters -------------------------------------------------------------------------------
    def now_us(self) -> float:
        """When everything enqueued so far completes (the simulated makespan)."""
        return max([self.host_us] + [c.clock_us for c in self.cores])

    def device_time_us(self) -> float:
        """Simulated time from the last reset_counters() until all enqueued work completes."""
        return max(0.0, self.now_us() - self.epoch_us)

    def reset_counters(self) -> None:
        """Zero launches, busy time, traffic; device time restarts from the current makespan."""
        with self.lock:
            self.epoch_us = self.now_us()
            for c in self.cores:
                c.reset_counters()

    def stats(self) -> dict:
        """What eager_neuron.stats() reports about the simulated device."""
        busy: dict = {}
        for c in self.cores:
            for engine, us in c.busy_us.items():
                busy[engine] = busy.get(engine, 0.0) + us
        return {
            "device": self.profile.name,
            "device_time_us": self.device_time_us(),
            "core_time_us": [max(0.0, c.clock_us - self.epoch_us) for c in self.cores],
            "launch_overhead_us": sum(c.launch_overhead_us for c in self.cores),
            "hbm_bytes": int(sum(c.hbm_bytes for c in self.cores)),
            "engine_busy_us": busy,
            "hbm_allocated": [c.allocated for c in self.cores],
            "hbm_peak": [c.peak for c in self.cores],
        }

    def summary(self) -> str:
        """A few lines for the demo: device time, where it went, traffic and memory.

        >>> print(SIM.summary().splitlines()[0])  # doctest: +ELLIPSIS
        simulated trn... x ... cores: device time ... us
        """
        s = self.stats()
        busy = ", ".join(f"{k} {v:.1f} us" for k, v in sorted(s["engine_busy_us"].items()))
        launches = sum(c.launches for c in self.cores)
        transfer_bytes = sum(c.transfer_bytes for c in self.cores)
        lines = [
            (f"simulated {self.profile.name} x {len(self.cores)} cores: device time "
             f"{s['device_time_us']:.1f} us"),
            (f"  {launches} launches, {s['launch_overhead_us']:.1f} us of launch overhead; "
             f"engines busy: {busy or 'idle'}"),
            f"  HBM traffic {_fmt(s['hbm_bytes'])}; host<->device {_fmt(transfer_bytes)}",
            "  HBM in use " + ", ".join(
                f"neuron:{c.index} {_fmt(c.allocated)} (peak {_fmt(c.peak)})"
                for c in self.cores),
        ]
        return "\n".join(lines)


SIM = Simulator()
