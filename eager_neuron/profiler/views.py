"""Profiler, step 4: the session object and its views: table(), summary(), rows(),
export_chrome_trace(), timeline(), export_timeline() (timeline.py), to_dataframe(),
to_parquet(), read_parquet().

>>> from eager_neuron.profiler.views import Table
>>> Table("a | b")
a | b
"""

from __future__ import annotations

import json
from collections import defaultdict
from time import perf_counter_ns

from ..simulator import SIM
from .attribution import FIELDS, Event, _materialize
from .recording import _ERRORS, _start, _stop
from .timeline import html_timeline, text_timeline

# -- the session and its views -------------------------------------------------------------------

_GROUPS = {
    # group_by: columns in display order (the first is the group's key)
    "line": ("location", "calls", "kernels", "compiles", "compile_ms", "host_ms", "device_us",
             "dma_us", "mbytes", "fused", "ops", "source"),
    "op": ("name", "calls", "kernels", "compiles", "host_ms", "self_host_ms", "device_us",
           "self_device_us", "dma_us"),
    "kernel": ("kernel", "launches", "memory", "disk", "compiles", "compile_ms", "host_us",
               "device_us", "mbytes", "engine", "group"),
    "label": ("label", "calls", "kernels", "host_ms", "device_us", "location"),
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
        """A readable table: per source line (default), per aten op, per kernel, or per
        `torch.profiler.record_function` block (group_by="label").

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
        numeric = [c not in ("location", "name", "kernel", "ops", "source", "engine", "group",
                             "label") for c in columns]

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

    def timeline(self, limit: int = 200) -> Table:
        """Kernels and DMA in device order, each with its core, simulated start and duration,
        its record_function block and your source line.

        >>> import torch, eager_neuron
        >>> with eager_neuron.profile() as prof: _ = torch.ones(8, device="neuron") + 1
        >>> print(prof.timeline())  # doctest: +SKIP
        """
        return Table(text_timeline(self.events, limit))

    def export_timeline(self, path: str, title: str = "eager_neuron profile") -> None:
        """Write the picture: a self-contained HTML page with one timeline per NeuronCore
        (record_function blocks, kernels coloured by family, DMA), tooltips with source lines.

        >>> import torch, eager_neuron
        >>> with eager_neuron.profile() as prof: _ = torch.ones(8, device="neuron") + 1
        >>> prof.export_timeline("/tmp/timeline.html")
        """
        with open(path, "w") as f:
            f.write(html_timeline(self.events, title))

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
    if e.type == "label":
        return None
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


def _by_label(groups: dict, e: Event, own: dict) -> dict | None:
    # record_function blocks: inclusive kernels and simulated device time
    if e.type != "label":
        return None
    row = groups.get(e.name)
    if row is None:
        row = groups[e.name] = {"label": e.name, "calls": 0, "kernels": 0, "host_ms": 0.0,
                                "device_us": 0.0, "location": e.location}
    row["calls"] += 1
    row["kernels"] += e.n_ops or 0
    row["host_ms"] += e.host_us / 1e3
    row["device_us"] += e.device_us
    return row


_AGGREGATE = {"line": _by_line, "op": _by_op, "kernel": _by_kernel, "label": _by_label}


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
    # a thread that ran backward ops only: autograd's device worker (backward of a graph rooted
    # on neuron runs on the caller's thread, see eager_neuron/device.py, unless switched off)
    backward_threads, forward_threads = set(), set()
    for e in events:
        if e.thread and e.thread not in tids:
            tids[e.thread] = len(tids) + 1
        (backward_threads if e.phase == "backward" else forward_threads).add(e.thread)
    backward_threads -= forward_threads
    cores = sorted({e.core for e in events if e.core is not None and e.type != "op"
                    and e.type != "label"})
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
        if e.type == "label":
            args.update(kernels=e.n_ops, device_us=e.device_us)
            trace.append({"ph": "X", "cat": "user_annotation", "name": e.name, "pid": host_pid,
                          "tid": tid, "ts": e.host_start_us, "dur": e.host_us, "args": args})
            continue
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
    # 3. each record_function block again on its core's clock, spanning the kernels it launched
    for e in events:
        if e.type == "label" and e.core is not None:
            trace.append({"ph": "X", "cat": "user_annotation", "name": e.name,
                          "pid": 100 + e.core, "tid": 3, "ts": e.device_start_us,
                          "dur": e.extra["device_end_us"] - e.device_start_us,
                          "args": {"location": e.location, "kernels": e.n_ops,
                                   "device_us": e.device_us}})
    for core in cores:
        trace.append({"ph": "M", "name": "thread_name", "pid": 100 + core, "tid": 3,
                      "args": {"name": "record_function blocks"}})
    return {"traceEvents": trace, "displayTimeUnit": "ms",
            "otherData": {"producer": "eager_neuron.profiler",
                          "note": "host is wall time since profile start; each neuron:i process "
                                  "is that core's simulated clock since profile start"}}
