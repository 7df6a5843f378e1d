"""eager_neuron.profile(): ops and kernels tied to source lines; table, Chrome trace, Parquet,
CLI."""

from __future__ import annotations

import inspect
import itertools
import json
import os
import threading
import types
import warnings

import numpy as np
import pytest
import torch

import eager_neuron
from eager_neuron import dispatch, launch, profiler

HERE = "test_profiler.py"


def _line(marker: str, obj) -> int:
    """Line number of the source line of `obj` that carries the comment `# <marker>`."""
    lines, start = inspect.getsourcelines(obj)
    for i, text in enumerate(lines):
        if text.rstrip().endswith(f"# {marker}"):
            return start + i
    raise AssertionError(marker)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc1(x)  # fc1
        h = torch.relu(h)  # relu
        return self.fc2(h)  # fc2


def train_step(model, opt, x, y) -> float:
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()  # loss
    loss.backward()  # backward
    opt.step()  # step
    return loss.item()  # item


@pytest.fixture(scope="module")
def mlp_profile():
    warnings.simplefilter("ignore")           # a CPU fallback, if any op lacks a kernel
    torch.manual_seed(0)
    model = Net().to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 8, device="neuron")
    y = torch.randn(5, 4, device="neuron")
    train_step(model, opt, x, y)              # compile (or load) every kernel first
    with eager_neuron.profile() as prof:
        train_step(model, opt, x, y)
    return prof


def _row(rows, location):
    found = [r for r in rows if r["location"] == location]
    assert found, f"no row for {location!r}; rows: {[r['location'] for r in rows]}"
    return found[0]


# -- attribution -------------------------------------------------------------------------------

def test_table_attributes_model_ops_to_their_lines(mlp_profile):
    rows = mlp_profile.summary(group_by="line")

    def fwd(marker, obj):
        return f"{HERE}:{_line(marker, obj)} in {obj.__name__}"

    # 1. forward: the first frame outside torch is the model's own line, not nn.Module internals
    assert "relu" in _row(rows, fwd("relu", Net.forward))["ops"]
    assert _row(rows, fwd("relu", Net.forward))["kernels"] >= 1
    for marker in ("fc1", "fc2"):
        row = _row(rows, fwd(marker, Net.forward))
        assert row["calls"] >= 2 and row["source"].startswith("h = self.fc1" if marker == "fc1"
                                                                else "return self.fc2")
    assert "pow" in _row(rows, fwd("loss", train_step))["ops"]
    assert _row(rows, fwd("step", train_step))["kernels"] >= 4      # one update per parameter
    assert "_local_scalar_dense" in _row(rows, fwd("item", train_step))["ops"]
    # 2. backward ops run on the caller's thread (eager_neuron/device.py BACKWARD_ON_CALLER);
    # they name the forward line they undo
    relu_bwd = _row(rows, "backward of " + fwd("relu", Net.forward))
    assert "threshold_backward" in relu_bwd["ops"] and relu_bwd["kernels"] >= 1
    _row(rows, "backward of " + fwd("loss", train_step))
    backward = [e for e in mlp_profile.events if e.phase == "backward"]
    assert backward and all(e.thread == "MainThread" for e in backward)
    # 3. every kernel has a location, and the per-line totals add up to the whole
    kernels = [e for e in mlp_profile.events if e.type == "kernel"]
    assert kernels and all(e.location != "<unknown>" for e in kernels)
    assert sum(r["kernels"] for r in rows) == mlp_profile.totals["launches"] == len(kernels)
    in_ops = sum(r["device_us"] for r in rows)
    assert in_ops == pytest.approx(mlp_profile.totals["device_us"], rel=1e-6, abs=1e-6)


