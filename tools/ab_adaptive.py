"""Adaptive eager against plain eager and torch CPU eager, in turns in one process.

`make sweep` times plain and then adaptive eager one after the other, so on a shared machine
a change of load between the two lands in the ratio. Here the three take turns (a few steps
each, several turns) on the same model and batches, and the medians of all turns are compared:
wall time per step and process CPU time (which waiting for a core does not inflate).

    .venv/bin/python tools/ab_adaptive.py --models mlp,gpt2,llama --turns 4
    EAGER_NEURON_ADAPTIVE_LIGHT=65536 .venv/bin/python tools/ab_adaptive.py   # host-time policy
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # (before torch loads: see compile_sweep)

import torch  # noqa: E402

import eager_neuron  # noqa: E402
from eager_neuron import adaptive_compile  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_sweep as cs  # noqa: E402 - the sweep's models, batches and steppers

MODES = ("plain", "adaptive", "cpu")


def measure(name: str, turns: int, steps: int) -> dict:
    """{mode: (median wall ms, median process CPU ms)} per training step."""
    model, batches, loss, _, _ = cs._build(name)
    _, step = cs._stepper(model, loss, "neuron", False)
    cmodel, cbatches, closs, _, _ = cs._build(name)
    _, cstep = cs._stepper(cmodel, closs, "cpu", False)
    for i in range(3):
        step(batches[i % len(batches)]).item()
        cstep(cbatches[i % len(cbatches)]).item()
    with eager_neuron.adaptive():
        for i in range(4):
            step(batches[i % len(batches)]).item()
        adaptive_compile.wait(600)   # the fused kernels the warm-up queued are built
    wall = {m: [] for m in MODES}
    cpu = {m: [] for m in MODES}
    for _ in range(turns):
        for mode in MODES:
            run, bs = (cstep, cbatches) if mode == "cpu" else (step, batches)
            with eager_neuron.adaptive(mode == "adaptive"):
                for i in range(steps):
                    t0, p0 = time.perf_counter(), time.process_time()
                    run(bs[i % len(bs)]).item()
                    wall[mode].append(time.perf_counter() - t0)
                    cpu[mode].append(time.process_time() - p0)
    return {m: (statistics.median(wall[m]) * 1e3, statistics.median(cpu[m]) * 1e3)
            for m in MODES}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mlp,gpt2,llama")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--steps", type=int, default=6, help="steps per mode and turn")
    args = p.parse_args(argv)
    torch.set_num_threads(1)   # (as make sweep: torch CPU eager on one thread)
    print(f"load {os.getloadavg()[0]:.1f}; EAGER_NEURON_ADAPTIVE_LIGHT="
          f"{eager_neuron.config.adaptive_light}")
    for name in args.models.split(","):
        r = measure(name, args.turns, args.steps)
        (wp, cp), (wa, ca), (wc, cc) = r["plain"], r["adaptive"], r["cpu"]
        print(f"{name}: ms/step wall plain {wp:.2f}, adaptive {wa:.2f}, torch {wc:.2f}; "
              f"adaptive/plain {wa / wp:.2f} (process CPU {ca / cp:.2f}; target <= 0.8), "
              f"plain/torch {wp / wc:.2f} (CPU {cp / cc:.2f}), adaptive/torch {wa / wc:.2f}",
              flush=True)
    print(f"load {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
