"""make bench: measured numbers for the README and the closing notes (medians, one run).

Everything is compared with torch CPU eager in the same process. The machine is shared and noisy:
read ratios, not absolute times.
"""

from __future__ import annotations

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
HERE = os.path.dirname(os.path.abspath(__file__))


def median_time(fn, repeat: int = 7, number: int = 1) -> float:
    fn()  # warm: compile / load kernels, fault pages in
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return statistics.median(times)


def sync(t):
    # neuron results are complete when the op returns (kernels run synchronously on the host);
    # the item() read is what a user would do to observe it
    return t


def per_op_overhead() -> None:
    print("== per-op overhead, tiny tensors, warm cache (a + b on 4 floats) ==")
    for dev in ("cpu", "neuron"):
        a = torch.randn(4, device=dev)
        b = torch.randn(4, device=dev)
        n = 2000

        def loop():
            for _ in range(n):
                a + b
        us = median_time(loop, repeat=5) / n * 1e6
        print(f"  {dev:>7}: {us:6.2f} us/op")
        if dev == "neuron":
            print(f"  target <= 8 us/op: {'met' if us <= 8 else f'missed by {us / 8:.1f}x'}")


def throughput() -> None:
    print("== throughput vs torch CPU eager (median of 7) ==")
    n = 4 * 1024 * 1024
    cases = {
        "add 4M": lambda x, y: x + y,
        "gelu 4M": lambda x, y: torch.nn.functional.gelu(x),
        "sum 4M": lambda x, y: x.sum(),
        "mm 1024^2": None,
    }
    for name, fn in cases.items():
        res = {}
        for dev in ("cpu", "neuron"):
            if fn is None:
                a = torch.randn(1024, 1024, device=dev)
                b = torch.randn(1024, 1024, device=dev)
                res[dev] = median_time(lambda: a @ b)
            else:
                x = torch.randn(n, device=dev)
                y = torch.randn(n, device=dev)
                res[dev] = median_time(lambda: fn(x, y))
        ratio = res["cpu"] / res["neuron"]
        target = 0.9 if fn is None else 1.0
        print(f"  {name:>10}: cpu {res['cpu'] * 1e3:7.3f} ms  neuron {res['neuron'] * 1e3:7.3f} ms"
              f"  speed vs torch {ratio:4.2f}x (target >= {target}x: "
              f"{'met' if ratio >= target else 'missed'})")


def _mlp():
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def _encoder():
    return nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)


def _step_fn(make, batch):
    torch.manual_seed(0)
    model = make().to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = batch().to("neuron")

    def step():
        out = model(x)
        loss = out.float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()
    return step


def adaptive_bench() -> None:
    print("== adaptive eager vs plain eager, per training step (AdamW) ==")
    models = {
        "MLP": (_mlp, lambda: torch.randn(32, 64)),
        "TransformerEncoderLayer": (_encoder, lambda: torch.randn(8, 16, 64)),
    }
    for name, (make, batch) in models.items():
        row = {}
        for mode in (False, True):
            eager_neuron.set_adaptive(mode)
            step = _step_fn(make, batch)
            step()
            step()  # warm: compile once, state initialised
            eager_neuron.reset_stats()
            from eager_neuron.simulator import SIM
            t_dev0 = SIM.device_time_us()
            wall = median_time(step, repeat=5)
            s = eager_neuron.stats()
            steps = 6  # median_time's warm call + 5 repeats
            row[mode] = (s["launches"] / steps, (SIM.device_time_us() - t_dev0) / steps, wall)
        eager_neuron.set_adaptive(False)
        (lp, dp, wp), (la, da, wa) = row[False], row[True]
        print(f"  {name}: launches/step plain {lp:.0f}, adaptive {la:.0f} (ratio 1/{lp / la:.1f};"
              f" target <= 1/5: {'met' if la * 5 <= lp else 'missed'})")
        print(f"  {'':>{len(name)}}  simulated device time/step plain {dp / 1e3:.3f} ms, "
              f"adaptive {da / 1e3:.3f} ms; wall/step plain {wp * 1e3:.1f} ms, "
              f"adaptive {wa * 1e3:.1f} ms")


def chain_bench() -> None:
    print("== 6-op elementwise chain on 4M floats ==")
    n = 4 * 1024 * 1024

    def chain(x):
        return ((x * 1.5 + 0.5).relu() - 0.25).sigmoid() * x + 1.0

    x_cpu = torch.randn(n)
    x_dev = x_cpu.to("neuron")
    t_cpu = median_time(lambda: chain(x_cpu))

    def fused():
        with eager_neuron.adaptive():
            y = chain(x_dev)
            eager_neuron.adaptive_flush = None
        return y
    t_ad = median_time(fused)
    print(f"  torch CPU eager {t_cpu * 1e3:.2f} ms; neuron adaptive {t_ad * 1e3:.2f} ms "
          f"-> {t_cpu / t_ad:.2f}x (target >= 2.5x)")
    try:
        compiled = torch.compile(chain)
        t_c = median_time(lambda: compiled(x_cpu))
        print(f"  torch.compile (inductor, CPU) {t_c * 1e3:.2f} ms -> adaptive is "
              f"{t_c / t_ad:.2f}x of it (target >= 1.5x)")
    except Exception as exc:  # inductor needs a working C++ toolchain
        print(f"  torch.compile unavailable here: {type(exc).__name__}: {str(exc)[:120]}")


def extra(script: str) -> None:
    path = os.path.join(HERE, script)
    if os.path.exists(path):
        print(f"== {script} ==", flush=True)
        subprocess.run([sys.executable, path], check=False)


def main() -> None:
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"{os.cpu_count()} cores; eager_neuron {eager_neuron.__version__}", flush=True)
    per_op_overhead()
    throughput()
    adaptive_bench()
    chain_bench()
    sys.stdout.flush()
    extra("bench_cache.py")
    extra("bench_profiler.py")
    extra("bench_kernels.py")
    extra("bench_compile.py")


if __name__ == "__main__":
    main()