def test_op_and_kernel_records_carry_the_issue_fields(mlp_profile):
    ops = [e for e in mlp_profile.events if e.type == "op"]
    relu = next(e for e in ops if e.name == "aten::relu")
    assert relu.kind == "kernel" and relu.shapes == [[5, 16]] and relu.dtypes == ["float32"]
    assert relu.line == _line("relu", Net.forward) and relu.function == "forward"
    assert relu.source == "h = torch.relu(h)  # relu" and relu.phase == "forward"
    k = next(e for e in mlp_profile.events if e.type == "kernel" and e.parent == relu.id)
    assert k.name.startswith("elementwise:") and k.key.startswith("('elementwise'")
    assert k.outcome in ("memory", "disk", "compile") and k.compile_ms >= 0
    assert k.host_us > 0 and k.device_us > 0 and k.bytes > 0 and k.engine in ("vector", "scalar")
    assert k.core == 0 and k.device_start_us >= 0 and k.shapes == relu.shapes
    assert relu.device_us == pytest.approx(k.device_us)     # inclusive op time = its kernel
    assert all(e.host_us >= 0 for e in ops) and all(e.self_host_us <= e.host_us for e in ops)


def test_tables_render_every_grouping(mlp_profile):
    for group_by in ("line", "op", "kernel"):
        text = mlp_profile.table(group_by=group_by, sort_by="device_us")
        assert text.startswith("eager_neuron profile:") and "device_us" in text
        assert repr(text) == text                # a REPL shows the table, not a quoted string
    assert "backward of test_profiler.py" in mlp_profile.table()
    assert "aten::relu" in mlp_profile.table(group_by="op")
    assert "elementwise:aten::relu" in mlp_profile.table(group_by="kernel")
    first = mlp_profile.summary(group_by="line", sort_by="first")
    assert first[0]["location"] == f"{HERE}:{_line('fc1', Net.forward)} in forward"
    with pytest.raises(ValueError, match="sort_by"):
        mlp_profile.table(sort_by="nope")
    with pytest.raises(ValueError, match="group_by"):
        mlp_profile.table(group_by="file")


# -- exports -----------------------------------------------------------------------------------

def test_chrome_trace_is_valid_json_with_host_and_device_timelines(mlp_profile, tmp_path):
    path = tmp_path / "trace.json"
    mlp_profile.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert "host (wall clock)" in names and "neuron:0 (simulated device clock)" in names
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    # (backward ran on the caller's thread: no thread of backward ops only, labelled so)
    assert "MainThread" in threads and not any("autograd" in t for t in threads)
    for e in events:
        assert {"ph", "pid", "tid", "name"} <= e.keys()
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e["ts"], (int, float))
    n_kernels = sum(1 for e in mlp_profile.events if e.type == "kernel")
    host_k = [e for e in events if e["ph"] == "X" and e["cat"] == "kernel" and e["pid"] == 1]
    dev_k = [e for e in events if e["ph"] == "X" and e["cat"] == "kernel" and e["pid"] >= 100]
    assert len(host_k) == len(dev_k) == n_kernels
    assert sum(1 for e in events if e["ph"] in ("s", "f")) == 2 * n_kernels
    ops = [e for e in events if e["ph"] == "X" and e["cat"] == "op"]
    assert any(e["name"] == "aten::threshold_backward" for e in ops)
    # a host kernel slice nests inside an op slice of its thread; device slices never overlap
    for k in host_k:
        assert any(o["tid"] == k["tid"] and o["ts"] <= k["ts"] + 1e-3 and
                   k["ts"] + k["dur"] <= o["ts"] + o["dur"] + 1e-3 for o in ops)
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in dev_k)
    assert all(a[1] <= b[0] + 1e-6 for a, b in itertools.pairwise(spans))


def test_parquet_round_trips(mlp_profile, tmp_path):
    pytest.importorskip("pyarrow")
    path = tmp_path / "events.parquet"
    mlp_profile.to_parquet(str(path))
    assert profiler.read_parquet(str(path)) == mlp_profile.rows()


def test_dataframe(mlp_profile):
    pytest.importorskip("pandas")
    df = mlp_profile.to_dataframe()
    assert len(df) == len(mlp_profile.events) and list(df.columns) == list(profiler.FIELDS)
    assert set(df["type"]) >= {"op", "kernel"}
    assert (df[df.type == "kernel"]["device_us"] > 0).all()


