"""Profiler: every op and kernel launch tied to the user's source line.

    1. record: a dispatch hook (dispatch.OP_HOOKS) around each op and a launch hook
       (launch.HOOKS) per kernel append raw records to one process-wide list; each thread keeps
       its own stack of open ops, so autograd's device thread records safely beside the main one
    2. attribute: a top-level op gets the first frame outside torch and eager_neuron; a backward
       op gets "backward of <forward line>" through the autograd node's sequence number, which
       the forward op recorded with its line
    3. materialize at exit: `Event`s with inclusive and self times, and the device time that no
       kernel explains (DMA transfers) as `transfer` events cut from the simulated clock
    4. views: table(), export_chrome_trace(), to_dataframe(), to_parquet()

>>> import torch, eager_neuron
>>> with eager_neuron.profile() as prof:
...     y = torch.ones(4, device="neuron") * 2
>>> print(prof.table(group_by="op"))  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import linecache
import os
import sys
import threading
from collections import defaultdict
from time import perf_counter_ns

import torch

from . import dispatch as _dispatch
from . import launch as _launch
from .errors import _SKIP
from .simulator import SIM

_Tensor = torch.Tensor
_current_node = torch._C._current_autograd_node
_sequence_nr = torch._C._autograd._get_sequence_nr
_torch_prof = torch.autograd.profiler   # `_is_profiler_enabled` is read per launch, not cached

# -- the recorder: process-wide, shared by nested sessions --------------------------------------
_LOCK = threading.Lock()
_TLS = threading.local()      # per thread: stack of open ops, thread label, last autograd seq nr
_RECORDS: list = []           # _Op / _Kernel / _Flush in start order (list.append is atomic)
_SEQ_LOC: dict = {}           # autograd sequence nr -> forward location of the op that made it
_PENDING: list = []           # kernel ops that launched nothing (recorded by adaptive eager)
_SESSIONS = [0]
_SKIP_CODE: dict = {}         # code object -> True if it lives in torch / eager_neuron / stdlib
# NOTE: errors._SKIP plus kernels/ and cache/, which sit beside eager_neuron/ in the repository
_SKIP_PREFIXES = (*_SKIP, *(os.path.dirname(sys.modules[m].__file__)
                            for m in ("eager_neuron.kernels", "eager_neuron.cache")),
                  "<eager_neuron")


class _Op:
    __slots__ = ("clk0", "clk1", "flush_reason", "group", "inputs", "kind", "launches", "loc",
                 "name", "parent", "t0", "t1", "thread")

    def __init__(self, name, kind, inputs, parent, thread, loc, clk0):
        self.name = name
        self.kind = kind
        self.inputs = inputs          # [(torch.Size, dtype)], never the tensors themselves
        self.parent = parent
        self.thread = thread
        self.loc = loc
        self.clk0 = clk0              # per-core simulated clock at entry / exit
        self.clk1 = None
        self.t1 = 0
        self.launches = 0
        self.group = None
        self.flush_reason = None


class _Kernel:
    __slots__ = ("clock", "core", "event", "group", "loc", "op", "t", "thread")

    def __init__(self, event, op, t, core, clock, thread, loc, group):
        self.event, self.op, self.t, self.core = event, op, t, core
        self.clock, self.thread, self.loc, self.group = clock, thread, loc, group


class _Flush:
    __slots__ = ("group", "loc", "n_ops", "op", "reason", "t", "thread")

    def __init__(self, reason, n_ops, group, op, t, thread, loc):
        self.reason, self.n_ops, self.group, self.op = reason, n_ops, group, op
        self.t, self.thread, self.loc = t, thread, loc


def _thread_state():
    tls = _TLS
    try:
        return tls.stack, tls.thread
    except AttributeError:
        tls.stack = []
        tls.thread = threading.current_thread().name
        tls.last_seq = -1
        return tls.stack, tls.thread


def _user_frame():
    """(code, instruction offset, None) of the first frame outside torch, eager_neuron and the
    stdlib. NOTE: the line number is resolved when the profile ends (f_lineno costs ~1 us)."""
    f = sys._getframe(2)
    skip = _SKIP_CODE
    while f is not None:
        code = f.f_code
        s = skip.get(code)
        if s is None:
            fn = code.co_filename
            s = skip[code] = fn.startswith(_SKIP_PREFIXES)
        if not s:
            return (code, f.f_lasti, None)
        f = f.f_back
    return None


def _locate():
    """Location of a top-level op: (code, offset, grad_fn or None) or None.

    NOTE: autograd runs a neuron tensor's backward on its own device thread, where no user frame
    exists; the node being run carries the forward op's sequence number instead.
    """
    node = _current_node()
    if node is not None:
        fwd = _SEQ_LOC.get(node._sequence_nr())
        name = node.name()
        return (fwd[0], fwd[1], name) if fwd else (None, None, name)
    loc = _user_frame()
    # the op's autograd node (if it has one) was made just before dispatch: its number is seq-1
    seq = _sequence_nr()
    if seq != _TLS.last_seq:
        _TLS.last_seq = seq
        if loc is not None:
            _SEQ_LOC[seq - 1] = loc
    return loc


def _inputs(args, kwargs) -> list:
    out = []
    for a in (args if not kwargs else (*args, *kwargs.values())):
        if isinstance(a, _Tensor):
            out.append((a.shape, a.dtype))
        elif type(a) in (list, tuple) and a and isinstance(a[0], _Tensor):
            out.extend((t.shape, t.dtype) for t in a if isinstance(t, _Tensor))
    return out


class _Exit:
    """The context OP_HOOKS returns: one shared object, the state is on the thread's stack."""

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        t = perf_counter_ns()
        op = _TLS.stack.pop()
        op.t1 = t
        op.clk1 = [c.clock_us for c in SIM.cores]
        # adaptive eager recorded this op instead of launching it: record_flush names its group
        if op.kind == "kernel" and not op.launches and op.clk1 == op.clk0:
            _PENDING.append(op)
        return False


