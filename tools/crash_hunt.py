"""Crash hunt: every op of PyTorch's op_db called on `neuron` with deliberately bad arguments.

Each call must end in a Python exception or a result: never a signal (segfault, abort, SIGFPE),
never a hang, and a call that raises must not have written to any tensor it was given.

For each OpInfo, the first sample that the CPU accepts (float32, else the first supported
dtype) is moved to the device and broken one way per call:
    dtype:<d>     every floating tensor cast to int64 / bool / float64 / complex64 / bfloat16
    rank+1 / rank0 / empty / noncontig   the input unsqueezed, a 0-d tensor, an empty tensor,
                  a transposed (non-contiguous) view
    cpu_arg       the first tensor argument left on the CPU (mixed devices)
    dim:<v>       every int argument replaced by 99 / -99 (out-of-range dims)
    index:<v>     every int64 tensor argument shifted far out of range (+1000 / -1000)
    negsize       every int / int-list argument made negative
    nan           a floating input filled with nan/inf
    out:<kind>    out= a tensor of the wrong shape / the wrong dtype / the input itself
    inplace:<d>   the in-place variant on an input of another dtype
Calls run in worker processes, many per worker; a worker announces each call before making it,
so a worker that dies from a signal or stops making progress names its call; the hunt records it
and restarts a worker after that call.

    .venv/bin/python tools/crash_hunt.py                      # every op (make fuzz-crash)
    .venv/bin/python tools/crash_hunt.py --ops 'gather|conv' -v
    .venv/bin/python tools/crash_hunt.py --quick              # the bounded set tests run
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import select
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

# the bounded run (tests/test_crashes.py): mutations that reach argument checks, dispatch and
# index/shape kernels without compiling a kernel per dtype; every 25th op of op_db
QUICK_MUTATIONS = ("cpu_arg", "dim:99", "dim:-99", "index:+", "index:-", "negsize", "rank0",
                   "out:shape", "out:dtype")
ALL_MUTATIONS = ("dtype:int64", "dtype:bool", "dtype:float64", "dtype:complex64",
                 "dtype:bfloat16", "rank+1", "rank0", "empty", "noncontig", "cpu_arg", "dim:99",
                 "dim:-99", "index:+", "index:-", "negsize", "nan", "out:shape", "out:dtype",
                 "out:alias", "inplace:int64", "inplace:float64")
QUICK_STRIDE = 25


# ---------------------------------------------------------------------------------------------
# the calls (worker side)
# ---------------------------------------------------------------------------------------------

def _op_id(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _ops(pattern: str | None, quick: bool) -> list:
    from torch.testing._internal.common_methods_invocations import op_db

    ops = sorted(op_db, key=_op_id)
    if quick:
        ops = ops[::QUICK_STRIDE]
    if pattern:
        ops = [op for op in ops if re.search(pattern, _op_id(op))]
    return ops


def _first_sample(op):
    import torch

    for dtype in (torch.float32, torch.int64, torch.bool, torch.float64):
        if dtype not in op.supported_dtypes("cpu"):
            continue
        try:
            torch.manual_seed(0)
            for i, s in enumerate(op.sample_inputs_func(op, "cpu", dtype, False)):
                if i >= 4:
                    break
                leaves = [s.input, *s.args, *s.kwargs.values()]
                if sum(t.numel() for t in leaves if isinstance(t, torch.Tensor)) > 4096:
                    continue
                return s, dtype
        except Exception:
            continue
    return None, None


def _mutate(kind: str, inp, args, kwargs):
    """(inp, args, kwargs, how to call) for mutation `kind`, or None when it does not apply."""
    import torch

    def tmap(fn, x):
        if isinstance(x, (list, tuple)):
            return type(x)(tmap(fn, v) for v in x)
        return fn(x)

    def every(fn):
        return tmap(fn, inp), tmap(fn, args), {k: tmap(fn, v) for k, v in kwargs.items()}

    call = "op"
    if kind == "selftest:segv":   # tests/test_crashes.py: the hunt must name a call that dies
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind.startswith("dtype:"):
        dt = getattr(torch, kind[6:])
        changed = [False]

        def cast(x):
            if isinstance(x, torch.Tensor) and x.dtype.is_floating_point and x.dtype != dt:
                changed[0] = True
                return x.to(dt)
            return x
        inp, args, kwargs = every(cast)
        if not changed[0]:
            return None
    elif kind == "rank+1":
        if not isinstance(inp, torch.Tensor):
            return None
        inp = inp.unsqueeze(0)
    elif kind == "rank0":
        if not isinstance(inp, torch.Tensor) or inp.numel() == 0 or inp.dim() == 0:
            return None
        inp = inp.reshape(-1)[0].clone()
    elif kind == "empty":
        if not isinstance(inp, torch.Tensor) or inp.dim() == 0:
            return None
        inp = inp[:0]
    elif kind == "noncontig":
        if not isinstance(inp, torch.Tensor) or inp.dim() < 2:
            return None
        inp = inp.transpose(0, -1)
    elif kind == "cpu_arg":
        args = list(args)
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.device.type == "neuron":
                args[i] = a.cpu()
                break
        else:
            if not isinstance(inp, torch.Tensor) or not any(
                    isinstance(a, torch.Tensor) for a in list(args) + list(kwargs.values())):
                return None
            inp = inp.cpu()
        args = tuple(args)
    elif kind.startswith("dim:"):
        v = int(kind[4:])
        changed = [False]

        def dim(x):
            if isinstance(x, int) and not isinstance(x, bool):
                changed[0] = True
                return v
            return x
        args = tuple(dim(a) for a in args)
        kwargs = {k: dim(x) for k, x in kwargs.items()}
        if not changed[0]:
            return None
    elif kind.startswith("index:"):
        shift = 1000 if kind.endswith("+") else -1000
        changed = [False]

        def far(x):
            if isinstance(x, torch.Tensor) and x.dtype == torch.int64 and x.numel():
                changed[0] = True
                return x + shift
            return x
        args = tmap(far, args)
        kwargs = {k: tmap(far, v) for k, v in kwargs.items()}
        if not changed[0]:
            return None
    elif kind == "negsize":
        changed = [False]

        def neg(x):
            if isinstance(x, int) and not isinstance(x, bool):
                changed[0] = True
                return -abs(x) - 3
            if isinstance(x, (list, tuple)) and x and all(
                    isinstance(v, int) and not isinstance(v, bool) for v in x):
                changed[0] = True
                return type(x)(-abs(v) - 3 for v in x)
            return x
        args = tuple(neg(a) for a in args)
        kwargs = {k: neg(x) for k, x in kwargs.items()}
        if not changed[0]:
            return None
    elif kind == "nan":
        if not isinstance(inp, torch.Tensor) or not inp.dtype.is_floating_point or \
                inp.numel() == 0:
            return None
        inp = inp.clone()
        flat = inp.view(-1) if inp.is_contiguous() else None
        if flat is None:
            return None
        flat[0::3] = float("nan")
        flat[1::3] = float("inf")
        flat[2::3] = -float("inf")
    elif kind.startswith("out:"):
        if not isinstance(inp, torch.Tensor) or inp.dtype.is_complex:
            return None
        # filled, not empty: uninitialised memory cannot show whether a failing op wrote to it
        if kind == "out:shape":
            out = torch.full((7, 3), 3, dtype=inp.dtype, device="neuron")
        elif kind == "out:dtype":
            out = torch.full(inp.shape, 1, dtype=torch.bool if inp.dtype != torch.bool
                             else torch.int64, device="neuron")
        else:
            out = inp
        kwargs = dict(kwargs, out=out)
        call = "out"
    elif kind.startswith("inplace:"):
        if not isinstance(inp, torch.Tensor):
            return None
        dt = getattr(torch, kind[8:])
        if inp.dtype == dt:
            return None
        inp = inp.to(dt)
        call = "inplace"
    return inp, args, kwargs, call


def _to_neuron(x):
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().to("neuron")
    if isinstance(x, (list, tuple)):
        return type(x)(_to_neuron(v) for v in x)
    if isinstance(x, torch.device) and x.type == "cpu":
        return torch.device("neuron")
    return x


def _tensors(x, found):
    import torch

    if isinstance(x, torch.Tensor):
        found.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _tensors(v, found)
    elif isinstance(x, dict):
        for v in x.values():
            _tensors(v, found)
    return found


def calls(op, mutations):
    """[(label, thunk, tensors it must not write to if it raises)] for one op."""
    sample, _dtype = _first_sample(op)
    if sample is None:
        return []
    out = []
    for kind in mutations:
        def thunk(kind=kind):
            # fresh device copies per call: an in-place call must not change the next one
            base = (_to_neuron(sample.input), _to_neuron(tuple(sample.args)),
                    {k: _to_neuron(v) for k, v in sample.kwargs.items()})
            m = _mutate(kind, *base)
            if m is None:
                return "n/a", []
            inp, args, kwargs, how = m
            if how == "out":
                if not op.supports_out:
                    return "n/a", []
                fn = op.op
            elif how == "inplace":
                fn = op.inplace_variant
                if fn is None:
                    return "n/a", []
            else:
                fn = op.op
            return fn, (inp, args, kwargs)
        out.append((f"{_op_id(op)} {kind}", thunk))
    return out


def _snapshot(tensors):
    import torch

    snap = []
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "neuron":
            try:
                snap.append((t, t.detach().cpu().clone()))
            except Exception:
                pass
    return snap


def _changed(snap) -> bool:
    import torch

    for t, before in snap:
        try:
            now = t.detach().cpu()
        except Exception:
            continue
        if now.shape != before.shape or now.dtype != before.dtype:
            # an out= resized before the dtype check fails: ATen's CPU kernels do the same
            # (kron, matrix_rank); only values written count
            continue
        if now.is_floating_point() or now.is_complex():
            same = torch.equal(now.isnan(), before.isnan()) and \
                torch.equal(now.nan_to_num(), before.nan_to_num())
        else:
            same = torch.equal(now, before)
        if not same:
            return True
    return False


def worker(pattern: str | None, quick: bool, mutations: list, start: int) -> None:
    """Run every call from index `start`; write 'S i label' before and 'E i status' after."""
    import warnings

    import torch

    import eager_neuron  # noqa: F401

    warnings.simplefilter("ignore")
    out = sys.stdout
    i = -1
    for op in _ops(pattern, quick):
        try:
            op_calls = calls(op, mutations)
        except Exception as exc:   # the sample generator failed: not a call
            out.write(f"X {_op_id(op)} {type(exc).__name__}\n")
            out.flush()
            continue
        out.write(f"O {_op_id(op)}\n")
        for label, thunk in op_calls:
            i += 1
            if i < start:
                continue
            out.write(f"S {i} {label}\n")
            out.flush()
            torch.manual_seed(0)
            status = "result"
            try:
                fn, payload = thunk()
                if fn == "n/a":
                    status = "n/a"
                else:
                    inp, args, kwargs = payload
                    snap = _snapshot(_tensors([inp, args, kwargs], []))
                    try:
                        res = fn(inp, *args, **kwargs)
                        # a result must be usable: read it back (a lazy failure shows here)
                        for t in _tensors([res], []):
                            if t.device.type == "neuron":
                                t.cpu()
                    except Exception as exc:
                        status = "exc:" + type(exc).__name__
                        if _changed(snap):
                            status = "wrote:" + type(exc).__name__
            except Exception as exc:
                status = "exc:" + type(exc).__name__
            out.write(f"E {i} {status}\n")
            out.flush()
    out.write("DONE\n")
    out.flush()


# ---------------------------------------------------------------------------------------------
# the hunt (parent side)
# ---------------------------------------------------------------------------------------------

def hunt(pattern=None, quick=False, mutations=None, timeout=120.0, verbose=False) -> dict:
    """Run the hunt; returns {'ops', 'calls', 'results', 'exceptions', 'n/a', 'signals': [...],
    'hangs': [...], 'wrote': [...], 'by_type': Counter}."""
    mutations = list(mutations or (QUICK_MUTATIONS if quick else ALL_MUTATIONS))
    summary = {"ops": 0, "calls": 0, "results": 0, "exceptions": 0, "n/a": 0, "signals": [],
               "hangs": [], "wrote": [], "by_type": collections.Counter()}
    ops_seen = set()
    start = 0
    env = dict(os.environ, PYTHONFAULTHANDLER="0")
    while True:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--start", str(start),
               "--mutations", ",".join(mutations)]
        if quick:
            cmd.append("--quick")
        if pattern:
            cmd += ["--ops", pattern]
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, bufsize=1)
        current, label, done = None, None, False
        last = time.monotonic()
        while True:
            ready, _, _ = select.select([p.stdout], [], [], 5.0)
            if not ready:
                if p.poll() is not None:
                    break
                if current is not None and time.monotonic() - last > timeout:
                    p.kill()
                    p.wait()
                    summary["hangs"].append(label)
                    if verbose:
                        print(f"HANG   {label}", flush=True)
                    break
                continue
            line = p.stdout.readline()
            if not line:
                break
            last = time.monotonic()
            tag, _, rest = line.rstrip("\n").partition(" ")
            if tag == "O":
                ops_seen.add(rest)
            elif tag == "S":
                n, _, label = rest.partition(" ")
                current = int(n)
            elif tag == "E":
                n, _, status = rest.partition(" ")
                current = None
                if status == "n/a":
                    summary["n/a"] += 1
                    continue
                summary["calls"] += 1
                if verbose and summary["calls"] % 200 == 0:
                    print(f"... {summary['calls']} calls, {len(ops_seen)} ops, at {label}",
                          flush=True)
                if status == "result":
                    summary["results"] += 1
                else:
                    summary["exceptions"] += 1
                    kind, _, typ = status.partition(":")
                    summary["by_type"][typ] += 1
                    if kind == "wrote":
                        summary["wrote"].append(label)
                        if verbose:
                            print(f"WROTE  {label} ({typ})", flush=True)
            elif tag == "DONE":
                done = True
        rc = p.wait()
        if done:
            break
        if current is None:   # died between calls (e.g. at import): do not loop forever
            if rc != 0:
                summary["signals"].append(f"(worker exit {rc} outside a call, after {start})")
            break
        if label not in summary["hangs"]:
            summary["calls"] += 1
            summary["signals"].append(f"{label} (exit {rc}"
                                      f"{', ' + signal.Signals(-rc).name if rc < 0 else ''})")
            if verbose:
                print(f"SIGNAL {label} exit {rc}", flush=True)
        start = current + 1
    summary["ops"] = len(ops_seen)
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", help="regex on OpInfo ids")
    ap.add_argument("--quick", action="store_true", help="the bounded set tests run")
    ap.add_argument("--mutations", help="comma-separated subset of: " + ",".join(ALL_MUTATIONS))
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds without progress")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    muts = a.mutations.split(",") if a.mutations else None
    if a.worker:
        worker(a.ops, a.quick, muts or list(QUICK_MUTATIONS if a.quick else ALL_MUTATIONS),
               a.start)
        return 0
    t0 = time.perf_counter()
    s = hunt(a.ops, a.quick, muts, a.timeout, a.verbose)
    dt = time.perf_counter() - t0
    print(f"crash hunt: {s['ops']} ops, {s['calls']} calls ({s['results']} results, "
          f"{s['exceptions']} Python exceptions, {s['n/a']} mutations not applicable), "
          f"signals: {len(s['signals'])}, hangs: {len(s['hangs'])}, "
          f"wrote-then-raised: {len(s['wrote'])}, {dt:.0f} s")
    print("exception types: " + ", ".join(f"{k} {v}" for k, v in s["by_type"].most_common()))
    for kind in ("signals", "hangs", "wrote"):
        for label in s[kind]:
            print(f"  {kind[:-1] if kind != 'wrote' else 'wrote'}: {label}")
    return 1 if (s["signals"] or s["hangs"] or s["wrote"]) else 0


if __name__ == "__main__":
    sys.exit(main())