# -- recorder: nesting, adaptive groups, threads, sessions ---------------------------------------

def _plan(name, kind="kernel"):
    return types.SimpleNamespace(name=name, kind=kind)


def _event(key, **extra):
    event = {"key": key, "outcome": "memory", "compile_s": 0.0, "host_us": 1.0,
             "device_us": 2.0, "bytes": 64.0, "flops": 16.0, "engine": "vector"}
    event.update(extra)
    return event


def test_nested_ops_get_parents_and_self_times():
    t = torch.ones(3)
    with eager_neuron.profile() as prof, \
            profiler._op_hook(_plan("aten::outer", "decomp"), (t,), {}), \
            profiler._op_hook(_plan("aten::inner"), (t, [t, t]), {"out": t}):
        profiler._launch_hook(_event(("fake", "inner")))
    outer, inner, kernel = prof.events
    assert (outer.depth, inner.parent, inner.depth, kernel.parent) == (0, outer.id, 1, inner.id)
    assert inner.shapes == [[3]] * 4 and inner.location == outer.location
    assert outer.self_host_us == pytest.approx(outer.host_us - inner.host_us)
    by_op = {r["name"]: r for r in prof.summary(group_by="op")}
    assert by_op["aten::inner"]["kernels"] == 1 and by_op["aten::outer"]["kernels"] == 0


def test_record_flush_marks_fused_group_members_and_passes_launch_keys_through():
    t = torch.ones(2)
    with eager_neuron.profile() as prof:
        for name in ("aten::add.Tensor", "aten::mul.Tensor", "aten::relu"):
            with profiler._op_hook(_plan(name), (t,), {}):
                pass                          # adaptive eager recorded it: nothing launched
        profiler.record_flush("host read", 2, 7)  # flush
        profiler._launch_hook(_event(("fused", "g7"), group=7, ops=("add", "mul")))
        profiler.record_flush("synchronize", 1, 8)
    ops = [e for e in prof.events if e.type == "op"]
    assert [(e.group, e.flush_reason) for e in ops] == [
        ("7", "host read"), ("7", "host read"), ("8", "synchronize")]
    flush = next(e for e in prof.events if e.type == "flush")
    assert (flush.name, flush.n_ops, flush.group) == ("host read", 2, "7")
    test = test_record_flush_marks_fused_group_members_and_passes_launch_keys_through
    line = _line("flush", test)
    assert flush.line == line
    kernel = next(e for e in prof.events if e.type == "kernel")
    assert kernel.group == "7" and kernel.extra == {"ops": ["add", "mul"]}
    assert prof.totals["flushes"] == 2
    profiler.record_flush("outside", 1, 9)   # no session: a no-op


def test_fused_launch_without_record_flush_takes_every_recorded_op():
    t = torch.ones(2)
    with eager_neuron.profile() as prof:
        for name in ("aten::add.Tensor", "aten::relu"):
            with profiler._op_hook(_plan(name), (t,), {}):
                pass
        with profiler._op_hook(_plan("aten::_local_scalar_dense", "host"), (t,), {}):
            profiler._launch_hook(_event(("fused", ((1,),), False), group_ops=2,
                                         flush_reason="item"))
    add, relu, item, flush, kernel = prof.events
    assert add.group == relu.group == kernel.group and item.group is None
    assert (add.flush_reason, kernel.flush_reason, kernel.n_ops) == ("item", "item", 2)
    assert kernel.name == "fused:add+relu" and kernel.extra is None
    assert (flush.type, flush.name, flush.parent) == ("flush", "item", item.id)
    line = {r["location"]: r for r in prof.summary(group_by="line")}[add.location]
    assert line["fused"] == 2