_EXIT = _Exit()


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_NULL = _Null()
_ERRORS = [0]   # records the profiler failed to take (it never fails the user's op)


def _op_hook(plan, args, kwargs):
    try:
        stack, thread = _TLS.stack, _TLS.thread
    except AttributeError:
        stack, thread = _thread_state()
    try:
        parent = stack[-1] if stack else None
        loc = parent.loc if parent is not None else _locate()
        op = _Op(plan.name, plan.kind, _inputs(args, kwargs), parent, thread, loc,
                 [c.clock_us for c in SIM.cores])
    except Exception:  # noqa: BLE001 - a profiler bug must not fail the user's op
        _ERRORS[0] += 1
        return _NULL
    stack.append(op)
    _RECORDS.append(op)
    op.t0 = perf_counter_ns()
    return _EXIT


def _launch_hook(event: dict) -> None:
    t = perf_counter_ns()
    try:
        core = _launch._current_core[0]
        stack, thread = _thread_state()
        op = stack[-1] if stack else None
        if op is not None:
            op.launches += 1
            loc = op.loc
        else:
            loc = _user_frame()
        group = event.get("group")
        if group is None and event.get("group_ops") is not None:
            # a fused group launched without record_flush: all recorded ops are its members
            group = _implicit_flush(event, op, thread, loc)
        elif _PENDING and group is None:
            _PENDING.clear()  # a plain launch: whatever launched nothing before was no recording
        _RECORDS.append(
            _Kernel(event, op, t, core, SIM.cores[core].clock_us, thread, loc, group))
        if _torch_prof._is_profiler_enabled:
            _annotate_torch_profiler(event, core)
    except Exception:  # noqa: BLE001 - a profiler bug must not fail the user's kernel
        _ERRORS[0] += 1


def _annotate_torch_profiler(event: dict, core: int) -> None:
    """A `neuron::<family>:<op>` marker in torch.profiler's CPU timeline, right after the kernel.

    NOTE: a Python backend cannot add device-side activity to Kineto (that needs a C++ profiler
    plugin), and launch.HOOKS fire after the kernel ran, so this is a marker, not a range.
    """
    key = event["key"]
    with torch._C._profiler._RecordFunctionFast(
            "neuron::" + _kernel_name(key),
            keyword_values={"outcome": event["outcome"], "device_us": float(event["device_us"]),
                            "host_us": float(event["host_us"]), "core": core,
                            "engine": str(event["engine"])}):
        pass


_GROUP_IDS = [0]


def _implicit_flush(event: dict, op, thread, loc) -> str:
    """adaptive.py launches one pending group per flush with extra={"group_ops": n,
    "flush_reason": r}: every op recorded since the last launch belongs to it."""
    with _LOCK:
        members = _PENDING[:]
        _PENDING.clear()
        _GROUP_IDS[0] += 1
        group = f"g{_GROUP_IDS[0]}"
    reason = event.get("flush_reason")
    for m in members:
        m.group, m.flush_reason = group, reason
    _RECORDS.append(_Flush(reason, event["group_ops"], group, op, perf_counter_ns(), thread, loc))
    return group


def record_flush(reason: str, n_ops: int, group_id=None) -> None:
    """Adaptive eager calls this once per fused group, in launch order, when it flushes.

    The oldest `n_ops` kernel ops that launched nothing since the last call become members of
    `group_id` with this flush reason; the flush itself is an event at the current user line.
    Cheap no-op when no profiler is running.

    >>> from eager_neuron.profiler import record_flush
    >>> record_flush("host read", 3, 7)    # outside a profile: nothing happens
    """
    if not _SESSIONS[0]:
        return
    with _LOCK:
        members = _PENDING[:n_ops]
        del _PENDING[:n_ops]
    for op in members:
        op.group = group_id
        op.flush_reason = reason
    stack, thread = _thread_state()
    op = stack[-1] if stack else None
    loc = op.loc if op is not None else _user_frame()
    _RECORDS.append(_Flush(reason, n_ops, group_id, op, perf_counter_ns(), thread, loc))


