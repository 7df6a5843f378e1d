"""FlexAttention timings: neuron fused kernels vs neuron dense path vs torch CPU eager.

    .venv/bin/python tools/bench_flex.py [--seq 1024] [--heads 8] [--dim 64] [--reps 5]

Per mask (causal, sliding window 256, document masking with 4 documents, each with a relative
bias score_mod): the median wall time of the forward and of forward + backward, compiled by the
neuron backend, with the fused kernels (compile/flex.py) and with them turned off (the dense
decomposition, torch's sdpa_dense), and torch's own CPU flex_attention in eager (forward only:
torch refuses a CPU backward in eager). Kernels are built before timing. Prints the machine
load (os.getloadavg) with the numbers: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import eager_neuron  # noqa: F401
from eager_neuron.compile import flex


def _median(fn, reps: int) -> float:
    fn()                                # warm: builds kernels, compiles graphs
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    S, H, D = args.seq, args.heads, args.dim
    doc_cpu = torch.arange(S) * 4 // S
    doc_dev = doc_cpu.to("neuron")

    def rel_bias(score, b, h, qi, ki):
        return score + (qi - ki) * 0.01

    masks = {
        "causal": lambda doc: lambda b, h, qi, ki: qi >= ki,
        "sliding256": lambda doc: lambda b, h, qi, ki: (qi >= ki) & (qi - ki < 256),
        "document": lambda doc: lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (qi >= ki),
    }
    g = torch.Generator().manual_seed(0)
    q0, k0, v0 = (torch.randn(1, H, S, D, generator=g) for _ in range(3))
    print(f"FlexAttention B=1 H={H} S={S} D={D} float32, median of {args.reps}; "
          f"load {os.getloadavg()[0]:.2f}, torch threads {torch.get_num_threads()}")
    print(f"{'mask':<12}{'pass':<10}{'fused ms':>10}{'dense ms':>10}{'cpu ms':>10}"
          f"{'dense/fused':>13}{'cpu/fused':>11}")
    fa = torch.compile(flex_attention, backend="neuron")
    for name, make in masks.items():
        bm = create_block_mask(make(doc_dev), 1, None, S, S, device="neuron")
        bm_cpu = create_block_mask(make(doc_cpu), 1, None, S, S, device="cpu")
        row = {}
        for mode in ("fused", "dense"):
            flex.ENABLED[0] = mode == "fused"
            torch._dynamo.reset()
            qn, kn, vn = (t.to("neuron").requires_grad_() for t in (q0, k0, v0))

            def fwd(qn=qn, kn=kn, vn=vn, bm=bm):
                with torch.no_grad():
                    fa(qn, kn, vn, score_mod=rel_bias, block_mask=bm).cpu()

            def fwd_bwd(qn=qn, kn=kn, vn=vn, bm=bm):
                out = fa(qn, kn, vn, score_mod=rel_bias, block_mask=bm)
                out.sum().backward()
                qn.grad.cpu()

            row[mode] = (_median(fwd, args.reps), _median(fwd_bwd, args.reps))
        flex.ENABLED[0] = True
        cpu = _median(lambda bm_cpu=bm_cpu: flex_attention(q0, k0, v0, score_mod=rel_bias,
                                                           block_mask=bm_cpu), args.reps)
        for k, label in enumerate(("fwd", "fwd+bwd")):
            f, d = row["fused"][k] * 1e3, row["dense"][k] * 1e3
            c = f"{cpu * 1e3:10.1f}" if k == 0 else f"{'-':>10}"
            r = f"{cpu * 1e3 / f:11.2f}" if k == 0 else f"{'-':>11}"
            print(f"{name:<12}{label:<10}{f:10.1f}{d:10.1f}{c}{d / f:13.2f}{r}")
    st = flex.stats()
    print(f"fused launches: forward {st['fused_forward']}, backward {st['fused_backward']}; "
          f"fallbacks {st['fallbacks']}")



if __name__ == "__main__":
    main()