@pytest.mark.skipif(not hasattr(eager_neuron, "adaptive"), reason="no adaptive eager yet")
def test_adaptive_eager_groups_show_up():
    x = torch.randn(100, device="neuron")
    with eager_neuron.profile() as prof, eager_neuron.adaptive():
        y = (x + 1).relu()  # fused
        v = y.sum().item()  # flush
    ops = {e.name: e for e in prof.events if e.type == "op"}
    kernels = [e for e in prof.events if e.type == "kernel" and e.group is not None]
    assert kernels and ops["aten::add.Tensor"].group == ops["aten::relu"].group == kernels[0].group
    assert kernels[0].name.startswith("fused:add+relu")
    fn = test_adaptive_eager_groups_show_up
    assert ops["aten::add.Tensor"].line == _line("fused", fn)
    assert kernels[0].line == _line("flush", fn) and v == pytest.approx((x.cpu() + 1).relu().sum())


def test_threads_record_their_own_stacks_and_lines():
    x = torch.ones(64, device="neuron")
    _ = x * 3 + 1                            # kernels ready before the threads race
    barrier = threading.Barrier(2)

    def worker_a():
        barrier.wait()
        for _ in range(20):
            _ = x * 3  # thread a

    def worker_b():
        barrier.wait()
        for _ in range(20):
            _ = x + 1  # thread b

    with eager_neuron.profile() as prof:
        threads = [threading.Thread(target=f, name=f.__name__) for f in (worker_a, worker_b)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    ops = [e for e in prof.events if e.type == "op"]
    for name, fn, op in (("worker_a", worker_a, "aten::mul.Tensor"),
                         ("worker_b", worker_b, "aten::add.Tensor")):
        mine = [e for e in ops if e.thread == name and e.depth == 0]
        assert len(mine) == 20 and {e.name for e in mine} == {op}
        marker = "thread a" if name == "worker_a" else "thread b"
        assert {e.line for e in mine} == {_line(marker, fn)}
    for e in prof.events:
        if e.parent is not None and e.type in ("op", "kernel"):
            assert prof.events[e.parent].thread == e.thread


def test_a_failing_record_is_dropped_and_counted_never_raised():
    with eager_neuron.profile() as prof, profiler._op_hook(object(), (), {}):  # no .name
        y = torch.ones(2, device="neuron") + 1
    assert prof.totals["dropped"] == 1 and "1 records DROPPED" in prof.table()
    assert y.sum().item() == 4.0


def test_hooks_come_off_and_nested_sessions_both_see_events():
    x = torch.ones(4, device="neuron")
    with eager_neuron.profile() as outer:
        _ = x + 1
        with eager_neuron.profile() as inner:
            _ = x * 2
    assert profiler._op_hook not in dispatch.OP_HOOKS
    assert profiler._launch_hook not in launch.HOOKS
    assert [e.name for e in inner.events if e.type == "op"] == ["aten::mul.Tensor"]
    assert [e.name for e in outer.events if e.type == "op"] == [
        "aten::add.Tensor", "aten::mul.Tensor"]


def test_launch_outside_any_op_is_attributed_to_the_caller():
    out = np.zeros(4, np.float32)

    def render():
        return "@njit\ndef proftest_fill(o):\n    o[:] = 2\n", "proftest_fill"

    with eager_neuron.profile() as prof:
        launch.launch(("proftest", "fill"), render, (out,))  # direct
    kernel = next(e for e in prof.events if e.type == "kernel")
    assert kernel.parent is None and kernel.name == "proftest:fill" and out[0] == 2
    assert kernel.line == _line("direct", test_launch_outside_any_op_is_attributed_to_the_caller)


# -- torch.profiler and the command line ---------------------------------------------------------

def _torch_profile(activities, body):
    from torch.profiler import profile

    with profile(activities=activities) as tp, eager_neuron.profile() as ours:
        body()
    return tp, ours


def _mlp_step():
    torch.manual_seed(0)
    model = Net().to("neuron")
    x = torch.randn(5, 8, device="neuron")

    def body():
        with torch.profiler.record_function("my_forward"):
            loss = model(x).pow(2).mean()
        with torch.profiler.record_function("my_backward"):
            loss.backward()
    body()                                     # compile (or load) every kernel first
    return body


def _forward_kernels(ours):
    """Kernels of the ops inside record_function("my_forward") (loss.backward()'s ones_like is
    a forward-phase op of the my_backward block)."""
    return [k for k in ours.events if k.type == "kernel" and k.phase == "forward"
            and k.source != "loss.backward()"]


@pytest.fixture(scope="module")
def torch_prof(tmp_path_factory):
    from torch.profiler import ProfilerActivity

    tp, ours = _torch_profile([ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], _mlp_step())
    path = tmp_path_factory.mktemp("tp") / "trace.json"
    tp.export_chrome_trace(str(path))
    return tp, ours, json.loads(path.read_text())


def test_torch_profiler_privateuse1_lists_every_kernel_with_its_device_time(torch_prof):
    from torch.autograd import DeviceType

    tp, ours, _ = torch_prof
    kernels = [e for e in ours.events if e.type == "kernel"]
    device = [e for e in tp.events() if e.device_type == DeviceType.PrivateUse1]
    assert kernels and sorted(e.name for e in device) == sorted(k.name for k in kernels)
    assert sum(e.device_time_total for e in device) == pytest.approx(
        sum(k.device_us for k in kernels), rel=1e-9)
    assert all(e.device_index == 0 and e.device_time_total > 0 for e in device)
    assert not any(e.name.startswith("neuron::profiler_clock") for e in tp.events())
    # each aten op carries the kernels it launched: linear's addmm, relu, the backward mm
    rows = {e.key: e for e in tp.key_averages()}
    for op, family in (("aten::addmm", "matmul"), ("aten::relu", "elementwise"),
                       ("aten::threshold_backward", "elementwise")):
        mine = [k for k in kernels if ours.events[k.parent].name.startswith(op + ".")
                or ours.events[k.parent].name == op]
        assert mine and all(k.name.startswith(family) for k in mine), op
        assert rows[op].self_device_time_total == pytest.approx(
            sum(k.device_us for k in mine), rel=1e-9), op
    table = tp.key_averages().table(sort_by="self_device_time_total", row_limit=200)
    assert "Self NEURON" in table and "elementwise:aten::relu" in table
    assert "neuron::elementwise:aten::relu" in table     # the launch, on the CPU side


def test_torch_profiler_record_function_labels_carry_the_kernels_they_cover(torch_prof):
    tp, ours, _ = torch_prof
    fwd = _forward_kernels(ours)
    label = next(e for e in tp.events() if e.name == "my_forward")
    assert fwd and label.device_time_total == pytest.approx(sum(k.device_us for k in fwd),
                                                            rel=1e-9)
    # loss.backward() runs its kernels on autograd's thread: the label around it carries them
    bwd = [k for k in ours.events if k.type == "kernel" and k not in fwd]
    label = next(e for e in tp.events() if e.name == "my_backward")
    assert any(k.phase == "backward" for k in bwd)
    assert label.device_time_total == pytest.approx(sum(k.device_us for k in bwd), rel=1e-9)


def test_torch_profiler_chrome_trace_has_a_device_track(torch_prof):
    tp, ours, trace = torch_prof
    evs = trace["traceEvents"]
    kernels = [e for e in ours.events if e.type == "kernel"]
    dev = [e for e in evs if e.get("ph") == "X" and e.get("cat") == "kernel"]
    assert len(dev) == len(kernels) and {e["pid"] for e in dev} == {0}
    labels = {e["args"]["labels"] for e in evs if e.get("name") == "process_labels"
              and e.get("pid") == 0}
    assert labels == {"neuron:0 (simulated NeuronCore)"}
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in dev)
    assert all(a[1] <= b[0] + 1e-3 for a, b in itertools.pairwise(spans))
    # a flow arrow from each launch (host) to its kernel (device), never backwards in time
    starts = {e["id"]: e for e in evs if e.get("ph") == "s" and e.get("cat") == "ac2g"}
    ends = {e["id"]: e for e in evs if e.get("ph") == "f" and e.get("cat") == "ac2g"}
    assert len(starts) == len(ends) == len(dev)
    for i, s in starts.items():
        assert s["pid"] == os.getpid() and s["ts"] <= ends[i]["ts"] + 1e-3
    launches = [e for e in evs if e.get("cat") == "neuron_runtime"]
    assert len(launches) == len(dev) and all(e["dur"] > 0 for e in launches)
    # the record_function label is on the device track too, spanning its forward kernels
    fwd = {k.name for k in _forward_kernels(ours)}
    ann = next(e for e in evs if e.get("cat") == "gpu_user_annotation"
               and e["name"] == "my_forward")
    inside = [e for e in dev if ann["ts"] <= e["ts"] and
              e["ts"] + e["dur"] <= ann["ts"] + ann["dur"] + 1e-3]
    assert {e["name"] for e in inside} >= fwd
    assert len(inside) == len(_forward_kernels(ours))
    assert not any(e.get("name", "").startswith("neuron::profiler_clock") for e in evs)


