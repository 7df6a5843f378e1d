"""Adaptive eager's group: the buffers, loops and trace tree of one pending fused group.

Data only (eager_neuron/adaptive.py records into it, eager_neuron/adaptive_launch.py launches
it): each kernel argument is a `_Buf` (a 1-D numpy view: address, length, stride, dtype), each
loop a `_Loop` of elementwise nodes, and the group's trace so far a node of the trace tree
(`_TNode`). `_observable` decides which stores something outside the group can see, `_spec`
turns the group into the plain-data spec kernels/fused.py renders.

>>> import numpy as np
>>> from eager_neuron.adaptive_group import _Buf, _overlaps
>>> x = np.zeros(8, np.float32)
>>> _overlaps(_Buf(x[0::2], x.ctypes.data, None), _Buf(x[1::2], x.ctypes.data + 4, None))
False
"""

from __future__ import annotations

import bisect
import sys

import numpy as np
import torch


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
        # indices of the other buffers of the group it overlaps (a set of its own once it has
        # one: most buffers overlap nothing, and a group makes and frees one per buffer)
        self.ov = _NO_OV


_NO_OV = frozenset()


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
    __slots__ = ("numel", "nodes", "size_buf", "last_writer", "touched")

    def __init__(self, numel: int, size_buf: int) -> None:
        self.numel = numel
        self.nodes = []
        self.size_buf = size_buf
        self.last_writer: dict = {}   # buf index -> node id whose value it holds
        self.touched: set = set()     # buf indices its nodes read or write


class _Call:
    """A launch of a joinable op (the matmul family) inside the group: the fused kernel calls
    the op's own kernel at this point of the program, with the op's own arguments (`args`, kept
    whole: the arrays stay n-D). It sits in the group's list of loops, between loops: the loops
    before it run before it, every op recorded after it goes into a loop after it (the group's
    `floor`), so program order holds without analysing what the call reads and writes."""

    __slots__ = ("key", "render", "args", "flops", "bytes", "engine", "dtype_class", "node_id",
                 "spans", "numel", "nodes", "size_buf", "last_writer", "touched")

    def __init__(self, staged: tuple, node_id: int, spans: list) -> None:
        (self.key, self.render, self.args, self.flops, self.bytes, self.engine,
         self.dtype_class) = staged
        self.node_id = node_id
        self.spans = spans            # [(lo, hi)] byte spans of its arrays (read and written)
        # what loops have, empty: code walking the group's loops skips a call
        self.numel = 0
        self.nodes = ()
        self.size_buf = None
        self.last_writer: dict = {}
        self.touched: set = set()


class _Group:
    def __init__(self, core: int = 0) -> None:
        self.core = core              # the NeuronCore the group runs on (and is charged to)
        self.loops: list[_Loop] = []
        self.bufs: list[_Buf] = []
        self.arrs: list = []          # each buffer's array, in buffer order (the kernel's args)
        self.index: dict = {}         # (address, length, stride, dtype) -> buf index
        self.pins: dict = {}          # id(Block) -> Block: no block is freed/pooled while pending
        self.pinned_bytes = 0
        self.hints = True             # addresses from torch's data_ptr (see buf_index)
        self.scalars: list = []
        self.scalar_casts: list[str] = []
        self.n_nodes = 0
        self.ops: list[str] = []
        self.sids: list = []          # per recorded node, its static_id (adaptive._judge)
        self.lines: list[str] = []    # the user's line per recorded op (for fault reports)
        # the trace so far: a node of the trace tree (see _TNode); every op moves it one step
        self.cursor = _ROOT[0]   # (read at run time: tests swap the tree)
        self.descs: list = []         # per new buffer of the op being recorded: its guard
        # bookkeeping of recognised ops not applied yet (see _sync): a replayed op only
        # appends its cached node; placement state is brought up to date when needed
        self.lag: list = []
        # buffer starts, sorted (with their indices), and the longest span: a new buffer's
        # overlaps are found by bisection among the buffers that start before it ends
        self.los: list = []
        self.los_j: list = []
        self.max_span = 0
        self.floor = 0                # ops join loops from this index on (after the last call)
        self.call_spans: list = []    # [(lo, hi)] of every call's arrays
        self.n_call_args = 0

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
        self.arrs.append(arr)
        ov = self._overlapping(b, j)
        # the trace guard of a new buffer: everything placement depends on (its size, stride,
        # dtype, whether it has a block, which earlier buffers it may share bytes with)
        self.descs.append((n, key[2], arr.dtype, block is not None, ov))
        return j

    def new_buf(self, key: tuple, arr: np.ndarray, block, fresh: bool = False) -> int:
        """buf_index's second half for a key not in the group yet (key[0] is arr's address).
        `fresh`: arr's memory was just allocated from the host heap (a recording runner's
        output, never the pool): no live array, hence no buffer of the group, shares a byte
        with it, so its overlaps are not searched."""
        if block is not None and id(block) not in self.pins:
            self.pins[id(block)] = block
            self.pinned_bytes += getattr(block, "nbytes", 0)
        self.index[key] = j = len(self.bufs)
        b = _Buf(arr, key[0], block)
        self.bufs.append(b)
        self.arrs.append(arr)
        ov = self._overlapping(b, j, fresh)
        self.descs.append((key[1], key[2], key[3], block is not None, ov))
        return j

    def _overlapping(self, b: _Buf, j: int, fresh: bool = False) -> tuple:
        """Record (both ways) and return the indices of earlier buffers b overlaps (none when
        b is `fresh`, see new_buf: only its start is recorded)."""
        lo, hi = b.lo, b.hi
        found = ()
        if hi > lo and fresh:
            i = bisect.bisect_right(self.los, lo)
            self.los.insert(i, lo)
            self.los_j.insert(i, j)
            if hi - lo > self.max_span:
                self.max_span = hi - lo
        elif hi > lo:
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
                        if kb.ov is _NO_OV:
                            kb.ov = {j}
                        else:
                            kb.ov.add(j)
                if hits:
                    b.ov = set(hits)
                    found = tuple(sorted(hits))
            i = bisect.bisect_right(los, lo)
            los.insert(i, lo)
            self.los_j.insert(i, j)
            if hi - lo > self.max_span:
                self.max_span = hi - lo
        return found

    def touches(self, spans: list) -> bool:
        """Does any buffer (or call argument) of the group intersect one of the byte spans
        [(lo, hi), ...]?"""
        for b in self.bufs:
            for lo, hi in spans:
                if b.lo < hi and lo < b.hi:
                    return True
        for clo, chi in self.call_spans:
            for lo, hi in spans:
                if clo < hi and lo < chi:
                    return True
        return False