# -- sessions ------------------------------------------------------------------------------------

def _start() -> int:
    with _LOCK:
        if _SESSIONS[0] == 0:
            _RECORDS.clear()
            _SEQ_LOC.clear()
            _PENDING.clear()
            _dispatch.OP_HOOKS.insert(0, _op_hook)
            _launch.HOOKS.append(_launch_hook)
        _SESSIONS[0] += 1
        return len(_RECORDS)


def _stop(first: int) -> list:
    with _LOCK:
        raw = _RECORDS[first:]
        _SESSIONS[0] -= 1
        if _SESSIONS[0] == 0:
            _dispatch.OP_HOOKS.remove(_op_hook)
            _launch.HOOKS.remove(_launch_hook)
            _RECORDS.clear()
            _SEQ_LOC.clear()
            _PENDING.clear()
    return raw


@dataclasses.dataclass(slots=True)
class Event:
    """One row of a profile. `type` is op | kernel | transfer | flush; times are microseconds.

    Host times are relative to the profile's start (perf_counter); device times are on the
    core's simulated clock, also relative to the start. `parent` is the id of the op that ran
    this event (the enclosing op for an op). `group` / `flush_reason` are set for ops and kernels
    of an adaptive-eager fused group.
    """

    id: int
    type: str
    name: str                        # aten::op.overload, family:op, "dma" or the flush reason
    kind: str | None = None          # op: view/kernel/decomp/host/alloc/foreach/fallback
    parent: int | None = None
    depth: int = 0
    thread: str = ""
    phase: str | None = None         # forward | backward (None: no user location known)
    shapes: list | None = None       # input shapes of the op (for a kernel: of its op)
    dtypes: list | None = None
    key: str | None = None           # kernel key as given to launch()
    outcome: str | None = None       # memory | disk | compile
    compile_ms: float | None = None
    host_start_us: float | None = None
    host_us: float | None = None     # inclusive host time
    self_host_us: float | None = None
    device_start_us: float | None = None
    device_us: float | None = None   # simulated device time (inclusive for an op, all cores)
    self_device_us: float | None = None
    core: int | None = None
    bytes: float | None = None
    flops: float | None = None
    engine: str | None = None
    group: str | None = None
    flush_reason: str | None = None
    n_ops: int | None = None
    file: str | None = None
    line: int | None = None
    function: str | None = None
    source: str | None = None
    location: str = "<unknown>"
    grad_fn: str | None = None
    extra: dict | None = None        # launch-event keys the profiler does not know, passed on


FIELDS = tuple(f.name for f in dataclasses.fields(Event))
_LAUNCH_KEYS = frozenset(
    ("key", "outcome", "compile_s", "host_us", "device_us", "bytes", "flops", "engine", "group",
     "group_ops", "flush_reason"))


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype) -> str:
    name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def _kernel_name(key) -> str:
    if isinstance(key, tuple) and len(key) >= 2:
        return f"{key[0]}:{key[1]}" if isinstance(key[1], str) else str(key[0])
    return str(key)


def _place(loc) -> tuple:
    """(phase, grad_fn, file, line, function, source, location) of a raw location."""
    if loc is None:
        return (None, None, None, None, None, None, "<unknown>")
    code, offset, grad_fn = loc
    phase = "forward" if grad_fn is None else "backward"
    if code is None:
        return (phase, grad_fn, None, None, None, None, "<backward>")
    file, func = code.co_filename, code.co_name
    line = next((ln for start, end, ln in code.co_lines() if start <= offset < end), None)
    line = line if line is not None else code.co_firstlineno
    source = linecache.getline(file, line).strip() or None
    here = f"{os.path.basename(file)}:{line} in {func}"
    return (phase, grad_fn, file, line, func, source,
            here if grad_fn is None else f"backward of {here}")


