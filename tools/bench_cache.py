"""Kernel disk cache: load time per kernel, and cold vs warm process time to a first training step.

Each round runs a small MLP training script (AdamW) in two fresh processes: *cold* on an empty
cache directory (every kernel compiles and is stored), then *warm* on the directory the cold run
filled (every kernel loads from disk). Reported as medians over the rounds:

- load: wall and CPU (thread) time of each disk hit inside `DISK.load` in the warm process,
  excluding the first hit (it pays the one-off imports: numba, diskcache, the NRT);
- first step: wall time from spawning the process to the end of its first training step
  (`loss.item()` returned), and the part of it after `import torch, eager_neuron`;
- getting the kernels: total time inside `launch._build` (cold: render, compile, store; warm:
  load), the part of a process the cache changes. Most of a warm process is torch importing
  itself and, on first use, `torch._dynamo` (AdamW) and DTensor (`Module.to`).

The machine's load average is printed too: on a shared machine wall times stretch, CPU times less.

    .venv/bin/python tools/bench_cache.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

CHILD = textwrap.dedent("""
    import json, os, sys, time
    t_start = time.time()
    import torch, eager_neuron
    from eager_neuron import launch
    t_imported = time.time()
    loads, builds = [], []
    _build = launch._build
    def timed_build(*a, **k):
        w = time.perf_counter()
        out = _build(*a, **k)
        builds.append(time.perf_counter() - w)
        return out
    launch._build = timed_build
    if launch.DISK is not None:
        _load = launch.DISK.load
        def timed(*a, **k):
            w, c = time.perf_counter(), time.thread_time()
            kernel = _load(*a, **k)
            if kernel is not None:
                loads.append(((time.perf_counter() - w) * 1e3, (time.thread_time() - c) * 1e3))
            return kernel
        launch.DISK.load = timed
    device = "neuron"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64).to(device), torch.randn(32, 10).to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    loss.item()
    t_step = time.time()
    s = eager_neuron.stats()
    print(json.dumps({"t_step": t_step, "after_import_s": t_step - t_imported,
                      "import_s": t_imported - t_start, "loads": loads,
                      "kernel_s": sum(builds),
                      "compiles": s["compiles"], "disk_hits": s["disk_hits"],
                      "disk_misses": s["disk_misses"], "fallbacks": s["fallbacks"]}))
""")


def _run(script: str, cache_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGER_NEURON_")}
    env["EAGER_NEURON_CACHE_DIR"] = cache_dir
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-W", "ignore", script], env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode:
        raise RuntimeError(f"benchmark child failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["to_first_step_s"] = out["t_step"] - t0
    return out


def bench_cache(rounds: int = 3) -> dict:
    """Medians over `rounds` cold/warm pairs; see the module docstring for what is timed."""
    cold, warm = [], []
    with tempfile.TemporaryDirectory(prefix="eager_neuron_bench_cache_") as tmp:
        script = os.path.join(tmp, "child.py")
        with open(script, "w") as f:
            f.write(CHILD)
        for r in range(rounds):
            cache_dir = os.path.join(tmp, f"cache{r}")
            cold.append(_run(script, cache_dir))
            warm.append(_run(script, cache_dir))
    med = statistics.median
    loads = [ld for w in warm for ld in w["loads"][1:]]
    first = [w["loads"][0] for w in warm if w["loads"]]
    result = {
        "rounds": rounds,
        "kernels": cold[0]["compiles"],
        "warm_compiles": max(w["compiles"] for w in warm),
        "warm_disk_hits": min(w["disk_hits"] for w in warm),
        "load_wall_ms": med(ld[0] for ld in loads) if loads else None,
        "load_cpu_ms": med(ld[1] for ld in loads) if loads else None,
        "first_load_wall_ms": med(ld[0] for ld in first) if first else None,
        "cold_to_first_step_s": med(c["to_first_step_s"] for c in cold),
        "warm_to_first_step_s": med(w["to_first_step_s"] for w in warm),
        "cold_after_import_s": med(c["after_import_s"] for c in cold),
        "warm_after_import_s": med(w["after_import_s"] for w in warm),
        "import_s": med(x["import_s"] for x in cold + warm),
        "cold_kernel_s": med(c["kernel_s"] for c in cold),
        "warm_kernel_s": med(w["kernel_s"] for w in warm),
        "loadavg": os.getloadavg()[0],
    }
    result["warm_over_cold"] = result["warm_to_first_step_s"] / result["cold_to_first_step_s"]
    result["warm_over_cold_after_import"] = (result["warm_after_import_s"]
                                             / result["cold_after_import_s"])
    result["warm_over_cold_kernels"] = result["warm_kernel_s"] / result["cold_kernel_s"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    r = bench_cache(args.rounds)
    print(f"kernel disk cache, small MLP + AdamW, {r['rounds']} cold/warm rounds "
          f"(load average {r['loadavg']:.1f})")
    print(f"  kernels compiled cold: {r['kernels']}; warm: {r['warm_compiles']} compiled, "
          f"{r['warm_disk_hits']} loaded from disk")
    print(f"  load per kernel (median): {r['load_wall_ms']:.2f} ms wall, "
          f"{r['load_cpu_ms']:.2f} ms CPU; first load of a process "
          f"{r['first_load_wall_ms']:.0f} ms")
    print(f"  spawn -> first step done: cold {r['cold_to_first_step_s']:.2f} s, "
          f"warm {r['warm_to_first_step_s']:.2f} s ({100 * r['warm_over_cold']:.0f}%)")
    print(f"  after `import torch, eager_neuron` ({r['import_s']:.2f} s): cold "
          f"{r['cold_after_import_s']:.2f} s, warm {r['warm_after_import_s']:.2f} s "
          f"({100 * r['warm_over_cold_after_import']:.0f}%)")
    print(f"  getting the kernels (launch._build: compile+store / load): cold "
          f"{r['cold_kernel_s']:.2f} s, warm {r['warm_kernel_s']:.2f} s "
          f"({100 * r['warm_over_cold_kernels']:.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
