"""Simulated NeuronCores: HBM accounting and OOM, the clock, streams and events, multi-core.

Env-var knobs (EAGER_NEURON_DEVICE/CORES/HBM_BYTES, NEURON_LAUNCH_BLOCKING) are checked in one
subprocess; everything else uses the Python API (SIM, core.capacity, config.launch_blocking).
"""

import gc
import json
import os
import subprocess
import sys
from contextlib import contextmanager

import pytest
import torch

import eager_neuron
from eager_neuron import cost
from eager_neuron.config import config
from eager_neuron.simulator import SIM, Simulator


@pytest.fixture(autouse=True)
def _clean_state():
    yield
    config.launch_blocking = False
    torch.neuron.set_device(0)
    for core in SIM.cores:
        core.queue = core.default_queue


def _settle():
    """Drop garbage and let the host catch up with the device: a clean start for timing."""
    gc.collect()
    for i in range(torch.neuron.device_count()):
        torch.neuron.synchronize(i)
    SIM.reset_counters()
    eager_neuron.reset_stats()


@contextmanager
def _chip(device: str, cores: int = 2):
    """Temporarily rebuild SIM as another device profile (old tensors keep their old cores)."""
    saved = (SIM.profile, SIM.cores, SIM.host_us, SIM.epoch_us)
    SIM.configure(device, cores)
    try:
        yield
    finally:
        SIM.profile, SIM.cores, SIM.host_us, SIM.epoch_us = saved


# -- HBM accounting ------------------------------------------------------------------------------

def test_memory_goes_up_and_back_down_with_views():
    gc.collect()
    base = torch.neuron.memory_allocated()
    x = torch.randn(256, 256, device="neuron")              # 256 KiB
    assert torch.neuron.memory_allocated() - base == 256 * 1024
    v, t = x[10:20], x.t()                                    # views share the block
    assert torch.neuron.memory_allocated() - base == 256 * 1024
    del x
    assert torch.neuron.memory_allocated() - base == 256 * 1024   # the views keep it alive
    del v
    assert torch.neuron.memory_allocated() - base == 256 * 1024
    del t
    assert torch.neuron.memory_allocated() == base


def test_memory_returns_to_baseline_after_backward():
    gc.collect()
    base = torch.neuron.memory_allocated()
    x = torch.randn(64, 64, device="neuron", requires_grad=True)
    y = (x * x).exp()                                         # saves x (mul) and y (exp)
    hidden = (x * 3).sin()                                    # a saved intermediate
    y.backward(torch.ones_like(y))
    (hidden * 1).backward(torch.ones_like(hidden))
    assert x.grad is not None and torch.neuron.memory_allocated() > base
    del x, y, hidden
    assert torch.neuron.memory_allocated() == base


def test_peak_reserved_and_empty_cache():
    gc.collect()
    base = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    x = torch.empty(1 << 18, device="neuron")                 # 1 MiB: pooled on free
    assert torch.neuron.max_memory_allocated() == base + (1 << 20)
    del x
    assert torch.neuron.memory_allocated() == base
    assert torch.neuron.memory_reserved() >= base + (1 << 20)  # cached for reuse
    assert torch.neuron.max_memory_allocated() == base + (1 << 20)
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() == torch.neuron.memory_allocated() == base
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == base
    stats = torch.neuron.memory_stats()
    assert stats["allocated_bytes.all.current"] == base
    assert stats["allocation.all.freed"] >= 1
    assert "neuron:0" in torch.neuron.memory_summary()
    free, total = torch.neuron.mem_get_info()
    assert total == SIM.core(0).capacity and free == total - torch.neuron.memory_reserved()


def test_oom_names_request_free_total_and_leaves_tensors_intact():
    core = SIM.core(0)
    a = torch.arange(1000, device="neuron", dtype=torch.float32)
    b = a * 2
    expect_a, expect_b = a.cpu().clone(), b.cpu().clone()
    torch.neuron.empty_cache()
    saved, ooms = core.capacity, core.oom_count
    core.capacity = core.allocated + (1 << 20)                # 1 MiB of headroom
    try:
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(1 << 20, device="neuron")             # 4 MiB
        msg = str(info.value)
        assert "neuron:0 out of memory" in msg
        assert "4194304 bytes" in msg                         # the request
        assert f"({1 << 20} bytes) free" in msg               # the free bytes
        assert f"({core.capacity} bytes) total" in msg        # the total
        with pytest.raises(torch.OutOfMemoryError):           # an op whose output cannot fit
            torch.ones(2048, 1024, device="neuron")
        assert core.oom_count == ooms + 2
        assert torch.neuron.memory_stats()["num_ooms"] == ooms + 2
        # the process goes on: old tensors intact, new (small) work runs
        assert torch.equal(a.cpu(), expect_a) and torch.equal(b.cpu(), expect_b)
        c = a + b
        assert torch.equal(c.cpu(), expect_a + expect_b)
    finally:
        core.capacity = saved


