"""Backward on the caller's thread against the autograd engine's neuron worker thread.

eager_neuron runs the backward of a graph rooted on neuron tensors on the calling thread
(eager_neuron/device.py, BACKWARD_ON_CALLER); the engine's default runs it on its worker thread
for the device while the caller waits. Both take turns step by step on the same model in one
process (the sweep's models and batches, tools/compile_sweep.py); medians of wall time and of
process CPU time (which waiting for a core does not inflate) per training step.

    .venv/bin/python tools/ab_backward.py --models mlp,gpt2,llama --steps 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # (before torch loads: see compile_sweep)

import torch  # noqa: E402,F401

import eager_neuron  # noqa: E402,F401
from eager_neuron import device  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_sweep as cs  # noqa: E402 - the sweep's models, batches and steppers


def measure(name: str, steps: int) -> dict:
    """{"caller" | "worker": (median wall ms, median process CPU ms)} per training step."""
    model, batches, loss, _, _ = cs._build(name)
    _, step = cs._stepper(model, loss, "neuron", False)
    for i in range(4):
        step(batches[i % len(batches)]).item()
    wall = {"caller": [], "worker": []}
    cpu = {"caller": [], "worker": []}
    try:
        for i in range(steps):
            for mode in ("caller", "worker"):
                device.BACKWARD_ON_CALLER[0] = mode == "caller"
                t0, p0 = time.perf_counter(), time.process_time()
                step(batches[i % len(batches)]).item()
                wall[mode].append(time.perf_counter() - t0)
                cpu[mode].append(time.process_time() - p0)
    finally:
        device.BACKWARD_ON_CALLER[0] = True
    return {m: (statistics.median(wall[m]) * 1e3, statistics.median(cpu[m]) * 1e3) for m in wall}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,gpt2,llama")
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args(argv)
    print(f"load {os.getloadavg()[0]:.1f}")
    for name in a.models.split(","):
        r = measure(name, a.steps)
        (cw, cc), (ww, wc) = r["caller"], r["worker"]
        print(f"{name}: ms/step wall caller {cw:.2f}, worker {ww:.2f} "
              f"(caller/worker {cw / ww:.3f}); process CPU {cc:.2f} vs {wc:.2f} ({cc / wc:.3f})")
    print(f"load {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
