"""The op context: what one op's lowering needs to know about the call, passed down explicitly.

dispatch() makes one `OpContext` per kernel op (the core, the mode, whether adaptive eager may
record the op, the arguments' blocks, the launcher) and installs it for the duration of the
lowering. `eager_neuron.launch.launch` hands each launch to the context's launcher: none runs
the kernel and charges the context's core; adaptive eager's recorder stages it into the
thread's pending group instead (adaptive_calls.py). A lowering that may be recorded asks
`ctx.recording`. Nothing about an op lives in a module global or a module's thread-local:
what adaptive eager learns from the call (the armed call a recording runner is left for, the
watched signature a decline reason is remembered for) rides in the context, and the staging
list is the stager's own (the launcher object). The context is per thread (autograd's worker
thread runs its own ops with its own contexts).

>>> from eager_neuron.context import OpContext, current, using
>>> with using(OpContext(core=1)):
...     current().core
1
>>> current() is None
True
"""

from __future__ import annotations

import contextlib
import threading

_TLS = threading.local()


class OpContext:
    """One op's call context.

    core       the NeuronCore the op runs on (and is charged to)
    mode       the NeuronMode when entered through it (CPU in, CPU out), else None
    recording  adaptive eager may record this op's launch into the stream's group
    blocks     id(host buffer) -> Block for the op's device operands and outputs
    capture    a list the launcher appends each launch (and replayable host call) to, while
               the fast path learns the op (see fastpath.py); None otherwise
    launcher   None: launch() runs each kernel and charges `core`; else a recorder
               fn(key, render, args, flops, bytes, engine, dtype_class, core) -> True when it
               took the launch (adaptive_calls.Stager: a matmul staged into the group, its
               list its own); False lets launch() run it. A group that launches while the op
               is lowered (memory pressure) runs under no context (adaptive._flush_locked)
    call       adaptive eager, set by dispatch's `_kernel_setup` for an op it may record:
               (func, plan, args, kwargs, index, bound args, outs, meta leaves); the
               lowering that records it (`adaptive_fast.learn`, `learn_call`) leaves a
               recording runner from it and clears it. None otherwise
    watch      adaptive eager: (func, plain fast-path signature, learn) of this op, so a
               decline reason `adaptive.flush` sees while it is lowered is remembered
               (DECLINED) and a repeat skips the funnel; `learn`: flush then arms `capture`
               (plain eager's runner is learned from the op's own launches). None otherwise
    """

    __slots__ = ("core", "mode", "recording", "blocks", "capture", "launcher", "call", "watch")

    def __init__(self, core: int = 0, mode=None, recording: bool = False,
                 blocks: dict | None = None, launcher=None) -> None:
        self.core = core
        self.mode = mode
        self.recording = recording
        self.blocks = blocks if blocks is not None else {}
        self.capture = None
        self.launcher = launcher
        self.call = None
        self.watch = None

    def __repr__(self) -> str:
        return (f"OpContext(core={self.core}, mode={self.mode!r}, "
                f"recording={self.recording}, launcher={self.launcher!r})")


def scratch(t):
    """Mark t, host scratch a lowering just allocated uninitialized (torch.empty) and fills
    before it reads it, for the fast path learning this op: a replay allocates a fresh one of
    t's layout instead of looking for t among the op's operands (fastpath_capture). Returns t."""
    ctx = getattr(_TLS, "ctx", None)
    if ctx is not None and ctx.capture is not None:
        ctx.capture.append(("scratch", t))
    return t


def rounded(names, fn=None) -> None:
    """Mark, for the fast path learning this op, that the lowering rounds these number
    operands before a kernel takes them (lower/half.py): a replay reads them from the call at
    run time through `fn` (number -> the value the kernel takes), or not at all when fn is None
    (fastpath_capture._half_runtime)."""
    ctx = getattr(_TLS, "ctx", None)
    if ctx is not None and ctx.capture is not None:
        ctx.capture.append(("rounded", tuple(names), fn))


def current() -> OpContext | None:
    """The context of the op this thread is lowering (None outside a lowering)."""
    return getattr(_TLS, "ctx", None)


def swap(ctx: OpContext | None) -> OpContext | None:
    """Install ctx for this thread; returns the previous one (restore it with swap(prev))."""
    prev = getattr(_TLS, "ctx", None)
    _TLS.ctx = ctx
    return prev


@contextlib.contextmanager
def using(ctx: OpContext):
    """with using(ctx): ... runs a lowering under ctx (restores the previous context)."""
    prev = swap(ctx)
    try:
        yield ctx
    finally:
        swap(prev)
