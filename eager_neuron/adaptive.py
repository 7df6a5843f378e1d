"""Adaptive eager: record runs of elementwise ops and launch each run as one fused kernel.

(Over 500 lines on purpose: record(), the flush triggers and the state machine read and change
the same per-stream state; the group's data, the flush, joined calls, the fast path and the
background compiler are their own modules.)

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

import contextlib
import sys
import threading
from bisect import bisect_left, bisect_right

import numpy as np
import torch

from . import adaptive_calls as _calls
from . import adaptive_group as _grp
from . import context as _context
from .adaptive_group import (  # noqa: F401 -- re-exported: tests and tools read them here
    COUNTERS,
    _apply,
    _Buf,
    _Call,
    _Group,
    _Loop,
    _overlaps,
    _sync,
    _TNode,
)
from .adaptive_launch import COMPILE, COMPILE_AFTER, launch_group, set_compile_mode  # noqa: F401
from .config import config
from .stats import STATS, add_counters

OFF, IDLE, RECORDING = "off", "idle", "recording"
MAX_NODES = 256       # compile time grows with the kernel: bound the group
# NOTE: an optimizer step of ~30 parameters touches ~5 buffers per parameter: at 96 its update
# split into three groups, each re-creating the buffers of the parameters it shares with the
# next (258 new buffers per step for 28 parameters instead of 140); 160 keeps it whole
# (tools' AdamW bench: adaptive/plain 1.9x -> 1.55x). Kernel size stays bounded by MAX_NODES.
MAX_BUFS = 160
MAX_PINNED_BYTES = 1 << 28   # a group holding more device memory than this launches
REDUCTIONS = {"aten::sum": "sum", "aten::mean": "mean",
              "aten::sum.dim_IntList": "sum", "aten::mean.dim": "mean"}
# ops that join the pending group as calls of their own kernel (adaptive_calls.py); dispatch
# hands them to try_record_reduction as it does the reductions
REDUCTIONS.update({name: "call" for name in _calls.JOINABLE})

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


# the adaptive() blocks open in any thread, oldest first: [saved previous state] each
_BLOCKS: list = []
_BLOCKS_LOCK = threading.Lock()


@contextlib.contextmanager
def adaptive(enabled: bool = True):
    """with eager_neuron.adaptive(): ... fuses consecutive elementwise ops into one kernel.

    The switch is process-wide. Blocks entered by several threads need not close in order: a
    block that closes while a later one (another thread's) is still open leaves the switch as
    that block set it and hands its saved state on to it, so the switch is restored when the
    last of them closes, never switched off under a thread still inside its block."""
    entry = [STATE.enabled]
    with _BLOCKS_LOCK:
        entry[0] = STATE.enabled
        _BLOCKS.append(entry)
    flush_all("adaptive toggled")
    STATE.enabled = enabled
    try:
        yield
    finally:
        flush_all("leave adaptive")
        with _BLOCKS_LOCK:
            i = next(k for k, e in enumerate(_BLOCKS) if e is entry)
            del _BLOCKS[i]
            if i == len(_BLOCKS):
                STATE.enabled = entry[0]     # the latest block: restore (the nested case)
            else:
                _BLOCKS[i][0] = entry[0]     # a later block is open: it restores ours



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
        g = _group_for(key, core, len(operands) + 1)
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
            g.cursor = nxt
        else:
            _record_new(g, sig, op, expr, kinds, loads, store, op_idx, out_idx, scalars, numel,
                        reduce)
        g.scalars.extend(scalars)
        g.scalar_casts.extend(scalar_casts)
        g.n_nodes += 1
        g.ops.append(op)
        g.sids.append(static)
        return True


def record_flat(op: str, expr: str, kinds: tuple, loads: tuple, scalar_casts: tuple, store: str,
                out: tuple, operands: list, scalars: tuple, numel: int, core: int, static: int,
                tails: tuple, fresh: bool = False) -> None:
    """record() for a recording runner (adaptive_fast.learn): every array was made from its
    tensor by numpy() + reshape (`trusted`), `static` is known, and `tails` holds, per operand
    and then the output, the (length, stride, dtype) part of its buffer key (fixed by the
    runner's signature: flat arrays of `numel` elements or single elements). `fresh`: the
    output was just allocated from the host heap (see _Group.new_buf)."""
    key = (_get_ident(), _graph_task_id())
    n_args = len(operands) + 1
    with _lock:
        g = PENDING.get(key)
        if (g is None or g.core != core or g.n_nodes >= MAX_NODES
                or len(g.bufs) + g.n_call_args + n_args > MAX_BUFS
                or g.pinned_bytes > MAX_PINNED_BYTES):
            g = _group_for(key, core, n_args)
        g.descs = descs = []
        index = g.index
        op_idx = []
        for (arr, src, blk), tail in zip(operands, tails):
            k = (src.data_ptr(),) + tail
            j = index.get(k)
            op_idx.append(g.new_buf(k, arr, blk) if j is None else j)
        op_idx = tuple(op_idx)
        k = (out[1].data_ptr(),) + tails[-1]
        out_idx = index.get(k)
        if out_idx is None:
            out_idx = g.new_buf(k, out[0], out[2], fresh)
        sig = (static, op_idx, out_idx, tuple(descs)) if descs else (static, op_idx, out_idx)
        nxt = g.cursor.children.get(sig)
        if nxt is None:
            _record_new(g, sig, op, expr, kinds, loads, store, op_idx, out_idx, scalars, numel,
                        None)
        else:
            # recognised: the cached node, placed where it was placed before
            new_loop, target, node, bk = nxt.step
            if new_loop:
                g.loops.append(_Loop(numel, out_idx))
            g.loops[target].nodes.append(node)
            g.lag.append(bk)
            g.cursor = nxt
        g.scalars.extend(scalars)
        g.scalar_casts.extend(scalar_casts)
        g.n_nodes += 1
        g.ops.append(op)
        g.sids.append(static)


def record_flat_many(items: list, core: int) -> None:
    """record_flat for every element of an in-place foreach call, in order, under one lock and
    one stream key (adaptive_fast's foreach runners). Each item is (facts, out, operands,
    scalars), facts = (op, expr, kinds, loads, scalar_casts, store, numel, static, tails) as
    record_flat takes them. The group gets exactly what one record_flat call per element
    gives it (same buffers, guards, trace edges, limit flushes): only the per-call work
    (the element runner, the lock, the group lookup) is paid once.

    NOTE: the body repeats record_flat's; tests/test_adaptive_fast.py checks that both build
    the same trace (a foreach step hits the trace an element-by-element step recorded)."""
    key = (_get_ident(), _graph_task_id())
    with _lock:
        g = PENDING.get(key)
        for facts, out, operands, scalars in items:
            op, expr, kinds, loads, scalar_casts, store, numel, static, tails = facts
            n_args = len(operands) + 1
            if (g is None or g.core != core or g.n_nodes >= MAX_NODES
                    or len(g.bufs) + g.n_call_args + n_args > MAX_BUFS
                    or g.pinned_bytes > MAX_PINNED_BYTES):
                g = _group_for(key, core, n_args)
            g.descs = descs = []
            index = g.index
            op_idx = []
            for (arr, src, blk), tail in zip(operands, tails):
                k = (src.data_ptr(),) + tail
                j = index.get(k)
                op_idx.append(g.new_buf(k, arr, blk) if j is None else j)
            op_idx = tuple(op_idx)
            k = (out[1].data_ptr(),) + tails[-1]
            out_idx = index.get(k)
            if out_idx is None:
                out_idx = g.new_buf(k, out[0], out[2])
            sig = (static, op_idx, out_idx, tuple(descs)) if descs else (static, op_idx, out_idx)
            nxt = g.cursor.children.get(sig)
            if nxt is None:
                _record_new(g, sig, op, expr, kinds, loads, store, op_idx, out_idx, scalars,
                            numel, None)
            else:
                new_loop, target, node, bk = nxt.step
                if new_loop:
                    g.loops.append(_Loop(numel, out_idx))
                g.loops[target].nodes.append(node)
                g.lag.append(bk)
                g.cursor = nxt
            g.scalars.extend(scalars)
            g.scalar_casts.extend(scalar_casts)
            g.n_nodes += 1
            g.ops.append(op)
            g.sids.append(static)


def _record_new(g: _Group, sig: tuple, op, expr, kinds, loads, store, op_idx, out_idx,
                scalars, numel, reduce) -> None:
    """The analysis of an op not recognised at the group's trace node: place it, apply its
    bookkeeping, grow the trace tree (called under _lock)."""
    if g.lag:
        _sync(g)
    target, ops, new_loop = _place(g, op_idx, out_idx, kinds, numel, reduce)
    base = len(g.scalars)
    node = (expr, loads, store, ops, tuple(range(base, base + len(scalars))), out_idx,
            reduce, g.n_nodes)
    g.loops[target].nodes.append(node)
    bk = (target, ops, op_idx, out_idx, reduce, g.n_nodes)
    _apply(g, bk)
    if _grp._TRACE_NODES[0] >= _grp.MAX_TRACE_NODES:
        _grp._ROOT[0] = _TNode()
        _grp._TRACE_NODES[0] = 0
    nxt = g.cursor.children[sig] = _TNode((new_loop, target, node, bk))
    g.cursor = nxt
    _grp._TRACE_NODES[0] += 1


_get_ident = threading.get_ident
_graph_task_id = torch._C._current_graph_task_id


def _group_for(key, core: int, n_args: int) -> _Group:
    """The stream's pending group that can take an op of `n_args` more kernel arguments (the
    current one, or a new one after launching it). Called under _lock."""
    g = PENDING.get(key)
    if g is not None and id(g) in _LAUNCHING:
        g = None   # (being launched: a new group takes its place, kept after the launch)
    if g is not None and g.core != core:
        _flush_locked(key, "core change")
        g = None
    if g is not None and (g.n_nodes >= MAX_NODES
                          or len(g.bufs) + g.n_call_args + n_args > MAX_BUFS
                          or g.pinned_bytes > MAX_PINNED_BYTES):
        _flush_locked(key, "buffer limit")
        g = None
    if g is None:
        # NOTE: STATE.enabled may have turned off since this op chose to record (another
        # thread left adaptive eager between the choice and here): the group is made anyway.
        # Nothing is lost: dispatch's gate launches a stream's group before its next op while
        # adaptive eager is off (dispatch._adaptive_gate), every read of its memory launches
        # it, and so does the next toggle (flush_all)
        g = PENDING[key] = _Group(core)
        if key[1] != -1:
            _flush_at_end_of_backward(key)
    return g


def record_call(name: str, a: dict, outs: list, blocks: dict) -> bool:
    """A joinable op (adaptive_calls.JOINABLE): its launches, staged, join the pending group
    as calls of its kernels (see eager_neuron/adaptive_calls.py). False: not joinable here (the
    caller launches the group and runs the op as plain eager, learning plain eager's runner,
    which a repeat of its signature takes after the same flush: see _declined_call)."""
    ctx = getattr(_context._TLS, "ctx", None)
    if not _calls.joinable(name, a, outs):
        _declined_call(ctx, "non-joinable call")
        return False
    core = ctx.core if ctx is not None else 0
    try:
        staged = _calls.stage(name, a, outs)
    except Exception:  # noqa: BLE001 -- nothing ran: plain eager's path raises it again,
        return False   # attributed to the user's line (or declined to the CPU fallback)
    if staged is None:
        return False
    if not staged:
        return True
    tensors = [v for v in a.values() if isinstance(v, torch.Tensor)] + list(outs)
    spans = _calls.spans(staged, tensors)
    key = stream_key()
    if spans is None:
        if _declined_call(ctx, "call with a scratch buffer"):
            # first seen: plain eager's path runs the lowering again (nothing staged ran)
            # and leaves its runner for the repeats
            _calls.COUNTERS["declined"] += 1
            return False
        with _lock:
            # a scratch buffer of the lowering: what is pending launches, then these launches,
            # as plain eager runs them (nothing of the op has run yet)
            _calls.COUNTERS["declined"] += 1
            _flush_locked(key, f"non-fusible op {name}")
            _calls.run_now(staged, core)
        return True
    sids = tuple(static_id(*_calls.guard(st)) for st in staged)
    join_calls(name, staged, spans, list(blocks.values()), sids, core)
    learn = LEARN_CALL[0]
    if learn is not None and ctx is not None and ctx.call is not None:
        learn(name, a, outs, staged, sids, core, ctx)
    return True


def _declined_call(ctx, reason: str) -> bool:
    """A joinable op that does not join for a reason its plain fast-path signature decides
    (dtypes, shapes, strides: `ctx.watch`, set by adaptive_fast.arm): remember it (DECLINED),
    so adaptive_fast.run sends a repeat to plain eager's runner after flushing its group (it
    took the whole slow path on every call: a strided bmm of Mamba's, ~100 us, 24 a step).
    True when newly remembered."""
    watched = ctx.watch if ctx is not None else None
    if watched is None:
        return False
    ctx.watch = None
    key = (watched[0], watched[1])
    if key in DECLINED or len(DECLINED) >= 100_000:
        return False
    DECLINED[key] = reason
    return True


# adaptive_fast.learn_call (set when it loads: it imports this module): after a joined call,
# leave the recording runner for its signature
LEARN_CALL: list = [None]


def join_calls(name: str, staged, spans: list, pins, sids: tuple, core: int) -> None:
    """Append the staged launches of one joinable op to the calling stream's group (the slow
    path's record_call and the recording runners of adaptive_fast share this). `spans`: the
    byte spans of all their arrays; `pins`: the op's operand and output blocks; `sids`: per
    launch, static_id of its guard (adaptive_calls.guard)."""
    key = stream_key()
    with _lock:
        g = _group_for(key, core, sum(len(st[2]) for st in staged))
        for blk in pins:
            if blk is not None and id(blk) not in g.pins:
                g.pins[id(blk)] = blk
                g.pinned_bytes += getattr(blk, "nbytes", 0)
        # (no _sync of the recognised ops' bookkeeping: nothing here reads it, and marking
        # hit buffers read from memory commutes with it; a replayed step never applies it)
        for st, sid in zip(staged, sids):
            # every buffer of the group the call's arrays overlap keeps its stores (the call
            # reads memory); ops recorded after the call go to loops after it (the floor)
            hits = _hits(g, spans)
            for j in hits:
                g.bufs[j].mem_read = True
            sig = (sid, hits)
            nxt = g.cursor.children.get(sig)
            if nxt is None:
                nxt = g.cursor.children[sig] = _TNode()
                _grp._TRACE_NODES[0] += 1
            g.cursor = nxt
            g.loops.append(_Call(st, g.n_nodes, spans))
            g.floor = len(g.loops)
            g.call_spans.extend(spans)
            g.n_call_args += len(st[2])
            g.n_nodes += 1
            g.ops.append(name)
            g.sids.append(sid)
        _calls.COUNTERS["joined"] += len(staged)


def _hits(g: _Group, spans: list) -> tuple:
    """The indices of the group's buffers that share a byte with one of the byte spans
    [(lo, hi), ...], in order: found by bisection among the buffers' starts (g.los), as a new
    buffer's overlaps are (a buffer starting at or before lo - max_span ends by lo)."""
    los, los_j, bufs, reach = g.los, g.los_j, g.bufs, g.max_span
    found = set()
    for lo, hi in spans:
        for t in range(bisect_right(los, lo - reach), bisect_left(los, hi)):
            j = los_j[t]
            if bufs[j].hi > lo:
                found.add(j)
    return tuple(sorted(found))


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



def _place(g: _Group, op_idx: tuple, out_idx: int, kinds: tuple, numel: int, reduce) -> tuple:
    """The analysis of a new op: (loop index, operands, whether it opened a new loop).

    After the last loop it conflicts with (reads what it writes, writes what it reads or
    writes); it joins a loop of its size; a value computed earlier in that loop is read from a
    register ("val"), a single element ("one") and the rest from memory ("buf")."""
    COUNTERS["analyses"] += 1
    barrier, aligned = _barrier(g, op_idx, out_idx, kinds, numel)
    target = None
    touched = set(op_idx)
    touched.add(out_idx)
    for li in range(len(g.loops) - 1, max(barrier, g.floor, 0) - 1, -1):
        loop = g.loops[li]
        if loop.numel != numel:
            continue
        if li == barrier and not aligned:
            continue
        if loop.touched.isdisjoint(touched):
            # NOTE: an op sharing no buffer with a loop opens its own: LLVM vectorizes a loop
            # only when it can check its arrays for overlap at run time, which it gives up on
            # for a loop over many arrays (an optimizer's update of every parameter of one
            # size in one loop ran scalar, 4-5x slower than plain eager's kernels)
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
    if any(probe.lo < hi and lo < probe.hi for lo, hi in g.call_spans):
        return True
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


# a fusible op whose lowering launches instead of recording, for a reason its argument
# signature decides: (op, signature) -> that flush reason (adaptive_fast.run then launches the
# group and runs plain eager's runner instead of the funnel); the op being watched is its
# OpContext's `watch` (set by dispatch's _kernel_setup)
DECLINED: dict = {}
DECLINE_REASONS = frozenset({"strided or broadcast operand", "op that can fault",
                             "special function"})
# (and, for joinable calls, recorded by _declined_call: "non-joinable call", "call with a
# scratch buffer")


def flush(reason: str) -> None:
    """Launch the calling stream's pending group (if any) as one fused kernel. `reason` is
    counted and logged."""
    ctx = getattr(_context._TLS, "ctx", None)
    learn = False
    if ctx is not None and ctx.watch is not None:
        watched, ctx.watch = ctx.watch, None
        if reason in DECLINE_REASONS and len(DECLINED) < 100_000:
            DECLINED[watched[0], watched[1]] = reason
            learn = watched[2]
    if PENDING:
        if reason in _DEVICE_WIDE:
            flush_all(reason)
        else:
            key = stream_key()
            if key in PENDING:
                with _lock:
                    _flush_locked(key, reason)
    if learn and ctx.capture is None:
        # the declined op launches as plain eager now, its group launched: the fast path
        # learns plain eager's runner from its launches (see adaptive_fast.arm)
        ctx.capture = []


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


_LAUNCHING: set = set()   # id() of the groups being launched now (under _lock)


def _flush_locked(key, reason: str) -> None:
    # NOTE: the group leaves PENDING when its launch is over, not before: another thread may
    # launch it (flush_others, flush_all) and its owner, reading PENDING without the lock,
    # must still see it pending meanwhile (its ops then take the lock and wait) -- popped
    # first, the owner's plain runners read its outputs before they were computed (a loss of
    # exactly log(C) from all-zero logits, with a cold kernel cache compiling in the launch)
    g = PENDING.get(key)
    if g is None or id(g) in _LAUNCHING:
        return   # (a flush re-entered from this group's own launch: nothing more to do)
    if g.n_nodes == 0:
        del PENDING[key]
        return
    _LAUNCHING.add(id(g))
    try:
        _launch_flushed(g, reason)
    finally:
        _LAUNCHING.discard(id(g))
        if PENDING.get(key) is g:
            del PENDING[key]


def _launch_flushed(g, reason: str) -> None:
    flushes = STATS.flushes
    flushes[reason] = flushes.get(reason, 0) + 1   # (a Counter's += costs 3x this)
    if g.n_nodes == 1:
        ALONE_COUNTS["adaptive_singletons"] += 1
    if LIGHT_NUMEL[0] or ALONE_ON[0]:
        cursor = g.cursor
        if cursor.verdicts < LIGHT_AFTER:
            cursor.verdicts += 1
            if LIGHT_NUMEL[0]:
                _judge(g)
            if ALONE_ON[0]:
                _judge_alone(g)
    if "flush" in config.log:
        from .errors import where

        print(f"[eager_neuron] flush ({reason}): {g.n_nodes} ops in {len(g.loops)} loops "
              f"-> 1 launch [{', '.join(sorted(set(g.ops)))}]\n{where()}", file=sys.stderr)
    # the group's launches are the group's, not the op's being lowered (if any): under no
    # context, a flush while a joinable op is staged (memory pressure) launches for real, and
    # no op's capture takes them (every launch of the group names its core)
    prev = _context.swap(None)
    try:
        launch_group(g, reason)
    finally:
        _context.swap(prev)



# ---------------------------------------------------------------------------------------------
# paying for itself: ops whose groups stay light start no group
# ---------------------------------------------------------------------------------------------
# Recording an op costs the host more than plain eager's runner spends launching it (a trace
# step, its buffers' guard, the group's launch: ~5-15 us against ~2 us), and what fusion saves
# is memory traffic, which grows with the elements a node touches. A group whose elementwise
# nodes average fewer than LIGHT_NUMEL[0] elements (a call counts as a node of none: fusing
# it saves a launch, not a pass over memory) is *light*: it costs more than plain eager.
# Each flushed group is judged (at most LIGHT_AFTER times per trace node: the verdict of a
# repeated trace is known), and every static_id it recorded is counted light or marked heavy.
# An op whose ids were all counted light LIGHT_AFTER times and never heavy does not *start* a
# group: with no group pending on its stream, adaptive_fast.run runs plain eager's runner for
# it (plain eager exactly: nothing is pending on the stream). Recorded inside a pending group
# it joins as before, and an id seen in any heavy group is recorded always.
# NOTE: measured (a chain of 16 float32 elementwise ops, alternated in one process, load ~4):
# adaptive/plain 1.43x at 1K-16K elements, 0.97x at 64K, far below at 256K: 64K is break-even
# for host time. Off by default (EAGER_NEURON_ADAPTIVE_LIGHT=0): judged light, the small ops of
# the sweep's models and of make bench's AdamW steps all run as plain eager, and adaptive eager
# no longer cuts launches or simulated device time (MLP AdamW step: 70 launches, as plain, against
# 8 fused). EAGER_NEURON_ADAPTIVE_LIGHT=65536 (or set_light_numel) puts host time first.
LIGHT_NUMEL = [config.adaptive_light]
LIGHT_AFTER = 2
LIGHT: dict = {}          # static_id -> light groups counted (-1: seen in a heavy group)


def _judge(g: _Group) -> None:
    """Count the group's static ids light or heavy (see LIGHT_NUMEL). Called under _lock."""
    elems = 0
    for lp in g.loops:
        elems += lp.numel * len(lp.nodes)
    light = elems < LIGHT_NUMEL[0] * g.n_nodes
    for sid in set(g.sids):
        n = LIGHT.get(sid, 0)
        if not light:
            LIGHT[sid] = -1
        elif n >= 0 and len(LIGHT) < 1_000_000:
            LIGHT[sid] = n + 1


def set_light_numel(numel: int) -> int:
    """Adaptive eager's host-time policy: ops whose groups average fewer than `numel` elements
    a node run as plain eager once judged light (0: fuse always, the default). Forgets every
    verdict; returns the previous value.

    >>> from eager_neuron.adaptive import MODULE as ad
    >>> prev = ad.set_light_numel(1 << 16); ad.set_light_numel(prev)
    65536
    """
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"set_light_numel: expected a whole number >= 0 of elements, not "
                         f"{numel!r}")
    with _lock:
        prev = LIGHT_NUMEL[0]
        LIGHT_NUMEL[0] = numel
        LIGHT.clear()
        ALONE.clear()
        _clear_verdicts(_grp._ROOT[0])
    return prev