def _materialize(raw: list, t0: int, t_end: int, clk0: list, clk1: list) -> list[Event]:
    """Raw records -> Events, with ids, self times and the device gaps that no kernel explains."""
    # 1. ops, kernels and flushes in start order
    events: list[Event] = []
    ids: dict = {}
    kids = defaultdict(list)         # op id (None: outside ops) -> child op events
    own_kernels = defaultdict(list)  # op id (None: outside ops) -> kernel events it launched
    op_clocks: dict = {}
    keys: dict = {}                  # kernel key -> (name, repr): keys repeat, launch after launch
    places: dict = {}                # raw location -> its Event fields
    for r in raw:
        ev = Event(id=len(events), type="", name="")
        if type(r) is _Op:
            ids[id(r)] = ev.id
            parent = ids.get(id(r.parent)) if r.parent is not None else None
            c0, c1 = r.clk0, r.clk1 if r.clk1 is not None else r.clk0
            op_clocks[ev.id] = (c0, c1)
            ev.type, ev.name, ev.kind, ev.parent = "op", r.name, r.kind, parent
            ev.depth = events[parent].depth + 1 if parent is not None else 0
            ev.shapes = [list(s) for s, _ in r.inputs]
            ev.dtypes = [_DTYPE_NAMES.get(d) or _dtype_name(d) for _, d in r.inputs]
            ev.host_start_us = (r.t0 - t0) / 1e3
            ev.host_us = ((r.t1 or t_end) - r.t0) / 1e3
            ev.device_us = sum(c1) - sum(c0) if len(c0) == len(c1) else 0.0
            moved = [i for i in range(min(len(c0), len(c1))) if c1[i] != c0[i]]
            ev.core = moved[0] if moved else None
            if r.group is not None:
                ev.group, ev.flush_reason = str(r.group), r.flush_reason
            kids[parent].append(ev)
        elif type(r) is _Kernel:
            e = r.event
            op = ids.get(id(r.op)) if r.op is not None else None
            key = keys.get(e["key"])
            if key is None:
                key = keys[e["key"]] = (_kernel_name(e["key"]), repr(e["key"]))
            ev.type, ev.parent, (ev.name, ev.key) = "kernel", op, key
            ev.depth = events[op].depth + 1 if op is not None else 0
            if op is not None:
                ev.shapes, ev.dtypes = events[op].shapes, events[op].dtypes
            ev.outcome, ev.compile_ms = e["outcome"], e["compile_s"] * 1e3
            ev.host_us = ev.self_host_us = e["host_us"]
            ev.host_start_us = (r.t - t0) / 1e3 - e["host_us"]
            ev.device_us = ev.self_device_us = e["device_us"]
            ev.core = r.core
            base = clk0[r.core] if r.core < len(clk0) else 0.0
            ev.device_start_us = r.clock - e["device_us"] - base
            ev.bytes, ev.flops, ev.engine = float(e["bytes"]), float(e["flops"]), e["engine"]
            if r.group is not None:
                ev.group, ev.flush_reason, ev.n_ops = str(r.group), e.get("flush_reason"), e.get(
                    "group_ops")
            extra = {k: v for k, v in e.items() if k not in _LAUNCH_KEYS}
            if extra:   # NOTE: through JSON once, so the rows equal what Parquet gives back
                ev.extra = json.loads(json.dumps(extra, default=str))
            own_kernels[op].append(ev)
        else:
            op = ids.get(id(r.op)) if r.op is not None else None
            ev.type, ev.name, ev.parent = "flush", r.reason, op
            ev.flush_reason, ev.n_ops = r.reason, r.n_ops
            ev.group = str(r.group) if r.group is not None else None
            ev.host_start_us, ev.host_us = (r.t - t0) / 1e3, 0.0
        ev.thread = r.thread
        place = places.get(r.loc)
        if place is None:
            place = places[r.loc] = _place(r.loc)
        (ev.phase, ev.grad_fn, ev.file, ev.line, ev.function, ev.source, ev.location) = place
        events.append(ev)
    # 2. a fused kernel is named after its group's ops: fused:add+mul+relu
    members = defaultdict(list)
    for ev in events:
        if ev.type == "op" and ev.group is not None:
            members[ev.group].append(ev.name.split("::")[-1].split(".")[0])
    for ev in events:
        if ev.type == "kernel" and ev.group in members and ":" not in ev.name:
            ev.name = f"{ev.name}:{'+'.join(members[ev.group])}"
    # 3. self times: inclusive minus the children's
    for ev in events:
        if ev.type == "op":
            children = kids.get(ev.id, ())
            ev.self_host_us = ev.host_us - sum(c.host_us for c in children)
            ev.self_device_us = ev.device_us - sum(c.device_us for c in children)
    # 4. device time inside an op (or outside all ops) that no kernel or child op covers: the
    #    simulated clock is serial per core, so these gaps are transfers (DMA) charged directly
    charged = [ev.id for ev in events if ev.type == "op" and ev.device_us > 0]
    for op_id in [None] + charged:
        c0, c1 = (clk0, clk1) if op_id is None else op_clocks[op_id]
        for core in range(min(len(c0), len(c1))):
            if c1[core] - c0[core] <= 1e-9:
                continue
            base = clk0[core] if core < len(clk0) else 0.0
            covered = [(k.device_start_us + base, k.device_start_us + base + k.device_us)
                       for k in own_kernels.get(op_id, ()) if k.core == core]
            covered += [(op_clocks[c.id][0][core], op_clocks[c.id][1][core])
                        for c in kids.get(op_id, ()) if core < len(op_clocks[c.id][1])]
            covered.sort()
            cursor = c0[core]
            for lo, hi in covered + [(c1[core], c1[core])]:
                if lo - cursor > 1e-6:
                    events.append(_transfer(len(events), events, op_id, core, cursor - base,
                                            lo - cursor))
                cursor = max(cursor, hi)
    return events


