"""Profiler bridge: `torch.profiler.profile(activities=[CPU, PrivateUse1])` shows neuron kernels.

Kineto takes device activity only from a C++ profiler plugin, which a backend written in Python
cannot register. What Python can reach is the layer above Kineto: `torch.autograd.profiler.profile`
turns Kineto's events into Python `FunctionEvent`s (key_averages(), table()) and asks Kineto to
write the Chrome trace. This module wraps four of its methods, only while the device is `neuron`
(`ProfilerActivity.PrivateUse1`, or `use_device="neuron"`):

1. start: an eager_neuron recording session opens beside Kineto, and a calibration marker ties
   our clock (perf_counter) to Kineto's.
2. every kernel launch emits a `neuron::<kernel>` range on the CPU timeline (recording.py); it
   is matched here to its recorded launch, so its thread and time are Kineto's own.
3. parse: each kernel becomes a device `FunctionEvent` (`DeviceType.PrivateUse1`, index = core),
   starting when its launch started (or when the previous kernel on that core ended) and lasting
   its simulated device time; the aten op that launched it gets it as a kernel
   (`append_kernel`), so op rows, `record_function` labels and their parents carry device time.
4. export: the Chrome trace Kineto wrote gets a track per NeuronCore with the kernels, flow
   arrows from each launch, and each `record_function` label again on the device track,
   spanning the kernels it covered.

>>> import torch, eager_neuron
>>> from torch.profiler import ProfilerActivity, profile
>>> with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as p:
...     _ = torch.ones(8, device="neuron") * 2
>>> print(p.key_averages().table(sort_by="self_device_time_total"))  # doctest: +SKIP
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import threading
from collections import defaultdict
from time import perf_counter_ns

import torch
from torch.autograd import profiler as _ap
from torch.autograd.profiler_util import FunctionEvent

from .recording import _Kernel, _kernel_name, _Op, _start, _stop

_CAL = "neuron::profiler_clock_sync"
_PRIVATEUSE1 = torch._C._autograd.DeviceType.PrivateUse1
_CPU = torch._C._autograd.DeviceType.CPU
# CPU events that never own a kernel: the subclass dispatch frame and our own launch ranges
_NOT_OWNERS = ("PythonSubclass",)
_LOCK = threading.Lock()
_installed = False


class _Bridge:
    """One torch profiler cycle: our records, the clock pairs, and the derived device events."""

    def __init__(self) -> None:
        self.first = _start()
        self.cal: list = []          # perf_counter midpoints of the calibration markers
        self.raw: list | None = None
        self.kernels: list = []      # matched kernels, for the Chrome trace (see _parse)
        self.labels: list = []       # (name, dev_start, dev_end, core) device-side annotations
        self.cal_rel: list = []      # relative-us midpoints of the calibration markers (Kineto)
        self.unmatched = 0
        self.calibrate()

    def calibrate(self) -> None:
        p0 = perf_counter_ns()
        with torch._C._profiler._RecordFunctionFast(_CAL):
            pass
        self.cal.append((p0 + perf_counter_ns()) / 2e3)

    def stop(self) -> None:
        if self.raw is None:
            self.raw = _stop(self.first)


def _is_neuron(prof) -> bool:
    name = torch._C._get_privateuse1_backend_name()
    return prof.use_device is not None and prof.use_device in (name, "privateuseone")


def install() -> None:
    """Wrap torch.autograd.profiler.profile's start, exit, parse and export (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    cls = _ap.profile
    init, start, exit_, parse, export = (cls.__init__, cls._start_trace, cls.__exit__,
                                         cls._parse_kineto_results, cls.export_chrome_trace)

    def __init__(self, *args, **kwargs):
        # NOTE: use_kineto=False on a PrivateUse1 device is the legacy mode, which calls C++
        # ProfilerStubs a Python backend cannot register: every op then logs "PrivateUse1 used
        # in profiler but not enabled". Kineto with our bridge gives the device events instead.
        dev = kwargs.get("use_device")
        if dev is not None and dev == torch._C._get_privateuse1_backend_name() and \
                not kwargs.get("use_kineto", False) and _ap.kineto_available():
            kwargs["use_kineto"] = True
        init(self, *args, **kwargs)

    def _start_trace(self):
        start(self)
        if _is_neuron(self) and getattr(self, "_neuron_bridge", None) is None:
            self._neuron_bridge = _Bridge()

    def __exit__(self, exc_type, exc_val, exc_tb):
        bridge = getattr(self, "_neuron_bridge", None)
        if bridge is not None and bridge.raw is None and self.enabled:
            torch.neuron.synchronize()          # pending fused groups launch inside the trace
            bridge.calibrate()
        try:
            return exit_(self, exc_type, exc_val, exc_tb)
        finally:
            if bridge is not None:
                bridge.stop()

    def _parse_kineto_results(self, result, timeout_s=None):
        events = parse(self, result, timeout_s=timeout_s)
        bridge = getattr(self, "_neuron_bridge", None)
        if bridge is None or bridge.raw is None:
            return events
        try:
            return _parse(self, bridge, events)
        except Exception as exc:  # noqa: BLE001 - never lose the user's CPU profile
            import warnings
            warnings.warn(f"eager_neuron: neuron kernels left out of the torch profile: {exc!r}",
                          stacklevel=2)
            return [e for e in events if e.name != _CAL]

    def export_chrome_trace(self, path, metadata=None, use_python_export=False):
        out = export(self, path, metadata, use_python_export)
        bridge = getattr(self, "_neuron_bridge", None)
        if bridge is not None and bridge.raw is not None and _ap.kineto_available():
            self._ensure_function_events()      # parsing derives the device events
            try:
                _rewrite_trace(path, bridge)
            except Exception as exc:  # noqa: BLE001 - Kineto's trace stays as it was written
                import warnings
                warnings.warn(f"eager_neuron: device tracks not added to {path}: {exc!r}",
                              stacklevel=2)
        return out

    cls.__init__ = __init__
    cls._start_trace = _start_trace
    cls.__exit__ = __exit__
    cls._parse_kineto_results = _parse_kineto_results
    cls.export_chrome_trace = export_chrome_trace
    export_chrome_trace.__doc__ = export.__doc__


