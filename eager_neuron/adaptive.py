"""Adaptive eager: record runs of elementwise ops and launch each run as one fused kernel.

States (an explicit machine, as tinygrad's TinyJit):
    OFF        ops launch one by one (plain eager)
    IDLE       adaptive on, nothing recorded
    RECORDING  fusible ops append nodes to the pending group instead of launching
and a flush (RECORDING -> IDLE) happens wherever a value could be observed or ordering matters:
a host read (item, print, tolist, .cpu()), a non-fusible op, a CPU fallback, RNG, synchronize,
the node/argument limit, leaving the context. Every flush has a named, counted reason.

>>> import torch, eager_neuron
>>> x = torch.ones(4, device="neuron")
>>> with eager_neuron.adaptive():
...     v = ((x + 1) * 2).relu().sum().item()
>>> v
16.0
"""

from __future__ import annotations

import bisect
import contextlib
import sys
import threading

import numpy as np
import torch

from . import context as _context
from .cache import FORMAT_VERSION
from .config import config
from .stats import STATS

OFF, IDLE, RECORDING = "off", "idle", "recording"
MAX_NODES = 256       # compile time grows with the kernel: bound the group
MAX_BUFS = 96
MAX_PINNED_BYTES = 1 << 28   # a group holding more device memory than this launches
REDUCTIONS = {"aten::sum": "sum", "aten::mean": "mean",
              "aten::sum.dim_IntList": "sum", "aten::mean.dim": "mean"}

_lock = threading.RLock()   # one lock for every group: record and flush are atomic


class _Armed:
    """ARMED[0]: may the op being lowered on this thread be recorded? It is the current
    OpContext's `recording` flag (a lowering that launches on its own sets it False)."""

    __slots__ = ()

    def __getitem__(self, i) -> bool:
        ctx = getattr(_context._TLS, "ctx", None)
        return ctx is not None and ctx.recording

    def __setitem__(self, i, value) -> None:
        ctx = getattr(_context._TLS, "ctx", None)
        if ctx is not None:
            ctx.recording = bool(value)


ARMED = _Armed()
PENDING: dict = {}      # stream key -> its recording _Group (every thread's, see stream_key)


def stream_key() -> tuple:
    """Which group an op records into: one per thread, and on autograd's worker thread one per
    backward call (graph task), so concurrent backward passes never interleave in one group."""
    return (threading.get_ident(), torch._C._current_graph_task_id())


class _Buf:
    """One kernel argument: a 1-D numpy view (address, length, stride, dtype). Two buffers are
    the same argument only when all four agree; whether two buffers can share an element is
    decided by `_overlaps` (exactly for equal strides, conservatively otherwise), once, when the
    buffer joins its group: `ov` holds the indices of the group's buffers it overlaps."""

    __slots__ = ("arr", "lo", "hi", "step", "width", "block_id", "mem_read", "last_write",
                 "last_read", "ov")

    def __init__(self, arr: np.ndarray, ptr: int, block) -> None:
        self.arr = arr
        n = arr.shape[0]
        self.width = arr.itemsize
        self.step = arr.strides[0] if n > 1 else self.width
        self.lo = ptr
        # NOTE: the span of a strided view is (n - 1) * stride + itemsize bytes, not nbytes
        self.hi = ptr + (n - 1) * self.step + self.width if n else ptr
        # the block is pinned by the group while pending: its id stays its own
        self.block_id = id(block) if block is not None else None
        self.mem_read = False      # some node reads it from memory (not from a register)
        self.last_write = -1       # the last loop that writes it (-1: none)
        self.last_read = -1        # the last loop that reads it (-1: none)
        self.ov: set = set()       # indices of the other buffers of the group it overlaps


def _overlaps(a: _Buf, b: _Buf) -> bool:
    """Can a and b share a byte? Exact for equal strides (x[0::2] vs x[1::2] do not);
    conservative (True) for other strided pairs whose spans intersect."""
    if not (a.lo < b.hi and b.lo < a.hi):
        return False
    if a.step == b.step and a.step >= a.width and a.step >= b.width and a.step > 0:
        d = (b.lo - a.lo) % a.step
        return d < a.width or a.step - d < b.width
    return True


class _Loop:
    __slots__ = ("numel", "nodes", "size_buf", "last_writer")

    def __init__(self, numel: int, size_buf: int) -> None:
        self.numel = numel
        self.nodes = []
        self.size_buf = size_buf
        self.last_writer: dict = {}   # buf index -> node id whose value it holds