def _transfer(eid: int, events: list, op_id, core: int, start: float, dur: float) -> Event:
    ev = Event(id=eid, type="transfer", name="dma", parent=op_id, core=core, engine="dma",
               device_start_us=start, device_us=dur, self_device_us=dur)
    if op_id is not None:
        op = events[op_id]
        ev.depth, ev.thread, ev.phase, ev.grad_fn = op.depth + 1, op.thread, op.phase, op.grad_fn
        ev.file, ev.line, ev.function, ev.source = op.file, op.line, op.function, op.source
        ev.location, ev.shapes, ev.dtypes = op.location, op.shapes, op.dtypes
    else:
        ev.location = "<outside ops>"
    return ev


# -- the session and its views -------------------------------------------------------------------

_GROUPS = {
    # group_by: columns in display order (the first is the group's key)
    "line": ("location", "calls", "kernels", "compiles", "compile_ms", "host_ms", "device_us",
             "dma_us", "mbytes", "fused", "ops", "source"),
    "op": ("name", "calls", "kernels", "compiles", "host_ms", "self_host_ms", "device_us",
           "self_device_us", "dma_us"),
    "kernel": ("kernel", "launches", "memory", "disk", "compiles", "compile_ms", "host_us",
               "device_us", "mbytes", "engine", "group"),
}
class Table(str):
    """The table text; shown as a table, not a quoted string, when a REPL echoes it."""

    def __repr__(self) -> str:
        return str(self)


_ALIASES = {"device": "device_us", "host": "host_ms", "time": "device_us", "compile": "compile_ms",
            "bytes": "mbytes", "count": "calls"}


