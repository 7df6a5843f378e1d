"""torch.compile(backend="neuron") vs neuron eager vs torch CPU eager vs inductor (CPU).

Prints medians and ratios (one run on a shared machine: read ratios, not absolute times):
  1. the 6-op elementwise chain on 4M floats (the chain of tools/bench.py)
  2. an MLP training step (forward, MSE loss, backward, AdamW step)
  3. cold vs warm compile of the MLP step (a second process with the disk cache)

    .venv/bin/python tools/bench_compile.py
"""

from __future__ import annotations

import copy
import os
import statistics
import subprocess
import sys
import time
import warnings

import torch
import torch.nn as nn

import eager_neuron

warnings.simplefilter("ignore")
torch._dynamo.config.cache_size_limit = 64


def median_time(fn, repeat: int = 7) -> float:
    fn()
    fn()  # warm: traced, compiled, kernels loaded
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def chain(x):
    return ((x * 1.5 + 0.5).relu() - 0.25).sigmoid() * x + 1.0


def chain_bench() -> None:
    print("== 6-op elementwise chain on 4M floats ==")
    n = 4 * 1024 * 1024
    x_cpu = torch.randn(n)
    x_dev = x_cpu.to("neuron")
    res = {"torch CPU eager": median_time(lambda: chain(x_cpu)),
           "neuron eager": median_time(lambda: chain(x_dev))}

    def adaptive():
        with eager_neuron.adaptive():   # leaving the context flushes the recorded group
            return chain(x_dev)
    res["neuron adaptive"] = median_time(adaptive)
    neuron_c = torch.compile(chain, backend="neuron")
    res["neuron compiled"] = median_time(lambda: neuron_c(x_dev))
    try:
        ind = torch.compile(chain)
        res["inductor (CPU)"] = median_time(lambda: ind(x_cpu))
    except Exception as exc:  # inductor needs a working C++ toolchain
        print(f"  inductor unavailable: {type(exc).__name__}: {str(exc)[:100]}")
    _report(res, "neuron compiled", targets={"inductor (CPU)": 1.0})


def _mlp():
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def _step(model, x, y):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def mlp_bench() -> None:
    print("== MLP training step (64-128-128-10, batch 32, AdamW) ==")
    torch.manual_seed(0)
    base = _mlp()
    x, y = torch.randn(32, 64), torch.randn(32, 10)
    res = {}
    res["torch CPU eager"] = median_time(_step(copy.deepcopy(base), x, y))
    xd, yd = x.to("neuron"), y.to("neuron")
    res["neuron eager"] = median_time(_step(copy.deepcopy(base).to("neuron"), xd, yd))
    res["neuron compiled"] = median_time(torch.compile(
        _step(copy.deepcopy(base).to("neuron"), xd, yd), backend="neuron"))
    try:
        res["inductor (CPU)"] = median_time(torch.compile(_step(copy.deepcopy(base), x, y)))
    except Exception as exc:
        print(f"  inductor unavailable: {type(exc).__name__}: {str(exc)[:100]}")
    _report(res, "neuron compiled", targets={"torch CPU eager": 1.0})
    s = eager_neuron.compile.stats()
    print(f"  kernels per graph {s['kernels_per_graph']}, eager ops in graphs "
          f"{sum(s['graph_eager_ops'].values())} ({len(s['graph_eager_ops'])} kinds)")


_COLD = """
import time, torch, eager_neuron
t0 = time.perf_counter()
import tools.bench_compile as b
m = b._mlp().to("neuron")
x, y = torch.randn(32, 64, device="neuron"), torch.randn(32, 10, device="neuron")
step = torch.compile(b._step(m, x, y), backend="neuron")
step(); step()
print("SECONDS", time.perf_counter() - t0, eager_neuron.stats()["compiles"])
"""


def compile_time_bench() -> None:
    print("== MLP step compile: cold process vs warm process (shared disk cache) ==")
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, EAGER_NEURON_CACHE_DIR=d, PYTHONPATH=root)
        out = []
        for label in ("cold", "warm"):
            r = subprocess.run([sys.executable, "-c", _COLD], env=env, cwd=root,
                               capture_output=True, text=True)
            line = [ln for ln in r.stdout.splitlines() if ln.startswith("SECONDS")]
            if not line:
                print(f"  {label}: failed: {r.stderr[-300:]}")
                return
            secs, compiles = float(line[0].split()[1]), int(line[0].split()[2])
            out.append(secs)
            print(f"  {label}: {secs:.2f} s to the second step, {compiles} Numba compiles")
        print(f"  warm/cold {out[1] / out[0]:.2f} (target <= 0.10)")


def _report(res: dict, ours: str, targets: dict) -> None:
    for k, v in res.items():
        print(f"  {k:>16}: {v * 1e3:9.3f} ms")
    for k, v in res.items():
        if k == ours:
            continue
        ratio = v / res[ours]
        t = targets.get(k)
        tail = f" (target >= {t}x: {'met' if ratio >= t else 'missed'})" if t else ""
        print(f"  {ours} is {ratio:.2f}x the speed of {k}{tail}")


def main() -> None:
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"{os.cpu_count()} cores", flush=True)
    chain_bench()
    mlp_bench()
    compile_time_bench()


if __name__ == "__main__":
    main()