# -- step 3: Kineto's CPU events + our launches -> device FunctionEvents ------------------------

def _parse(prof, bridge: _Bridge, events: list) -> list:
    cal = sorted((e for e in events if e.name == _CAL), key=lambda e: e.time_range.start)
    events = [e for e in events if e.name != _CAL]
    if not cal:
        return events
    bridge.cal_rel = [(c.time_range.start + c.time_range.end) / 2 for c in cal]
    pairs = list(zip(bridge.cal, bridge.cal_rel))
    (p0, k0), (p1, k1) = pairs[0], pairs[-1]
    scale = (k1 - k0) / (p1 - p0) if p1 > p0 and len(pairs) > 1 else 1.0

    def to_rel(perf_us: float) -> float:       # our perf_counter (us) -> Kineto relative us
        return k0 + (perf_us - p0) * scale

    markers = defaultdict(list)                  # marker name -> [(start, event)] by start
    cpu_by_thread = defaultdict(list)
    for e in events:
        if e.device_type != _CPU:
            continue
        if e.name.startswith("neuron::"):
            markers[e.name].append((e.time_range.start, e))
        cpu_by_thread[e.thread].append(e)
    for lst in markers.values():
        lst.sort(key=lambda p: p[0])
    matched = _match(bridge, markers, to_rel)

    # the aten op that launched a kernel: innermost CPU event on the marker's thread around it
    pos = {}
    for lst in cpu_by_thread.values():
        lst.sort(key=lambda e: (e.time_range.start, -e.time_range.end))
        pos.update((id(e), i) for i, e in enumerate(lst))
    next_id = max((e.id for e in events), default=0) + 1
    free_at: dict = defaultdict(float)          # core -> when its last kernel ended
    members = defaultdict(list)                  # adaptive eager: fused group -> its ops
    for r in bridge.raw:
        if type(r) is _Op and r.group is not None:
            members[r.group].append(r.name.split("::")[-1].split(".")[0])
    device_events = []
    matched.sort(key=lambda p: p[1].time_range.start)
    for r, m in matched:
        ev = r.event
        host_us, device_us, core = float(ev["host_us"]), float(ev["device_us"]), r.core
        same = cpu_by_thread[m.thread]
        # the launch range covers the kernel's run on the host (the marker closes after it)
        idx = pos[id(m)]
        launch = _prior_end(same, idx, m.time_range.start - host_us)
        owner = _owner(same, idx)
        m.time_range.start = launch
        name = _kernel_name(ev["key"])
        if r.group in members and ":" not in name:      # fused:add+mul+relu, as ours names it
            name = f"{name}:{'+'.join(members[r.group])}"
        start = max(launch, free_at[core])
        free_at[core] = start + device_us
        fe = FunctionEvent(
            id=next_id, name=name, thread=core, start_us=start, end_us=start + device_us,
            overload_name="", trace_name=name, fwd_thread=m.thread, input_shapes=[], stack=[],
            use_device=prof.use_device, device_type=_PRIVATEUSE1, device_index=core,
            device_resource_id=core, flops=float(ev["flops"]) if prof.with_flops else None,
            linked_correlation_id=owner.id if owner is not None else 0,
            activity_type="kernel")
        next_id += 1
        if owner is not None:
            owner.append_kernel(name, core, device_us)
        device_events.append(fe)
        backward = r.op is not None and r.op.loc is not None and r.op.loc[2] is not None
        bridge.kernels.append((fe, m, r, backward))
    # record_function labels: on the device, a label spans the kernels launched inside it
    bridge.labels = []
    labels = [lab for lst in cpu_by_thread.values() for lab in lst
              if lab.is_user_annotation and not lab.name.startswith("neuron::")]
    # a backward kernel runs on autograd's thread, outside the label's CPU subtree: the innermost
    # label around its launch (on another thread) takes it, so `with record_function("bwd"):
    # loss.backward()` carries the backward's device time (outer labels get it through the tree)
    for fe, m, _r, bwd in bridge.kernels:
        if not bwd:
            continue
        around = [lab for lab in labels if lab.thread != m.thread
                  and lab.time_range.start <= m.time_range.end <= lab.time_range.end]
        if around:
            inner = max(around, key=lambda lab: lab.time_range.start)
            inner.append_kernel(fe.name, fe.device_index, fe.time_range.end - fe.time_range.start)
    for lst in cpu_by_thread.values():
        for lab in lst:
            if not lab.is_user_annotation or lab.name.startswith("neuron::"):
                continue
            lo, hi = lab.time_range.start, lab.time_range.end
            inside = [fe for fe, m, _r, bwd in bridge.kernels
                      if lo <= m.time_range.end <= hi and (m.thread == lab.thread or bwd)]
            for core in sorted({fe.device_index for fe in inside}):
                mine = [fe for fe in inside if fe.device_index == core]
                bridge.labels.append((lab.name, min(f.time_range.start for f in mine),
                                      max(f.time_range.end for f in mine), core))
    out = events + device_events
    out.sort(key=lambda e: (e.time_range.start, -e.time_range.end))
    return out