class Profile:
    """`with eager_neuron.profile() as prof:` records every op and kernel launch in the block.

    >>> import torch, eager_neuron
    >>> with eager_neuron.profile() as prof: _ = torch.ones(8, device="neuron") + 1
    >>> any(e.type == "kernel" for e in prof.events)
    True
    """

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.totals: dict = {}

    def __enter__(self) -> Profile:  # noqa: PYI034
        self._first = _start()
        self._errors0 = _ERRORS[0]
        self._clk0 = [c.clock_us for c in SIM.cores]
        self._t0 = perf_counter_ns()
        return self

    def __exit__(self, *exc) -> bool:
        t_end = perf_counter_ns()
        clk1 = [c.clock_us for c in SIM.cores]
        raw = _stop(self._first)
        self.events = _materialize(raw, self._t0, t_end, self._clk0, clk1)
        self.totals = self._totals((t_end - self._t0) / 1e3, clk1)
        return False

    def _totals(self, wall_us: float, clk1: list) -> dict:
        ops = [e for e in self.events if e.type == "op"]
        kernels = [e for e in self.events if e.type == "kernel"]
        outcomes = defaultdict(int)
        for k in kernels:
            outcomes[k.outcome] += 1
        n = min(len(clk1), len(self._clk0))
        return {
            "wall_ms": wall_us / 1e3, "ops": len(ops),
            "top_level_ops": sum(1 for e in ops if e.depth == 0),
            "host_ms": sum(e.host_us for e in ops if e.depth == 0) / 1e3,
            "launches": len(kernels), "compiles": outcomes["compile"],
            "memory_hits": outcomes["memory"], "disk_hits": outcomes["disk"],
            "compile_ms": sum(k.compile_ms for k in kernels),
            "device_us": sum(clk1[i] - self._clk0[i] for i in range(n)),
            "kernel_device_us": sum(k.device_us for k in kernels),
            "flushes": sum(1 for e in self.events if e.type == "flush"),
            "dropped": _ERRORS[0] - self._errors0,   # records the profiler failed to take
        }

    # -- rows ----------------------------------------------------------------------------------
    def rows(self) -> list[dict]:
        """One dict per event (the columns of to_dataframe / to_parquet).

        >>> import torch, eager_neuron
        >>> with eager_neuron.profile() as prof: _ = torch.ones(8, device="neuron") + 1
        >>> prof.rows()[-1]["type"]
        'kernel'
        """
        return [{f: getattr(e, f) for f in FIELDS} for e in self.events]

    def summary(self, group_by: str = "line", sort_by: str = "device_us") -> list[dict]:
        """Aggregated rows, as table() prints them (group_by: line | op | kernel).

        >>> import torch, eager_neuron
        >>> with eager_neuron.profile() as prof: _ = torch.ones(8, device="neuron") + 1
        >>> [r["calls"] for r in prof.summary(group_by="line")]  # doctest: +SKIP
        """
        if group_by not in _GROUPS:
            raise ValueError(f"group_by={group_by!r}: choose one of {sorted(_GROUPS)}")
        columns = _GROUPS[group_by]
        own: dict = {}      # op id -> (kernels, compiles, DMA us) it ran itself
        for e in self.events:
            if e.type in ("kernel", "transfer") and e.parent is not None:
                k, c, d = own.get(e.parent, (0, 0, 0.0))
                if e.type == "kernel":
                    own[e.parent] = (k + 1, c + (e.outcome == "compile"), d)
                else:
                    own[e.parent] = (k, c, d + e.device_us)
        groups: dict = {}
        fold = _AGGREGATE[group_by]
        for e in self.events:
            row = fold(groups, e, own)
            if row is not None:
                row.setdefault("_first", e.id)
        rows = list(groups.values())
        for row in rows:
            names = row.pop("_ops", None)
            if names is not None:
                top = sorted(names.items(), key=lambda kv: -kv[1])
                row["ops"] = ", ".join(n.replace("aten::", "") for n, _ in top[:3]) + (
                    ", ..." if len(top) > 3 else "")
        sort_by = _ALIASES.get(sort_by, sort_by)
        if sort_by in ("first", "order"):
            rows.sort(key=lambda r: r["_first"])
        elif sort_by not in columns:
            raise ValueError(f"sort_by={sort_by!r}: choose one of {columns} or 'first'")
        elif rows and isinstance(rows[0].get(sort_by), str):
            rows.sort(key=lambda r: r.get(sort_by) or "")
        else:
            rows.sort(key=lambda r: -(r.get(sort_by) or 0))
        for row in rows:
            row.pop("_first", None)
        return rows

    def table(self, sort_by: str = "device_us", group_by: str = "line",
              row_limit: int = 30) -> Table:
        """A readable table: per source line (default), per aten op, or per kernel.

        >>> import torch, eager_neuron
        >>> with eager_neuron.profile() as prof: _ = torch.ones(8, device="neuron") + 1
        >>> print(prof.table(group_by="kernel"))  # doctest: +SKIP
        """
        rows = self.summary(group_by, sort_by)
        columns = _GROUPS[group_by]
        t = self.totals
        head = (f"eager_neuron profile: {t['ops']} ops ({t['top_level_ops']} top-level), "
                f"{t['launches']} kernel launches ({t['compiles']} compiled in "
                f"{t['compile_ms']:.1f} ms, {t['memory_hits']} memory hits, {t['disk_hits']} "
                f"disk hits), host {t['host_ms']:.2f} ms in ops of {t['wall_ms']:.2f} ms wall, "
                f"simulated device {t['device_us']:.2f} us"
                + (f", {t['flushes']} flushes" if t["flushes"] else "")
                + (f", {t['dropped']} records DROPPED" if t["dropped"] else ""))
        cells = [[_cell(row.get(c), c) for c in columns] for row in rows[:row_limit]]
        widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
        numeric = [c not in ("location", "name", "kernel", "ops", "source", "engine", "group")
                   for c in columns]

        def fmt(values):
            return "  ".join(v.rjust(w) if num else v.ljust(w)
                             for v, w, num in zip(values, widths, numeric)).rstrip()

        lines = [head, fmt(columns), fmt(["-" * w for w in widths])]
        lines += [fmt(r) for r in cells]
        if len(rows) > row_limit:
            lines.append(f"... {len(rows) - row_limit} more rows (row_limit={row_limit})")
        return Table("\n".join(lines))

    def __str__(self) -> str:
        return self.table()

    # -- exports -------------------------------------------------------------------------------
    def export_chrome_trace(self, path: str) -> None:
        """Write a Chrome trace (Perfetto, chrome://tracing): host ops and kernels per thread;
        one process per NeuronCore on its simulated clock, kernels and DMA on separate tracks.

        >>> import torch, eager_neuron
        >>> with eager_neuron.profile() as prof: _ = torch.ones(8, device="neuron") + 1
        >>> prof.export_chrome_trace("/tmp/trace.json")
        """
        with open(path, "w") as f:
            json.dump(chrome_trace(self.events), f)

    def to_dataframe(self):
        """A pandas DataFrame, one row per event (needs pandas: pip install eager_neuron[profile]).

        >>> import torch, eager_neuron
        >>> with eager_neuron.profile() as prof: _ = torch.ones(8, device="neuron") + 1
        >>> prof.to_dataframe().groupby("type").device_us.sum()  # doctest: +SKIP
        """
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("to_dataframe() needs pandas: pip install 'eager_neuron[profile]'"
                              ) from None
        return pd.DataFrame(self.rows(), columns=list(FIELDS))

    def to_parquet(self, path: str) -> None:
        """Write the events as Parquet (needs pyarrow); read_parquet(path) gives the rows back.

        >>> import torch, eager_neuron
        >>> with eager_neuron.profile() as prof: _ = torch.ones(8, device="neuron") + 1
        >>> prof.to_parquet("/tmp/events.parquet")  # doctest: +SKIP
        """
        pa, pq = _arrow()
        rows = self.rows()
        cols = {f: [r[f] for r in rows] for f in FIELDS}
        cols["extra"] = [json.dumps(v) if v is not None else None for v in cols["extra"]]
        pq.write_table(pa.table(cols, schema=_arrow_schema(pa)), path)


