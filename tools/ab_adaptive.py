"""Adaptive eager against plain eager and torch CPU eager, in turns in one process.

`make sweep` times plain and then adaptive eager one after the other, so on a shared machine
a change of load between the two lands in the ratio. Here the three take turns (a few steps
each, several turns) on the same model and batches, and the medians of all turns are compared:
wall time per step and process CPU time (which waiting for a core does not inflate).

    .venv/bin/python tools/ab_adaptive.py --models mlp,gpt2,llama --turns 4
    EAGER_NEURON_ADAPTIVE_LIGHT=65536 .venv/bin/python tools/ab_adaptive.py   # host-time policy
    .venv/bin/python tools/ab_adaptive.py --models gpt2 --phases --reach --bound

Diagnostics (each on a model of its own, after the timed turns):
- `--phases`: process CPU per phase (zero_grad + forward, backward, optimizer step, the loss's
  item) per mode, the modes alternating step by step;
- `--reach`: how many recorded calls per adaptive step an *exact-address replay* could take
  (docs/ADAPTIVE.md, thirteenth session): a call whose group, from its start, repeated the
  previous step's group call for call with equal operand and output addresses (equal trace
  edges and equal addresses: the same buffers, guards and overlaps as then);
- `--bound`: the share of a plain step's process CPU spent in kernel calls (Numba's dispatch
  and the kernels' work): what fusing every op into free kernels at no host cost could remove.
  It wraps every cached kernel and relearns the runners: run it last.
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


def measure(name: str, turns: int, steps: int, modes=MODES) -> dict:
    """{mode: (median wall ms, median process CPU ms)} per training step. Mode "before":
    adaptive eager with the change under test switched off (`--ab`, see _switch)."""
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
    wall = {m: [] for m in modes}
    cpu = {m: [] for m in modes}
    for _ in range(turns):
        for mode in modes:
            run, bs = (cstep, cbatches) if mode == "cpu" else (step, batches)
            _switch(mode != "before")
            with eager_neuron.adaptive(mode in ("adaptive", "before")):
                for i in range(steps):
                    t0, p0 = time.perf_counter(), time.process_time()
                    run(bs[i % len(bs)]).item()
                    wall[mode].append(time.perf_counter() - t0)
                    cpu[mode].append(time.process_time() - p0)
    _switch(True)
    return {m: (statistics.median(wall[m]) * 1e3, statistics.median(cpu[m]) * 1e3)
            for m in modes}


def _switch(on: bool) -> None:
    """The change under test for --ab: adaptive.ALONE_ON (an op that only ever starts groups
    of one runs as plain eager; its verdicts are kept while it is off)."""
    from eager_neuron.adaptive import MODULE as ad

    ad.ALONE_ON[0] = on


def _model(name: str):
    """(model on neuron as make sweep trains it, its AdamW, batches, loss)."""
    model, batches, loss, _, _ = cs._build(name)
    m, _ = cs._stepper(model, loss, "neuron", False)
    return m, torch.optim.AdamW(m.parameters(), lr=1e-2, eps=1e-4), batches, loss


def _stepper(m, opt, loss):
    """One training step on a batch, ending in the loss's item (a sync)."""

    def step(batch):
        opt.zero_grad()
        y = loss(m, batch, "neuron")
        y.backward()
        opt.step()
        y.detach().item()

    return step


def _warm(step, batches) -> None:
    for i in range(3):
        step(batches[i % len(batches)])
    with eager_neuron.adaptive():
        for i in range(4):
            step(batches[i % len(batches)])
        adaptive_compile.wait(600)


def phases(name: str, steps: int) -> str:
    """Median process CPU ms per phase and mode, the modes alternating step by step."""
    m, opt, batches, loss = _model(name)
    clock = time.process_time
    rec: dict = {"plain": [], "adaptive": []}

    def step(batch, out=None):
        t0 = clock()
        opt.zero_grad()
        y = loss(m, batch, "neuron")
        t1 = clock()
        y.backward()
        t2 = clock()
        opt.step()
        t3 = clock()
        y.detach().item()
        if out is not None:
            out.append((t1 - t0, t2 - t1, t3 - t2, clock() - t3, clock() - t0))

    _warm(step, batches)
    for i in range(steps):
        for mode in rec:
            with eager_neuron.adaptive(mode == "adaptive"):
                step(batches[i % len(batches)], rec[mode])
    med = {mode: [statistics.median(c) * 1e3 for c in zip(*r)] for mode, r in rec.items()}
    rows = [f"  {mode:8s} " + ", ".join(f"{k} {v:.2f}" for k, v in zip(_PHASES, med[mode]))
            for mode in med]
    rows.append("  a/p      " + ", ".join(f"{k} {a / p:.2f}" for k, a, p in
                                           zip(_PHASES, med["adaptive"], med["plain"])))
    return f"{name} phases, process CPU ms per step (median of {steps}):\n" + "\n".join(rows)


_PHASES = ("forward", "backward", "optimizer", "item", "step")


