"""Process-wide counters: every outcome that matters is named and counted here.

>>> import eager_neuron, torch
>>> eager_neuron.reset_stats(); _ = torch.ones(3, device="neuron") + 1
>>> eager_neuron.stats()["launches"] >= 1
True
"""

from __future__ import annotations

from collections import Counter
from typing import Any

# Counters kept by a subsystem in its own object (eager_neuron.distributed's collectives): each
# has snapshot() -> dict and reset(); eager_neuron.stats() shows them and reset_stats() resets
# them with the rest. Registered here, so no subsystem wraps eager_neuron.stats() itself.
_EXTRA: list = []


def add_counters(counters) -> None:
    """Show `counters.snapshot()` in eager_neuron.stats() and reset it with reset_stats().

    >>> class C:
    ...     def snapshot(self): return {"widgets": 0}
    ...     def reset(self): pass
    >>> add_counters(C()); "widgets" in STATS.snapshot(); _EXTRA.pop() and None
    True
    """
    if counters not in _EXTRA:
        _EXTRA.append(counters)


class Stats:
    # NOTE: plain attributes, not a dict, because the hot path bumps them per op.
    __slots__ = (
        "ops", "launches", "compiles", "compile_seconds", "memory_hits", "disk_hits",
        "disk_misses", "disk_errors", "fallbacks", "flushes", "decompositions", "views",
        "transfers", "transfer_bytes", "fused_launches", "fused_ops", "fusion_fallbacks",
        "trace_hits", "trace_misses",   # adaptive eager's trace cache (eager_neuron/adaptive.py)
    )

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.ops = 0
        self.launches = 0
        self.compiles = 0
        self.compile_seconds = 0.0
        self.memory_hits = 0
        self.disk_hits = 0
        self.disk_misses: Counter = Counter()   # reason -> count (absent, corrupt, version, io)
        self.disk_errors = 0
        self.fallbacks: Counter = Counter()     # aten op name -> count
        self.flushes: Counter = Counter()       # flush reason -> count
        self.decompositions: Counter = Counter()
        self.views = 0
        self.transfers = 0
        self.transfer_bytes = 0
        self.fused_launches = 0
        self.fused_ops = 0
        self.fusion_fallbacks = 0
        self.trace_hits = 0      # adaptive: a flushed group replayed a trace launched before
        self.trace_misses = 0    # adaptive: a flushed group's trace was new (spec and key built)
        for counters in _EXTRA:
            counters.reset()

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            out[name] = dict(value) if isinstance(value, Counter) else value
        for counters in _EXTRA:
            out.update(counters.snapshot())
        return out


STATS = Stats()