def test_knobs_from_the_environment():
    # One subprocess for every env var: device profile, core count, HBM capacity, blocking.
    # NOTE: no kernels here (a fresh process would compile them): host ops and SIM verbs only
    code = r"""
import json, torch, eager_neuron
from eager_neuron.simulator import SIM
out = {"device": SIM.profile.name, "cores": torch.neuron.device_count(),
       "total": torch.neuron.get_device_properties(0).total_memory}
try:
    torch.empty(1 << 20, device="neuron")
except torch.OutOfMemoryError as e:
    out["oom"] = str(e)
out["after_oom"] = torch.arange(4, device="neuron:2").cpu().tolist()
SIM.core(2).launch(1e6, 0, "vector")
out["blocking_done"] = torch.neuron.current_stream(2).query()
print(json.dumps(out))
"""
    env = dict(os.environ, EAGER_NEURON_DEVICE="trn3", EAGER_NEURON_CORES="3",
               EAGER_NEURON_HBM_BYTES=str(1 << 20), NEURON_LAUNCH_BLOCKING="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out["device"], out["cores"], out["total"]) == ("trn3", 3, 1 << 20)
    assert "tried to allocate 4.00 MiB" in out["oom"] and "(1048576 bytes) total" in out["oom"]
    assert out["after_oom"] == [0, 1, 2, 3]
    assert out["blocking_done"] is True


# -- clock, streams, events ----------------------------------------------------------------------

def test_launches_are_asynchronous_until_synchronize():
    x = torch.ones(1 << 16, device="neuron")
    _settle()
    host = SIM.host_us
    for _ in range(3):
        x = x * 2
    s = torch.neuron.current_stream()
    assert SIM.host_us == host                                # enqueue does not block the host
    assert not s.query()
    torch.neuron.synchronize()
    assert s.query()
    assert SIM.host_us == pytest.approx(host + eager_neuron.stats()["device_time_us"])


def test_launch_blocking_makes_every_launch_synchronous():
    x = torch.ones(1 << 16, device="neuron")
    _settle()
    config.launch_blocking = True
    y = x * 2
    assert torch.neuron.current_stream().query()
    assert SIM.host_us == pytest.approx(SIM.core(0).clock_us)
    del y


def test_events_measure_simulated_time_consistently_with_stats():
    x = torch.ones(1 << 18, device="neuron")                  # 1 MiB of fp32
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    _settle()
    start.record()
    for _ in range(4):
        x = x * 2                                             # memory-bound vector kernels
    end.record()
    end.synchronize()
    st = eager_neuron.stats()
    ms = start.elapsed_time(end)
    assert ms * 1000 == pytest.approx(st["device_time_us"])
    assert st["device_time_us"] == pytest.approx(
        st["launch_overhead_us"] + sum(st["engine_busy_us"].values()))
    assert st["launches"] == 4 and st["launch_overhead_us"] == pytest.approx(4 * 15.0)
    per_kernel = cost.launch_cost_us(SIM.profile, 0, 2 * (1 << 20), "vector")
    assert ms * 1000 == pytest.approx(4 * per_kernel, rel=0.05)   # each reads + writes 1 MiB


def test_event_errors_follow_cuda():
    plain = torch.neuron.Event()
    timed = torch.neuron.Event(enable_timing=True)
    assert plain.query() and timed.query()                     # never recorded: nothing pending
    with pytest.raises(RuntimeError, match="recorded"):
        torch.neuron.Event(enable_timing=True).elapsed_time(timed)
    x = torch.ones(1 << 16, device="neuron")
    _settle()
    timed.record()
    y = x + 1
    end = torch.neuron.Event(enable_timing=True)
    end.record()
    assert not end.query()
    with pytest.raises(RuntimeError, match="not completed"):
        timed.elapsed_time(end)
    with pytest.raises(RuntimeError, match="enable_timing"):
        plain.elapsed_time(end)
    torch.neuron.synchronize()
    assert end.query() and timed.elapsed_time(end) > 0
    assert end.device == torch.device("neuron", 0)
    del y


def test_streams_wait_for_events_and_each_other():
    x = torch.ones(1 << 18, device="neuron")
    _settle()
    side = torch.neuron.Stream()
    assert isinstance(side, torch.Stream) and side.device == torch.device("neuron", 0)
    assert side != torch.neuron.default_stream()
    for _ in range(3):
        x = x * 2                                              # busy default stream
    done = torch.neuron.current_stream().record_event(torch.neuron.Event(enable_timing=True))
    side.wait_event(done)
    with torch.neuron.stream(side):
        assert torch.neuron.current_stream() == side
        y = x + 1
        after = torch.neuron.Event(enable_timing=True)
        after.record()
    assert torch.neuron.current_stream() == torch.neuron.default_stream()
    side.synchronize()
    assert done.elapsed_time(after) > 0                         # side ran after the default work
    # wait_stream: the default stream's next kernel starts after the side stream's tail
    with side:
        z = y * 3
    torch.neuron.current_stream().wait_stream(side)
    w = z + 0
    mark = torch.neuron.current_stream().record_event(torch.neuron.Event(enable_timing=True))
    torch.neuron.synchronize()
    assert mark._time >= side._queue.tail_us
    assert torch.equal(w.cpu(), torch.full((1 << 18,), 27.0))


def test_a_copy_on_a_side_stream_overlaps_compute_on_the_default_stream():
    x = torch.ones(1 << 18, device="neuron")
    small = torch.ones(16, device="neuron")
    _settle()
    for _ in range(8):
        x = x * 2                                              # ~8 x 20 us queued, not waited on
    with torch.neuron.stream(torch.neuron.Stream()):
        small.cpu()                                            # a blocking copy, on the DMA engine
    assert SIM.host_us < SIM.core(0).default_queue.tail_us     # the host did not wait for x
    torch.neuron.synchronize()
    assert torch.equal(x.cpu(), torch.full((1 << 18,), 256.0))


def test_generic_accelerator_api_reaches_the_simulator():
    x = torch.ones(1 << 16, device="neuron")
    _settle()
    y = x * 2
    assert not torch.accelerator.current_stream().query()
    torch.accelerator.synchronize()
    assert torch.accelerator.current_stream().query()
    assert torch.accelerator.current_stream() == torch.neuron.current_stream()
    s = torch.neuron.Stream(device="neuron:1")
    torch.accelerator.set_stream(s)                            # also makes core 1 current
    assert torch.accelerator.current_device_index() == 1
    assert torch.neuron.current_stream() == s
    with torch.accelerator.device_index(0):
        assert torch.neuron.current_device() == 0
    assert torch.accelerator.memory_allocated(0) == torch.neuron.memory_allocated(0)
    del y


def test_generic_torch_event_is_not_routed_by_pytorch():
    # PyTorch 2.13's Python device guard has no event hooks: torch.Event on neuron is a no-op
    # shell. If this starts passing, PyTorch routes it and we can wire it (docs/SIMULATOR.md).
    e1, e2 = torch.Event(device="neuron", enable_timing=True), torch.Event(
        device="neuron", enable_timing=True)
    e1.record()
    e2.record()
    with pytest.raises(RuntimeError, match="elapsedTime"):
        e1.elapsed_time(e2)


# -- multi-core -----------------------------------------------------------------------------------

def test_tensors_on_core_1_allocate_and_launch_there():
    gc.collect()
    base0, base1 = torch.neuron.memory_allocated(0), torch.neuron.memory_allocated(1)
    _settle()
    x = torch.randn(3, device="neuron:1")
    y = x + 1
    assert y.device == torch.device("neuron", 1)
    assert torch.neuron.memory_allocated(0) == base0
    assert torch.neuron.memory_allocated(1) == base1 + 2 * 512
    assert (SIM.core(0).launches, SIM.core(1).launches) == (0, 1)
    assert SIM.core(1).busy_us["vector"] > 0 and SIM.core(0).clock_us < SIM.core(1).clock_us
    assert torch.allclose(y.cpu(), x.cpu() + 1)
    with torch.neuron.device(1):
        z = torch.zeros(2, device="neuron")
        assert z.device == torch.device("neuron", 1)


def test_host_to_core_copy_is_charged_to_that_core():
    _settle()
    before = eager_neuron.stats()["transfers"]
    t = torch.arange(1024, dtype=torch.float32).to("neuron:1")
    assert t.device == torch.device("neuron", 1)
    assert eager_neuron.stats()["transfers"] == before + 1
    assert SIM.core(1).transfer_bytes == 4096 and SIM.core(0).transfer_bytes == 0
    assert SIM.core(1).busy_us["dma"] == pytest.approx(4096 / 64e9 * 1e6)


def test_cross_core_copy_is_charged_as_a_transfer():
    x = torch.arange(1024, dtype=torch.float32, device="neuron:0")
    _settle()
    y = x.to("neuron:1")
    assert y.device == torch.device("neuron", 1)
    assert eager_neuron.stats()["transfers"] == 1
    assert eager_neuron.stats()["transfer_bytes"] == 4096
    assert SIM.core(1).transfer_bytes == 4096
    assert torch.equal(y.cpu(), torch.arange(1024, dtype=torch.float32))


def test_copy_between_cores_orders_after_both_queues():
    sim = Simulator()
    sim.configure("trn2", 2)
    a, b = sim.cores
    a.launch(0, 3.625e6, "vector")                              # core 0 busy until 25 us
    t = sim.copy_between(0, 1, 3.625e6 / 2)                     # 10 us through HBM
    assert t == pytest.approx(10.0)
    assert b.clock_us == pytest.approx(35.0) and a.clock_us == pytest.approx(35.0)
    assert sim.host_us == 0.0                                   # asynchronous for the host
    b.launch(0, 0, "vector")
    assert b.clock_us == pytest.approx(50.0)


def test_cores_run_in_parallel():
    sim = Simulator()
    sim.configure("trn2", 2)
    for core in sim.cores:
        core.launch(0, 3.625e6, "vector")                       # 15 + 10 us each
    assert sim.device_time_us() == pytest.approx(25.0)
    assert sim.stats()["core_time_us"] == pytest.approx([25.0, 25.0])


def test_backward_on_core_1():
    # the engine runs graphs on core 1+ on the caller's thread (device._install_multicore_backward)
    x = torch.randn(4, device="neuron:1", requires_grad=True)
    (x * x).backward(torch.ones(4, device="neuron:1"))
    assert x.grad.device == torch.device("neuron", 1)
    assert torch.equal(x.grad.cpu(), 2 * x.detach().cpu())
    lin = torch.nn.Linear(3, 2).to("neuron:1")
    (w,) = torch.autograd.grad(lin(torch.ones(5, 3, device="neuron:1")).sum(), [lin.weight])
    assert w.device == torch.device("neuron", 1) and torch.equal(w.cpu(), torch.full((2, 3), 5.0))


# -- device profiles ------------------------------------------------------------------------------

def test_trn2_and_trn3_give_different_times_for_the_same_work():
    times = {}
    for device in ("trn2", "trn3"):
        with _chip(device):
            x = torch.ones(1 << 18, device="neuron")
            _settle()
            y = (x * 2).exp()                                   # vector + scalar kernels
            torch.neuron.synchronize()
            times[device] = eager_neuron.stats()["device_time_us"]
            assert eager_neuron.stats()["device"] == device
            del x, y
    assert times["trn3"] < times["trn2"]


def test_stats_and_summary():
    x = torch.ones(1 << 16, device="neuron")
    _settle()
    y = x * 2
    torch.neuron.synchronize()
    st = eager_neuron.stats()
    for key in ("device_time_us", "launch_overhead_us", "hbm_bytes", "transfer_bytes",
                "engine_busy_us", "core_time_us"):
        assert key in st
    assert st["hbm_bytes"] == 2 * 4 * (1 << 16)
    text = SIM.summary()
    assert text.startswith("simulated trn2 x 2 cores") and "launch overhead" in text
    del y


def test_a_pooled_storage_keeps_its_host_view():
    # a large output comes from the pool's storage with the host view made over it the last
    # time (buffers._host_view: torch.empty + set_ cost ~19 us of a large op's host path), only
    # while nothing but the core's cache holds that view; values and accounting as before
    from eager_neuron import buffers

    n = 1 << 16   # 256 KiB: pooled
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    x, y = a.to("neuron"), b.to("neuron")
    core = SIM.core(x.device.index)
    before = buffers.VIEW_STATS["reused"]
    for _ in range(4):
        assert torch.equal((x + y).cpu(), a + b)
    assert buffers.VIEW_STATS["reused"] - before >= 2
    # a view someone still holds is not handed out again: the next output gets a new one
    z = x + y
    held = z._data
    del z
    gc.collect()
    w = x * 2.0
    assert w._data is not held and held.shape == (n,) and held.stride() == (1,)
    assert torch.equal(w.cpu(), a * 2.0)
    del w, held
    # the same storage under other metadata: a view of that shape
    m = x.view(256, 256) + y.view(256, 256)
    assert m._data.shape == (256, 256) and torch.equal(m.cpu(), (a + b).view(256, 256))
    del m
    gc.collect()
    allocated = torch.neuron.memory_allocated()
    torch.neuron.empty_cache()
    assert core.views == {} and torch.neuron.memory_allocated() == allocated
    assert torch.equal((x + y).cpu(), a + b)
