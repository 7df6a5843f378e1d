"""Cold Numba compile time per kernel family, on a fixed corpus of kernels.

Each run is a fresh process with a fresh EAGER_NEURON_CACHE_DIR: the corpus (elementwise unary
and binary ops incl. the division/rounding/pow/shift helpers and vmath, casts incl. float16 and
bfloat16, reductions, an adaptive fused group, sorts, a resample, index ops, half-type pools
and grid sampling) compiles every
kernel once, and the compile seconds per family are read back from the cache's index
(`cache.db`, column `tag`: family, op, name, compile_s). Prints the median over `--runs` of the
per-family sums and kernel counts.

    .venv/bin/python tools/bench_coldcompile.py                    # this tree, 3 runs
    .venv/bin/python tools/bench_coldcompile.py --runs 5 --tree /tmp/h13base   # another checkout
    .venv/bin/python tools/bench_coldcompile.py --diff /tmp/h13base   # outputs old vs this tree

`--tree DIR` runs the corpus against the eager_neuron of checkout DIR (its kernels/ and cache/
mapped in as the package's subpackages, as pyproject.toml installs them), so before/after is one
command per tree, on the same corpus (this file's CORPUS).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
# 8. half types: the rounding helpers in pool, grid-sample and index kernels
hi = d(torch.randn(1, 2, 8, 8, generator=g).bfloat16())
out += [F.avg_pool2d(hi, 2), F.avg_pool2d(hi.half(), 2),
        F.grid_sample(hi.half(), d(torch.rand(1, 3, 4, 2, generator=g).half() * 2 - 1),
                      align_corners=False),
        hi.view(-1)[:10].index_add(0, idx, hi.view(-1)[:4]), torch.cumsum(hi, -1)]
# 9. adaptive fused groups (compiled before they run)
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

# --diff: the same ops on two trees, outputs compared bit for bit (special values of every dtype,
# all pairs for binary ops, casts between all dtypes, sorts, reductions, adaptive fused groups,
# parallel sizes); an exception is recorded as (type, message) and must match too
DIFF = r'''
import sys, math, torch
import torch.nn.functional as F
import eager_neuron
from eager_neuron.adaptive import MODULE as ad
ad.set_compile_mode("sync")
dev = "neuron"
OUT = {}
def rec(name, fn):
    try:
        r = fn()
        if isinstance(r, (tuple, list)):
            r = tuple(t.cpu() if isinstance(t, torch.Tensor) else t for t in r)
        elif isinstance(r, torch.Tensor):
            r = r.cpu()
        OUT[name] = r
    except Exception as exc:
        OUT[name] = ("exc", type(exc).__name__, str(exc))
FL = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
IN = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
def special(dt):
    if dt.is_floating_point:
        fi = torch.finfo(dt)
        v = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -2.5, 2.5, 3.0, -3.0, 7.0, 1e-3, -1e-3,
             math.nan, -math.nan, math.inf, -math.inf, fi.tiny, -fi.tiny, fi.tiny / 4,
             -fi.tiny / 4, fi.max, -fi.max, fi.eps, 0.999, 1.001, 88.7, -88.7, 104.0, -104.0,
             20.0, -20.0, 5.5, -5.5, 1e-7, 0.1, math.pi]
        return torch.tensor(v, dtype=torch.float64).to(dt)
    ii = torch.iinfo(dt)
    v = [0, 1, -1, 2, -2, 3, -3, 7, -7, 8, 63, 64, 65, ii.min, ii.max, ii.min + 1, ii.max - 1]
    return torch.tensor([x for x in v if ii.min <= x <= ii.max], dtype=torch.int64).to(dt)
def pairs(dt, big=False):
    v = special(dt)
    a, b = v.repeat_interleave(len(v)), v.repeat(len(v))
    if big:   # above PARALLEL_MIN: the prange kernels
        a, b = a.repeat(300000 // len(a) + 1), b.repeat(300000 // len(b) + 1)
    return a.to(dev), b.to(dev)
g = torch.Generator().manual_seed(1)
for dt in FL:
    x = torch.cat([special(dt), (torch.randn(300, generator=g) * 4).to(dt)]).to(dev)
    for name in ["exp", "expm1", "log", "log1p", "tanh", "erf", "sigmoid", "sin", "cos", "sqrt",
                 "abs", "neg", "floor", "ceil", "round", "trunc", "reciprocal", "sign", "exp2",
                 "log2", "atan", "rsqrt", "erfc", "lgamma", "digamma", "erfinv", "frac", "sinh",
                 "asinh", "square", "logit"]:
        rec(f"{dt}.{name}", lambda: getattr(torch, name)(x))
    rec(f"{dt}.gelu", lambda: F.gelu(x))
    rec(f"{dt}.gelu_tanh", lambda: F.gelu(x, approximate="tanh"))
    rec(f"{dt}.silu", lambda: F.silu(x))
    rec(f"{dt}.softplus", lambda: F.softplus(x))
    rec(f"{dt}.logit_eps", lambda: torch.logit(x, 1e-6))
    rec(f"{dt}.nan_to_num", lambda: torch.nan_to_num(x))
    rec(f"{dt}.round2", lambda: torch.round(x, decimals=2))
    rec(f"{dt}.softmax", lambda: torch.softmax(x.view(2, -1), -1))
    rec(f"{dt}.logsoftmax", lambda: torch.log_softmax(x.view(2, -1), -1))
    rec(f"{dt}.sum", lambda: x.sum())
    rec(f"{dt}.amax", lambda: x.amax())
    rec(f"{dt}.sort", lambda: torch.sort(x))
    rec(f"{dt}.sort_desc", lambda: torch.sort(x.view(2, -1), 1, descending=True))
    rec(f"{dt}.sort_stable", lambda: torch.sort(x, stable=True))
    rec(f"{dt}.topk", lambda: torch.topk(x, 5))
    rec(f"{dt}.kthvalue", lambda: torch.kthvalue(x.view(2, -1), 3, 1))
    rec(f"{dt}.median", lambda: torch.median(x.view(2, -1), 1))
    rec(f"{dt}.nanmedian", lambda: torch.nanmedian(x.view(2, -1), 1))
for dt in FL + IN:
    for big in (False, True):
        if big and dt in (torch.int8, torch.uint8, torch.int16, torch.float16):
            continue
        a, b = pairs(dt, big)
        t = f"{dt}{'.big' if big else ''}"
        ops = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
               "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
               "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
               "remainder": torch.remainder, "fmod": torch.fmod, "maximum": torch.maximum,
               "minimum": torch.minimum, "eq": torch.eq, "lt": torch.lt}
        if dt.is_floating_point:
            ops.update(pow=torch.pow, atan2=torch.atan2, copysign=torch.copysign,
                       hypot=torch.hypot, fmax=torch.fmax)
        else:
            bb = b.clamp(0, 70) if dt != torch.uint8 else b
            ops.update(pow=lambda a, b: torch.pow(a, b.clamp(-3, 9)), band=torch.bitwise_and,
                       bxor=torch.bitwise_xor, gcd=torch.gcd,
                       shl=lambda a, b: a << bb, shr=lambda a, b: a >> bb)
            nz = (b != 0)
            ops.update(div_floor_nz=lambda a, b: torch.div(a[nz], b[nz], rounding_mode="floor"),
                       rem_nz=lambda a, b: torch.remainder(a[nz], b[nz]),
                       fmod_nz=lambda a, b: torch.fmod(a[nz], b[nz]),
                       div_trunc_nz=lambda a, b: torch.div(a[nz], b[nz], rounding_mode="trunc"))
        for name, fn in ops.items():
            rec(f"{t}.{name}", lambda: fn(a, b))
        rec(f"{t}.scalar_floordiv", lambda: torch.floor_divide(a, 3))
        rec(f"{t}.scalar_rem", lambda: torch.remainder(a, -3))
        rec(f"{t}.scalar_pow", lambda: torch.pow(a, 2))
for dt in IN:
    x = torch.cat([special(dt), special(dt).flip(0)]).to(dev)
    rec(f"{dt}.sort", lambda: torch.sort(x))
    rec(f"{dt}.sort_stable", lambda: torch.sort(x, stable=True, descending=True))
    rec(f"{dt}.topk", lambda: torch.topk(x, 4))
# resampling (forward and backward) over modes, with special values in the image
for dt in FL:
    img = torch.cat([special(dt), (torch.randn(2 * 2 * 9 * 11 - len(special(dt)),
                     generator=g) * 3).to(dt)]).view(2, 2, 9, 11)
    for mode, kw in (("nearest", {}), ("nearest-exact", {}), ("bilinear", {}),
                     ("bilinear", {"align_corners": True}), ("bicubic", {}),
                     ("bicubic", {"align_corners": True}), ("bilinear", {"antialias": True}),
                     ("bicubic", {"antialias": True}), ("area", {})):
        for size in ((5, 7), (17, 23)):
            def up():
                x = img.to(dev).requires_grad_(dt in (torch.float32, torch.float64))
                y = F.interpolate(x, size=size, mode=mode, **kw)
                if not x.requires_grad:
                    return y
                (gx,) = torch.autograd.grad(y, x, torch.ones_like(y) * 1.5)
                return y, gx
            rec(f"resample.{dt}.{mode}.{kw}.{size}", up)
    rec(f"resample.{dt}.scale", lambda: F.interpolate(img.to(dev), scale_factor=1.7,
                                                      mode="bilinear"))
    rec(f"resample.{dt}.linear1d", lambda: F.interpolate(img.view(2, 2, -1).to(dev),
                                                         scale_factor=0.6, mode="linear"))
    rec(f"resample.{dt}.trilinear", lambda: F.interpolate(img.view(1, 2, 2, 9, 11).to(dev),
                                                          size=(3, 4, 5), mode="trilinear"))
# the half types' rounding helpers (kernels/halfround.py) inside pool, grid_sample, index,
# reduce, sort and conv kernels
for dt in (torch.float16, torch.bfloat16, torch.float32):
    img = torch.cat([special(dt), (torch.randn(2 * 2 * 9 * 11 - len(special(dt)),
                     generator=g) * 3).to(dt)]).view(2, 2, 9, 11)
    grid = (torch.rand(2, 5, 6, 2, generator=g) * 2.4 - 1.2).to(dt)
    rec(f"half.{dt}.avgpool", lambda: F.avg_pool2d(img.to(dev), 2))
    rec(f"half.{dt}.adaptive_avg", lambda: F.adaptive_avg_pool2d(img.to(dev), (3, 4)))
    rec(f"half.{dt}.maxpool", lambda: F.max_pool2d(img.to(dev), 3, 2))
    for mode in ("bilinear", "nearest", "bicubic"):
        rec(f"half.{dt}.grid_{mode}", lambda: F.grid_sample(img.to(dev), grid.to(dev),
                                                             mode=mode, align_corners=False))
    flat = img.reshape(-1)
    idx = torch.tensor([0, 3, 3, 7, 1, 7, 7])
    src_ = flat[:7].clone()
    rec(f"half.{dt}.index_add", lambda: flat[:10].to(dev).index_add(0, idx.to(dev),
                                                                    src_.to(dev)))
    rec(f"half.{dt}.index_put_acc", lambda: flat[:10].to(dev).index_put(
        (idx.to(dev),), src_.to(dev), accumulate=True))
    rec(f"half.{dt}.scatter_add", lambda: flat[:10].to(dev).scatter_add(0, idx.to(dev),
                                                                       src_.to(dev)))
    rec(f"half.{dt}.cumsum", lambda: torch.cumsum(img.to(dev), -1))
    rec(f"half.{dt}.sum1", lambda: img.to(dev).sum(1))
    rec(f"half.{dt}.mean", lambda: img.to(dev).mean((2, 3)))
    rec(f"half.{dt}.histc", lambda: torch.histc(img.to(dev).float().nan_to_num(0, 9, -9).to(dt),
                                                bins=7, min=-3, max=3))
    w = (torch.randn(3, 2, 3, 3, generator=g) * 0.5).to(dt)
    rec(f"half.{dt}.conv", lambda: F.conv2d(img.to(dev).nan_to_num(0, 9, -9), w.to(dev)))
    rec(f"half.{dt}.conv_t", lambda: F.conv_transpose2d(img.to(dev).nan_to_num(0, 9, -9),
                                                        w.transpose(0, 1).to(dev)))
# casts between all dtypes
for src in FL + IN + [torch.bool]:
    v = special(src) if src != torch.bool else torch.tensor([True, False, True])
    for dst in FL + IN + [torch.bool]:
        rec(f"cast.{src}.{dst}", lambda: v.to(dev).to(dst))
# adaptive fused groups (helpers inside fused kernels), run 3 times (record, compile, replay)
for dt in (torch.float32, torch.float64, torch.int64, torch.int32):
    a, b = pairs(dt)
    for it in range(3):
        with eager_neuron.adaptive():
            if dt.is_floating_point:
                r = (torch.floor_divide(a, b) + torch.remainder(a, b) * 2).exp().tanh()
                r2 = F.gelu(a * 0.5) + torch.sigmoid(b) - torch.fmod(a, b)
            else:
                r = (a * 3 + b).to(torch.float32) / 7
                r2 = (a << 1) ^ (b >> 2)
            torch.neuron.synchronize()
        rec(f"adaptive.{dt}.{it}", lambda: (r, r2))
torch.save(OUT, sys.argv[1])
n_exc = sum(1 for v in OUT.values() if isinstance(v, tuple) and v and v[0] == "exc")
print("RECORDS", len(OUT), "EXCEPTIONS", n_exc)
'''


def _bits(t):
    import torch

    if t.is_floating_point():
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def _same(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(_bits(a.contiguous()), _bits(b.contiguous())))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def diff(old_tree: str, new_tree: str | None) -> int:
    import torch

    outs = []
    for tree in (old_tree, new_tree):
        with tempfile.TemporaryDirectory(prefix="coldcompile-diff-") as cache_dir:
            path = os.path.join(cache_dir, "out.pt")
            env = dict(os.environ, EAGER_NEURON_CACHE_DIR=cache_dir)
            env.pop("EAGER_NEURON_ADAPTIVE", None)
            # (both trees through the shim: the corpus's line numbers, quoted in errors, match)
            src = _TREE_SHIM.format(tree=os.path.abspath(tree or ROOT)) + DIFF
            proc = subprocess.run([sys.executable, "-c", src, path], env=env,
                                  capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"diff corpus failed on {tree or ROOT}:\n{proc.stderr[-4000:]}")
            print(f"{tree or ROOT}: {proc.stdout.strip()}")
            outs.append(torch.load(path, weights_only=False))
            if os.environ.get("COLDCOMPILE_KEEP"):   # for a closer look at a difference
                shutil.copy(path, os.environ["COLDCOMPILE_KEEP"] + f".{len(outs)}.pt")
    old, new = outs
    bad = sorted(k for k in old.keys() | new.keys()
                 if k not in old or k not in new or not _same(old[k], new[k]))
    for k in bad[:20]:
        print("DIFFERS:", k, str(old.get(k))[:200], "|", str(new.get(k))[:200])
    print(f"{len(old)} records, {len(bad)} differ (bitwise, exceptions by type and message)")
    return 1 if bad else 0


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
        src = _TREE_SHIM.format(tree=os.path.abspath(tree or ROOT)) + CORPUS
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
    ap.add_argument("--diff", default=None, metavar="OLD_TREE",
                    help="no timing: run the DIFF corpus on OLD_TREE and on --tree (default: "
                         "this one) and compare the outputs bit for bit")
    args = ap.parse_args()
    if args.diff:
        sys.exit(diff(args.diff, args.tree))
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}   tree: "
          f"{args.tree or ROOT}")
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
