"""OpInfo sweep for the dtypes tests/test_opinfo.py leaves out: float16, complex64 (and bfloat16
backward), forward and backward, at PyTorch's test_compare_cpu tolerances (atol = rtol = 1e-3,
raised by each OpInfo's toleranceOverride). One process; run it on the ops you touch.

    .venv/bin/python tools/dtype_sweep.py --dtypes float16,bfloat16 --ops '^(addbmm|cov)$'
    .venv/bin/python tools/dtype_sweep.py --dtypes complex64 --samples 4 -v
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.join(ROOT, "tests"))


def tolerances(T, op, dtype) -> tuple:
    """test_compare_cpu's default 1e-3 raised by the OpInfo's CPU overrides for this dtype."""
    atol = rtol = 1e-3
    a2, r2 = T.tolerances(op, dtype)
    if a2 is not None:
        atol, rtol = max(atol, a2), max(rtol, r2)
    return atol, rtol


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="bfloat16,float16,complex64")
    ap.add_argument("--ops", default=".", help="regex on OpInfo names (name.variant)")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--no-bwd", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every failure")
    ap.add_argument("--shard", default="0/1", help="k/n: only every n-th op from the k-th "
                    "(run n processes, one per core, then --merge their --json files)")
    ap.add_argument("--json", help="write {table, failures} here (for --merge)")
    ap.add_argument("--merge", nargs="+", help="print the table of these --json files")
    args = ap.parse_args(argv)
    if args.merge:
        return _merge(args.merge)

    import test_opinfo as T
    import torch

    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    for d in dtypes:
        T.DTYPE_NAMES.setdefault(d, str(d).split(".")[1])
    rx = re.compile(args.ops)
    k, n = (int(v) for v in args.shard.split("/"))
    table = collections.defaultdict(lambda: [0, 0])
    reasons = collections.Counter()
    failures = []
    ops = [op for op in T.all_ops() if rx.search(T.op_id(op)) and T.comparable(op)]
    for op in ops[k::n]:
        oid = T.op_id(op)
        supported = op.supported_dtypes("cpu")
        for dtype in dtypes:
            if dtype not in supported:
                continue
            name = T.DTYPE_NAMES[dtype]
            do_bwd = (not args.no_bwd and op.supports_autograd
                      and dtype in op.supported_backward_dtypes("cpu"))
            atol, rtol = tolerances(T, op, dtype)
            verdict = {"fwd": "", "bwd": ""}
            ran = set()
            try:
                torch.manual_seed(0)
                taken = 0
                for sample in op.sample_inputs_func(op, "cpu", dtype, do_bwd):
                    if taken >= args.samples:
                        break
                    if T._numel(sample) > 2 ** 16:
                        continue
                    taken += 1
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        res = T.run_sample(op, sample, dtype, do_bwd, atol, rtol)
                    for phase, (ok, reason, _fb) in res.items():
                        ran.add(phase)
                        if not ok and not verdict[phase]:
                            verdict[phase] = reason
            except Exception as exc:   # the sample generator: not ours to judge
                if not ran:
                    continue
                verdict["fwd"] = verdict["fwd"] or f"harness: {T._short(exc)}"
            if args.json:   # after every op: a long sweep stopped early still has its numbers
                _dump(args.json, table, failures)
            for phase in sorted(ran):
                row = table[(name, phase)]
                row[1] += 1
                if not verdict[phase]:
                    row[0] += 1
                else:
                    reasons[T._short(Exception(verdict[phase]))[11:70]] += 1
                    failures.append([oid, name, phase, verdict[phase][:300]])
                    if args.verbose:
                        print(f"FAIL {oid} {name} {phase}: {verdict[phase][:160]}", flush=True)
    if args.json:
        _dump(args.json, table, failures)
    _print(table, reasons)
    return 0


def _dump(path: str, table, failures) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump({"table": [[nm, ph, ok, tot] for (nm, ph), (ok, tot) in table.items()],
                   "failures": failures}, f)
    os.replace(path + ".tmp", path)


def _print(table, reasons) -> None:
    print(f"{'dtype':10} {'phase':5} {'pass/total':>12} {'%':>6}")
    for (name, phase), (ok, tot) in sorted(table.items()):
        print(f"{name:10} {phase:5} {ok:>5}/{tot:<6} {100 * ok / max(tot, 1):6.1f}")
    if reasons:
        print("top reasons:")
        for r, c in reasons.most_common(10):
            print(f"  {c:4} {r}")


def _merge(paths) -> int:
    table = collections.defaultdict(lambda: [0, 0])
    reasons = collections.Counter()
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        for nm, ph, ok, tot in d["table"]:
            table[(nm, ph)][0] += ok
            table[(nm, ph)][1] += tot
        for _oid, _nm, _ph, why in d["failures"]:
            reasons[why[:60]] += 1
    _print(table, reasons)
    return 0


if __name__ == "__main__":
    sys.exit(main())