class _Group:
    def __init__(self, core: int = 0) -> None:
        self.core = core              # the NeuronCore the group runs on (and is charged to)
        self.loops: list[_Loop] = []
        self.bufs: list[_Buf] = []
        self.index: dict = {}         # (address, length, stride, dtype) -> buf index
        self.pins: dict = {}          # id(Block) -> Block: no block is freed/pooled while pending
        self.pinned_bytes = 0
        self.hints = True             # addresses from torch's data_ptr (see buf_index)
        self.scalars: list = []
        self.scalar_casts: list[str] = []
        self.n_nodes = 0
        self.ops: list[str] = []
        self.lines: list[str] = []    # the user's line per recorded op (for fault reports)
        # the trace so far: a node of the trace tree (see _TNode); every op moves it one step
        self.cursor = _ROOT[0]
        self.descs: list = []         # per new buffer of the op being recorded: its guard
        # bookkeeping of recognised ops not applied yet (see _sync): a replayed op only
        # appends its cached node; placement state is brought up to date when needed
        self.lag: list = []
        # buffer starts, sorted (with their indices), and the longest span: a new buffer's
        # overlaps are found by bisection among the buffers that start before it ends
        self.los: list = []
        self.los_j: list = []
        self.max_span = 0

    def buf_index(self, arr: np.ndarray, src, block, trusted: bool = False) -> int:
        # NOTE: `arr` is a 1-D numpy view of the tensor `src` (numpy() + reshape, no copy),
        # so src.data_ptr() is its address: ~20x cheaper than numpy's __array_interface__.
        # A new buffer checks that once (unless the caller made arr from src with numpy(),
        # which never copies: `trusted`); a mismatch turns the shortcut off for the group.
        hint = self.hints and isinstance(src, torch.Tensor)
        ptr = src.data_ptr() if hint else arr.__array_interface__["data"][0]
        n = arr.shape[0]
        key = (ptr, n, arr.strides[0] if n > 1 else 0, arr.dtype)
        j = self.index.get(key)
        if j is not None:
            return j
        if hint and not trusted:
            real = arr.__array_interface__["data"][0]
            if real != ptr:
                self.hints = False
                return self.buf_index(arr, src, block)
        if block is not None:
            # pinned until the flush: a temporary that dies while its op is pending cannot
            # hand its memory to a new tensor (a host copy, a pool allocation) meanwhile
            if id(block) not in self.pins:
                self.pins[id(block)] = block
                self.pinned_bytes += getattr(block, "nbytes", 0)
        self.index[key] = j = len(self.bufs)
        b = _Buf(arr, ptr, block)
        self.bufs.append(b)
        ov = self._overlapping(b, j)
        # the trace guard of a new buffer: everything placement depends on (its size, stride,
        # dtype, whether it has a block, which earlier buffers it may share bytes with)
        self.descs.append((n, key[2], arr.dtype, block is not None, ov))
        return j

    def _overlapping(self, b: _Buf, j: int) -> tuple:
        """Record (both ways) and return the indices of earlier buffers b overlaps."""
        lo, hi = b.lo, b.hi
        found = ()
        if hi > lo:
            los = self.los
            i0 = bisect.bisect_right(los, lo - self.max_span)
            i1 = bisect.bisect_left(los, hi)
            if i1 > i0:
                bufs = self.bufs
                hits = []
                for t in range(i0, i1):
                    k = self.los_j[t]
                    kb = bufs[k]
                    if kb.hi > lo and _overlaps(kb, b):
                        hits.append(k)
                        kb.ov.add(j)
                if hits:
                    b.ov.update(hits)
                    found = tuple(sorted(hits))
            i = bisect.bisect_right(los, lo)
            los.insert(i, lo)
            self.los_j.insert(i, j)
            if hi - lo > self.max_span:
                self.max_span = hi - lo
        return found

    def touches(self, spans: list) -> bool:
        """Does any buffer of the group intersect one of the byte spans [(lo, hi), ...]?"""
        for b in self.bufs:
            for lo, hi in spans:
                if b.lo < hi and lo < b.hi:
                    return True
        return False


class _State:
    """The process-wide switch (OFF when disabled) and the calling stream's group state."""

    def __init__(self) -> None:
        self.enabled = config.adaptive

    @property
    def group(self) -> _Group | None:
        return PENDING.get(stream_key()) if PENDING else None

    @property
    def name(self) -> str:
        if not self.enabled:
            return OFF
        return RECORDING if self.group is not None else IDLE


STATE = _State()
# NOTE: `eager_neuron.adaptive` is the public context manager, which shadows this module as a
# package attribute; internal code imports the module as `from .adaptive import MODULE`.
MODULE = sys.modules[__name__]