def profile() -> Profile:
    """Profile the ops and kernels run inside the block; see `Profile` for its views.

    >>> import torch, eager_neuron
    >>> with eager_neuron.profile() as prof: _ = torch.ones(8, device="neuron") * 3
    >>> print(prof.table())  # doctest: +SKIP
    """
    return Profile()


def read_parquet(path: str) -> list[dict]:
    """The rows a Profile wrote with to_parquet (as Profile.rows() gives them).

    >>> from eager_neuron.profiler import read_parquet
    >>> rows = read_parquet("/tmp/events.parquet")  # doctest: +SKIP
    """
    _pa, pq = _arrow()
    rows = pq.read_table(path).to_pylist()
    for r in rows:
        r["extra"] = json.loads(r["extra"]) if r["extra"] is not None else None
    return rows


def _arrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("to_parquet() needs pyarrow: pip install 'eager_neuron[profile]'"
                          ) from None
    return pa, pq


def _arrow_schema(pa):
    ints = {"id", "parent", "depth", "core", "n_ops", "line"}
    floats = {"compile_ms", "host_start_us", "host_us", "self_host_us", "device_start_us",
              "device_us", "self_device_us", "bytes", "flops"}
    fields = []
    for f in FIELDS:
        if f in ints:
            t = pa.int64()
        elif f in floats:
            t = pa.float64()
        elif f == "shapes":
            t = pa.list_(pa.list_(pa.int64()))
        elif f == "dtypes":
            t = pa.list_(pa.string())
        else:
            t = pa.string()
        fields.append(pa.field(f, t))
    return pa.schema(fields)


def _by_line(groups: dict, e: Event, own: dict) -> dict | None:
    # top-level ops, kernels, transfers and flushes count at the line they ran for
    key = (e.file, e.line, e.function, e.phase, e.location)
    row = groups.get(key)
    if row is None:
        row = groups[key] = {"location": e.location, "source": e.source or "", "calls": 0,
                             "kernels": 0, "compiles": 0, "compile_ms": 0.0, "host_ms": 0.0,
                             "device_us": 0.0, "dma_us": 0.0, "mbytes": 0.0, "fused": 0,
                             "_ops": {}}
    if e.type == "op" and e.group is not None:
        row["fused"] += 1             # recorded into a fused group (its kernel ran at the flush)
    if e.type == "op" and e.depth != 0:
        return row
    if e.type == "op":
        row["calls"] += 1
        row["host_ms"] += e.host_us / 1e3
        row["_ops"][e.name] = row["_ops"].get(e.name, 0) + 1
    elif e.type == "kernel":
        row["kernels"] += 1
        row["compiles"] += e.outcome == "compile"
        row["compile_ms"] += e.compile_ms
        row["device_us"] += e.device_us
        row["mbytes"] += e.bytes / 1e6
    elif e.type == "transfer":
        row["device_us"] += e.device_us
        row["dma_us"] += e.device_us
    return row


def _by_op(groups: dict, e: Event, own: dict) -> dict | None:
    # every op at every depth: inclusive and self times; kernels/DMA it ran itself
    if e.type != "op":
        return None
    row = groups.get(e.name)
    if row is None:
        row = groups[e.name] = {"name": e.name, "calls": 0, "kernels": 0, "compiles": 0,
                                "host_ms": 0.0, "self_host_ms": 0.0, "device_us": 0.0,
                                "self_device_us": 0.0, "dma_us": 0.0}
    kernels, compiles, dma = own.get(e.id, (0, 0, 0.0))
    row["calls"] += 1
    row["kernels"] += kernels
    row["compiles"] += compiles
    row["dma_us"] += dma
    row["host_ms"] += e.host_us / 1e3
    row["self_host_ms"] += e.self_host_us / 1e3
    row["device_us"] += e.device_us
    row["self_device_us"] += e.self_device_us
    return row


def _by_kernel(groups: dict, e: Event, own: dict) -> dict | None:
    if e.type not in ("kernel", "transfer"):
        return None
    key = e.key or e.name
    row = groups.get(key)
    if row is None:
        row = groups[key] = {"kernel": _short_key(e) if e.key else e.name, "launches": 0,
                             "memory": 0, "disk": 0, "compiles": 0, "compile_ms": 0.0,
                             "host_us": 0.0, "device_us": 0.0, "mbytes": 0.0,
                             "engine": e.engine, "group": e.group}
    row["launches"] += 1
    row["device_us"] += e.device_us
    if e.type == "kernel":
        row[{"memory": "memory", "disk": "disk"}.get(e.outcome, "compiles")] += 1
        row["compile_ms"] += e.compile_ms
        row["host_us"] += e.host_us
        row["mbytes"] += e.bytes / 1e6
    return row