def _clear_verdicts(node) -> None:
    stack = [node]
    while stack:
        n = stack.pop()
        n.verdicts = 0
        stack.extend(n.children.values())


def light(sids) -> bool:
    """Do ops of these static ids not pay for a group of their own (see LIGHT_NUMEL)?"""
    for sid in sids:
        if LIGHT.get(sid, 0) < LIGHT_AFTER:
            return False
    return True


# A group of one op is pure overhead: it launches plain eager's kernel for that op (a trace
# node's kernel, _launch_single) after paying for recording it and for a flush, and fuses
# nothing (tools/ab_adaptive.py: ~30 us per group on top of plain eager's op; a Llama step
# flushes 27 of its 57 groups with one op, most before a broadcast operand the group declines).
# Each flushed group is judged (at most LIGHT_AFTER times per trace node, as above): the
# static id of the op that started it is counted *alone* when the group held that op only, and
# marked -1 when it started a larger group (that op then always records). An op whose id was
# counted alone LIGHT_AFTER times and never started a larger group does not start a group:
# with no group pending on its stream, adaptive_fast.run runs plain eager's runner for it
# (plain eager exactly, as for a light op). Only fusion is at stake, never a value.
# ALONE_ON[0] False: no verdicts taken or used (the earlier behaviour; tools/ab_adaptive.py
# --ab switches it per turn).
ALONE_ON = [True]
ALONE: dict = {}          # static_id -> groups of one it started (-1: it started a larger one)
# stats(): flushed groups of one op, and ops run as plain eager instead of starting one
ALONE_COUNTS = {"adaptive_singletons": 0, "adaptive_alone": 0}