def set_adaptive(enabled: bool) -> None:
    """Switch adaptive eager on or off for the process (flushes pending work)."""
    flush_all("adaptive toggled")
    STATE.enabled = bool(enabled)


@contextlib.contextmanager
def adaptive(enabled: bool = True):
    """with eager_neuron.adaptive(): ... fuses consecutive elementwise ops into one kernel."""
    prev = STATE.enabled
    flush_all("adaptive toggled")
    STATE.enabled = enabled
    try:
        yield
    finally:
        flush_all("leave adaptive")
        STATE.enabled = prev


class _TNode:
    """A node of the trace tree: the ops recorded into a group since it started, one edge per
    op, labelled by the op's guard (its code, size, scalar types, which group buffers it reads
    and writes, and each new buffer's size, stride, dtype, block and overlaps). An edge also
    keeps where the op was placed (`step`); a node keeps the launches already built for a group
    that ends there (`launches`, per observable-stores pattern). Equal guards from the root
    mean equal placement decisions, so a recognised op skips the analysis and a recognised
    group its spec, key and kernel lookup: tinygrad's TinyJit capture/replay, guarded."""

    __slots__ = ("children", "step", "launches", "mem_read")

    def __init__(self, step=None) -> None:
        self.children: dict = {}
        self.step = step
        self.launches: dict = {}
        self.mem_read = None      # per buffer: read from memory by the group (for _observable)


_ROOT = [_TNode()]
_TRACE_NODES = [0]
MAX_TRACE_NODES = 200_000     # a bound on the tree's memory: past it, the tree starts anew
# counted work of the recording and flush paths (tests assert that a repeated step does none)
COUNTERS = {"analyses": 0, "renders": 0, "deferred": 0}


def record(op: str, expr: str, kinds: tuple, loads: tuple, scalar_casts: tuple, store: str,
           out: np.ndarray, operands: list, scalars: tuple, numel: int,
           reduce: str | None = None, blocks: dict | None = None, core: int | None = None,
           trusted: bool = False, static: int | None = None) -> bool:
    """Append one elementwise node (flat loop) to the pending group. False: not fusible here.

    `trusted`: every array was made from its tensor by numpy() (+ reshape), never a copy, and
    `operands` / `out` carry each tensor's block as a third item (`blocks` unused).
    `static`: `static_id(...)` of this call's code, size and scalar types, when the caller
    knows it already (a recording runner)."""
    if core is None or blocks is None:
        ctx = getattr(_context._TLS, "ctx", None)
        if core is None:
            core = ctx.core if ctx is not None else 0
        if blocks is None:
            blocks = ctx.blocks if ctx is not None else {}
    key = stream_key()
    with _lock:
        g = PENDING.get(key)
        if g is not None and g.core != core:
            _flush_locked(key, "core change")
            g = None
        if g is not None and (g.n_nodes >= MAX_NODES
                              or len(g.bufs) + len(operands) + 1 > MAX_BUFS
                              or g.pinned_bytes > MAX_PINNED_BYTES):
            _flush_locked(key, "buffer limit")
            g = None
        if g is None:
            if not STATE.enabled:   # the state machine: only IDLE -> RECORDING records
                raise AssertionError("adaptive eager: record() while OFF")
            g = PENDING[key] = _Group(core)
            if key[1] != -1:
                _flush_at_end_of_backward(key)
        # 1. buffers: operands and output, by (address, length, stride, dtype)
        g.descs = descs = []
        if trusted:
            op_idx = tuple([g.buf_index(arr, src, blk, True) for arr, src, blk in operands])
            out_idx = g.buf_index(out[0], out[1], out[2], True)
        else:
            op_idx = tuple([g.buf_index(arr, src, blocks.get(id(src))) for arr, src in operands])
            out_idx = g.buf_index(out[0], out[1], blocks.get(id(out[1])))
        # 2. the guard: a group that recorded the same guards before places this op as then
        if static is None:
            static = static_id(op, expr, kinds, loads, scalar_casts, store, reduce, numel,
                               tuple(map(type, scalars)))
        sig = (static, op_idx, out_idx, tuple(descs)) if descs else (static, op_idx, out_idx)
        cursor = g.cursor
        nxt = cursor.children.get(sig)
        if nxt is not None:
            # recognised: the cached node, placed where it was placed before
            new_loop, target, node, bk = nxt.step
            if new_loop:
                g.loops.append(_Loop(numel, out_idx if not reduce else op_idx[0]))
            g.loops[target].nodes.append(node)
            g.lag.append(bk)
        else:
            if g.lag:
                _sync(g)
            target, ops, new_loop = _place(g, op_idx, out_idx, kinds, numel, reduce)
            base = len(g.scalars)
            node = (expr, loads, store, ops, tuple(range(base, base + len(scalars))), out_idx,
                    reduce, g.n_nodes)
            g.loops[target].nodes.append(node)
            bk = (target, ops, op_idx, out_idx, reduce, g.n_nodes)
            _apply(g, bk)
            if _TRACE_NODES[0] >= MAX_TRACE_NODES:
                _ROOT[0] = _TNode()
                _TRACE_NODES[0] = 0
            nxt = cursor.children[sig] = _TNode((new_loop, target, node, bk))
            _TRACE_NODES[0] += 1
        g.cursor = nxt
        g.scalars.extend(scalars)
        g.scalar_casts.extend(scalar_casts)
        g.n_nodes += 1
        g.ops.append(op)
        return True


