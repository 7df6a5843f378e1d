"""make demo: train a small CNN and an MLP on `neuron` and on `cpu` with the same seed.

Prints both loss curves, their largest relative difference, and eager_neuron's stats. Exits
non-zero if the curves differ by more than 1e-5 relative.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.nn as nn

import eager_neuron

STEPS = 5


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 10))


def train(make_model, make_batch, device: str) -> tuple[list[float], float]:
    torch.manual_seed(0)
    model = make_model().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = make_batch()
    x, y = x.to(device), y.to(device)
    losses = []
    t0 = time.perf_counter()
    for _ in range(STEPS):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, time.perf_counter() - t0


def main() -> int:
    ok = True
    cases = {
        "mlp": (mlp, lambda: (torch.randn(64, 32), torch.randint(0, 10, (64,)))),
        "cnn": (CNN, lambda: (torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,)))),
    }
    mode = "adaptive" if eager_neuron.set_adaptive and os.environ.get(
        "EAGER_NEURON_ADAPTIVE") == "1" else "plain eager"
    print(f"eager_neuron {eager_neuron.__version__} - {torch.neuron.get_device_name(0)}, {mode}")
    for name, (make_model, make_batch) in cases.items():
        cpu, t_cpu = train(make_model, make_batch, "cpu")
        eager_neuron.reset_stats()
        dev, t_dev = train(make_model, make_batch, "neuron")
        s = eager_neuron.stats()
        worst = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(cpu, dev))
        ok &= worst <= 1e-5
        print(f"\n== {name}: {STEPS} AdamW steps, same seed ==")
        print("  step   cpu loss        neuron loss")
        for i, (a, b) in enumerate(zip(cpu, dev)):
            print(f"  {i:>4}   {a:.8f}      {b:.8f}")
        print(f"  max relative difference: {worst:.2e} ({'OK' if worst <= 1e-5 else 'MISMATCH'})")
        print(f"  wall: cpu {t_cpu:.2f} s, neuron {t_dev:.2f} s (first run includes compiles)")
        print(f"  stats: ops={s['ops']} launches={s['launches']} compiles={s['compiles']} "
              f"({s['compile_seconds']:.1f} s) memory_hits={s['memory_hits']} "
              f"disk_hits={s['disk_hits']} fallbacks={dict(s['fallbacks']) or 'none'}")
        print(f"  simulated device: {s['device_time_us'] / 1e3:.3f} ms, launch overhead "
              f"{s['launch_overhead_us'] / 1e3:.3f} ms, HBM traffic {s['hbm_bytes'] / 1e6:.2f} MB,"
              f" host<->device {s['transfer_bytes'] / 1e6:.3f} MB")
        print(f"  HBM in use now: {torch.neuron.memory_allocated() / 1e6:.2f} MB, "
              f"peak {torch.neuron.max_memory_allocated() / 1e6:.2f} MB")
    print("\nall loss curves match" if ok else "\nMISMATCH between cpu and neuron")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