def test_torch_profiler_cpu_only_and_legacy_forms():
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    x = torch.ones(32, device="neuron")
    _ = x * 5
    with profile(activities=[ProfilerActivity.CPU]) as tp:    # CPU only: as on CUDA, no kernels
        _ = x * 5
    names = {e.key for e in tp.key_averages()}
    assert "aten::mul" in names and "elementwise:aten::mul" not in names
    # the autograd profiler's use_device form (legacy use_kineto=False is upgraded)
    with torch.autograd.profiler.profile(use_device="neuron") as ap:
        _ = x * 5
    rows = {e.key: e for e in ap.key_averages()}
    assert rows["aten::mul"].device_time_total > 0
    assert any(e.device_type == DeviceType.PrivateUse1 for e in ap.function_events)


@pytest.mark.skipif(not hasattr(eager_neuron, "adaptive"), reason="no adaptive eager yet")
def test_torch_profiler_names_fused_kernels_after_their_ops():
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(100, device="neuron")
    with eager_neuron.adaptive():
        (x + 1).relu().sum().item()                 # compile the fused kernel first
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as tp:
            v = (x + 1).relu().sum().item()
    dev = [e for e in tp.events() if e.device_type == DeviceType.PrivateUse1]
    assert any(e.name.startswith("fused:add+relu") for e in dev), [e.name for e in dev]
    assert v == pytest.approx((x.cpu() + 1).relu().sum().item(), rel=1e-5)


