"""torch.distributed on neuron: the c10d backend, collectives, DDP, FSDP2, DTensor/TP, faults.

Every multi-process test spawns 2 ranks on this machine (FileStore rendezvous, gloo over
127.0.0.1), each bounded by a timeout; a rank's failure comes back as its traceback. References
are exact integers or float64 CPU runs.
"""

from __future__ import annotations

import datetime
import os
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import eager_neuron
from eager_neuron.distributed import cost as dcost

WORLD = 2
pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")


# -- the harness: ONE spawn of WORLD ranks runs every part in order (a process start and
# `import eager_neuron` cost seconds each on a loaded machine); each test judges its own part.
def _entry(rank, store_dir, results):
    try:
        import eager_neuron  # noqa: F401 -- registers the backend in the child

        torch.neuron.set_device(rank)
    except BaseException:   # noqa: BLE001 - every failure goes back to the parent
        results.put((rank, "setup", "error", traceback.format_exc()))
        os._exit(1)
    for name, body in PARTS:
        try:
            out = body(rank, store_dir, results)
            results.put((rank, name, "ok", out))
        except BaseException:   # noqa: BLE001
            results.put((rank, name, "error", traceback.format_exc()))
        finally:
            if dist.is_initialized():
                try:
                    dist.destroy_process_group()
                except Exception:   # noqa: BLE001, S110 - a dead peer: nothing to tear down
                    pass
    os._exit(0)   # no atexit hooks: a peer that died must not block this rank's exit


TIMEOUT_S = 240.0   # the whole run, all parts (a hung collective times out after 30 s itself)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    """{(rank, part): ("ok", result) | ("error", traceback)} from one 2-rank run."""
    store_dir = tmp_path_factory.mktemp("dist")
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    procs = [ctx.Process(target=_entry, args=(r, str(store_dir), results)) for r in range(WORLD)]
    for p in procs:
        p.start()
    got: dict = {}
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if not results.empty():
                rank, part, status, out = results.get()
                got[(rank, part)] = (status, out)
                continue
            if not any(p.is_alive() for p in procs) and results.empty():
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
    return got


def _result(ranks, part, rank):
    key = (rank, part)
    if (rank, "setup") in ranks:
        pytest.fail(f"rank {rank} failed to start:\n{ranks[(rank, 'setup')][1]}")
    assert key in ranks, f"rank {rank} gave no result for {part} within {TIMEOUT_S} s"
    status, out = ranks[key]
    if status == "error":
        pytest.fail(f"rank {rank} failed in {part}:\n{out}")
    return out


