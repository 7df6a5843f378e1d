"""Kernel lookup and launch: memory cache -> disk cache -> render + compile, then run and charge.

Every lowering calls `launch(...)`; it is the one place that counts launches, compiles and hits,
and charges the simulated NeuronCore.

>>> import numpy as np
>>> from eager_neuron.launch import launch
>>> out = np.zeros(3, np.float32)
>>> launch(("doc", "fill"), lambda: ("@njit\\ndef k(o):\\n    o[:] = 1\\n", "k"), (out,))
>>> out.tolist()
[1.0, 1.0, 1.0]
"""

from __future__ import annotations

import sys
import time
from typing import Callable

import numpy as np

from . import context as _context
from .cache import FORMAT_VERSION, MemoryCache
from .config import config
from .kernels import compile as kc
from .stats import STATS, add_counters


class RenderStats:
    """Kernel sources rendered, and kernels the disk tier's render index found without one.

    A render is a lowering's render() run by a memory miss (or a row kernel's source built
    with its program, compile/rowstep.py); a warm process renders nothing: each kernel comes
    from the render index (cache/tier.py). In eager_neuron.stats()."""

    __slots__ = ("kernel_renders", "render_index_hits")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.kernel_renders = 0
        self.render_index_hits = 0

    def snapshot(self) -> dict:
        return {"kernel_renders": self.kernel_renders,
                "render_index_hits": self.render_index_hits}


RSTATS = RenderStats()
add_counters(RSTATS)
MEMORY = MemoryCache()
DISK = None          # set by eager_neuron.cache.disk when the disk tier is enabled
_TLS = _context._TLS
HOOKS: list = []     # profiler callbacks: fn(event dict)
_SIM = [None]        # the simulator (imported on first launch: it imports this module's peers)
# time.monotonic() at the end of the last kernel build (disk load or compile) by a thread other
# than the fused-kernel worker, inf while one is under way: both take Numba's global compiler
# lock, so adaptive_compile starts a background compile only once such builds have gone quiet
LAST_BUILD = [0.0]


def arg_types(args: tuple) -> tuple:
    """What Numba specialises on, per argument: (dtype, ndim, layout) or the scalar's type."""
    out = []
    for a in args:
        if type(a) is np.ndarray:
            flags = a.flags
            layout = "C" if flags.c_contiguous else ("F" if flags.f_contiguous else "A")
            out.append((a.dtype.char, a.ndim, layout))
        else:
            out.append(type(a).__name__)
    return tuple(out)


def full_key(key: tuple, args: tuple) -> tuple:
    """The memory/disk cache key of a launch: the format, the lowering's key, the arg types."""
    return (FORMAT_VERSION,) + key + arg_types(args)


def current_core() -> int:
    """The core the op being lowered on this thread runs on (from its OpContext)."""
    ctx = getattr(_TLS, "ctx", None)
    return ctx.core if ctx is not None else 0   # outside an op: core 0


def _build(key: tuple, render: Callable[[], tuple[str, str]], args: tuple,
           background: bool = False):
    """(kernel, outcome, seconds) for a memory miss: from the disk tier or compiled, its exec
    namespace released (_release). `background`: the fused-kernel worker's build (not noted in
    LAST_BUILD)."""
    if background:
        kernel, outcome, seconds = _find_or_compile(key, render, args)
    else:
        LAST_BUILD[0] = float("inf")
        try:
            kernel, outcome, seconds = _find_or_compile(key, render, args)
        finally:
            LAST_BUILD[0] = time.monotonic()
    if outcome != "memory":
        _release(kernel)
    return kernel, outcome, seconds


def _release(kernel) -> None:
    """Let a kernel be freed when the memory tier drops it (MEMORY.clear()).

    Numba registers every compiled function with its target context for good (the context's
    user functions, which it forgets only when the dispatcher is collected), and that entry
    reaches the function's Environment, whose globals are the kernel's exec namespace, which
    holds the dispatcher: so no kernel was ever freed, and a process that cleared its kernel
    cache and reloaded grew by every kernel each time (tools/fuzz_fastpath.py slowed from
    ~2 s to ~3.5 s a program over 100 programs: gc walked the dead kernels). The dispatcher's
    compilation is over (disable_compile: its machine code links its helpers'), so the
    namespace need not name a dispatcher any longer."""
    py_func = getattr(kernel, "py_func", None)
    if py_func is None or getattr(kernel, "_can_compile", True):
        return
    namespace = py_func.__globals__
    for name in [n for n, v in namespace.items() if v is kernel or (
            hasattr(v, "py_func") and getattr(v.py_func, "__globals__", None) is namespace)]:
        del namespace[name]


