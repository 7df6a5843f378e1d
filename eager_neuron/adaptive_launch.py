"""Adaptive eager's flush: launch a pending group as one fused kernel (or op by op).

A group whose trace was launched before replays the kernel cached on its trace node (no spec,
render or key); a new trace builds its spec and key once. A fused kernel in neither cache runs
the group op by op (plain eager's kernels) while it compiles in the background
(eager_neuron/adaptive_compile.py), unless the compile mode is "sync".

>>> from eager_neuron.adaptive_launch import set_compile_mode
>>> prev = set_compile_mode("sync"); set_compile_mode(prev)
'sync'
"""

from __future__ import annotations

import sys

from . import elementwise_base as _ewb
from .adaptive_group import COUNTERS, _Call, _Group, _observable, _spec, _sync
from .cache import FORMAT_VERSION
from .config import config
from .stats import STATS

# "background": a group whose fused kernel is not built yet runs op by op while the kernel
# compiles on a background thread (eager_neuron/adaptive_compile.py); "sync": it compiles first
COMPILE = ["background"]
# background mode: the flush of a trace that finds its kernel unbuilt for this many times
# queues the build (1: at once; 2: when the trace repeats)
COMPILE_AFTER = [2]
# a group whose ops are all judged light (adaptive.light: from the next step on, none of them
# starts a group) does not queue its build for LIGHT_DEFER more flushes: the trace is not
# expected again, and its compile would compete with the steps for the interpreter (a light
# trace that does recur, started by an op run() cannot send to plain eager, builds then)
LIGHT_DEFER = 4
LIGHT_OF: list = [lambda g: False]   # adaptive sets it: are all of g's ops judged light?


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

    __slots__ = ("spec", "key", "full_key", "flops", "bytes", "kernel", "seen", "engine",
                 "callees")

    def __init__(self, spec, key, full_key, flops, nbytes) -> None:
        self.spec, self.key, self.full_key = spec, key, full_key
        self.flops, self.bytes = flops, nbytes
        self.kernel = None
        self.seen = 0         # flushes that found no built kernel (see COMPILE_AFTER)
        self.engine = "vector"
        self.callees: dict = {}   # callee key -> its render(): the calls' kernels


_SIM = [None]


_MODS: list = []   # (kernels.compile, adaptive_compile, launch), imported on first use


def _mods() -> list:
    from . import adaptive_compile, launch
    from .kernels import compile as kc

    _MODS[:] = [kc, adaptive_compile, launch]
    return _MODS