_AGGREGATE = {"line": _by_line, "op": _by_op, "kernel": _by_kernel}


def _short_key(e: Event) -> str:
    """family:op plus the key's static fields, cut to a readable width."""
    rest = e.key[1:-1] if e.key and e.key.startswith("(") else (e.key or "")
    text = f"{e.name} {rest.split(', ', 2)[2] if rest.count(', ') >= 2 else ''}".strip()
    return text if len(text) <= 60 else text[:57] + "..."


def _cell(v, column: str) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3f}" if column in ("host_ms", "self_host_ms", "mbytes") else f"{v:.2f}"
    text = str(v)
    limit = 40 if column in ("source", "ops") else 60
    return text if len(text) <= limit else text[:limit - 3] + "..."


def chrome_trace(events: list[Event]) -> dict:
    """The Chrome trace JSON object (export_chrome_trace writes it)."""
    host_pid, trace = 1, []
    tids: dict = {}
    backward_threads = set()
    for e in events:
        if e.thread and e.thread not in tids:
            tids[e.thread] = len(tids) + 1
        if e.phase == "backward":
            backward_threads.add(e.thread)
    cores = sorted({e.core for e in events if e.core is not None and e.type != "op"})
    # 1. metadata: process and track names, host first
    trace.append({"ph": "M", "name": "process_name", "pid": host_pid, "tid": 0,
                  "args": {"name": "host (wall clock)"}})
    trace.append({"ph": "M", "name": "process_sort_index", "pid": host_pid, "tid": 0,
                  "args": {"sort_index": 0}})
    for name, tid in tids.items():
        label = name + (" (autograd backward)" if name in backward_threads else "")
        trace.append({"ph": "M", "name": "thread_name", "pid": host_pid, "tid": tid,
                      "args": {"name": label}})
    for core in cores:
        pid = 100 + core
        trace.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                      "args": {"name": f"neuron:{core} (simulated device clock)"}})
        trace.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                      "args": {"sort_index": 1 + core}})
        for tid, name in ((1, "kernels"), (2, "dma")):
            trace.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                          "args": {"name": name}})
    # 2. events
    for e in events:
        args = {"location": e.location}
        if e.source:
            args["source"] = e.source
        if e.group is not None:
            args["group"], args["flush_reason"] = e.group, e.flush_reason
        tid = tids.get(e.thread, 0)
        if e.type == "op":
            args.update(kind=e.kind, shapes=e.shapes, dtypes=e.dtypes, device_us=e.device_us)
            trace.append({"ph": "X", "cat": "op", "name": e.name, "pid": host_pid, "tid": tid,
                          "ts": e.host_start_us, "dur": e.host_us, "args": args})
        elif e.type == "kernel":
            args.update(key=e.key, outcome=e.outcome, compile_ms=e.compile_ms, core=e.core,
                        device_us=e.device_us, bytes=e.bytes, flops=e.flops, engine=e.engine)
            if e.extra:
                args["extra"] = e.extra
            if e.compile_ms:
                trace.append({"ph": "X", "cat": "compile", "name": f"compile {e.name}",
                              "pid": host_pid, "tid": tid,
                              "ts": e.host_start_us - e.compile_ms * 1e3,
                              "dur": e.compile_ms * 1e3, "args": {"key": e.key}})
            trace.append({"ph": "X", "cat": "kernel", "name": e.name, "pid": host_pid,
                          "tid": tid, "ts": e.host_start_us, "dur": e.host_us, "args": args})
            trace.append({"ph": "X", "cat": "kernel", "name": e.name, "pid": 100 + e.core,
                          "tid": 1, "ts": e.device_start_us, "dur": e.device_us, "args": args})
            # a flow arrow from the host launch to the kernel on the device clock
            trace.append({"ph": "s", "cat": "launch", "name": "launch", "id": e.id,
                          "pid": host_pid, "tid": tid, "ts": e.host_start_us})
            trace.append({"ph": "f", "bp": "e", "cat": "launch", "name": "launch", "id": e.id,
                          "pid": 100 + e.core, "tid": 1, "ts": e.device_start_us})
        elif e.type == "transfer":
            trace.append({"ph": "X", "cat": "dma", "name": "dma", "pid": 100 + e.core,
                          "tid": 2, "ts": e.device_start_us, "dur": e.device_us, "args": args})
        else:
            args.update(reason=e.flush_reason, n_ops=e.n_ops)
            trace.append({"ph": "i", "s": "t", "cat": "flush", "name": f"flush: {e.name}",
                          "pid": host_pid, "tid": tid, "ts": e.host_start_us, "args": args})
    return {"traceEvents": trace, "displayTimeUnit": "ms",
            "otherData": {"producer": "eager_neuron.profiler",
                          "note": "host is wall time since profile start; each neuron:i process "
                                  "is that core's simulated clock since profile start"}}