def _judge_alone(g: _Group) -> None:
    """Count the static id of the op that started g alone or mark it -1 (see ALONE). Called
    under _lock."""
    sid = g.sids[0]
    n = ALONE.get(sid, 0)
    if g.n_nodes > 1:
        if n != -1:
            ALONE[sid] = -1
    elif n >= 0 and len(ALONE) < 1_000_000:
        ALONE[sid] = n + 1


def alone(sids) -> bool:
    """Did ops of these static ids only ever start groups of one (see ALONE)?"""
    for sid in sids:
        if ALONE.get(sid, 0) < LIGHT_AFTER:
            return False
    return True


class _AloneCounters:
    def snapshot(self) -> dict:
        return dict(ALONE_COUNTS)

    def reset(self) -> None:
        for k in ALONE_COUNTS:
            ALONE_COUNTS[k] = 0


add_counters(_AloneCounters())


_launch_mod = sys.modules[launch_group.__module__]
_launch_mod.LIGHT_OF[0] = lambda g: bool(LIGHT) and light(g.sids)


# NOTE: no float dtype. Plain eager sums floats into a float64 accumulator compiled with
# fastmath reassoc (lower/reduce.py); the group's epilogue adds in program order. The two agree
# only while the float64 sum is exact: a float64 sum's last bits depend on the order (7 elements
# and up, random data), and so does a float32 sum of values far apart in magnitude ([1e30, 1.0,
# -1e30, 1.0, 3.0, -2.0, 1e-3, 5.0, 7.0]: 12.0 plain, 14.001 fused). Not plain eager's bits, so
# a float sum/mean launches the group and runs as plain eager (an integer sum would be exact in
# any order, but none is recorded here: `dtype=` and int -> int64 promotion change its output)
_TORCH_FLOAT: dict = {}


def try_record_reduction(name: str, a: dict, outs: list, blocks: dict) -> bool:
    """sum/mean over every element of a contiguous tensor of a dtype in _TORCH_FLOAT (none
    today: see there) as a group epilogue; other reductions joined as calls."""
    kind = REDUCTIONS.get(name)
    if kind == "call":
        return record_call(name, a, outs, blocks)
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