def launch_group(g: _Group, reason: str) -> None:
    kc, bg, _launch = _MODS or _mods()
    cursor = g.cursor
    # what the trace decides (equal traces, equal loops and buffers): found once per trace
    # node, as the stores' read flags always were
    rp = cursor.replay
    if rp is None or len(rp[0]) != len(g.bufs):
        COUNTERS["analyses"] += 1   # (a repeated step does none: tests assert it)
        if g.lag:
            _sync(g)
        mem_read = tuple(b.mem_read for b in g.bufs)
        rp = cursor.replay = (
            mem_read,
            tuple(j for j, m in enumerate(mem_read) if not m),   # (see _observable)
            max(lp.numel for lp in g.loops),
            tuple(i for i, lp in enumerate(g.loops) if type(lp) is _Call))
    mem_read, unread, numel, call_at = rp
    parallel = numel >= _ewb.PARALLEL_MIN and kc.parallel_allowed()
    loops = g.loops
    calls = [loops[i] for i in call_at]
    if len(loops) == 1:
        if calls:
            # a call alone is plain eager's launch, under plain eager's key; the trace node
            # keeps its kernel (the edge's guard holds the key and the argument types)
            c = calls[0]
            kernel = cursor.launches.get("call")
            if kernel is not None and not _launch.HOOKS and "kernels" not in config.log \
                    and not config.cache_verify:
                kernel(*c.args)
                STATS.memory_hits += 1
                STATS.launches += 1
                _sim().cores[g.core].launch(c.flops, c.bytes, c.engine, c.dtype_class)
                return
            _launch.launch(c.key, c.render, c.args, flops=c.flops, bytes_moved=c.bytes,
                           engine=c.engine, dtype_class=c.dtype_class, core=g.core)
            cursor.launches["call"] = _launch.MEMORY.get(
                (FORMAT_VERSION,) + c.key + _launch.arg_types(c.args))
            return
        if len(g.loops[0].nodes) == 1 and g.loops[0].nodes[0][6] is None:
            _launch_single(g, parallel, reason)
            return

    keep = _observable(g, mem_read, unread)
    args = (*g.arrs, *g.scalars)
    if calls:
        args += tuple(a for c in calls for a in c.args)
    lkey = (tuple(keep), parallel)
    ent = cursor.launches.get(lkey)
    if ent is None:
        # a trace not launched before: its spec, key and cost, once
        STATS.trace_misses += 1
        COUNTERS["analyses"] += 1
        spec = _spec(g, keep)
        stored = sum(g.bufs[n[5]].arr.nbytes for lp in spec[0] if lp[0] != "call"
                     for n in lp[1] if n[5] is not None)
        loaded = sum(b.arr.nbytes for b in g.bufs if b.last_read >= 0)
        key = ("fused", spec, parallel)
        # NOTE: one charge for the whole kernel: the calls' cost (on their engine, the tensor
        # engine for a matmul) plus the loops'
        ent = _Launch(spec, key, (FORMAT_VERSION,) + key + _launch.arg_types(args),
                      float(numel * (g.n_nodes - len(calls)) + sum(c.flops for c in calls)),
                      float(stored + loaded + sum(c.bytes for c in calls)))
        ent.engine = calls[0].engine if calls else "vector"
        ent.callees = {c.key: c.render for c in calls}
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
            if ent.seen >= COMPILE_AFTER[0] and not (
                    ent.seen < COMPILE_AFTER[0] + LIGHT_DEFER and LIGHT_OF[0](g)) and \
                    not bg.submit(ent.full_key, _renderer(ent.spec, parallel, ent.callees), args):
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
            _sim().cores[g.core].launch(ent.flops, ent.bytes, ent.engine, "fp32")
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

            _launch.launch(ent.key, _renderer(ent.spec, parallel, ent.callees), args,
                           flops=ent.flops, bytes_moved=ent.bytes, engine=ent.engine,
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


def _sim():
    sim = _SIM[0]
    if sim is None:
        from .simulator import SIM as sim

        _SIM[0] = sim
    return sim


def _from_disk(ent: _Launch, parallel: bool, args: tuple):
    """The fused kernel from the disk tier (an earlier process built it), else None."""
    from . import launch as _launch

    disk = _launch.DISK
    if disk is None:
        return None
    render = _renderer(ent.spec, parallel, ent.callees)
    # the render index first (as launch() asks it): a warm process renders no fused source
    kernel = disk.load_indexed(ent.full_key, args, render)
    if kernel is not None:
        _launch.RSTATS.render_index_hits += 1
    else:
        source, _name = render()
        _launch.RSTATS.kernel_renders += 1
        kernel = disk.load(ent.full_key, args, source, render=render)
        if kernel is None:
            return None
    STATS.disk_hits += 1
    _launch.MEMORY.put(ent.full_key, kernel)
    return kernel


def _launch_single(g: _Group, parallel: bool, reason: str) -> None:
    """A group of one elementwise node is plain eager's kernel, under plain eager's key: a
    flush after a single op (the common case before a non-fusible op) compiles nothing new.
    tests/test_adaptive.py checks that such a flush compiles nothing after plain eager ran."""
    node = g.loops[0].nodes[0]
    _kc, _bg, _launch = _MODS or _mods()
    cursor = g.cursor
    hit = cursor.launches.get(("one", parallel))
    direct = not _launch.HOOKS and "kernels" not in config.log and not config.cache_verify
    if hit is not None and direct:
        # the trace node's kernel (plain eager's, found by _launch_plain the first time)
        kernel, flops, nbytes = hit
        _expr, _loads, _store, ops, scal, out_idx, _reduce, _nid = node
        bufs, scalars = g.bufs, g.scalars
        kernel(bufs[out_idx].arr, *[bufs[j].arr for _, j in ops], *[scalars[i] for i in scal])
        STATS.memory_hits += 1
        STATS.launches += 1
        _sim().cores[g.core].launch(flops, nbytes, "vector", "fp32")
    else:
        found = _launch_plain(g, node, node[3], parallel, reason)
        if found is not None and direct:
            cursor.launches[("one", parallel)] = found
    STATS.fused_launches += 1
    STATS.fused_ops += 1


def _launch_plain(g: _Group, node, ops, parallel: bool, reason: str):
    """Launch one recorded elementwise node with plain eager's kernel and key; returns
    (kernel, flops, bytes) when the kernel is in the memory cache now, else None.

    NOTE: the key and render mirror lower/elementwise.py lower_elementwise's flat launch."""
    from .kernels import elementwise as kew
    from .kernels import vmath
    from .launch import MEMORY, full_key, launch
    expr, loads, store, _ops, scal, out_idx, _reduce, node_id = node
    kinds = tuple("one" if kind == "one" else "flat" for kind, _ in ops)
    casts = tuple(g.scalar_casts[i] for i in scal)
    arrays = [g.bufs[out_idx].arr] + [g.bufs[j].arr for _, j in ops]

    def render():
        COUNTERS["renders"] += 1
        src, name = kew.render(expr, kinds, 1, loads, casts, store, parallel)
        vm = vmath.VMATH_PRELUDE if vmath.needs_vmath(expr) else ""
        return vm + _ewb.PRELUDE + src, name

    key = ("elementwise", g.ops[node_id], expr, kinds, 1, loads, casts, store, parallel,
           _ewb.PRELUDE_ID, False)
    args = (*arrays, *(g.scalars[i] for i in scal))
    flops = float(arrays[0].size * max(1, expr.count("(")))
    nbytes = float(sum(x.nbytes for x in arrays))
    launch(key, render, args, flops=flops, bytes_moved=nbytes, engine="vector",
           extra={"group_ops": 1, "flush_reason": reason}, core=g.core)
    kernel = MEMORY.get(full_key(key, args))
    return None if kernel is None else (kernel, flops, nbytes)


def _run_one_by_one(g: _Group, reason: str = "replay") -> None:
    """Run the group node by node, in program order, each with its own small kernel: what
    plain eager runs (every store kept). Used while the fused kernel builds in the background
    and when it cannot be built; nothing of the group has run before."""
    from .kernels import compile as kc
    from .launch import launch

    order = sorted((n[7], li, n) for li, lp in enumerate(g.loops) for n in lp.nodes)
    # a call runs where it was recorded: after every node recorded before it
    order += [(lp.node_id, li, lp) for li, lp in enumerate(g.loops) if type(lp) is _Call]
    order.sort(key=lambda t: t[0])
    writers = {n[7]: n[5] for lp in g.loops for n in lp.nodes}
    allowed = kc.parallel_allowed()
    for _id, li, node in order:
        if type(node) is _Call:
            launch(node.key, node.render, node.args, flops=node.flops, bytes_moved=node.bytes,
                   engine=node.engine, dtype_class=node.dtype_class, core=g.core)
            continue
        expr, loads, store, ops, scal, out_idx, reduce, _ = node
        # a "val" operand refers to a node of the same loop: its buffer holds the value now
        fixed = tuple(("buf", writers[ref]) if kind == "val" else (kind, ref)
                      for kind, ref in ops)
        numel = g.loops[li].numel
        parallel = numel >= _ewb.PARALLEL_MIN and allowed
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


def _renderer(spec: tuple, parallel: bool, callees: dict | None = None):
    """render() for launch: the fused source behind the preludes its expressions call and the
    sources of the kernels it calls (`callees`: callee key -> that kernel's render())."""
    from .kernels import fused as kf
    from .kernels.vmath import VMATH_PRELUDE, needs_vmath

    def render():
        COUNTERS["renders"] += 1
        inner, names = [], {}
        for ckey, crender in (callees or {}).items():
            csrc, cname = crender()
            inner.append(csrc)
            names[ckey] = cname
        src, name = kf.render(spec, parallel, names)
        vm = VMATH_PRELUDE if needs_vmath(src) else ""
        return vm + _ewb.PRELUDE + _special_prelude(src) + "".join(inner) + src, name
    return render


def _special_prelude(src: str) -> str:
    return _ewb.SPECIAL_PRELUDE if _ewb.SPECIAL_RE.search(src) else ""