def test_record_function_blocks_enclose_their_kernels_in_eager_neuron_profile(tmp_path):
    torch.manual_seed(0)
    model = Net().to("neuron")
    x = torch.randn(5, 8, device="neuron")
    model(x).sum().backward()
    with eager_neuron.profile() as prof:
        with torch.profiler.record_function("step"):
            with torch.profiler.record_function("fwd"):
                y = model(x).sum()
            with torch.profiler.record_function("bwd"):
                y.backward()               # runs on autograd's thread: still inside "bwd"
        _ = x * 2                          # outside every block
    kernels = [e for e in prof.events if e.type == "kernel"]
    labels = {e.name: e for e in prof.events if e.type == "label"}
    assert set(labels) == {"step", "fwd", "bwd"}
    assert labels["fwd"].parent == labels["bwd"].parent == labels["step"].id
    by = {n: [k for k in kernels if k.label == n] for n in ("fwd", "bwd")}
    assert by["fwd"] and by["bwd"] and any(k.phase == "backward" for k in by["bwd"])
    assert [k for k in kernels if k.label is None] == [kernels[-1]]     # z = x * 2
    for name in ("fwd", "bwd"):
        lab = labels[name]
        assert lab.n_ops == len(by[name])
        assert lab.device_us == pytest.approx(sum(k.device_us for k in by[name]))
        # the block spans exactly its kernels on the device clock
        assert lab.device_start_us == pytest.approx(min(k.device_start_us for k in by[name]))
        assert lab.extra["device_end_us"] == pytest.approx(
            max(k.device_start_us + k.device_us for k in by[name]))
    assert labels["step"].n_ops == len(by["fwd"]) + len(by["bwd"])
    rows = {r["label"]: r for r in prof.summary(group_by="label")}
    assert rows["bwd"]["kernels"] == len(by["bwd"]) and "label" in prof.table(group_by="label")
    # the line table does not count blocks; the Chrome trace shows them on host and device
    assert sum(r["kernels"] for r in prof.summary()) == len(kernels)
    trace = chrome_trace_json(prof, tmp_path)
    dev = [e for e in trace if e.get("cat") == "user_annotation" and e["pid"] >= 100]
    host = [e for e in trace if e.get("cat") == "user_annotation" and e["pid"] == 1]
    assert {e["name"] for e in dev} == {e["name"] for e in host} == {"step", "fwd", "bwd"}
    # the text timeline and the picture name every kernel with its block and source line
    text = prof.timeline()
    assert len(text.splitlines()) == 2 + len(kernels) and "backward of test_profiler.py" in text
    path = tmp_path / "t.html"
    prof.export_timeline(str(path))
    page = path.read_text()
    import xml.etree.ElementTree as ET

    svg = ET.fromstring(page[page.index("<svg"):page.index("</svg>") + 6])
    boxes = [g for g in svg.iter("{http://www.w3.org/2000/svg}g")]
    tips = [g.find("{http://www.w3.org/2000/svg}title").text for g in boxes]
    assert sum(1 for t in tips if not t.startswith("record_function")) >= len(kernels)
    assert sum(1 for t in tips if t.startswith("record_function")) == 3
    assert any("y = model(x).sum()" in t for t in tips)