def _nearest(cands: list, want: float, used: set):
    i = bisect.bisect_left(cands, want, key=lambda p: p[0])
    best = None
    for j in (i - 2, i - 1, i, i + 1):
        if 0 <= j < len(cands) and id(cands[j][1]) not in used:
            d = abs(cands[j][0] - want)
            if best is None or d < best[0]:
                best = (d, cands[j][1])
    return None if best is None else best[1]


def _match(bridge: _Bridge, markers: dict, to_rel) -> list:
    """(launch record, its Kineto marker) pairs.

    Each thread emits its markers in the order it recorded its launches, so per (thread, kernel
    name) the k-th launch is the k-th marker; the clocks only decide which Kineto thread is which
    Python thread (a vote of nearest markers), which survives a calibration off by more than the
    gap between two launches (a busy machine, a foreach loop of tiny kernels). Where the counts
    disagree (a marker lost), the nearest unused marker in time is taken.
    """
    recs = [r for r in bridge.raw if type(r) is _Kernel and r.marked]
    names = {id(r): "neuron::" + _kernel_name(r.event["key"]) for r in recs}
    votes: dict = defaultdict(lambda: defaultdict(int))
    for r in recs:
        m = _nearest(markers.get(names[id(r)], ()), to_rel(r.t / 1e3), set())
        if m is not None:
            votes[r.thread][m.thread] += 1
    tid_of = {th: max(v.items(), key=lambda kv: kv[1])[0] for th, v in votes.items()}
    mine = defaultdict(list)                     # (python thread, name) -> records in order
    for r in recs:
        mine[(r.thread, names[id(r)])].append(r)
    theirs = defaultdict(list)                   # (kineto thread, name) -> markers by start
    for name, lst in markers.items():
        for _t, m in lst:
            theirs[(m.thread, name)].append(m)
    out, used, rest = [], set(), []
    for (thread, name), rs in mine.items():
        ms = theirs.get((tid_of.get(thread), name), [])
        if len(ms) == len(rs):
            out.extend(zip(rs, ms))
            used.update(id(m) for m in ms)
        else:
            rest.extend(rs)
    for r in rest:
        m = _nearest(markers.get(names[id(r)], ()), to_rel(r.t / 1e3), used)
        if m is None:
            bridge.unmatched += 1
            continue
        used.add(id(m))
        out.append((r, m))
    return out


def _prior_end(same: list, idx: int, floor: float) -> float:
    """End of the latest event on the thread that closed before the marker `same[idx]` opened
    and after `floor` (the launch range must not swallow a sibling). Events are in start order
    and nest, so walking back from the marker finds them; ops more than 10 ms older stop it."""
    t = same[idx].time_range.start
    best = floor
    for k in range(idx - 1, -1, -1):
        e = same[k]
        if e.time_range.start < floor - 1e4:
            break
        if best < e.time_range.end <= t:
            best = e.time_range.end
    return best


