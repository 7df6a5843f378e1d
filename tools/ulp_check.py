"""Exhaustive accuracy check of the float32 vmath helpers (kernels/vmath.py) on all 2^32 inputs.

Each helper runs in the loop shape a rendered kernel uses (`out[i] = helper(x[i])`, vectorized
exactly as in a kernel), over every float32 bit pattern in blocks, inside a parallel Numba loop;
a float64 reference (libm through Numba) judges each result. Per helper it prints:

- max ulp: the distance between the float32 bit patterns of the result and of the float64
  reference rounded to float32 (ordered-integer form, +0/-0 are 0 apart, NaN matches NaN only:
  the metric of tests/test_vmath.py), with the input where it occurs, over the region where the
  documented bound applies (e.g. gelu_as: x >= 0);
- max err: the same error in fractional ulps of the reference, |got - ref| / ulp(ref);
- nan/zero-sign mismatches against the reference in that region (a NaN where there should be
  none or none where there should be one, or the wrong sign of a zero result);
- for gelu_as (x < 0) the largest |got - ref| / |x| (documented bound 1.5e-7).

`--rev REV` checks the helpers of kernels/vmath.py at a git revision instead of the working
tree (before/after comparisons). `--bits LO:HI` restricts the range of bit patterns (hex ok).

    .venv/bin/python tools/ulp_check.py                       # every helper, all 2^32 inputs
    .venv/bin/python tools/ulp_check.py exp erf --rev HEAD~1  # two helpers, as they were
    .venv/bin/python tools/ulp_check.py exp --bits 0x3f000000:0x3f800000
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# helper -> (float64 reference expression in `xd`, documented bound region in `x` (float32),
#            documented max ulp in that region)
HELPERS = {
    "exp": ("math.exp(xd)", "True", 1),
    "exp_neg": ("math.exp(xd)", "not (x > np.float32(0.0))", 1),   # softmax's, x <= 0 only
    "expm1": ("math.expm1(xd)", "True", 2),
    "log": ("math.log(xd)", "True", 1),
    "log1p": ("math.log1p(xd)", "True", 1),
    "tanh": ("math.tanh(xd)", "True", 1),
    "erf": ("math.erf(xd)", "True", 1),
    "sigmoid": ("1.0 / (1.0 + math.exp(-xd))", "x > np.float32(-87.0)", 2),
    "gelu": ("0.5 * xd * math.erfc(-xd * 0.7071067811865476)", "True", 7),
    "gelu_as": ("0.5 * xd * math.erfc(-xd * 0.7071067811865476)", "x >= np.float32(0.0)", 2),
    "gelu_tanh": ("xd / (1.0 + math.exp(-2.0 * 0.7978845608028654 * (xd + 0.044715 * xd ** 3)))",
                  "x >= np.float32(-1.0)", 3),
}
# the helper's name in kernels/vmath.py
NAMES = {h: ("_v_exp_neg" if h == "exp_neg" else "_v" + h) for h in HELPERS}

_CHECK = '''
@njit(parallel=True, error_model="numpy")
def _check_{h}(start, nblocks, bs, stats, where):
    # stats[b] = (max ulp, its bits, max frac err * 2^20, its bits, nan/sign mismatches,
    #             max |err|/|x| for x < 0 * 2^60, its bits)
    for b in prange(nblocks):
        xs = np.empty(bs, np.float32)
        out = np.empty(bs, np.float32)
        base = start + np.int64(b) * bs
        for j in range(bs):
            xs[j] = np.uint32(base + j).view(np.float32)
        for j in range(bs):
            out[j] = {name}(xs[j])
        mu = np.int64(0)
        mub = np.int64(-1)
        mf = 0.0
        mfb = np.int64(-1)
        bad = np.int64(0)
        ma = 0.0
        mab = np.int64(-1)
        for j in range(bs):
            x = xs[j]
            g = out[j]
            xd = np.float64(x)
            r = {ref}
            r32 = np.float32(r)
            inside = {where}
            gn = g != g
            rn = r != r
            if gn or rn:
                if gn != rn and inside:
                    bad += 1
                continue
            if inside and g == 0.0 and r32 == 0.0:
                if (np.float32(g).view(np.int32) < 0) != (r32.view(np.int32) < 0):
                    bad += 1
            gi = np.int64(np.float32(g).view(np.int32))
            ri = np.int64(r32.view(np.int32))
            gi = -(gi & 0x7FFFFFFF) if gi < 0 else gi
            ri = -(ri & 0x7FFFFFFF) if ri < 0 else ri
            u = abs(gi - ri)
            if inside and u > mu:
                mu = u
                mub = base + j
            if inside and abs(r32) < np.float32(np.inf):
                ex = np.int64((np.float32(abs(r32)).view(np.int32) >> 23) & 0xFF)
                ulp = np.int64((max(ex, 1) - 150 + 1023) << 52).view(np.float64)
                f = abs(np.float64(g) - r) / ulp
                if f > mf:
                    mf = f
                    mfb = base + j
            if x < np.float32(0.0) and abs(x) < np.float32(np.inf):
                a = abs(np.float64(g) - r) / abs(xd)
                if a > ma:
                    ma = a
                    mab = base + j
        stats[b, 0] = mu
        stats[b, 1] = mub
        stats[b, 2] = np.int64(min(mf, 1e12) * 1048576.0)
        stats[b, 3] = mfb
        stats[b, 4] = bad
        stats[b, 5] = np.int64(min(ma, 1.0) * 1.152921504606847e18)
        stats[b, 6] = mab
'''


def helper_source(rev: str | None) -> str:
    """The SOURCE string of kernels/vmath.py, at `rev` (git) or in the working tree."""
    if rev is None:
        from eager_neuron.kernels import vmath

        return vmath.SOURCE
    text = subprocess.run(["git", "show", f"{rev}:kernels/vmath.py"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "SOURCE":
            return ast.literal_eval(node.value)
    raise SystemExit(f"no SOURCE in kernels/vmath.py at {rev}")


def build(source: str, helpers: list) -> dict:
    from eager_neuron.kernels import compile as kc

    ns = kc._namespace()
    exec(compile(source, "<vmath helpers>", "exec"), ns)
    for h in helpers:
        ref, where, _bound = HELPERS[h]
        exec(compile(_CHECK.format(h=h, name=NAMES[h], ref=ref, where=where), f"<check {h}>",
                     "exec"), ns)
    return ns


def _f(bits: int) -> str:
    if bits < 0:
        return "-"
    return repr(float(np.uint32(bits).view(np.float32)))


def check(ns: dict, h: str, lo: int, hi: int, chunk: int = 1 << 26, bs: int = 4096) -> dict:
    """Run helper h over bit patterns [lo, hi); the summary dict."""
    fn = ns[f"_check_{h}"]
    mu = mf = ma = -1
    mub = mfb = mab = -1
    bad = 0
    for s in range(lo, hi, chunk):
        n = min(chunk, hi - s)
        nb = -(-n // bs)
        stats = np.zeros((nb, 7), np.int64)
        fn(s, nb, bs if n >= bs else n, stats, 0)
        i = int(np.argmax(stats[:, 0]))
        if stats[i, 0] > mu:
            mu, mub = int(stats[i, 0]), int(stats[i, 1])
        i = int(np.argmax(stats[:, 2]))
        if stats[i, 2] > mf:
            mf, mfb = int(stats[i, 2]), int(stats[i, 3])
        i = int(np.argmax(stats[:, 5]))
        if stats[i, 5] > ma:
            ma, mab = int(stats[i, 5]), int(stats[i, 6])
        bad += int(stats[:, 4].sum())
    return {"max_ulp": mu, "at": _f(mub), "max_err": mf / 1048576.0, "err_at": _f(mfb),
            "mismatches": bad, "neg_abs_over_x": ma / 1.152921504606847e18, "neg_at": _f(mab)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("helpers", nargs="*", help=f"default: all of {', '.join(HELPERS)}")
    ap.add_argument("--rev", help="check kernels/vmath.py as of this git revision")
    ap.add_argument("--bits", default="0:0x100000000", help="range LO:HI of bit patterns")
    args = ap.parse_args()
    helpers = args.helpers or list(HELPERS)
    lo, hi = (int(v, 0) for v in args.bits.split(":"))
    # blocks must tile the range: keep it a multiple of 4096
    assert lo % 4096 == 0 and (hi - lo) % 4096 == 0, "LO and HI - LO must be multiples of 4096"
    ns = build(helper_source(args.rev), helpers)
    print(f"vmath helpers of {args.rev or 'the working tree'}; bits [{lo:#x}, {hi:#x})")
    for h in helpers:
        t0 = time.perf_counter()
        r = check(ns, h, lo, hi)
        bound = HELPERS[h][2]
        extra = (f"; x<0 max |err|/|x| {r['neg_abs_over_x']:.3g} at {r['neg_at']}"
                 if h == "gelu_as" else "")
        print(f"  {h:>10}: max {r['max_ulp']} ulp at x={r['at']} (documented {bound}); "
              f"max err {r['max_err']:.3f} ulp at x={r['err_at']}; nan/zero-sign mismatches "
              f"{r['mismatches']}{extra}  [{time.perf_counter() - t0:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