def chrome_trace_json(prof, tmp_path):
    path = tmp_path / "labels.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())["traceEvents"]


def test_cli_runs_a_script_and_writes_table_and_trace(tmp_path, capsys):
    from eager_neuron.tools.profile import main

    script = tmp_path / "tiny.py"
    script.write_text("import sys, torch\n"
                      "x = torch.ones(4, device='neuron')\n"
                      "y = x * float(sys.argv[1])\n"
                      "sys.exit(3 if y.sum().item() == 8.0 else 0)\n")
    out = tmp_path / "new" / "dir"                  # created by the tool
    status = main(["--out-dir", str(out), "--timeline", "--group-by", "line,kernel", str(script),
                   "2"])
    assert status == 3
    assert "tiny.py:3 in &lt;module&gt;" in (out / "tiny.timeline.html").read_text()
    tmp_path = out
    table = (tmp_path / "tiny.profile.txt").read_text()
    assert "tiny.py:3 in <module>" in table and "elementwise:aten::mul" in table
    assert table.strip() in capsys.readouterr().out
    trace = json.loads((tmp_path / "tiny.trace.json").read_text())
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])


def test_chrome_trace_labels_autograds_worker_thread_when_backward_runs_there(tmp_path):
    # with backward on the engine's neuron worker (device.BACKWARD_ON_CALLER off), the thread
    # that ran only backward ops is labelled as autograd's; the caller's thread is not
    from eager_neuron import device

    torch.manual_seed(0)
    model = Net().to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 8, device="neuron")
    y = torch.randn(5, 4, device="neuron")
    train_step(model, opt, x, y)
    device.BACKWARD_ON_CALLER[0] = False
    try:
        with eager_neuron.profile() as prof:
            train_step(model, opt, x, y)
    finally:
        device.BACKWARD_ON_CALLER[0] = True
    backward = [e for e in prof.events if e.phase == "backward"]
    assert backward and all(e.thread != "MainThread" for e in backward)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "MainThread" in threads and any(t.endswith("(autograd backward)") for t in threads)