_STATICS: dict = {}


def static_id(*static) -> int:
    """A small integer standing for an op's code (op, expression, operand kinds, loads, scalar
    casts, store, reduction), element count and scalar types in trace guards: equal parts,
    equal id, for the life of the process.

    >>> from eager_neuron.adaptive import MODULE as ad
    >>> ad.static_id("t::neg", "-x0") == ad.static_id("t::neg", "-x0")
    True
    """
    sid = _STATICS.get(static)
    if sid is None:
        with _lock:
            sid = _STATICS.setdefault(static, len(_STATICS))
    return sid


def _apply(g: _Group, bk: tuple) -> None:
    """The placement bookkeeping of one recorded op: which loops read and write each buffer,
    which buffers are read from memory, which node's value each buffer holds in its loop."""
    target, ops, op_idx, out_idx, reduce, node_id = bk
    bufs = g.bufs
    for (kind, _), j in zip(ops, op_idx):
        b = bufs[j]
        if target > b.last_read:
            b.last_read = target
        if kind != "val":
            b.mem_read = True   # read from memory: keep the stores of buffers overlapping
    ob = bufs[out_idx]
    if target > ob.last_write:
        ob.last_write = target
    if not reduce:
        g.loops[target].last_writer[out_idx] = node_id


def _sync(g: _Group) -> None:
    """Apply the bookkeeping recognised ops skipped (before an analysis or a spec needs it)."""
    lag, g.lag = g.lag, []
    for bk in lag:
        _apply(g, bk)


def _place(g: _Group, op_idx: tuple, out_idx: int, kinds: tuple, numel: int, reduce) -> tuple:
    """The analysis of a new op: (loop index, operands, whether it opened a new loop).

    After the last loop it conflicts with (reads what it writes, writes what it reads or
    writes); it joins a loop of its size; a value computed earlier in that loop is read from a
    register ("val"), a single element ("one") and the rest from memory ("buf")."""
    COUNTERS["analyses"] += 1
    barrier, aligned = _barrier(g, op_idx, out_idx, kinds, numel)
    target = None
    for li in range(len(g.loops) - 1, max(barrier, 0) - 1, -1):
        loop = g.loops[li]
        if loop.numel != numel:
            continue
        if li == barrier and not aligned:
            continue
        target = li
        break
    new_loop = target is None
    if new_loop:
        g.loops.append(_Loop(numel, out_idx if not reduce else op_idx[0]))
        target = len(g.loops) - 1
    loop = g.loops[target]
    ops = []
    for i, j in enumerate(op_idx):
        if kinds[i] == "one":
            ops.append(("one", j))
        elif j in loop.last_writer:
            ops.append(("val", loop.last_writer[j]))
        else:
            ops.append(("buf", j))
    return target, tuple(ops), new_loop


def _flush_at_end_of_backward(key) -> None:
    """A group recorded by autograd for one backward call launches when that call ends (its
    gradients are then complete, as in plain eager), whichever thread runs the callback."""
    def done():
        with _lock:
            _flush_locked(key, "end of backward")
    try:
        torch.autograd.Variable._execution_engine.queue_callback(done)
    except RuntimeError:   # not inside a backward call after all: flushed when touched
        pass


def pending_write(arr: np.ndarray, src) -> bool:
    """Does the calling stream's group hold a pending write that may touch arr's memory?"""
    g = PENDING.get(stream_key()) if PENDING else None
    if g is None:
        return False
    if g.lag:
        _sync(g)
    probe = _Buf(arr, src.data_ptr(), None)
    return any(b.last_write >= 0 and _overlaps(b, probe) for b in g.bufs)


