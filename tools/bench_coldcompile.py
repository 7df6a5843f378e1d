"""Cold Numba compile time per kernel family, on a fixed corpus of kernels.

Each run is a fresh process with a fresh EAGER_NEURON_CACHE_DIR: the corpus (elementwise unary
and binary ops incl. the division/rounding/pow/shift helpers and vmath, casts incl. float16 and
bfloat16, reductions, an adaptive fused group, sorts, a resample, index ops) compiles every
kernel once, and the compile seconds per family are read back from the cache's index
(`cache.db`, column `tag`: family, op, name, compile_s). Prints the median over `--runs` of the
per-family sums and kernel counts.

    .venv/bin/python tools/bench_coldcompile.py                    # this tree, 3 runs
    .venv/bin/python tools/bench_coldcompile.py --runs 5 --tree /tmp/h13base   # another checkout

`--tree DIR` runs the corpus against the eager_neuron of checkout DIR (its kernels/ and cache/
mapped in as the package's subpackages, as pyproject.toml installs them), so before/after is one
command per tree, on the same corpus (this file's CORPUS).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

CORPUS = r'''
import os, time
t_start = time.perf_counter()
import torch
import torch.nn.functional as F
import eager_neuron
from eager_neuron.adaptive import MODULE as ad

dev = "neuron"
g = torch.Generator().manual_seed(0)
x32 = torch.randn(257, generator=g)
y32 = torch.randn(257, generator=g) + 3
x64, y64 = x32.double(), y32.double()
i32 = torch.randint(-100, 100, (257,), generator=g, dtype=torch.int32)
j32 = torch.randint(1, 50, (257,), generator=g, dtype=torch.int32)
i64, j64 = i32.long(), j32.long()
i8 = i32.to(torch.int8)
h16, b16 = x32.half(), x32.bfloat16()
d = lambda t: t.to(dev)
out = []
# 1. elementwise unary: vmath (float32), libm (float64), integer, half
for t in (x32, x64, h16, b16):
    out += [torch.exp(d(t)), torch.tanh(d(t)), F.gelu(d(t)), torch.sigmoid(d(t)), torch.sin(d(t))]
out += [torch.abs(d(i32)), torch.neg(d(i64)), torch.bitwise_not(d(i8)), torch.log1p(d(x32).abs())]
# 2. elementwise binary: arithmetic and the prelude's division/rounding/pow/shift helpers
for a, b in ((x32, y32), (x64, y64), (i32, j32), (i64, j64), (h16, y32.half())):
    a, b = d(a), d(b)
    out += [a + b, a * b, a / b, torch.floor_divide(a, b), torch.remainder(a, b),
            torch.fmod(a, b), torch.div(a, b, rounding_mode="trunc"), torch.maximum(a, b)]
out += [torch.pow(d(i64), 3), torch.pow(d(x32), d(y32)), d(i32) << d(j32) % 8,
        d(i64) >> 2, torch.gcd(d(i64), d(j64)), torch.logit(d(x32).sigmoid(), 1e-6),
        torch.atan2(d(x64), d(y64)), torch.clamp(d(x32), -0.5, 0.5), d(x32) > d(y32)]
# 3. casts incl. half
for t in (x32, x64, i32, i64):
    for dt in (torch.float16, torch.bfloat16, torch.int8, torch.float32, torch.bool):
        if dt != t.dtype:
            out.append(d(t).to(dt))
out += [d(h16).float(), d(b16).double(), d(h16).to(torch.bfloat16)]
# 4. reductions
m = d(torch.randn(33, 65, generator=g))
out += [m.sum(), m.sum(1), m.amax(0), m.mean(1), m.double().sum(0), d(i32).sum(), m.argmax(1),
        torch.softmax(m, 1), m.norm()]
# 5. sort, topk
out += [torch.sort(m, 1)[0], torch.sort(d(i64))[1], torch.argsort(d(x64)), torch.topk(m, 3)[0]]
# 6. resample
img = d(torch.randn(1, 2, 9, 11, generator=g))
out += [F.interpolate(img, scale_factor=2, mode="bilinear"),
        F.interpolate(img, size=(5, 7), mode="bicubic", align_corners=True),
        F.interpolate(img, scale_factor=2, mode="nearest")]
# 7. index
idx = d(torch.tensor([3, 1, 0, 7]))
out += [m[idx], m.index_select(1, idx), torch.gather(m, 1, idx.expand(33, 4)),
        m.clone().index_put_((idx,), torch.zeros(65, device=dev), accumulate=True)]
# 8. adaptive fused groups (compiled before they run)
ad.set_compile_mode("sync")
with eager_neuron.adaptive():
    for _ in range(3):
        a, b = d(x32), d(y32)
        r = ((a * 1.5 + b).relu() - 0.25).sigmoid() * a
        r2 = (torch.floor_divide(a, b) + torch.remainder(a, b)).exp()
        r3 = (d(i64) * 3 + d(j64)).to(torch.float32) / 7
        out += [r, r2, r3]
        torch.neuron.synchronize()
[o.cpu() for o in out]
print("TOTAL_S", time.perf_counter() - t_start)
'''

_TREE_SHIM = r'''
import importlib.util, os, sys, types
TREE = {tree!r}
def _pkg(name, path):
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(path, "__init__.py"), submodule_search_locations=[path])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
# eager_neuron's own __init__ imports its kernels/cache subpackages: map those first
sys.modules.pop("eager_neuron", None)
spec = importlib.util.spec_from_file_location(
    "eager_neuron", os.path.join(TREE, "eager_neuron", "__init__.py"),
    submodule_search_locations=[os.path.join(TREE, "eager_neuron")])
root = importlib.util.module_from_spec(spec)
sys.modules["eager_neuron"] = root
_pkg("eager_neuron.kernels", os.path.join(TREE, "kernels"))
_pkg("eager_neuron.cache", os.path.join(TREE, "cache"))
spec.loader.exec_module(root)
'''


def run_once(tree: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="coldcompile-") as cache_dir:
        env = dict(os.environ, EAGER_NEURON_CACHE_DIR=cache_dir, OMP_WAIT_POLICY="PASSIVE")
        env.pop("EAGER_NEURON_ADAPTIVE", None)
        src = (_TREE_SHIM.format(tree=os.path.abspath(tree)) if tree else "") + CORPUS
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", src], env=env, capture_output=True,
                              text=True)
        wall = time.perf_counter() - t0
        if proc.returncode:
            sys.exit(f"corpus failed:\n{proc.stderr[-4000:]}")
        fams: dict[str, list] = {}
        con = sqlite3.connect(os.path.join(cache_dir, "cache.db"))
        try:
            for (tag,) in con.execute("SELECT tag FROM Cache"):
                try:
                    meta = json.loads(tag)
                except (TypeError, ValueError):
                    continue
                f = fams.setdefault(meta.get("family", "?"), [0, 0.0])
                f[0] += 1
                f[1] += float(meta.get("compile_s", 0.0))
        finally:
            con.close()
        return {"families": fams, "wall": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tree", default=None, help="a checkout to run instead of this one")
    ap.add_argument("--json", default=None, help="also write the per-run results here")
    args = ap.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}   tree: "
          f"{args.tree or 'installed'}")
    runs = [run_once(args.tree) for _ in range(args.runs)]
    fams = sorted({f for r in runs for f in r["families"]})
    print(f"{'family':<14}{'kernels':>8}{'compile s (median)':>20}{'per kernel':>12}")
    total = []
    for fam in fams:
        n = statistics.median(r["families"].get(fam, [0, 0.0])[0] for r in runs)
        s = statistics.median(r["families"].get(fam, [0, 0.0])[1] for r in runs)
        print(f"{fam:<14}{n:>8.0f}{s:>20.2f}{s / max(n, 1):>12.3f}")
    for r in runs:
        total.append(sum(v[1] for v in r["families"].values()))
    print(f"{'all':<14}{'':>8}{statistics.median(total):>20.2f}   runs: "
          + " ".join(f"{t:.1f}" for t in total)
          + "   process wall: " + " ".join(f"{r['wall']:.1f}" for r in runs))
    print(f"load after: {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(runs, fh)


if __name__ == "__main__":
    main()
