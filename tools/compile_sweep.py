"""The models of `make sweep` under torch.compile(backend="neuron"): correct? fallbacks? speed?

Per model: the training step (forward, loss, backward, AdamW step) compiled as one function;
3+ steps compared with neuron eager step by step (losses and final parameters, rtol 1e-4 /
atol 1e-5 as tools/model_sweep.py; dropout off: compiled masks are drawn in another order);
CPU fallbacks (must be 0), graphs that fell back to eager, eager ops inside graphs; median
wall time per step of torch CPU eager, neuron eager and neuron compiled, and the ratio
compiled / torch CPU eager (targets: <= 1.0 on mlp and gpt2, <= 1.5 on every model), the
three timed in turns step by step, with each side's process CPU time per step next to it
(the load-independent view on a shared machine), and torch CPU eager on one intra-op thread
beside it (its two threads collapse under load); the cold compile time (first compiled step).

    .venv/bin/python tools/compile_sweep.py                      # every model
    .venv/bin/python tools/compile_sweep.py --models mlp,gpt2 --steps 5
    .venv/bin/python tools/compile_sweep.py --models llama --turns 40   # steadier medians
    .venv/bin/python tools/compile_sweep.py --compiled-autograd   # the backward as one graph
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# OpenMP's workers spin after each of torch's parallel regions (GNU OpenMP: a few hundred ms by
# default). Timed in turns on 2 cores, torch's two-thread steps left a worker spinning through
# the next side's step: Llama compiled 59 ms wall / 42 ms CPU next to it, 23 / 23 ms without
# it, torch on one thread 16 ms against 6 ms (2026-12-03, load 5). Passive workers sleep at
# once; set before torch loads OpenMP (a value the caller exported wins).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import eager_neuron  # noqa: E402

MODELS = ["mlp", "cnn", "lstm", "gpt2", "bert", "llama", "t5", "bart", "vit"]
TARGET = {"mlp": 1.0, "gpt2": 1.0}


def _build(name):
    import model_sweep as ms

    return ms._small(name) if name in ("mlp", "cnn", "lstm") else ms._hf(name)


def _stepper(model, loss, device, compiled):
    m = copy.deepcopy(model).to(device).train()
    for sub in m.modules():
        if isinstance(sub, torch.nn.Dropout):
            # compiled dropout draws its masks in another order than eager (as inductor's
            # does): off, so that compiled and eager steps are comparable
            sub.p = 0.0
        for attr in ("dropout", "activation_dropout", "attention_dropout"):
            # functional dropout (BART's layers: F.dropout(x, p=self.dropout, ...)): off too
            if isinstance(getattr(sub, attr, None), float):
                setattr(sub, attr, 0.0)
        if getattr(getattr(sub, "config", None), "use_cache", None):
            # training needs no KV cache (a compiled DynamicCache works: it would only add
            # its per-layer tensors to every step of both sides)
            sub.config.use_cache = False
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, eps=1e-4)

    def step(batch):
        opt.zero_grad()
        out = loss(m, batch, device)
        out.backward()
        opt.step()
        return out.detach()

    if compiled:
        step = torch.compile(step, backend="neuron")
    return m, step


def _close(a, b) -> bool:
    return bool(torch.allclose(a.detach().cpu().float(), b.detach().cpu().float(), rtol=1e-4,
                               atol=1e-5))


def run(name: str, steps: int, turns: int = 0) -> dict:
    # each model from a fresh dynamo cache: every model's stepper shares one code object, and
    # after the MLP dynamo's automatic dynamic shapes made GPT-2's AdamW graph symbolic (not
    # planned, twice the eager nodes: compiled 20-22 ms against 12 ms with a reset)
    torch._dynamo.reset()
    model, batches, loss, _, _ = _build(name)
    row = {"model": name}
    # 1. correctness: compiled vs neuron eager, step by step
    me, se = _stepper(model, loss, "neuron", False)
    eager_neuron.compile.reset_stats()
    eager_neuron.reset_stats()
    mc, sc = _stepper(model, loss, "neuron", True)
    t0 = time.perf_counter()
    first = sc(batches[0])
    row["cold_s"] = time.perf_counter() - t0
    le, lc = [se(batches[0])], [first]
    for i in range(1, steps):
        b = batches[i % len(batches)]
        le.append(se(b))
        lc.append(sc(b))
    ok = _close(torch.stack(lc), torch.stack(le))
    pe, pc = dict(me.named_parameters()), dict(mc.named_parameters())
    ok = ok and all(_close(pc[k], pe[k]) for k in pe)
    s, cs = eager_neuron.stats(), eager_neuron.compile.stats()
    row.update(ok=ok, fallbacks=sum(s["fallbacks"].values()),
               graph_fallbacks=sum(cs["graph_fallbacks"].values()),
               group_fallbacks=sum(cs["group_fallbacks"].values()),
               eager_ops=sum(cs["graph_eager_ops"].values()),
               kernels=sum(cs["kernels_per_graph"]), graphs=cs["graphs_compiled"],
               max_err=max(float((a - b).abs().max()) for a, b in zip(lc, le)))
    # 2. time per step (after the steps above: compiled and cached). The three sides take
    #    turns step by step, so a change of the shared machine's load hits them alike; wall
    #    time (the target's measure) and this process's CPU time (what the step costs,
    #    whatever the load; torch's idle intra-op threads spin on it too) per step
    #    torch CPU eager also runs on one intra-op thread ("cpu1"): on a shared machine its
    #    two threads collapse under load where its ops are parallel, and their spinning
    #    inflates every side's process CPU time; one thread is the load-independent reference
    steppers = {"compiled": sc}
    for label, device in (("cpu", "cpu"), ("cpu1", "cpu"), ("neuron", "neuron")):
        _, steppers[label] = _stepper(model, loss, device, False)
        steppers[label](batches[0])
    wall: dict = {k: [] for k in steppers}
    cpu: dict = {k: [] for k in steppers}
    threads = torch.get_num_threads()
    for i in range(max(turns, steps + 3)):
        b = batches[i % len(batches)]
        for label, step in steppers.items():
            torch.set_num_threads(1 if label == "cpu1" else threads)
            t0, c0 = time.perf_counter(), time.process_time()
            step(b).item()
            wall[label].append(time.perf_counter() - t0)
            cpu[label].append(time.process_time() - c0)
    torch.set_num_threads(threads)
    for label in steppers:
        row[f"{label}_ms"] = statistics.median(wall[label][1:]) * 1e3
        row[f"{label}_cpu_ms"] = statistics.median(cpu[label][1:]) * 1e3
    row["ratio_cpu"] = row["compiled_ms"] / row["cpu_ms"]
    row["ratio_cpu_time"] = row["compiled_cpu_ms"] / row["cpu_cpu_ms"]
    row["ratio_cpu1"] = row["compiled_ms"] / row["cpu1_ms"]
    row["ratio_cpu1_time"] = row["compiled_cpu_ms"] / row["cpu1_cpu_ms"]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--steps", type=int, default=3)
    # timed turns per side (the first one dropped): at load 6 medians of 7 moved by +-15%
    p.add_argument("--turns", type=int, default=15)
    # torch's compiled autograd: the compiled step's backward is one dynamo graph on the
    # calling thread (docs/COMPILE.md, Session 12); neuron and torch eager are unaffected
    p.add_argument("--compiled-autograd", action="store_true")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.compiled_autograd = args.compiled_autograd
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"{os.cpu_count()} cores, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
          f"compiled autograd {'on' if args.compiled_autograd else 'off'}")
    print(f"{'model':7} {'ok':3} {'fallbk':6} {'gfb':3} {'kfb':3} {'eager':5} {'kern':4} "
          f"{'cold s':>7} {'cpu ms':>8} {'eager ms':>8} {'comp ms':>8} {'comp/cpu':>8} target")
    for name in args.models.split(","):
        try:
            r = run(name, args.steps, args.turns)
        except Exception as exc:  # one model's failure is a row, not the end of the sweep
            print(f"{name:7} FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:150]}",
                  flush=True)
            continue
        limit = TARGET.get(name, 1.5)
        verdict = "met" if r["ratio_cpu"] <= limit else f"missed by {r['ratio_cpu'] / limit:.2f}x"
        print(f"{name:7} {'yes' if r['ok'] else 'NO':3} {r['fallbacks']:6d} "
              f"{r['graph_fallbacks']:3d} {r['group_fallbacks']:3d} {r['eager_ops']:5d} "
              f"{r['kernels']:4d} {r['cold_s']:7.1f} {r['cpu_ms']:8.2f} {r['neuron_ms']:8.2f} "
              f"{r['compiled_ms']:8.2f} {r['ratio_cpu']:8.2f} <= {limit} {verdict}"
              f" (max loss diff {r['max_err']:.1e}); process CPU ms per step: torch "
              f"{r['cpu_cpu_ms']:.1f}, neuron eager {r['neuron_cpu_ms']:.1f}, compiled "
              f"{r['compiled_cpu_ms']:.1f} (compiled/torch {r['ratio_cpu_time']:.2f}); torch "
              f"on 1 thread {r['cpu1_ms']:.2f} ms wall, {r['cpu1_cpu_ms']:.1f} ms CPU: "
              f"compiled/torch-1-thread {r['ratio_cpu1']:.2f} wall, "
              f"{r['ratio_cpu1_time']:.2f} CPU time", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