def _barrier(g: _Group, op_idx, out_idx: int, kinds: tuple, numel: int) -> tuple:
    """(the last loop the node conflicts with or -1, whether it may join that loop).

    Only buffers the node touches or that overlap them (their `ov` sets) can conflict: one
    overlapping what the node reads or writes conflicts in its last writing loop; one
    overlapping what it writes, also in its last reading loop. The node may join the barrier
    loop only element-aligned: every conflict there is the node's own buffer, of its size,
    overlapping no other buffer it touches, not read as a single element."""
    bufs = g.bufs
    reads = set(op_idx)
    wset = bufs[out_idx].ov
    cands = reads | wset
    cands.add(out_idx)
    for r in reads:
        cands |= bufs[r].ov
    barrier, conflicts = -1, []
    for j in cands:
        b = bufs[j]
        lw, lr = b.last_write, b.last_read
        if lw < 0 and lr < 0:
            continue
        hit_w = j == out_idx or j in wset
        m = lw
        if hit_w and lr > m:
            m = lr
        if m >= 0:
            conflicts.append((j, hit_w))
            if m > barrier:
                barrier = m
    if barrier < 0:
        return -1, True
    touched = reads | {out_idx}
    for j, hit_w in conflicts:
        b = bufs[j]
        if b.last_write == barrier:
            same = j in touched and b.arr.shape[0] == numel
            one_read = any(k == "one" and op_idx[i] == j for i, k in enumerate(kinds))
            if not same or one_read or not b.ov.isdisjoint(touched):
                return barrier, False
        if hit_w and b.last_read == barrier and (j != out_idx or b.arr.shape[0] != numel):
            return barrier, False
    return barrier, True


def flush(reason: str) -> None:
    """Launch the calling stream's pending group (if any) as one fused kernel. `reason` is
    counted and logged."""
    if not PENDING:
        return
    if reason in _DEVICE_WIDE:
        flush_all(reason)
        return
    key = stream_key()
    if key in PENDING:
        with _lock:
            _flush_locked(key, reason)


# waits for all work on the device: every thread's group launches, not only the caller's
_DEVICE_WIDE = frozenset({"synchronize", "stream synchronize", "event synchronize"})


def flush_all(reason: str) -> None:
    """Launch every stream's pending group (synchronize, toggling adaptive eager)."""
    if not PENDING:
        return
    with _lock:
        for key in list(PENDING):
            _flush_locked(key, reason)


def flush_others(spans: list) -> None:
    """Before an op touches the byte spans [(lo, hi), ...]: launch every other stream's group
    that may touch them (a thread reading what another thread's group has yet to write, or
    writing what it has yet to read). Groups never share pending memory."""
    mine = stream_key()
    with _lock:
        for key, g in list(PENDING.items()):
            if key != mine and g.touches(spans):
                _flush_locked(key, "other thread")


def _flush_locked(key, reason: str) -> None:
    g = PENDING.pop(key, None)
    if g is None or g.n_nodes == 0:
        return
    STATS.flushes[reason] += 1
    if "flush" in config.log:
        from .errors import where

        print(f"[eager_neuron] flush ({reason}): {g.n_nodes} ops in {len(g.loops)} loops "
              f"-> 1 launch [{', '.join(sorted(set(g.ops)))}]\n{where()}", file=sys.stderr)
    _launch_group(g, reason)


def _refs_baseline() -> int:
    # what sys.getrefcount reports for a block only the group's pins hold, read the way
    # _observable reads it (a list of the pins' values, a loop variable, the call's argument)
    pins = {0: object()}
    for blk in list(pins.values()):
        return sys.getrefcount(blk)


_REFS_BASELINE = _refs_baseline()


