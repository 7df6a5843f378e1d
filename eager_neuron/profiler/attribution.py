"""Profiler, steps 2 and 3: attribute and materialize. A top-level op gets the first frame
outside torch and eager_neuron; a backward op gets "backward of <forward line>" through the
autograd node's sequence number, which the forward op recorded with its line. At a session's
exit the raw records become `Event`s with inclusive and self times, and the device time that no
kernel explains (DMA transfers) becomes `transfer` events cut from the simulated clock.

>>> from eager_neuron.profiler.attribution import FIELDS
>>> FIELDS[:3]
('id', 'type', 'name')
"""

from __future__ import annotations

import dataclasses
import json
import linecache
import os
from collections import defaultdict

from .recording import _Kernel, _kernel_name, _Label, _Op


@dataclasses.dataclass(slots=True)
class Event:
    """One row of a profile. `type` is op | kernel | transfer | flush | label (a
    `torch.profiler.record_function` block); times are microseconds.

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
    label: str | None = None         # innermost record_function block around an op or kernel


FIELDS = tuple(f.name for f in dataclasses.fields(Event))
_LAUNCH_KEYS = frozenset(
    ("key", "outcome", "compile_s", "host_us", "device_us", "bytes", "flops", "engine", "group",
     "group_ops", "flush_reason"))


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype) -> str:
    name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


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
    labels = []                      # (label event, raw label)
    for r in raw:
        ev = Event(id=len(events), type="", name="")
        if type(r) is _Label:
            ids[id(r)] = ev.id
            parent = ids.get(id(r.parent)) if r.parent is not None else None
            ev.type, ev.name, ev.parent = "label", r.name, parent
            ev.depth = events[parent].depth + 1 if parent is not None else 0
            ev.host_start_us = (r.t0 - t0) / 1e3
            ev.host_us = ev.self_host_us = ((r.t1 or t_end) - r.t0) / 1e3
            ev.device_us, ev.n_ops = 0.0, 0
            ev.label = events[parent].name if parent is not None else None
            labels.append(ev)
        elif type(r) is _Op:
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
            ev.label = r.label.name if r.label is not None else None
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
            ev.device_start_us = max(r.clock - e["device_us"] - base, 0.0)
            if r.label is not None:
                ev.label = r.label.name
                lab = r.label                   # every enclosing block counts the kernel
                while lab is not None:
                    lid = ids.get(id(lab))
                    if lid is not None:
                        _cover(events[lid], ev)
                    lab = lab.parent
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
        if ev.type == "label":
            ev.self_device_us = None
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


def _cover(label: Event, k: Event) -> None:
    """A kernel launched inside a record_function block: the block's kernel count (n_ops),
    device time, and its span on the device (device_start_us .. extra["device_end_us"], on the
    core of its first kernel)."""
    label.device_us += k.device_us
    label.n_ops += 1
    end = k.device_start_us + k.device_us
    if label.core is None:
        label.core, label.device_start_us, label.extra = k.core, k.device_start_us, {
            "device_end_us": end}
    elif k.core == label.core:
        label.device_start_us = min(label.device_start_us, k.device_start_us)
        label.extra["device_end_us"] = max(label.extra["device_end_us"], end)


def _transfer(eid: int, events: list, op_id, core: int, start: float, dur: float) -> Event:
    ev = Event(id=eid, type="transfer", name="dma", parent=op_id, core=core, engine="dma",
               device_start_us=start, device_us=dur, self_device_us=dur)
    if op_id is not None:
        op = events[op_id]
        ev.depth, ev.thread, ev.phase, ev.grad_fn = op.depth + 1, op.thread, op.phase, op.grad_fn
        ev.file, ev.line, ev.function, ev.source = op.file, op.line, op.function, op.source
        ev.location, ev.shapes, ev.dtypes = op.location, op.shapes, op.dtypes
        ev.label = op.label
    else:
        ev.location = "<outside ops>"
    return ev
