"""What the numerics debugger costs: a small MLP training step (forward, backward, SGD) timed
plain, under check_numerics() (every op also on the CPU) and under check_numerics(mode="nan").
Prints seconds per step and the ratio; the results of all three runs are checked to be equal.

    .venv/bin/python tools/numerics_overhead.py --steps 20
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args(argv)

    import torch

    import eager_neuron  # noqa: F401
    from eager_neuron.numerics import check_numerics

    def run(ctx):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.GELU(),
                                torch.nn.LayerNorm(args.width),
                                torch.nn.Linear(args.width, 10)).to("neuron")
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        x = torch.randn(64, args.width).to("neuron")
        y = torch.randint(0, 10, (64,)).to("neuron")
        with ctx() as chk:
            for step in range(args.steps + 1):
                if step == 1:
                    t0 = time.perf_counter()   # step 0 compiles: not timed
                loss = torch.nn.functional.cross_entropy(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            loss_v = loss.item()
        dt = (time.perf_counter() - t0) / args.steps
        return dt, loss_v, getattr(chk, "ops_checked", 0)

    class _Plain:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    base, l0, _ = run(_Plain)
    rows = [("plain", base, l0, 0)]
    for name, ctx in (("check_numerics()", check_numerics),
                      ("check_numerics(mode='nan')", lambda: check_numerics(mode="nan"))):
        dt, lv, n = run(ctx)
        rows.append((name, dt, lv, n))
    print(f"{'run':28} {'s/step':>9} {'x plain':>8} {'ops checked':>12}  final loss")
    for name, dt, lv, n in rows:
        print(f"{name:28} {dt:9.4f} {dt / base:8.1f} {n:12d}  {lv:.6f}")
    same = all(r[2] == l0 for r in rows)
    print("results unchanged:", same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