def _observable(g: _Group, mem_read=None) -> list:
    """Per buffer: can anything outside the group's registers see its memory after a store?

    Yes when any buffer overlapping its byte range (itself included) is read from memory in
    the group, has an owner we cannot track (no block: host scratch, a reinterpreting view), or
    has a block someone besides the group's pins refers to (a live tensor). Counting more
    references than there are only keeps a store: the rule errs on the safe side.
    `mem_read`: the buffers' read-from-memory flags when known (a trace's cached copy)."""
    held = {}
    for blk in list(g.pins.values()):
        held[id(blk)] = sys.getrefcount(blk) > _REFS_BASELINE
    if mem_read is None:
        if g.lag:
            _sync(g)
        mem_read = [b.mem_read for b in g.bufs]
    out = [m or b.block_id is None or held.get(b.block_id, True)
           for b, m in zip(g.bufs, mem_read)]
    if all(out):
        return out
    # the seen ranges, merged into disjoint sorted spans; an unseen buffer is kept if it
    # overlaps one (bisect on the span starts)
    spans: list = []
    for lo, hi in sorted((b.lo, b.hi) for b, seen in zip(g.bufs, out) if seen):
        if spans and lo < spans[-1][1]:
            if hi > spans[-1][1]:
                spans[-1][1] = hi
        else:
            spans.append([lo, hi])
    starts = [s[0] for s in spans]
    for j, b in enumerate(g.bufs):
        if not out[j]:
            k = bisect.bisect_left(starts, b.hi) - 1
            out[j] = k >= 0 and spans[k][1] > b.lo
    return out


def _spec(g: _Group, keep: list | None = None):
    """Plain-data kernel spec; a store is dropped when nothing can observe the buffer."""
    loops = []
    if g.lag:
        _sync(g)
    if keep is None:
        keep = _observable(g)
    for loop in g.loops:
        nodes = []
        for expr, loads, store, ops, scal, out_idx, reduce, node_id in loop.nodes:
            observable = (reduce is not None or keep[out_idx]
                          or loop.last_writer.get(out_idx) != node_id)
            nodes.append((expr, loads, store, tuple(ops), scal,
                          out_idx if observable else None, reduce, node_id))
        loops.append((loop.size_buf, tuple(nodes)))
    return (tuple(loops), len(g.bufs), tuple(g.scalar_casts))


# "background": a group whose fused kernel is not built yet runs op by op while the kernel
# compiles on a background thread (eager_neuron/adaptive_compile.py); "sync": it compiles first
COMPILE = ["background"]
# background mode: the flush of a trace that finds its kernel unbuilt for this many times
# queues the build (1: at once; 2: when the trace repeats)
COMPILE_AFTER = [2]


def set_compile_mode(mode: str) -> str:
    """How a group whose fused kernel is not built yet runs: "background" (op by op now, the
    fused kernel compiles on a background thread for the next time) or "sync" (compile, then
    launch it). Returns the previous mode.

    >>> from eager_neuron.adaptive import MODULE as ad
    >>> prev = ad.set_compile_mode("sync"); ad.set_compile_mode(prev)
    'sync'
    """
    if mode not in ("background", "sync"):
        raise ValueError(f"adaptive compile mode must be 'background' or 'sync', not {mode!r}")
    prev = COMPILE[0]
    COMPILE[0] = mode
    return prev


class _Launch:
    """A built launch of one trace (a node of the trace tree) and observable-stores pattern:
    its spec, launch key and full key (with the argument types), cost, and the kernel once it
    is built."""

    __slots__ = ("spec", "key", "full_key", "flops", "bytes", "kernel", "seen")

    def __init__(self, spec, key, full_key, flops, nbytes) -> None:
        self.spec, self.key, self.full_key = spec, key, full_key
        self.flops, self.bytes = flops, nbytes
        self.kernel = None
        self.seen = 0         # flushes that found no built kernel (see COMPILE_AFTER)


_SIM = [None]


