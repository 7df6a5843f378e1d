"""Custom-kernel library vs the built-in ops on neuron: medians and ratios in one run.

    python tools/bench_kernels.py            (part of `make bench` once the lead adds the line)

1. RMSNorm forward+backward at (64, 4096) float32: the two custom kernels vs the built-in op
   sequence (pow, mean, add, rsqrt, mul, mul and their backward); target >= 2x, equal within 1e-5.
2. flash attention (custom, tiled online softmax) vs the built-in fused
   `F.scaled_dot_product_attention`, forward and forward+backward; target within 1.2x.
3. the simulator's HBM peak (torch.neuron.max_memory_allocated above the inputs) of flash
   attention, the built-in fused SDPA and the unfused op sequence (q k^T, softmax, @ v) at two
   sequence lengths: O(sequence) vs O(sequence^2).

Wall times are host medians (kernels run on the CPU); "device" is the simulated NeuronCore time
charged by the cost model. The machine is shared: read the ratios.
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

import eager_neuron
from eager_neuron import kernel_lib

warnings.simplefilter("ignore")


def measure(fn, repeat: int = 5) -> tuple[float, float, int]:
    """(median wall seconds, simulated device us per call, launches per call); warm first."""
    fn()
    walls = []
    eager_neuron.reset_stats()
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
    s = eager_neuron.stats()
    return statistics.median(walls), s["device_time_us"] / repeat, s["launches"] // repeat


def _rms_builtin(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _row(name, wall, dev, launches) -> None:
    print(f"  {name:<34} wall {wall * 1e3:8.2f} ms   device {dev:9.1f} us   "
          f"launches {launches:3d}")


def bench_rms_norm() -> None:
    print("== RMSNorm forward+backward, (64, 4096) float32 ==")
    torch.manual_seed(0)
    x = torch.randn(64, 4096, device="neuron")
    w = torch.randn(4096, device="neuron")
    g = torch.randn(64, 4096, device="neuron")
    results = {}
    for name, fn in (("custom kernels", kernel_lib.rms_norm), ("built-in op sequence",
                                                              _rms_builtin)):
        xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()

        def step(fn=fn, xr=xr, wr=wr):
            xr.grad = wr.grad = None
            y = fn(xr, wr)
            y.backward(g)
            return y

        res = measure(step)
        _row(name, *res)
        y = step()
        results[name] = res, (y.detach().cpu(), xr.grad.cpu(), wr.grad.cpu())
    (wc, dc, _), outs_c = results["custom kernels"]
    (wb, db, _), outs_b = results["built-in op sequence"]
    diff = max(((a - b).abs().max() / (1 + b.abs().max())).item()
               for a, b in zip(outs_c, outs_b))
    ratio = wb / wc
    print(f"  speedup wall {ratio:.2f}x (target >= 2x: {'met' if ratio >= 2 else 'missed'}), "
          f"device {db / dc:.2f}x; max relative difference {diff:.1e} "
          f"(target <= 1e-5: {'met' if diff <= 1e-5 else 'missed'})")


def bench_flash(B=1, H=8, L=1024, D=64) -> None:
    print(f"== flash attention vs built-in fused SDPA, ({B}, {H}, {L}, {D}) float32 ==")
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device="neuron") for _ in range(3))
    g = torch.randn(B, H, L, D, device="neuron")
    for causal in (False, True):
        walls = {}
        for name, fn in (("flash (custom)", kernel_lib.flash_attention),
                         ("SDPA (built-in)", lambda q, k, v, causal: (
                             F.scaled_dot_product_attention(q, k, v, is_causal=causal)))):
            fwd = measure(lambda fn=fn, c=causal: fn(q, k, v, causal=c), repeat=3)
            qkv = [t.detach().requires_grad_() for t in (q, k, v)]
            both = measure(lambda fn=fn, c=causal, qkv=qkv: fn(*qkv, causal=c).backward(g),
                           repeat=3)
            _row(f"{name} fwd, causal={causal}", *fwd)
            _row(f"{name} fwd+bwd, causal={causal}", *both)
            walls[name] = fwd[0], both[0]
        (ff, fb), (sf, sb) = walls["flash (custom)"], walls["SDPA (built-in)"]
        verdict = "met" if max(ff / sf, fb / sb) <= 1.2 else "missed"
        print(f"  causal={causal}: flash/SDPA time fwd {ff / sf:.2f}x, fwd+bwd {fb / sb:.2f}x "
              f"(target <= 1.2x: {verdict})")


def _peak(fn) -> int:
    """Simulated HBM bytes allocated above the current level while fn runs (its result freed)."""
    base = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    out = fn()
    del out
    return torch.neuron.max_memory_allocated() - base


def _memory_rows(B: int, H: int, L: int, D: int) -> None:
    q, k, v = (torch.randn(B, H, L, D, device="neuron") for _ in range(3))
    kernel_lib.flash_attention(q, k, v)
    rows = (("flash (custom)", lambda: kernel_lib.flash_attention(q, k, v)),
            ("SDPA (built-in fused)", lambda: F.scaled_dot_product_attention(q, k, v)),
            ("op sequence (qk^T, softmax, @v)",
             lambda: (q @ k.transpose(-1, -2) * D ** -0.5).softmax(-1) @ v))
    for name, fn in rows:
        print(f"  L={L:5d} {name:<33} {_peak(fn) / 2**20:9.2f} MiB")


def bench_memory(B=1, H=8, D=64) -> None:
    print("== simulated HBM peak above the inputs, forward, float32 ==")
    for L in (512, 2048):
        _memory_rows(B, H, L, D)
    print("  (4x the sequence: flash and fused SDPA grow 4x, the op sequence 16x)")


def main() -> None:
    print(f"eager_neuron custom-kernel bench (torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads)")
    bench_rms_norm()
    bench_flash()
    bench_memory()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