def _init(rank, store_dir, name="pg", backend=None, seconds=30):
    kw = {} if backend is None else {"backend": backend}
    dist.init_process_group(init_method=f"file://{store_dir}/{name}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=seconds), **kw)


# -- in-process: registration and the cost model ---------------------------------------------------
def test_backend_is_registered_as_the_neuron_default():
    assert dist.Backend.default_device_backend_map["neuron"] == "neuron"
    assert "neuron" in dist.Backend.backend_list
    assert set(dist.Backend.backend_capability["neuron"]) == {"cpu", "neuron"}


def test_cost_model():
    trn2 = eager_neuron.cost.PROFILES["trn2"]
    link = dcost.link_for(trn2, 2, 2)
    assert link.name == "chip" and link.bytes_per_s == trn2.hbm_bytes_per_s / 8
    assert dcost.link_for(trn2, 16, 16).name == "neuronlink"
    assert dcost.link_for(trn2, 4, 2).name == "efa"
    assert dcost.allreduce_time_us(1 << 30, 1, link) == 0.0
    big, small = 64 << 20, 64
    for p in (2, 4, 8):
        lk = dcost.Link("t", 1e9, 5.0)
        # ring: 2(p-1)/p n/bw + 2(p-1) lat; tree: 2 log2(p) (n/bw + lat); all-reduce takes the min
        ring = 2 * (p - 1) / p * big / 1e9 * 1e6 + 2 * (p - 1) * 5.0
        assert dcost.ring_allreduce_us(big, p, lk) == pytest.approx(ring)
        assert dcost.allreduce_time_us(big, p, lk) == pytest.approx(
            min(ring, dcost.tree_allreduce_us(big, p, lk)))
        # small messages are latency bound: the tree is never worse for p >= 4
        if p >= 4:
            assert dcost.allreduce_time_us(small, p, lk) == dcost.tree_allreduce_us(small, p, lk)
        # all-gather + reduce-scatter of the same data costs what a ring all-reduce costs
        assert dcost.allgather_time_us(big, p, lk) + dcost.reduce_scatter_time_us(
            big, p, lk) == pytest.approx(ring)
    # the faster NeuronLink of trn3 makes the same cross-chip all-reduce cheaper
    trn3 = eager_neuron.cost.PROFILES["trn3"]
    assert dcost.allreduce_time_us(big, 16, dcost.link_for(trn3, 16, 16)) < \
        dcost.allreduce_time_us(big, 16, dcost.link_for(trn2, 16, 16))


def test_one_rank_group_in_process_counts_and_profiles(tmp_path):
    """A 1-rank neuron group in this process: the result, the counters, the profiler row."""
    dist.init_process_group(init_method=f"file://{tmp_path}/one", rank=0, world_size=1)
    try:
        eager_neuron.reset_stats()
        x = torch.arange(4.0, device="neuron")
        with eager_neuron.profile() as prof:
            dist.all_reduce(x)
        assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
        s = eager_neuron.stats()
        assert s["collectives"] == {"all_reduce": 1} and s["collective_bytes"]["all_reduce"] == 16
        assert s["fallbacks"] == {}
        assert "c10d::allreduce_" in str(prof)
        eager_neuron.reset_stats()
        assert eager_neuron.stats()["collectives"] == {}
    finally:
        dist.destroy_process_group()


# -- collectives -----------------------------------------------------------------------------------
def _collectives_body(rank, store_dir, results):
    import torch.distributed._functional_collectives as funcol

    eager_neuron.reset_stats()
    dev = torch.device("neuron", rank)
    _init(rank, store_dir, "default")   # no backend: the neuron device's default
    assert dist.get_backend_config() in ("neuron:neuron", "neuron:neuron, cpu:neuron") or \
        "neuron" in dist.get_backend_config(), dist.get_backend_config()
    base = torch.arange(6, dtype=torch.float32)
    other = base + 10 * (1 - rank) + 1   # what the peer holds (rank r holds base + 10 r + 1)
    mine = base + 10 * rank + 1
    expect = {dist.ReduceOp.SUM: mine + other, dist.ReduceOp.AVG: (mine + other) / 2,
              dist.ReduceOp.PRODUCT: mine * other, dist.ReduceOp.MIN: torch.minimum(mine, other),
              dist.ReduceOp.MAX: torch.maximum(mine, other)}
    for op, want in expect.items():
        t = mine.to(dev)
        dist.all_reduce(t, op=op)
        assert t.device == dev and torch.equal(t.cpu(), want), (op, t.cpu(), want)
    # int64 and a non-contiguous view (staged through a contiguous copy, written back)
    i = torch.full((3,), rank + 1, dtype=torch.int64, device=dev)
    dist.all_reduce(i)
    assert i.cpu().tolist() == [3, 3, 3]
    grid = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(dev)
    col = grid[:, 1]
    dist.all_reduce(col)
    assert grid.cpu()[:, 1].tolist() == [2.0, 10.0, 18.0] and grid.cpu()[0, 0] == 0
    # broadcast, reduce
    b = torch.full((4,), float(rank), device=dev)
    dist.broadcast(b, src=1)
    assert b.cpu().tolist() == [1.0] * 4
    r = torch.full((2,), float(rank + 1), device=dev)
    dist.reduce(r, dst=0)
    if rank == 0:
        assert r.cpu().tolist() == [3.0, 3.0]
    # all_gather (list and tensor), reduce_scatter_tensor, all_to_all(_single)
    outs = [torch.empty(2, device=dev) for _ in range(WORLD)]
    dist.all_gather(outs, torch.full((2,), float(rank), device=dev))
    assert [o.cpu().tolist() for o in outs] == [[0.0, 0.0], [1.0, 1.0]]
    flat = torch.empty(4, device=dev)
    dist.all_gather_into_tensor(flat, torch.full((2,), float(rank), device=dev))
    assert flat.cpu().tolist() == [0.0, 0.0, 1.0, 1.0]
    rs = torch.empty(2, device=dev)
    dist.reduce_scatter_tensor(rs, torch.arange(4.0, device=dev) * (rank + 1))
    assert rs.cpu().tolist() == ([0.0, 3.0] if rank == 0 else [6.0, 9.0])
    a2a = torch.empty(4, device=dev)
    dist.all_to_all_single(a2a, torch.arange(4.0, device=dev) + 10 * rank)
    assert a2a.cpu().tolist() == ([0.0, 1.0, 10.0, 11.0] if rank == 0 else [2.0, 3.0, 12.0, 13.0])
    lo = [torch.empty(1, device=dev) for _ in range(WORLD)]
    dist.all_to_all(lo, [torch.full((1,), 10.0 * rank + j, device=dev) for j in range(WORLD)])
    assert [x.item() for x in lo] == [float(rank), 10.0 + rank]
    # send/recv, isend/irecv, batch_isend_irecv
    peer = 1 - rank
    if rank == 0:
        dist.send(torch.arange(3.0, device=dev), dst=1)
    else:
        got = torch.zeros(3, device=dev)
        dist.recv(got, src=0)
        assert got.cpu().tolist() == [0.0, 1.0, 2.0]
    box = torch.zeros(2, device=dev)
    reqs = [dist.isend(torch.full((2,), float(rank + 5), device=dev), dst=peer),
            dist.irecv(box, src=peer)]
    for w in reqs:
        w.wait()
    assert box.cpu().tolist() == [float(peer + 5)] * 2
    box2 = torch.zeros(2, device=dev)
    ops = [dist.P2POp(dist.isend, torch.full((2,), float(rank + 7), device=dev), peer),
           dist.P2POp(dist.irecv, box2, peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert box2.cpu().tolist() == [float(peer + 7)] * 2
    # async work handles, coalesced all-reduce, barrier, objects
    h = torch.ones(3, device=dev)
    work = dist.all_reduce(h, async_op=True)
    work.wait()
    assert work.is_completed() and h.cpu().tolist() == [2.0] * 3
    xs = [torch.ones(2, device=dev), torch.full((3,), 2.0, device=dev)]
    dist.all_reduce_coalesced(xs)
    assert xs[0].cpu().tolist() == [2.0] * 2 and xs[1].cpu().tolist() == [4.0] * 3
    dist.barrier()
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": 0}, {"rank": 1}]
    # functional collectives (what DTensor issues): results stay on the device
    g = dist.group.WORLD
    fr = funcol.all_reduce(torch.full((2,), rank + 1.0, device=dev), "sum", g)
    fr = funcol.wait_tensor(fr)
    assert fr.device == dev and fr.cpu().tolist() == [3.0, 3.0]
    fg = funcol.wait_tensor(funcol.all_gather_tensor(torch.full((2,), float(rank), device=dev),
                                                     0, g))
    assert fg.device == dev and fg.cpu().tolist() == [0.0, 0.0, 1.0, 1.0]
    fs = funcol.wait_tensor(funcol.reduce_scatter_tensor(torch.arange(4.0, device=dev), "sum",
                                                         0, g))
    assert fs.cpu().tolist() == ([0.0, 2.0] if rank == 0 else [4.0, 6.0])
    fc = funcol.all_reduce_coalesced([torch.ones(2, device=dev), torch.full((1,), 3.0, device=dev)],
                                     "sum", g)
    assert [funcol.wait_tensor(t).cpu().tolist() for t in fc] == [[2.0, 2.0], [6.0]]
    fgc = funcol.all_gather_into_tensor_coalesced([torch.full((1,), float(rank), device=dev)], g)
    assert funcol.wait_tensor(fgc[0]).cpu().tolist() == [0.0, 1.0]
    s = eager_neuron.stats()
    assert not any("c10d" in k or "fsdp" in k for k in s["fallbacks"]), s["fallbacks"]
    assert s["collectives"]["all_reduce"] >= 9 and s["collective_us"]["all_reduce"] > 0
    assert s["collective_staged"] >= 1
    dist.destroy_process_group()

    # the other two spellings of the backend
    for name, backend in (("named", "neuron"), ("split", "cpu:gloo,neuron:neuron")):
        _init(rank, store_dir, name, backend)
        t = torch.full((2,), rank + 1.0, device=dev)
        dist.all_reduce(t)
        c = torch.full((2,), rank + 1.0)            # CPU tensors on the same group
        dist.all_reduce(c)
        assert t.cpu().tolist() == [3.0, 3.0] and c.tolist() == [3.0, 3.0]
        dist.destroy_process_group()
    return eager_neuron.stats()["fallbacks"]


def test_collectives(ranks):
    for rank in range(WORLD):
        fallbacks = _result(ranks, "collectives", rank)
        assert not any("c10d" in k for k in fallbacks), fallbacks


# -- DDP and FSDP2 against one CPU process on the global batch -------------------------------------
def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4)).to(dtype)


def _batches(steps=5):
    g = torch.Generator().manual_seed(1)
    return torch.randn(steps, 8, 8, generator=g), torch.randn(steps, 8, 4, generator=g)


def _cpu_losses(steps=5):
    """Float64 single-process run on the global batch (the reference)."""
    m = _model(torch.float64)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    xs, ys = _batches(steps)
    out = []
    for i in range(steps):
        loss = ((m(xs[i].double()) - ys[i].double()) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def _train(model, rank, dev, steps=5):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = _batches(steps)
    losses = []
    for i in range(steps):
        x, y = xs[i].chunk(WORLD)[rank].to(dev), ys[i].chunk(WORLD)[rank].to(dev)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        losses.append(t.item())
    return losses


def _ddp_fsdp_body(rank, store_dir, results):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = torch.device("neuron", rank)            # rank 1 trains on neuron:1, backward included
    _init(rank, store_dir, "ddp")
    eager_neuron.reset_stats()
    # DDP: several buckets (tiny bucket cap), 5 steps
    ddp = DDP(_model().to(dev), device_ids=[rank], bucket_cap_mb=1e-4)
    ddp_losses = _train(ddp, rank, dev)
    # no_sync: gradients stay local (equal to this rank's own shard's gradient)
    local = _model().to(dev)
    ddp2 = DDP(_model().to(dev), device_ids=[rank])
    xs, ys = _batches(1)
    x, y = xs[0].chunk(WORLD)[rank].to(dev), ys[0].chunk(WORLD)[rank].to(dev)
    with ddp2.no_sync():
        ((ddp2(x) - y) ** 2).mean().backward()
    ((local(x) - y) ** 2).mean().backward()
    for a, b in zip(ddp2.parameters(), local.parameters()):
        assert torch.allclose(a.grad.cpu(), b.grad.cpu(), rtol=1e-6, atol=1e-7)
    # find_unused_parameters cannot work here (pinned memory): refused when chosen, with a fix
    with pytest.raises(NotImplementedError, match="(?s)find_unused_parameters=True.*fix:"):
        DDP(_model().to(dev), device_ids=[rank], find_unused_parameters=True)
    # FSDP2: every Linear and the root sharded over a 1-D neuron mesh, 5 steps
    mesh = init_device_mesh("neuron", (WORLD,))
    model = _model().to(dev)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    fsdp_losses = _train(model, rank, dev)
    # FSDP2 with bfloat16 parameters for compute, float32 gradient reduction
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    bf = _model().to(dev)
    for layer in bf:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(bf, mesh=mesh, mp_policy=policy)
    bf16_losses = _train(bf, rank, dev)
    s = eager_neuron.stats()
    assert s["fallbacks"] == {}, s["fallbacks"]
    assert s["collectives"]["reduce_scatter"] >= 10 and s["collectives"]["all_gather"] >= 10
    return ddp_losses, fsdp_losses, bf16_losses, str(next(ddp.parameters()).device)


def test_ddp_and_fsdp2_match_one_cpu_process(ranks):
    ref = _cpu_losses()
    for rank in range(WORLD):
        ddp_losses, fsdp_losses, bf16_losses, device = _result(ranks, "ddp_fsdp", rank)
        assert device == f"neuron:{rank}"
        for got in (ddp_losses, fsdp_losses):
            assert got == pytest.approx(ref, rel=1e-5), (got, ref)
        # bfloat16 compute: a few roundings of 2**-8 relative each, far below a wrong answer
        assert bf16_losses == pytest.approx(ref, rel=2 ** -5), (bf16_losses, ref)
        assert bf16_losses != ddp_losses   # the policy really computed in bfloat16


# -- DTensor and tensor parallel -------------------------------------------------------------------
class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _dtensor_body(rank, store_dir, results):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    dev = torch.device("neuron", rank)
    _init(rank, store_dir, "dtensor")
    eager_neuron.reset_stats()
    mesh = init_device_mesh("neuron", (WORLD,))
    full = torch.arange(32.0).reshape(8, 4)
    d = distribute_tensor(full.to(dev), mesh, [Shard(0)])
    assert d.to_local().device == dev and d.to_local().shape == (4, 4)
    assert torch.equal(d.redistribute(mesh, [Replicate()]).to_local().cpu(), full)
    assert (d * 2).sum().full_tensor().item() == 2 * full.sum().item()
    # tensor parallel MLP against the unsharded float64 model, forward and backward
    torch.manual_seed(0)
    ref = _MLP().double()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    yref = ref(x.double())
    yref.sum().backward()
    torch.manual_seed(0)
    tp = parallelize_module(_MLP().to(dev), mesh, {"up": ColwiseParallel(),
                                                   "down": RowwiseParallel()})
    y = tp(x.to(dev))
    y.sum().backward()
    assert torch.allclose(y.cpu().double(), yref, rtol=1e-5, atol=1e-6)
    for name in ("up", "down"):
        g = getattr(tp, name).weight.grad.full_tensor().cpu().double()
        assert torch.allclose(g, getattr(ref, name).weight.grad, rtol=1e-5, atol=1e-6), name
    # sequence parallel LayerNorm feeding the TP pair, a residual block in DTensors throughout
    from torch.distributed.tensor.parallel import SequenceParallel

    torch.manual_seed(0)
    ref_b = _Block().double()
    xb = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(1))
    yb_ref = ref_b(xb.double())
    yb_ref.sum().backward()
    torch.manual_seed(0)
    blk = parallelize_module(_Block().to(dev), mesh, {
        "norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)})
    yb = blk(distribute_tensor(xb.to(dev), mesh, [Shard(1)]))
    yb.sum().backward()
    assert torch.allclose(yb.full_tensor().cpu().double(), yb_ref, rtol=1e-5, atol=1e-6)
    assert torch.allclose(blk.norm.weight.grad.full_tensor().cpu().double(),
                          ref_b.norm.weight.grad, rtol=1e-5, atol=1e-6)
    s = eager_neuron.stats()
    assert s["fallbacks"] == {}, s["fallbacks"]
    return sum(s["collectives"].values())


class _Block(torch.nn.Module):
    """LayerNorm -> Linear -> ReLU -> Linear with a residual: a transformer MLP block."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


def test_dtensor_and_tensor_parallel(ranks):
    for rank in range(WORLD):
        assert _result(ranks, "dtensor", rank) > 0


# -- faults ----------------------------------------------------------------------------------------
def _faults_body(rank, store_dir, results):
    dev = torch.device("neuron", rank)
    _init(rank, store_dir, "faults", seconds=10)
    seen = []
    for make in (lambda: torch.ones(4 + rank, device=dev),                    # shapes differ
                 lambda: torch.ones(4, device=dev,
                                    dtype=torch.float32 if rank == 0 else torch.int32)):
        try:
            dist.all_reduce(make())
            seen.append("no error")
        except RuntimeError as e:
            seen.append(str(e))
    # the group still works after a refused collective: nothing was sent
    t = torch.ones(2, device=dev)
    dist.all_reduce(t)
    assert t.cpu().tolist() == [2.0, 2.0]
    # rank 1 dies; rank 0's next collective fails with an error within the timeout, not a hang
    if rank == 1:
        results.put((rank, "faults", "ok", seen))
        os._exit(7)
    time.sleep(0.5)
    try:
        dist.all_reduce(torch.ones(2, device=dev))
        seen.append("no error")
    except RuntimeError as e:
        seen.append(str(e))
    return seen


def test_faults_give_every_survivor_a_clear_error(ranks):
    seen0, seen1 = _result(ranks, "faults", 0), _result(ranks, "faults", 1)   # rank 1 died
    for seen in (seen0, seen1):
        # every rank gets the same message, naming what each rank tried
        assert "collective mismatch" in seen[0] and "4 elements" in seen[0] and \
            "5 elements" in seen[0], seen[0]
        assert "float32" in seen[1] and "int32" in seen[1], seen[1]
    assert seen0[2] != "no error" and ("peer" in seen0[2] or "timed out" in seen0[2].lower()), \
        seen0[2]


# -- pipeline parallelism, distributed checkpoint, ZeRO --------------------------------------------
def _pipeline_dcp_body(rank, store_dir, results):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    from torch.distributed.tensor import Shard, distribute_tensor

    dev = torch.device("neuron", rank)
    _init(rank, store_dir, "pp")
    eager_neuron.reset_stats()
    # 2 stages (one Linear each), GPipe over 2 micro-batches; the last stage reports the losses
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 4) for _ in range(WORLD)]
    ref = torch.nn.Sequential(*[torch.nn.Linear(4, 4).double() for _ in range(WORLD)])
    for a, b in zip(ref, layers):
        a.load_state_dict({k: v.double() for k, v in b.state_dict().items()})
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(5))
    target = torch.zeros(4, 4)

    def loss_fn(out, tgt):
        return ((out - tgt) ** 2).mean()

    stage = PipelineStage(layers[rank].to(dev), rank, WORLD, dev)
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=loss_fn)
    pp = None
    if rank == 0:
        schedule.step(x.to(dev))
    else:
        losses = []
        schedule.step(target=target.to(dev), losses=losses)
        want = [loss_fn(ref(c.double()), t.double()).item()
                for c, t in zip(x.chunk(2), target.chunk(2))]
        got = [v.item() for v in losses]
        assert got == pytest.approx(want, rel=1e-5), (got, want)
        pp = got
    # DCP: save a sharded DTensor, load it into a fresh one
    mesh = init_device_mesh("neuron", (WORLD,))
    saved = distribute_tensor(torch.arange(8.0).to(dev), mesh, [Shard(0)])
    ckpt = os.path.join(store_dir, "ckpt")
    dcp.save({"t": saved}, checkpoint_id=ckpt)
    state = {"t": distribute_tensor(torch.zeros(8).to(dev), mesh, [Shard(0)])}
    dcp.load(state, checkpoint_id=ckpt)
    assert state["t"].to_local().device == dev
    assert state["t"].full_tensor().cpu().tolist() == [float(i) for i in range(8)]
    # ZeroRedundancyOptimizer: each rank steps its shard of the optimizer state, then broadcasts
    from torch.distributed.optim import ZeroRedundancyOptimizer

    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    ref = torch.nn.Linear(4, 3).double()
    ref.load_state_dict({k: v.double() for k, v in lin.state_dict().items()})
    lin = lin.to(dev)
    zero = ZeroRedundancyOptimizer(lin.parameters(), optimizer_class=torch.optim.Adam, lr=0.1)
    xs = torch.randn(WORLD, 2, 4, generator=torch.Generator().manual_seed(6))
    lin(xs[rank].to(dev)).square().sum().backward()
    for p_ in lin.parameters():
        dist.all_reduce(p_.grad, op=dist.ReduceOp.AVG)
    zero.step()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.1)
    (sum(ref(x.double()).square().sum() for x in xs) / WORLD).backward()
    ref_opt.step()
    for a, b in zip(lin.parameters(), ref.parameters()):
        assert torch.allclose(a.detach().cpu().double(), b.detach(), rtol=1e-5, atol=1e-6)
    s = eager_neuron.stats()
    assert not any("c10d" in k for k in s["fallbacks"]), s["fallbacks"]
    return pp


def test_pipeline_checkpoint_and_zero(ranks):
    assert _result(ranks, "pipeline_dcp", 0) is None
    assert len(_result(ranks, "pipeline_dcp", 1)) == 2


PARTS = [("collectives", _collectives_body), ("ddp_fsdp", _ddp_fsdp_body),
         ("dtensor", _dtensor_body), ("pipeline_dcp", _pipeline_dcp_body),
         ("faults", _faults_body)]   # faults last: rank 1 dies