def _launch_group(g: _Group, reason: str) -> None:
    from .kernels import compile as kc
    from .lower.elementwise import PARALLEL_MIN

    numel = max(lp.numel for lp in g.loops)
    parallel = numel >= PARALLEL_MIN and kc.parallel_allowed()
    if len(g.loops) == 1 and len(g.loops[0].nodes) == 1 and g.loops[0].nodes[0][6] is None:
        _launch_single(g, parallel, reason)
        return
    from . import adaptive_compile as bg
    from . import launch as _launch

    cursor = g.cursor
    mem_read = cursor.mem_read
    if mem_read is None or len(mem_read) != len(g.bufs):
        if g.lag:
            _sync(g)
        mem_read = cursor.mem_read = tuple(b.mem_read for b in g.bufs)
    keep = _observable(g, mem_read)
    args = tuple(b.arr for b in g.bufs) + tuple(g.scalars)
    lkey = (tuple(keep), parallel)
    ent = cursor.launches.get(lkey)
    if ent is None:
        # a trace not launched before: its spec, key and cost, once
        STATS.trace_misses += 1
        COUNTERS["analyses"] += 1
        spec = _spec(g, keep)
        stored = sum(g.bufs[n[5]].arr.nbytes for lp in spec[0] for n in lp[1]
                     if n[5] is not None)
        loaded = sum(b.arr.nbytes for b in g.bufs if b.last_read >= 0)
        key = ("fused", spec, parallel)
        ent = _Launch(spec, key, (FORMAT_VERSION,) + key + _launch.arg_types(args),
                      float(numel * g.n_nodes), float(stored + loaded))
        cursor.launches[lkey] = ent
    else:
        STATS.trace_hits += 1
    kernel = ent.kernel
    if kernel is None:
        kernel = ent.kernel = _launch.MEMORY.get(ent.full_key)
    if (kernel is None and COMPILE[0] == "background" and not _launch.HOOKS
            and not config.cache_verify):
        if not ent.seen:
            kernel = ent.kernel = _from_disk(ent, parallel, args)
        if kernel is None:
            # not built yet: never compile on the critical path. The ops run one by one now
            # (exactly plain eager); once the trace repeats, the fused kernel builds in the
            # background for next time (a trace seen once is not worth a compile, and the
            # compiler would compete with the first step for the interpreter)
            ent.seen += 1
            if ent.seen >= COMPILE_AFTER[0] and \
                    not bg.submit(ent.full_key, _renderer(ent.spec, parallel), args):
                STATS.fusion_fallbacks += 1   # it failed to build: op by op, counted
            COUNTERS["deferred"] += 1
            _run_one_by_one(g, reason)
            return
    try:
        if kernel is not None and not _launch.HOOKS and "kernels" not in config.log \
                and not config.cache_verify:
            # the replay: one call, counted and charged as launch() does on a memory hit
            kernel(*args)
            STATS.memory_hits += 1
            STATS.launches += 1
            sim = _SIM[0]
            if sim is None:
                from .simulator import SIM as sim

                _SIM[0] = sim
            sim.cores[g.core].launch(ent.flops, ent.bytes, "vector", "fp32")
        else:
            failed = []

            def replay(exc: Exception) -> None:
                # the fused kernel could not be built: nothing ran, so op by op is exact
                STATS.fusion_fallbacks += 1
                failed.append(exc)
                if "flush" in config.log:
                    print(f"[eager_neuron] fused group failed to build ({type(exc).__name__}: "
                          f"{str(exc)[:2000]}); running its ops one by one", file=sys.stderr)
                _run_one_by_one(g, reason)

            _launch.launch(ent.key, _renderer(ent.spec, parallel), args, flops=ent.flops,
                           bytes_moved=ent.bytes, engine="vector",
                           extra={"group_ops": g.n_nodes, "flush_reason": reason},
                           core=g.core, on_build_error=replay)
            if failed:
                return
            ent.kernel = _launch.MEMORY.get(ent.full_key)
    except Exception as exc:
        # NOTE: ops that can fault at run time (integer division, indexing) are never
        # recorded, so this is a bug, not a user error: say which ops the group held
        from .errors import KernelError, where

        raise KernelError(
            f"fused group of {g.n_nodes} ops failed on neuron: {type(exc).__name__}: {exc}\n"
            f"  ops: {', '.join(g.ops)}\n{where()}") from exc
    STATS.fused_launches += 1
    STATS.fused_ops += g.n_nodes


def _from_disk(ent: _Launch, parallel: bool, args: tuple):
    """The fused kernel from the disk tier (an earlier process built it), else None."""
    from . import launch as _launch

    disk = _launch.DISK
    if disk is None:
        return None
    source, _name = _renderer(ent.spec, parallel)()
    kernel = disk.load(ent.full_key, args, source)
    if kernel is None:
        return None
    STATS.disk_hits += 1
    _launch.MEMORY.put(ent.full_key, kernel)
    return kernel


def _launch_single(g: _Group, parallel: bool, reason: str) -> None:
    """A group of one elementwise node is plain eager's kernel, under plain eager's key: a
    flush after a single op (the common case before a non-fusible op) compiles nothing new.
    tests/test_adaptive.py checks that such a flush compiles nothing after plain eager ran."""
    _launch_plain(g, g.loops[0].nodes[0], g.loops[0].nodes[0][3], parallel, reason)
    STATS.fused_launches += 1
    STATS.fused_ops += 1


