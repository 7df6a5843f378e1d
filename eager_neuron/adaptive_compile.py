"""Adaptive eager: fused kernels compile off the critical path, on one background thread.

A flushed group whose fused kernel is in neither cache runs op by op (each op's own small
kernel) while this module builds the fused kernel; the next flush of the same trace launches it.
The worker only renders, compiles and stores (memory and disk tier, through launch._build and so
under its per-key lock): it never runs a kernel. It is given stand-in arrays of the real
arguments' Numba types, never the group's buffers.

A compile holds Numba's global compiler lock for its whole length (0.2-1 s for a fused kernel),
and every kernel another thread loads from the disk cache or compiles needs that lock too. So the
worker starts a compile only when no other thread has built a kernel for QUIET seconds
(launch.LAST_BUILD), deferring each one by at most MAX_DEFER: a first adaptive step, which loads
its plain kernels one after another, is not kept waiting behind fused kernels it does not yet
use (BERT's first step: 4.2 s with the worker compiling beside it, 0.7 s warm).

>>> from eager_neuron.adaptive_compile import stand_ins
>>> import numpy as np
>>> [a.flags.c_contiguous for a in stand_ins((np.zeros(3), np.zeros(6)[::2], 1.5))[:2]]
[True, False]
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
import threading
import time

import numpy as np

from . import launch as _launch
from .config import config

_QUEUE: queue.Queue = queue.Queue()
_IDLE = threading.Event()
_IDLE.set()
_STATE_LOCK = threading.Lock()
_WORKER: list = [None]
IN_FLIGHT: set = set()     # full keys queued or compiling
FAILED: dict = {}          # full key -> the build error (the group runs op by op)
COUNTERS = {"queued": 0, "built": 0, "failed": 0}
QUIET = 0.3        # seconds without another thread's kernel build before a compile starts
MAX_DEFER = 10.0   # the longest one compile waits for that


def stand_ins(args: tuple) -> tuple:
    """Arrays of the same Numba type as `args` (dtype, rank, C, F or strided layout) and the same
    scalars: what the compiler types the kernel for, detached from device memory.

    >>> [a.ndim for a in stand_ins((np.zeros((3, 4)), np.zeros((3, 4)).T))]
    [2, 2]
    """
    out = []
    for a in args:
        if type(a) is np.ndarray:
            # the rank and layout Numba types the array by (a call's matmul operands are 2-D
            # or 3-D, C, F or strided); a 0-d array is C-contiguous
            shape = (2,) * a.ndim
            if a.flags.c_contiguous:
                out.append(np.zeros(shape, a.dtype))
            elif a.flags.f_contiguous:
                out.append(np.zeros(shape, a.dtype, order="F"))
            else:
                out.append(np.zeros((4,) * a.ndim, a.dtype)[(slice(None, None, 2),) * a.ndim])
        else:
            out.append(a)
    return tuple(out)


def submit(full_key: tuple, render, args: tuple) -> bool:
    """Queue a build of `full_key` (once). False when it failed to build before."""
    if full_key in FAILED:
        return False
    with _STATE_LOCK:
        if full_key in IN_FLIGHT:
            return True
        IN_FLIGHT.add(full_key)
        _IDLE.clear()
        COUNTERS["queued"] += 1
        if _WORKER[0] is None or not _WORKER[0].is_alive():
            t = threading.Thread(target=_work, name="eager_neuron-fuse-compile", daemon=True)
            _WORKER[0] = t
            t.start()
    _QUEUE.put((full_key, render, stand_ins(args)))
    return True


def _defer() -> None:
    """Wait until other threads' kernel builds have been quiet for QUIET seconds (at most
    MAX_DEFER): their disk loads and compiles would otherwise queue on Numba's compiler lock
    behind this thread's compile."""
    deadline = time.monotonic() + MAX_DEFER
    while True:
        now = time.monotonic()
        rest = QUIET - (now - _launch.LAST_BUILD[0])   # inf while a build is under way
        if rest <= 0 or now >= deadline:
            return
        time.sleep(min(rest, deadline - now, QUIET))


def _work() -> None:
    while True:
        full_key, render, args = _QUEUE.get()
        try:
            if _launch.MEMORY.get(full_key) is None:
                _defer()
                kernel, _outcome, _s = _launch._build(full_key, render, args, background=True)
                _launch.MEMORY.put(full_key, kernel)
            COUNTERS["built"] += 1
        except Exception as exc:  # noqa: BLE001 -- the group keeps running op by op
            FAILED[full_key] = exc
            COUNTERS["failed"] += 1
            if "flush" in config.log:
                print(f"[eager_neuron] fused kernel failed to build in the background "
                      f"({type(exc).__name__}: {str(exc)[:500]}); its group runs op by op",
                      file=sys.stderr)
        finally:
            with _STATE_LOCK:
                IN_FLIGHT.discard(full_key)
                if not IN_FLIGHT:
                    _IDLE.set()


def wait(timeout: float | None = None) -> bool:
    """Block until every queued fused kernel is built (True) or `timeout` seconds pass."""
    return _IDLE.wait(timeout)


# a fork while the worker holds the compiler's lock would leave that lock held forever in the
# child (DataLoader workers): wait for the worker to go idle first; at exit, let it finish
# storing what it compiles (the next process finds it on disk)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=lambda: wait(120.0))
atexit.register(lambda: wait(60.0))
