"""Profiler overhead on a training step of a small MLP, measured in one run.

Rounds alternate a block of plain steps with a block of steps inside one `eager_neuron.profile()`
(so drift such as CPU frequency or cache warmth hits both alike); each step is timed on its own and
ends with `loss.item()`, so all its work is done. Reported, on the wall clock and on the process's
CPU clock (steadier when other jobs share the machine): median step time without and with
recording, the overhead, and the end-of-session cost (building the events) per profiled step.

    .venv/bin/python tools/bench_profiler.py [--steps 200] [--block 10] [--batch 32]
                                             [--torch-steps 40]

Then the same step under `torch.profiler.profile` with CPU activity only and with
`ProfilerActivity.PrivateUse1` (the neuron bridge, eager_neuron/profiler/kineto.py): median step
times, the bridge's overhead, the cost of key_averages() + export_chrome_trace() per step, and
how many launches became device events.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
import warnings

# NOTE: python puts tools/ first on sys.path, where tools/coverage.py shadows the `coverage`
# package that numba probes at import (numba.misc.coverage_support); keep tools/ off the path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import torch  # noqa: E402

import eager_neuron  # noqa: E402


def make_step(batch: int, width: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 10)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 64, device="neuron")
    y = torch.randn(batch, 10, device="neuron")

    def step() -> float:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def _timed(fn) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="timed steps per variant")
    p.add_argument("--block", type=int, default=10, help="steps per alternating block")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--torch-steps", type=int, default=40,
                   help="steps per torch.profiler variant (0: skip)")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")       # CPU-fallback warnings, if any op has no kernel yet
    step = make_step(args.batch, args.width)
    for _ in range(5):                    # compile every kernel before timing
        step()
    # per step: (wall, process CPU) seconds; CPU time is steadier when other jobs share the cores
    plain, recorded, finish = [], [], []
    while len(plain) < args.steps:
        for _ in range(args.block):
            plain.append(_timed(step))
        prof = eager_neuron.profile()
        prof.__enter__()
        for _ in range(args.block):
            recorded.append(_timed(step))
        t = _timed(functools.partial(prof.__exit__, None, None, None))
        finish.append((t[0] / args.block, t[1] / args.block))
    out = {"ops_per_step": prof.totals["ops"] / args.block,
           "launches_per_step": prof.totals["launches"] / args.block}
    for i, clock in enumerate(("wall", "cpu")):
        base, rec, fin = (statistics.median(v[i] for v in runs) * 1e3
                          for runs in (plain, recorded, finish))
        out[clock] = {"plain_ms": base, "profiled_ms": rec, "overhead_pct": (rec / base - 1) * 100,
                      "finish_ms_per_step": fin}
    print(f"MLP 64-{args.width}-{args.width}-10, batch {args.batch}, MSE, AdamW; "
          f"{len(plain)} steps per variant, alternating blocks of {args.block}; "
          f"{out['ops_per_step']:.0f} ops and {out['launches_per_step']:.0f} kernel launches "
          "per step")
    for clock in ("wall", "cpu"):
        r = out[clock]
        print(f"  {clock:4s} median step: plain {r['plain_ms']:.3f} ms, recording "
              f"{r['profiled_ms']:.3f} ms -> overhead {r['overhead_pct']:+.1f}%; building the "
              f"events at exit {r['finish_ms_per_step']:.3f} ms per step")
    if args.torch_steps:
        out["torch_profiler"] = torch_profiler_bench(step, args.torch_steps, args.block)
    return out


def torch_profiler_bench(step, steps: int, block: int) -> dict:
    """torch.profiler around `block` steps at a time: CPU only vs CPU + PrivateUse1."""
    import tempfile

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    variants = {"cpu": [ProfilerActivity.CPU],
                "cpu+neuron": [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]}
    times = {k: [] for k in variants}
    post = {k: [] for k in variants}
    launched = devices = 0
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    while len(times["cpu"]) < steps:
        for name, acts in variants.items():
            before = eager_neuron.stats()["launches"]
            with profile(activities=acts) as tp:
                for _ in range(block):
                    times[name].append(_timed(step)[1])
            t = _timed(lambda tp=tp: (tp.key_averages(), tp.export_chrome_trace(path)))
            post[name].append(t[1] / block)
            if name == "cpu+neuron":
                launched += eager_neuron.stats()["launches"] - before
                devices += sum(1 for e in tp.events() if e.device_type == DeviceType.PrivateUse1)
    res = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    res.update({f"{k}_post_ms": statistics.median(v) * 1e3 for k, v in post.items()})
    res["overhead_pct"] = (res["cpu+neuron"] / res["cpu"] - 1) * 100
    res["device_events"], res["launches"] = devices, launched
    print(f"torch.profiler, {steps} steps per variant (process CPU clock): CPU activity only "
          f"{res['cpu']:.3f} ms/step, with PrivateUse1 {res['cpu+neuron']:.3f} ms/step -> bridge "
          f"overhead {res['overhead_pct']:+.1f}%; key_averages + export_chrome_trace "
          f"{res['cpu_post_ms']:.3f} -> {res['cpu+neuron_post_ms']:.3f} ms per step; "
          f"{devices}/{launched} launches became device events")
    return res


if __name__ == "__main__":
    main()