def _launch_plain(g: _Group, node, ops, parallel: bool, reason: str) -> None:
    """Launch one recorded elementwise node with plain eager's kernel and key.

    NOTE: the key and render mirror lower/elementwise.py lower_elementwise's flat launch."""
    from .kernels import elementwise as kew
    from .kernels import vmath
    from .launch import launch
    from .lower import elementwise as ew

    expr, loads, store, _ops, scal, out_idx, _reduce, node_id = node
    kinds = tuple("one" if kind == "one" else "flat" for kind, _ in ops)
    casts = tuple(g.scalar_casts[i] for i in scal)
    arrays = [g.bufs[out_idx].arr] + [g.bufs[j].arr for _, j in ops]

    def render():
        COUNTERS["renders"] += 1
        src, name = kew.render(expr, kinds, 1, loads, casts, store, parallel)
        vm = vmath.VMATH_PRELUDE if vmath.needs_vmath(expr) else ""
        return vm + ew.PRELUDE + src, name

    launch(("elementwise", g.ops[node_id], expr, kinds, 1, loads, casts, store, parallel,
            ew.PRELUDE_ID), render, (*arrays, *(g.scalars[i] for i in scal)),
           flops=float(arrays[0].size * max(1, expr.count("("))),
           bytes_moved=float(sum(x.nbytes for x in arrays)), engine="vector",
           extra={"group_ops": 1, "flush_reason": reason}, core=g.core)


def _run_one_by_one(g: _Group, reason: str = "replay") -> None:
    """Run the group node by node, in program order, each with its own small kernel: what
    plain eager runs (every store kept). Used while the fused kernel builds in the background
    and when it cannot be built; nothing of the group has run before."""
    from .kernels import compile as kc
    from .launch import launch
    from .lower.elementwise import PARALLEL_MIN

    order = sorted((n[7], li, n) for li, lp in enumerate(g.loops) for n in lp.nodes)
    writers = {n[7]: n[5] for lp in g.loops for n in lp.nodes}
    allowed = kc.parallel_allowed()
    for _id, li, node in order:
        expr, loads, store, ops, scal, out_idx, reduce, _ = node
        # a "val" operand refers to a node of the same loop: its buffer holds the value now
        fixed = tuple(("buf", writers[ref]) if kind == "val" else (kind, ref)
                      for kind, ref in ops)
        numel = g.loops[li].numel
        parallel = numel >= PARALLEL_MIN and allowed
        if reduce is None:
            _launch_plain(g, node, fixed, parallel, reason)
            continue
        # a sum/mean epilogue: a one-node fused kernel over just its own buffers (shared by
        # every group that reduces the same way)
        remap: dict = {}
        for _kind, j in fixed:
            remap.setdefault(j, len(remap))
        remap.setdefault(out_idx, len(remap))
        spec = (((remap[fixed[0][1]],
                  ((expr, loads, store, tuple((k, remap[j]) for k, j in fixed),
                    tuple(range(len(scal))), remap[out_idx], reduce, 0),)),),
                len(remap), tuple(g.scalar_casts[i] for i in scal))
        args = tuple(g.bufs[j].arr for j in remap) + tuple(g.scalars[i] for i in scal)
        launch(("fused", spec, False), _renderer(spec, False), args, core=g.core,
               extra={"group_ops": 1, "flush_reason": reason})


def _renderer(spec: tuple, parallel: bool):
    """render() for launch: the fused source behind the preludes its expressions call."""
    from .kernels import fused as kf
    from .kernels.vmath import VMATH_PRELUDE, needs_vmath
    from .lower.elementwise import PRELUDE

    def render():
        COUNTERS["renders"] += 1
        src, name = kf.render(spec, parallel)
        vm = VMATH_PRELUDE if needs_vmath(src) else ""
        return vm + PRELUDE + _special_prelude(src) + src, name
    return render


def _special_prelude(src: str) -> str:
    from .lower import elementwise as ew

    special = getattr(ew, "SPECIAL_PRELUDE", "")
    return special if special and ew._SPECIAL_RE.search(src) else ""



_TORCH_FLOAT = {torch.float32: "np.float32", torch.float64: "np.float64"}


def try_record_reduction(name: str, a: dict, outs: list, blocks: dict) -> bool:
    """sum/mean over every element of a contiguous float tensor: a group epilogue."""
    kind = REDUCTIONS.get(name)
    x, out = a.get("self"), outs[0]
    if kind is None or a.get("dtype") is not None or out.numel() != 1 or x.numel() <= 1:
        return False
    if not x.is_contiguous() or not out.is_contiguous() or x.dtype != out.dtype:
        return False
    t = _TORCH_FLOAT.get(x.dtype)   # bfloat16 has no numpy view: not fusible here
    if t is None:
        return False
    arr = x.reshape(-1).numpy()
    return record(name, "x0", ("flat",), (t,), (), t + "({})", (out.reshape(-1).numpy(), out),
                  [(arr, x)], (), arr.shape[0], reduce=kind, blocks=blocks)
