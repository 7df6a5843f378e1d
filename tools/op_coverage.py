"""OpInfo coverage: every op of PyTorch's op_db on `neuron` vs the CPU, all samples.

Prints pass rates per dtype for forward and backward, the CPU fallbacks met, and the most
common failure reasons, in plain eager and in adaptive eager (EAGER_NEURON_ADAPTIVE=1 is set in
the worker processes before they import eager_neuron). Ops run in worker processes (--jobs): a
phase that aborts its worker is reported as a crash and the sweep goes on.

    .venv/bin/python tools/op_coverage.py                 # plain and adaptive, all samples
    .venv/bin/python tools/op_coverage.py --adaptive --ops 'add|mul'
    .venv/bin/python tools/op_coverage.py --update-xfail  # regenerate tests/opinfo_xfail.txt

With both modes, the triples whose verdict differs between them are listed at the end (what
tests/test_opinfo.py test_op_adaptive fails on).

--update-xfail runs what tests/test_opinfo.py runs (plain eager, its sample bound) and rewrites
the list from the failures and crashes it sees.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
# NOTE: run as a script, this file's directory is sys.path[0], and this file would shadow the
# `coverage` package that Numba imports: take the directory off the path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]


# ---------------------------------------------------------------------------------------------
# worker: runs a list of ops, one JSON line per event, flushed (the parent reads the file)
# ---------------------------------------------------------------------------------------------

# --tol compare_cpu: the workers judge at PyTorch's test_compare_cpu tolerances (the issue's
# measure) instead of assert_close's per-dtype defaults (the test's stricter judge)
_TOL_ENV = "OP_COVERAGE_TOL"   # not EAGER_NEURON_*: config warns on names it does not know


def _compare_cpu_tol(T):
    def tol(op, dtype):
        """test_compare_cpu's atol = rtol = 1e-3, raised by the OpInfo's CPU overrides."""
        atol, rtol = T.tolerances(op, dtype)
        return (max(1e-3, atol), max(1e-3, rtol)) if atol is not None else (1e-3, 1e-3)
    return tol


def worker(out_path: str, op_ids: list, skip: list, samples, max_numel) -> None:
    sys.path.insert(0, TESTS)
    import test_opinfo as T  # imports torch and eager_neuron (after the env is set)

    by_id = {T.op_id(op): op for op in T.all_ops()}
    skip_set = {tuple(x) for x in skip}
    tol = _compare_cpu_tol(T) if os.environ.get(_TOL_ENV) == "compare_cpu" else None
    with open(out_path, "a", buffering=1) as out:
        def progress(op_id):
            def emit(dtype, phase, index):
                out.write(json.dumps({"progress": [op_id, dtype, phase, index]}) + "\n")
            return emit

        from eager_neuron.stats import STATS

        parent = os.getppid()
        for op_id in op_ids:
            if os.getppid() != parent:   # the sweep that started us is gone (killed pytest)
                return
            op = by_id[op_id]
            t0, c0 = time.perf_counter(), time.process_time()
            k0, ks0 = STATS.compiles, STATS.compile_seconds
            skip_here = {(d, p) for (o, d, p) in skip_set if o == op_id}
            res = {}
            if T.comparable(op):
                try:
                    res = T.run_op(op, max_samples=samples, max_numel=max_numel,
                                   skip=skip_here, progress=progress(op_id), tol=tol)
                except Exception as exc:   # a harness bug: say so, do not call it a crash
                    o = T.Outcome(status="fail", reason=f"harness error: {T._short(exc)}")
                    res = {("float32", "fwd"): o}
            out.write(json.dumps({
                "op": op_id, "seconds": time.perf_counter() - t0,
                "cpu_seconds": time.process_time() - c0, "compiles": STATS.compiles - k0,
                "compile_seconds": STATS.compile_seconds - ks0, "results": {
                f"{d} {p}": {"status": o.status, "reason": o.reason, "samples": o.samples,
                             "passed": o.passed, "fallbacks": dict(o.fallbacks)}
                for (d, p), o in res.items()}}) + "\n")


# ---------------------------------------------------------------------------------------------
# parent: shard the ops over worker processes, survive crashes and timeouts
# ---------------------------------------------------------------------------------------------

def sweep(T, op_ids: list, args, adaptive: bool) -> dict:
    """{results, timing, crashed} of `op_ids` over `args.jobs` worker processes."""
    log = (lambda m: print("  " + m, file=sys.stderr, flush=True)) if args.verbose else None
    sw = T.Sweep(op_ids, args.jobs, args.samples, args.max_numel, adaptive=adaptive,
                 timeout=args.timeout, log=log).start()
    try:
        sw.wait()
    finally:
        sw.stop()
    return {"results": sw.results, "timing": sw.timing,
            "crashed": {" ".join(k): v for k, v in sw.crashed.items()}}


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------

_DTYPES = ("float32", "int64", "bool", "bfloat16")


def _normalize(reason: str) -> str:
    """A failure reason without its numbers, shapes and op-specific details."""
    r = reason
    if r.startswith("fallback:"):
        return "fallback to CPU"
    if r.startswith("forward failed"):
        return "backward not run: forward failed"
    r = re.sub(r"Tensor-likes are not (close|equal)!.*", r"values not \1", r)
    r = re.sub(r"\[[^\]]*\]", "[..]", r)
    r = re.sub(r"\(.*?\)", "(..)", r)
    r = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "N", r)
    r = re.sub(r"(aten|prims)::[\w.]+", r"\1::OP", r)
    return r[:110]


def report(data: dict, title: str) -> str:
    results, crashed = data["results"], data["crashed"]
    lines = [f"== {title}: {len(results)} OpInfos =="]
    table = collections.defaultdict(lambda: [0, 0, 0, 0])   # pass, total, s_pass, s_total
    reasons: collections.Counter = collections.Counter()
    examples: dict = {}
    fallbacks: collections.Counter = collections.Counter()
    fallback_ops: dict = collections.defaultdict(set)
    for op, res in results.items():
        for key, r in res.items():
            if r["status"] == "skip":
                continue
            row = table[key]
            row[1] += 1
            row[3] += r["samples"]
            row[2] += r["passed"]
            if r["status"] == "pass":
                row[0] += 1
            else:
                norm = _normalize(r["reason"])
                reasons[norm] += 1
                examples.setdefault(norm, f"{op} {key}")
            for name, n in r["fallbacks"].items():
                fallbacks[name] += n
                fallback_ops[name].add(op)
    for key, how in crashed.items():
        op, dt, ph = key.split()
        table[f"{dt} {ph}"][1] += 1
        reasons[how.split(" (")[0]] += 1
        examples.setdefault(how.split(" (")[0], key)
    lines.append(f"{'dtype':10} {'forward (op pass/total)':>26} {'backward':>22}"
                 f"   {'fwd samples':>14} {'bwd samples':>14}")
    for dt in _DTYPES:
        f, b = table.get(f"{dt} fwd", [0] * 4), table.get(f"{dt} bwd", [0] * 4)
        cell = lambda r: f"{r[0]}/{r[1]} ({100 * r[0] / r[1]:.1f}%)" if r[1] else "-"  # noqa
        scell = lambda r: f"{r[2]}/{r[3]}" if r[3] else "-"  # noqa: E731
        lines.append(f"{dt:10} {cell(f):>26} {cell(b):>22}   {scell(f):>14} {scell(b):>14}")
    lines.append(f"CPU fallbacks: {sum(fallbacks.values())} calls in {len(fallbacks)} aten ops"
                 " (top 25: op, calls, OpInfos)")
    for name, n in fallbacks.most_common(25):
        lines.append(f"  {n:6d}  {name:45} {len(fallback_ops[name]):4d}")
    lines.append("top failure reasons (op-dtype-phase count, example):")
    for norm, n in reasons.most_common(25):
        lines.append(f"  {n:5d}  {norm}\n         e.g. {examples[norm]}")
    timing = data.get("timing", {})
    if timing:
        tot = [sum(t[i] for t in timing.values()) for i in range(4)]
        lines.append(f"time: {tot[0]:.0f} s in ops (sum over workers), {tot[1]:.0f} s CPU, "
                     f"{tot[2]} compiles taking {tot[3]:.0f} s; slowest ops (wall s, compiles):")
        for op, t in sorted(timing.items(), key=lambda kv: -kv[1][0])[:12]:
            lines.append(f"  {t[0]:7.1f}  {t[2]:4d}  {op}")
    if crashed:
        lines.append(f"crashes/timeouts: {len(crashed)}")
        for key, how in sorted(crashed.items()):
            lines.append(f"  {key}: {how}")
    return "\n".join(lines)


def _verdicts(data: dict) -> dict:
    """{(op, dtype, phase): (status, reason)}, crashes included."""
    out = {(op, *key.split()): (r["status"], r["reason"])
           for op, res in data["results"].items() for key, r in res.items()}
    out.update({tuple(k.split()): ("crash", v) for k, v in data["crashed"].items()})
    return out


def mode_differences(plain: dict, adaptive: dict) -> str:
    """The (op, dtype, phase) triples whose pass/not-pass verdict differs between the modes."""
    p, a = _verdicts(plain), _verdicts(adaptive)
    rows = []
    for key in sorted(set(p) | set(a)):
        ps, pr = p.get(key, ("skip", ""))
        as_, ar = a.get(key, ("skip", ""))
        if (ps == "pass") != (as_ == "pass") and not (ps == "skip" and as_ == "skip"):
            rows.append(f"  {' '.join(key)}: plain {ps}, adaptive {as_}: {(ar or pr)[:100]}")
    return f"plain vs adaptive: {len(rows)} triples differ" + ("\n" if rows else "") + \
        "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--adaptive", action="store_true", help="adaptive eager only")
    mode.add_argument("--plain", action="store_true", help="plain eager only")
    ap.add_argument("--samples", type=int, default=None,
                    help="samples per op and dtype (default: all)")
    ap.add_argument("--max-numel", type=int, default=None,
                    help="skip samples with more elements (default: no limit)")
    ap.add_argument("--ops", default=None, help="regex on OpInfo names (name.variant)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds without progress before a worker is killed")
    ap.add_argument("--json", default=None, help="also write the raw results here")
    ap.add_argument("--update-xfail", action="store_true",
                    help="rewrite tests/opinfo_xfail.txt from a run of the test's bounded sweep")
    ap.add_argument("--tol", choices=("default", "compare_cpu"), default="default",
                    help="default: assert_close's per-dtype tolerances raised by the OpInfo's "
                    "overrides (the test's judge); compare_cpu: PyTorch's test_compare_cpu "
                    "(atol = rtol = 1e-3, raised by the overrides)")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        with open(args.worker[1]) as f:
            spec = json.load(f)
        worker(args.worker[0], spec["ops"], spec["skip"], spec["samples"], spec["max_numel"])
        return 0

    sys.path.insert(0, TESTS)
    os.environ.setdefault("EAGER_NEURON_ADAPTIVE", "0")
    os.environ[_TOL_ENV] = args.tol   # the workers inherit it
    import test_opinfo as T  # the op list and the xfail file (the parent runs no op)

    op_ids = [T.op_id(op) for op in T.all_ops()]
    if args.ops:
        op_ids = [o for o in op_ids if re.search(args.ops, o)]
    if args.update_xfail:
        if args.tol != "default":
            ap.error("--update-xfail records the test's judge (--tol default)")
        if args.adaptive:
            ap.error("--update-xfail records plain eager (the test's mode)")
        if args.samples is None:
            args.samples = T.MAX_SAMPLES
        if args.max_numel is None:
            args.max_numel = T.MAX_NUMEL
        if (args.samples, args.max_numel) != (T.MAX_SAMPLES, T.MAX_NUMEL):
            print("warning: the xfail list should match the test's bound "
                  f"(--samples {T.MAX_SAMPLES} --max-numel {T.MAX_NUMEL})", file=sys.stderr)
    modes = [False] if (args.plain or args.update_xfail) else [True] if args.adaptive else \
        [False, True]
    bound = f"{args.samples or 'all'} samples" + (f", <= {args.max_numel} elements"
                                                   if args.max_numel else "")
    if args.tol != "default":
        bound += f", {args.tol} tolerances"
    out = {}
    for adaptive in modes:
        name = "adaptive eager" if adaptive else "plain eager"
        t0 = time.time()
        data = sweep(T, op_ids, args, adaptive)
        data["seconds"] = time.time() - t0
        out[name] = data
        print(report(data, f"{name} ({bound}; {data['seconds']:.0f}s)"), flush=True)
    if len(out) == 2:
        print(mode_differences(out["plain eager"], out["adaptive eager"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.update_xfail:
        data = out["plain eager"]
        failures = {}
        for op, res in data["results"].items():
            for key, r in res.items():
                if r["status"] == "fail":
                    failures[(op, *key.split())] = r["reason"]
        crashes = {tuple(k.split()): v for k, v in data["crashed"].items()}
        if args.ops:   # a partial run: keep the other ops' entries
            old_x, old_c = T.load_xfail()
            keep = lambda d: {k: v for k, v in d.items() if k[0] not in op_ids}  # noqa: E731
            failures.update(keep(old_x))
            crashes.update(keep(old_c))
        T.write_xfail(failures, crashes)
        print(f"wrote {T.XFAIL_FILE}: {len(failures)} expected failures, {len(crashes)} "
              "crashing phases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