class _TNode:
    """A node of the trace tree: the ops recorded into a group since it started, one edge per
    op, labelled by the op's guard (its code, size, scalar types, which group buffers it reads
    and writes, and each new buffer's size, stride, dtype, block and overlaps). An edge also
    keeps where the op was placed (`step`); a node keeps the launches already built for a group
    that ends there (`launches`, per observable-stores pattern). Equal guards from the root
    mean equal placement decisions, so a recognised op skips the analysis and a recognised
    group its spec, key and kernel lookup: tinygrad's TinyJit capture/replay, guarded."""

    __slots__ = ("children", "step", "launches", "replay", "verdicts")

    def __init__(self, step=None) -> None:
        self.children: dict = {}
        self.step = step
        self.launches: dict = {}
        self.verdicts = 0     # flushes here whose weight adaptive._judge counted
        # for a group that ends here (adaptive_launch.launch_group): per buffer, read from
        # memory by the group; the indices of those that are not (for _observable); the
        # largest loop's size; the indices of the calls among the loops
        self.replay = None


_ROOT = [_TNode()]
_TRACE_NODES = [0]
MAX_TRACE_NODES = 200_000     # a bound on the tree's memory: past it, the tree starts anew
# counted work of the recording and flush paths (tests assert that a repeated step does none)
COUNTERS = {"analyses": 0, "renders": 0, "deferred": 0}


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
    loop = g.loops[target]
    loop.touched.update(op_idx)
    loop.touched.add(out_idx)
    if not reduce:
        loop.last_writer[out_idx] = node_id


def _sync(g: _Group) -> None:
    """Apply the bookkeeping recognised ops skipped (before an analysis or a spec needs it)."""
    lag, g.lag = g.lag, []
    for bk in lag:
        _apply(g, bk)


def _refs_baseline() -> int:
    # what sys.getrefcount reports for a block only the group's pins hold, read the way
    # _observable reads it (the pins dict's value, a local variable, the call's argument)
    pins = {0: object()}
    blk = pins.get(0)
    return sys.getrefcount(blk)


_REFS_BASELINE = _refs_baseline()


def _observable(g: _Group, mem_read=None, unread=None) -> list:
    """Per buffer: can anything outside the group's registers see its memory after a store?

    Yes when any buffer overlapping its byte range (itself included) is read from memory in
    the group, has an owner we cannot track (no block: host scratch, a reinterpreting view), or
    has a block someone besides the group's pins refers to (a live tensor). Counting more
    references than there are only keeps a store: the rule errs on the safe side.
    `mem_read`: the buffers' read-from-memory flags when known (a trace's cached copy);
    `unread`: the indices of the buffers whose flag is False (cached with it)."""
    if mem_read is None:
        if g.lag:
            _sync(g)
        mem_read = [b.mem_read for b in g.bufs]
    if unread is None:
        unread = [j for j, m in enumerate(mem_read) if not m]
    bufs = g.bufs
    out = [True] * len(bufs)
    pins = g.pins
    refs = sys.getrefcount
    unseen = []
    for j in unread:
        bid = bufs[j].block_id
        if bid is None:
            continue   # no block: an owner we cannot track
        blk = pins.get(bid)
        if blk is not None and refs(blk) <= _REFS_BASELINE:
            unseen.append(j)   # only the group holds it: no one outside can look
    blk = None
    if not unseen:
        return out
    for j in unseen:
        out[j] = False
    # an unseen buffer is kept if it may share a byte with a seen one (its `ov` set: exact for
    # equal strides, conservative otherwise)
    seen = out[:]
    for j in unseen:
        for k in bufs[j].ov:
            if seen[k]:
                out[j] = True
                break
    return out


def _spec(g: _Group, keep: list | None = None):
    """Plain-data kernel spec; a store is dropped when nothing can observe the buffer."""
    loops = []
    if g.lag:
        _sync(g)
    if keep is None:
        keep = _observable(g)
    base = 0
    for loop in g.loops:
        if type(loop) is _Call:
            loops.append(("call", loop.key, base, len(loop.args)))
            base += len(loop.args)
            continue
        nodes = []
        for expr, loads, store, ops, scal, out_idx, reduce, node_id in loop.nodes:
            observable = (reduce is not None or keep[out_idx]
                          or loop.last_writer.get(out_idx) != node_id)
            nodes.append((expr, loads, store, tuple(ops), scal,
                          out_idx if observable else None, reduce, node_id))
        loops.append((loop.size_buf, tuple(nodes)))
    return (tuple(loops), len(g.bufs), tuple(g.scalar_casts))