def _owner(same: list, idx: int):
    """Innermost CPU event on the marker's thread that encloses `same[idx]`: walking back in
    start order, the first enclosing one (not a dispatch frame, not another launch range)."""
    t1 = same[idx].time_range.end
    for k in range(idx - 1, -1, -1):
        e = same[k]
        if e.time_range.end >= t1 and e.name not in _NOT_OWNERS and \
                not e.name.startswith("neuron::"):
            return e
    return None


# -- step 4: the Chrome trace --------------------------------------------------------------------

def _rewrite_trace(path: str, bridge: _Bridge) -> None:
    """Add the device tracks to the trace Kineto wrote at `path` (in place)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    evs = trace.get("traceEvents", [])
    cal_json = sorted(e["ts"] for e in evs if e.get("name") == _CAL and e.get("ph") == "X")
    if not cal_json or not bridge.cal_rel:
        return
    # JSON ts (us) = relative us + shift; the calibration markers pin the shift
    first = next(e for e in evs if e.get("name") == _CAL and e.get("ph") == "X")
    shift = first["ts"] + first.get("dur", 0) / 2 - bridge.cal_rel[0]
    evs = [e for e in evs if e.get("name") != _CAL]
    pid = os.getpid()
    cores = sorted({fe.device_index for fe, *_ in bridge.kernels})
    for e in evs:                               # Kineto labels pids 0..N "GPU i": name ours
        if e.get("ph") == "M" and e.get("pid") in cores:
            if e.get("name") == "process_labels":
                e["args"] = {"labels": f"neuron:{e['pid']} (simulated NeuronCore)"}
            elif e.get("name") == "process_name":
                e["args"] = {"name": f"neuron:{e['pid']}"}
    for core in cores:
        evs.append({"ph": "M", "name": "process_name", "pid": core, "tid": 0,
                    "args": {"name": f"neuron:{core}"}})
        evs.append({"ph": "M", "name": "process_labels", "pid": core, "tid": 0,
                    "args": {"labels": f"neuron:{core} (simulated NeuronCore)"}})
        evs.append({"ph": "M", "name": "thread_name", "pid": core, "tid": 1,
                    "args": {"name": "kernels (simulated device time)"}})
    # our launch ranges: Kineto wrote each marker as it closed; widen it to the kernel's run
    by_name = defaultdict(list)
    for e in evs:
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("neuron::"):
            by_name[e["name"]].append(e)
    for lst in by_name.values():
        lst.sort(key=lambda e: e["ts"] + e["dur"])
    for fe, m, r, _bwd in bridge.kernels:
        ts_end = m.time_range.end + shift
        cands = by_name.get(m.name, ())
        i = bisect.bisect_left(cands, ts_end, key=lambda e: e["ts"] + e["dur"])
        near = [cands[j] for j in (i - 1, i) if 0 <= j < len(cands)]
        je = min(near, key=lambda e: abs(e["ts"] + e["dur"] - ts_end), default=None)
        tid = None
        if je is not None and abs(je["ts"] + je["dur"] - ts_end) < 1.0:
            je["ts"] = m.time_range.start + shift
            je["dur"] = m.time_range.end - m.time_range.start
            je["cat"] = "neuron_runtime"
            tid = je["tid"]
        ev = r.event
        args = {"device": fe.device_index, "correlation": fe.id, "outcome": ev["outcome"],
                "device_us": float(ev["device_us"]), "host_us": float(ev["host_us"]),
                "engine": str(ev["engine"]), "bytes": float(ev["bytes"]),
                "flops": float(ev["flops"]), "key": repr(ev["key"])}
        ts = fe.time_range.start + shift
        evs.append({"ph": "X", "cat": "kernel", "name": fe.name, "pid": fe.device_index,
                    "tid": 1, "ts": ts, "dur": fe.time_range.end - fe.time_range.start,
                    "args": args})
        if tid is not None:
            evs.append({"ph": "s", "id": fe.id, "pid": pid, "tid": tid,
                        "ts": m.time_range.start + shift, "cat": "ac2g", "name": "ac2g"})
            evs.append({"ph": "f", "id": fe.id, "pid": fe.device_index, "tid": 1, "ts": ts,
                        "cat": "ac2g", "name": "ac2g", "bp": "e"})
    for name, lo, hi, core in bridge.labels:
        evs.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": core,
                    "tid": 1, "ts": lo + shift, "dur": hi - lo, "args": {"device": core}})
    trace["traceEvents"] = evs
    tmp = path + ".neuron-tmp"
    with opener(tmp, "wt") as f:
        json.dump(trace, f)
    os.replace(tmp, path)
