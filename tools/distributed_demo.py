"""Train GPT-2 tiny on 2 neuron ranks with DDP and with FSDP2; compare with one CPU process.

    torchrun --standalone --nproc-per-node 2 tools/distributed_demo.py     # or: make ddp

Each rank trains on neuron:<local_rank> (forward and backward) on its half of every global batch;
rank 0 also trains the same model in one CPU process on the whole global batch and prints the
three loss curves side by side, the largest relative difference, the collectives each run issued
(all on the device: no CPU fallback) and their simulated time. `--bench` adds a 64 MB all-reduce
row: neuron tensors through the "neuron" backend against gloo on plain CPU tensors. With 4 ranks
(EAGER_NEURON_CORES=4 ... --nproc-per-node 4) it also checks a 2-D (dp, tp) mesh.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import eager_neuron

VOCAB, SEQ, BATCH = 128, 16, 8     # global batch: BATCH sequences, split across the ranks


def build_model() -> torch.nn.Module:
    """GPT-2 tiny from a seed (dropout off: a rank's half batch must see what the whole does)."""
    torch.manual_seed(0)
    try:
        import transformers
    except ImportError:   # a plain MLP language model when transformers is not installed
        return torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, 64),
                                   torch.nn.Tanh(), torch.nn.Linear(64, VOCAB))
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                                  n_positions=SEQ, attn_pdrop=0.0, resid_pdrop=0.0,
                                  embd_pdrop=0.0, bos_token_id=0, eos_token_id=1)
    return transformers.GPT2LMHeadModel(cfg)


def batches(steps: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (steps, BATCH, SEQ), generator=g)


def loss_of(model, ids: torch.Tensor) -> torch.Tensor:
    if isinstance(model, torch.nn.Sequential) or getattr(model, "module", None).__class__ is \
            torch.nn.Sequential:
        logits = model(ids[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                                 ids[:, 1:].reshape(-1))
    return model(input_ids=ids, labels=ids).loss


def train(model, ids_all, rank: int, world: int, device) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for ids in ids_all:
        local = ids.chunk(world)[rank].to(device)
        loss = loss_of(model, local)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        if world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
        losses.append(t.item())
    return losses


def bench_allreduce(device, nbytes: int = 64 << 20, reps: int = 7) -> dict:
    """Median seconds of an all-reduce of nbytes: neuron tensors vs plain CPU tensors (gloo).

    The two alternate rep by rep, so a load spike on a shared machine hits both alike."""
    xs = {"neuron": torch.ones(nbytes // 4, device=device), "cpu (gloo)": torch.ones(nbytes // 4)}
    for x in xs.values():
        dist.all_reduce(x)   # warm-up (connections, pages)
    times: dict = {k: [] for k in xs}
    for _ in range(reps):
        for label, x in xs.items():
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            if x.device.type == "neuron":
                torch.neuron.synchronize()
            times[label].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def mesh_2d_check(world: int, device) -> str:
    """4 ranks: a (dp, tp) = (2, 2) mesh, tensor parallel inside FSDP2, against float64 CPU."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("neuron", (2, world // 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                              torch.nn.Linear(32, 16)).double()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
    y_ref = ref(x.double())
    y_ref.sum().backward()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 16)).to(device)
    model = parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(),
                                                   "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    y = model(x.to(device))
    y.sum().backward()
    y_err = (y.cpu().double() - y_ref).abs().max().item()
    g_err = (model[0].weight.grad.full_tensor().cpu().double() -
             ref[0].weight.grad).abs().max().item()
    return (f"2-D mesh (dp=2, tp={world // 2}), TP inside FSDP2: max |output - float64| "
            f"{y_err:.1e}, max |grad - float64| {g_err:.1e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--bench", action="store_true", help="add the 64 MB all-reduce row")
    args = ap.parse_args()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.neuron.set_device(local_rank)
    device = torch.device("neuron", local_rank)
    dist.init_process_group()            # no backend named: the neuron device's default
    rank, world = dist.get_rank(), dist.get_world_size()
    ids = batches(args.steps)

    eager_neuron.reset_stats()
    ddp = DDP(build_model().to(device), device_ids=[local_rank])
    ddp_losses = train(ddp, ids, rank, world, device)
    ddp_stats = eager_neuron.stats()

    eager_neuron.reset_stats()
    mesh = init_device_mesh("neuron", (world,))
    model = build_model().to(device)
    for block in getattr(getattr(model, "transformer", None), "h", []):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    fsdp_losses = train(model, ids, rank, world, device)
    fsdp_stats = eager_neuron.stats()

    mesh_line = mesh_2d_check(world, device) if world == 4 else None
    bench = bench_allreduce(device) if args.bench else None
    if rank == 0:
        cpu_losses = train(build_model(), ids, 0, 1, torch.device("cpu"))
        print(f"GPT-2 tiny, {world} ranks on neuron (backends {dist.get_backend_config()}), "
              f"global batch {BATCH}x{SEQ}, AdamW, {args.steps} steps")
        print(f"{'step':>4} {'cpu (1 process)':>16} {'DDP':>12} {'FSDP2':>12}")
        for i, (c, d, f) in enumerate(zip(cpu_losses, ddp_losses, fsdp_losses)):
            print(f"{i:>4} {c:>16.7f} {d:>12.7f} {f:>12.7f}")
        for name, got in (("DDP", ddp_losses), ("FSDP2", fsdp_losses)):
            rel = max(abs(a - b) / abs(b) for a, b in zip(got, cpu_losses))
            print(f"{name}: max relative difference to the CPU run {rel:.2e} "
                  f"({'within' if rel <= 1e-5 else 'OUTSIDE'} 1e-5)")
        for name, s in (("DDP", ddp_stats), ("FSDP2", fsdp_stats)):
            coll = ", ".join(f"{k} {v}" for k, v in sorted(s["collectives"].items()))
            sim = sum(s["collective_us"].values())
            print(f"{name} rank 0: collectives {coll}; simulated {sim:.1f} us; "
                  f"CPU fallbacks {sum(s['fallbacks'].values())} {s['fallbacks'] or ''}")
        if mesh_line:
            print(mesh_line)
        if bench:
            mb = 64
            n, c = bench["neuron"], bench["cpu (gloo)"]
            print(f"all-reduce {mb} MB, {world} local processes: neuron {mb / n:.0f} MB/s "
                  f"({n * 1e3:.1f} ms), gloo on CPU tensors {mb / c:.0f} MB/s ({c * 1e3:.1f} ms): "
                  f"{c / n:.0%} of gloo")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
