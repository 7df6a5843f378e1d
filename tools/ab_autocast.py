"""Autocast training steps with and without a half-type speed-up, in turns in one process.

The sweep's models (tools/compile_sweep.py), each step under `torch.autocast("neuron",
dtype=torch.bfloat16)`, torch on one thread. Three switches (--switch):
- `learned`: `dispatch._NOT_HALF`, the dtypes that keep a kernel op from being learned by the
  fast path (complex and float8 by default; with the half types added, bfloat16/float16 ops
  take the slow path on every call, as before the eighteenth session);
- `one-kernel`: `lower.elementwise.ONE_KERNEL`, a half elementwise op as one kernel reading and
  writing half bits, or as the three of the half route (casts up, the float32 op, the cast
  down: before the nineteenth session);
- `half-mm`: `handles_half` of lower/matmul.py's mm, addmm, bmm and baddbmm: a half matrix
  product as one kernel (bits into float32 temporaries, BLAS, one rounding), or through the
  half route's four kernels (before the twentieth session).
Process CPU per step, medians of the turns; the ratio is on / off.

    .venv/bin/python tools/ab_autocast.py --models mlp,gpt2,llama,bert --turns 4
    .venv/bin/python tools/ab_autocast.py --switch one-kernel
    .venv/bin/python tools/ab_autocast.py --switch half-mm
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # (before torch loads: see compile_sweep)

import torch  # noqa: E402

import eager_neuron  # noqa: E402,F401
from eager_neuron import dispatch, fastpath  # noqa: E402
from eager_neuron.lower import elementwise as ew  # noqa: E402
from eager_neuron.lower import matmul as mm  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_sweep as cs  # noqa: E402 - the sweep's models, batches and steppers


def _set(switch: str, on: bool) -> None:
    if switch == "learned":
        dispatch._NOT_HALF = _NOT_HALF if on else dispatch._WIDENED
    elif switch == "half-mm":
        for lower in (mm.lower_mm, mm.lower_addmm, mm.lower_bmm, mm.lower_baddbmm):
            lower.handles_half = on
    else:
        ew.ONE_KERNEL[0] = on


_NOT_HALF = dispatch._NOT_HALF


def measure(name: str, turns: int, steps: int, dtype, switch: str) -> tuple[float, float]:
    """(ms per step with the switch on, ms with it off), process CPU medians."""
    model, batches, loss, _, _ = cs._build(name)
    _, step = cs._stepper(model, loss, "neuron", False)

    def run(i):
        with torch.autocast("neuron", dtype=dtype):
            return step(batches[i % len(batches)]).item()

    times = {True: [], False: []}
    try:
        for i in range(4):
            run(i)
        for _ in range(turns):
            for learned in (True, False):
                _set(switch, learned)
                fastpath.reset()   # each mode learns its own runners
                for i in range(3):
                    run(i)
                t0 = time.process_time()
                for i in range(steps):
                    run(i)
                times[learned].append((time.process_time() - t0) / steps * 1e3)
    finally:
        _set(switch, True)
    return statistics.median(times[True]), statistics.median(times[False])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mlp,gpt2,llama,bert")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--switch", default="learned", choices=("learned", "one-kernel", "half-mm"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    print(f"load {os.getloadavg()[0]:.1f}; autocast {args.dtype}; switch {args.switch}; "
          "process CPU ms per step")
    for name in args.models.split(","):
        on, off = measure(name, args.turns, args.steps, dtype, args.switch)
        print(f"{name}: {args.switch} on {on:.2f}, off {off:.2f}, ratio {on / off:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