def _find_or_compile(key: tuple, render: Callable[[], tuple[str, str]], args: tuple):
    if DISK is not None:
        # 0. the render index: a kernel stored by a process of the same toolchain and sources
        #    loads by its key, its source never rendered (the entry holds it)
        kernel = DISK.load_indexed(key, args, render)
        if kernel is not None:
            STATS.disk_hits += 1
            RSTATS.render_index_hits += 1
            return kernel, "disk", 0.0
    source, name = render()
    RSTATS.kernel_renders += 1
    if DISK is None:
        kernel, seconds = kc.timed_compile(source, name, args)
    else:
        # 1. disk tier (machine code from an earlier process)
        kernel = DISK.load(key, args, source, render=render)
        if kernel is not None:
            STATS.disk_hits += 1
            return kernel, "disk", 0.0
        # 2. a miss compiles once across threads and processes: whoever waited for the lock
        #    finds the winner's kernel in memory (same process) or on disk (another process)
        with DISK.lock(key, source):
            kernel = MEMORY.get(key)
            if kernel is not None:
                STATS.memory_hits += 1
                return kernel, "memory", 0.0
            kernel = DISK.load(key, args, source, count=False, render=render)
            if kernel is not None:
                STATS.disk_hits += 1
                return kernel, "disk", 0.0
            kernel, seconds = kc.timed_compile(source, name, args)
            DISK.store(key, kernel, source, name, seconds, render)
            MEMORY.put(key, kernel)
    STATS.compiles += 1
    STATS.compile_seconds += seconds
    return kernel, "compile", seconds


def checked(fn: Callable, *args) -> None:
    """Run `fn(*args)`: a host-side check of what a kernel reported (an out-of-range index in
    its error-flag array). While the fast path learns the op, the check is recorded so a
    replay makes it too, on the replay's own flag array (fastpath_capture.py).

    >>> checked(lambda flags: None, [0])
    """
    ctx = getattr(_TLS, "ctx", None)
    if ctx is not None and ctx.capture is not None:
        ctx.capture.append(("check", fn, args))
    fn(*args)


def launch(key: tuple, render: Callable[[], tuple[str, str]], args: tuple,
           flops: float = 0.0, bytes_moved: float = 0.0, engine: str = "vector",
           dtype_class: str = "fp32", extra: dict | None = None, core: int | None = None,
           on_build_error: Callable[[Exception], None] | None = None,
           check: tuple | None = None) -> None:
    """Run the kernel for `key` on `args` (numpy arrays and scalars) and charge its cost.

    `key` is (family, op, static fields...); the arguments' types are appended here, so a new
    layout or dtype is a new kernel and a new size is not. The core charged is `core`, else the
    current op context's. `on_build_error(exc)`, if given, is called instead of raising when
    the kernel cannot be built (nothing has run: the caller may take another route). `check`
    (fn, *args): the host check of what the kernel reported, made after it ran (see checked).
    When the op context has a launcher (adaptive eager staging a joined matmul), it takes the
    launch.
    """
    ctx = getattr(_TLS, "ctx", None)
    if ctx is not None and ctx.launcher is not None and ctx.launcher(
            key, render, args, flops, bytes_moved, engine, dtype_class, core):
        return   # taken (staged into the group); a launcher that declines lets it run here
    fkey = (FORMAT_VERSION,) + key + arg_types(args)
    if config.cache_verify:   # debugging: the key must hold all that changes the source
        from .cache import verify

        verify.seen(fkey, render)
    kernel = MEMORY.get(fkey)
    if kernel is not None:
        STATS.memory_hits += 1
        outcome, seconds = "memory", 0.0
    else:
        try:
            kernel, outcome, seconds = _build(fkey, render, args)
        except Exception as exc:
            if on_build_error is None:
                raise
            if ctx is not None:
                ctx.capture = None   # the lowering goes another way: nothing to replay
            on_build_error(exc)
            return
        MEMORY.put(fkey, kernel)
    t0 = time.perf_counter() if (HOOKS or "kernels" in config.log) else 0.0
    if ctx is not None and ctx.capture is not None:
        # the fast path is learning this op: small arrays as they are before the kernel runs
        # (a lowering's constant or scratch array is replayed from this copy)
        snaps = tuple(a.copy() if type(a) is np.ndarray and a.nbytes <= 256 else None
                      for a in args)
    kernel(*args)
    STATS.launches += 1
    sim = _SIM[0]
    if sim is None:
        # NOTE: resolved once, not imported per launch (an import statement costs ~1 us here)
        from .simulator import SIM as sim

        _SIM[0] = sim
    if core is None:
        core = ctx.core if ctx is not None else 0
    device_us = sim.cores[core].launch(flops, bytes_moved, engine, dtype_class)
    if ctx is not None and ctx.capture is not None:   # the fast path is learning this op
        ctx.capture.append(("launch", kernel, args, flops, bytes_moved, engine, dtype_class,
                            core, snaps, key, extra))
    if t0:
        host_us = (time.perf_counter() - t0) * 1e6
        event = {"key": key, "outcome": outcome, "compile_s": seconds, "host_us": host_us,
                 "device_us": device_us, "bytes": bytes_moved, "flops": flops, "engine": engine}
        if extra:
            event.update(extra)
        for hook in HOOKS:
            hook(event)
        if "kernels" in config.log:
            print(f"[eager_neuron] kernel {key[0]}:{key[1]} {outcome}"
                  + (f" ({seconds * 1e3:.1f} ms)" if seconds else "")
                  + f" host {host_us:.1f} us, device {device_us:.2f} us", file=sys.stderr)
    if check is not None:
        checked(*check)