def reach(name: str, steps: int = 4) -> str:
    """Recorded calls per adaptive step an exact-address replay could take (see the module
    doc): per group of the step, the calls from its start that repeat the previous step's
    group at the same position (same static id or call guards, same addresses)."""
    from eager_neuron import adaptive_fast
    from eager_neuron.adaptive import MODULE as ad

    calls: dict = {}
    groups: list = []

    def keys(operands, out) -> tuple:
        return tuple(src.data_ptr() for _a, src, _b in operands) + (out[1].data_ptr(),)

    def record_flat(*a):
        calls.setdefault(ad.stream_key(), []).append((a[11], keys(a[7], a[6])))
        return orig["record_flat"](*a)

    def record_flat_many(items, core):
        mine = calls.setdefault(ad.stream_key(), [])
        mine += [(facts[7], keys(ops, out)) for facts, out, ops, _s in items]
        return orig["record_flat_many"](items, core)

    def record(op, expr, kinds, loads, scalar_casts, store, out, operands, *a, **kw):
        addr = tuple(x[0].__array_interface__["data"][0] for x in [*operands, out])
        calls.setdefault(ad.stream_key(), []).append(((op, expr, kinds), addr))
        return orig["record"](op, expr, kinds, loads, scalar_casts, store, out, operands,
                              *a, **kw)

    def join_calls(name, staged, spans, pins, sids, core):
        calls.setdefault(ad.stream_key(), []).append((sids, tuple(spans)))
        return orig["join_calls"](name, staged, spans, pins, sids, core)

    def flush_locked(key, reason):
        g = ad.PENDING.get(key)
        if g is not None and g.n_nodes:
            groups.append(calls.pop(key, []))
        return orig["_flush_locked"](key, reason)

    new = {"record_flat": record_flat, "record_flat_many": record_flat_many,
           "record": record, "join_calls": join_calls, "_flush_locked": flush_locked}
    orig = {k: getattr(ad, k) for k in new}
    for k, f in new.items():
        setattr(ad, k, f)
    adaptive_fast.reset()   # (its runners hold record_flat and the rest: learned anew)
    try:
        m, opt, batches, loss = _model(name)
        step = _stepper(m, opt, loss)
        _warm(step, batches)
        per_step = []
        with eager_neuron.adaptive():
            for i in range(steps + 1):
                groups.clear()
                step(batches[i % len(batches)])
                per_step.append(list(groups))
    finally:
        for k, f in orig.items():
            setattr(ad, k, f)
        adaptive_fast.reset()
    rows = []
    for before, now in zip(per_step, per_step[1:]):
        total = sum(len(g) for g in now)
        prefix, whole = 0, 0
        for g0, g1 in zip(before, now):
            k = 0
            while k < min(len(g0), len(g1)) and g0[k] == g1[k]:
                k += 1
            prefix += k
            whole += k == len(g1) == len(g0)
        rows.append(f"{prefix}/{total} calls ({whole}/{len(now)} whole groups)")
    return f"{name} exact-address replay reach per step: " + "; ".join(rows)


def bound(name: str, steps: int) -> str:
    """The share of a plain step's process CPU spent inside kernel calls (see the module doc)."""
    from eager_neuron import launch

    m, opt, batches, loss = _model(name)
    step = _stepper(m, opt, loss)
    for i in range(3):
        step(batches[i % len(batches)])
    spent = [0.0, 0]
    clock = time.thread_time

    def timed(kernel):
        def call(*a):
            t0 = clock()
            try:
                return kernel(*a)
            finally:
                spent[0] += clock() - t0
                spent[1] += 1
        return call

    kernels = launch.MEMORY._kernels
    for k in list(kernels):
        kernels[k] = timed(kernels[k])
    for forget in launch.MEMORY.on_clear:   # runners hold kernels: learned anew, wrapped
        forget()
    for i in range(3):
        step(batches[i % len(batches)])
    spent[:] = [0.0, 0]
    t0 = time.process_time()
    for i in range(steps):
        step(batches[i % len(batches)])
    total = (time.process_time() - t0) / steps
    return (f"{name} plain step: {total * 1e3:.2f} ms process CPU, {spent[1] / steps:.0f} kernel "
            f"calls taking {spent[0] / steps * 1e3:.2f} ms ({spent[0] / steps / total:.0%} of "
            f"the step: the rest runs in both modes while ops are dispatched one by one)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mlp,gpt2,llama")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--steps", type=int, default=6, help="steps per mode and turn")
    p.add_argument("--ab", action="store_true",
                   help="also time adaptive eager with the change under test off (see _switch)")
    p.add_argument("--timed", action=argparse.BooleanOptionalAction, default=True,
                   help="the turns above (--no-timed: only the diagnostics)")
    p.add_argument("--phases", action="store_true", help="process CPU per phase and mode")
    p.add_argument("--reach", action="store_true", help="exact-address replay reach")
    p.add_argument("--bound", action="store_true", help="plain eager's kernel-call share")
    args = p.parse_args(argv)
    torch.set_num_threads(1)   # (as make sweep: torch CPU eager on one thread)
    print(f"load {os.getloadavg()[0]:.1f}; EAGER_NEURON_ADAPTIVE_LIGHT="
          f"{eager_neuron.config.adaptive_light}")
    for name in args.models.split(",") if args.timed else ():
        r = measure(name, args.turns, args.steps, MODES + ("before",) if args.ab else MODES)
        (wp, cp), (wa, ca), (wc, cc) = r["plain"], r["adaptive"], r["cpu"]
        if args.ab:
            wb, cb = r["before"]
            print(f"{name}: change off -> on: adaptive/plain wall {wb / wp:.2f} -> {wa / wp:.2f}, "
                  f"process CPU {cb / cp:.2f} -> {ca / cp:.2f}; on/off process CPU {ca / cb:.3f}")
        print(f"{name}: ms/step wall plain {wp:.2f}, adaptive {wa:.2f}, torch {wc:.2f}; "
              f"adaptive/plain {wa / wp:.2f} (process CPU {ca / cp:.2f}; target <= 0.8), "
              f"plain/torch {wp / wc:.2f} (CPU {cp / cc:.2f}), adaptive/torch {wa / wc:.2f}",
              flush=True)
    for name in args.models.split(","):
        if args.phases:
            print(phases(name, args.turns * args.steps), flush=True)
        if args.reach:
            print(reach(name), flush=True)
    for name in args.models.split(",") if args.bound else ():
        print(bound(name, args.turns * args.steps), flush=True)
    print(f"load {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
