"""Randomized differential test of adaptive eager: CPU vs plain neuron vs adaptive neuron.
(Over 500 lines on purpose: a standalone script whose generator and executor are two halves of
one step vocabulary, read side by side.)

A program is a list of steps over a few base tensors: random views (step slices, transposes,
as_strided, expands for reads), functional, in-place and out= ops, host copies, 0-d CPU operands
(changed after use), dtype mixes, reads and dropped temporaries, and the ops adaptive eager
joins as calls (mm/addmm/bmm on strided, transposed and broadcast operands with bias/epilogues,
select_scatter, slice_scatter, contiguous copies). Each program runs on the CPU, in plain eager
and in adaptive eager; every observation must agree: adaptive eager with plain eager bitwise,
always (sums included); plain eager with the CPU bitwise for values (the ops used are exactly
rounded on every ISA: + - * / neg abs relu floor max where casts; not sqrt: torch's CPU
float64 sqrt is not correctly rounded on every ISA) except in programs with a matmul (BLAS's
order may vary by ISA: within 1e-5 there), within float64 bounds for sums (their order
differs), and by exception type where the CPU raises.

    python tools/fuzz_adaptive.py --programs 2000 --seed 0     # the long run (make fuzz-adaptive)
    python tools/fuzz_adaptive.py --show 17                    # print program 17

>>> from tools.fuzz_adaptive import generate, check
>>> check(generate(3)) is None
True
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import torch

import eager_neuron
from eager_neuron.adaptive import MODULE as _ad

COMPILE = ["sync"]   # adaptive eager's compile mode in check() (--compile)
# (--mix) also write across dtypes: x.add_(y) and torch.add(y, z, out=x) with y, z of other
# dtypes than x (ATen computes in the operands' common dtype, then casts into x). Drawn from a
# second generator, so the programs of a seed without --mix stay what they were
MIX = [False]
# adaptive runs per program in check() (--repeat): a repeat takes the recording runners and
# replays the trace cache's kernels, which a first run only learns
REPEAT = [2]

# the bases: name -> (dtype, numel); "big" is pooled memory (>= 64 KiB), the rest host-allocated
BASES = {"f": (torch.float32, 48), "d": (torch.float64, 24), "i": (torch.int64, 24),
         "big": (torch.float32, 1 << 15)}
# --mix's extra bases (uint8/int8 over their whole range, float16, float64 values that float32
# cannot hold): only in programs that write across dtypes
MIX_BASES = {"u8": (torch.uint8, 24), "i8": (torch.int8, 24), "f16": (torch.float16, 24),
             "x64": (torch.float64, 24)}


def generate(seed: int, n_ops: int | None = None, mix: bool | None = None) -> list:
    """A random program (a list of step tuples), reproducible from its seed (and `mix`)."""
    rng = random.Random(seed)
    mix_rng = random.Random(seed * 7919 + 1) if (MIX[0] if mix is None else mix) else None
    n_ops = n_ops or rng.randint(5, 40)
    steps = []
    # tensors known to the generator: name -> (base, index tensor into the base, writable)
    env = {}
    bases = {**BASES, **MIX_BASES} if mix_rng is not None else BASES
    for b, (_dtype, n) in bases.items():
        env[b] = (b, torch.arange(n), True)
    counter = [0]
    # results whose storage offset is the implementation's choice (the CPU's select_scatter of
    # a view keeps the view's offset): as_strided's absolute offsets would read elsewhere
    offset_free = set()
    dt = {b: v[0] for b, v in bases.items()}   # base or derived tensor -> dtype

    def dtype(k):
        return dt[env[k][0]]

    def new_name(prefix):
        counter[0] += 1
        return f"{prefix}{counter[0]}"

    def pick(writable=None, base=None, shape=None):
        names = [k for k, (bb, idx, w) in env.items()
                 if (writable is None or w == writable) and (base is None or bb in base)
                 and (shape is None or tuple(idx.shape) == shape)]
        return rng.choice(names) if names else None

    def add_view(src):
        bb, idx, w = env[src]
        n = idx.numel()
        flat = idx.reshape(-1) if idx.is_contiguous() else None
        kind = rng.choice(["slice", "slice", "t", "as_strided", "expand", "view"])
        if kind == "slice" and idx.dim() == 1:
            step = rng.choice([1, 1, 2, 3])
            length = rng.choice([4, 8]) if bb != "big" else 8192
            if (length - 1) * step >= n:
                return None
            start = rng.randrange(0, n - (length - 1) * step)
            params = (start, start + (length - 1) * step + 1, step)
            new = idx[params[0]:params[1]:params[2]]
            writable = w
        elif kind == "t" and idx.dim() == 2:
            params = ()
            new = idx.t()
            writable = w
        elif kind == "view" and flat is not None and n in (8, 16, 24, 48):
            params = ((2, n // 2),)
            new = idx.view(*params[0])
            writable = w
        elif kind == "as_strided" and bb != "big" and bb not in offset_free:
            total = BASES[bb][1] if bb in BASES else n
            size = rng.choice([(4,), (8,), (2, 4)])
            stride = tuple(rng.choice([1, 2, 3]) for _ in size)
            if len(size) == 2 and rng.random() < 0.5:
                stride = (stride[0] * 4, stride[1])
            off = rng.randrange(0, 6)
            span = off + sum((s - 1) * st for s, st in zip(size, stride))
            if span >= total:
                return None
            base_idx = torch.arange(total)
            new = base_idx.as_strided(size, stride, off)
            params = (size, stride, off)
            # writable only when no two indices share an element
            writable = new.unique().numel() == new.numel()
            steps.append(("as_strided", (name := new_name("v")), bb, size, stride, off))
            env[name] = (bb, new, writable)
            return name
        elif kind == "expand" and idx.dim() == 1 and bb != "big":
            params = (rng.choice([4, 8]),)
            new = idx[:1].expand(params[0])
            steps.append(("expand", (name := new_name("v")), src, params[0]))
            env[name] = (bb, new, False)
            return name
        else:
            return None
        name = new_name("v")
        steps.append((kind, name, src, *params))
        env[name] = (bb, new, writable)
        return name

    def overlap(a, b):
        ba, ia, _ = env[a]
        bb_, ib, _ = env[b]
        if ba != bb_:
            return False
        return bool(set(ia.reshape(-1).tolist()) & set(ib.reshape(-1).tolist()))

    def same_view(a, b):
        return env[a][0] == env[b][0] and torch.equal(env[a][1], env[b][1])

    def mix_write():
        # a write into a base-layout tensor from tensors of any dtype (no overlap: other bases)
        ws = sorted(k for k, (bb, _i, w) in env.items() if w)
        if not ws:
            return
        w = mix_rng.choice(ws)
        shape = tuple(env[w][1].shape)
        srcs = sorted(k for k in env if tuple(env[k][1].shape) == shape
                      and env[k][0] != env[w][0] and dtype(k) != dtype(w))
        if not srcs:
            return
        a, b = mix_rng.choice(srcs), mix_rng.choice(srcs + [w])
        if b == w or env[b][0] == env[w][0]:
            b = a
        if mix_rng.random() < 0.5:
            steps.append(("inplace", w, mix_rng.choice(["add_", "sub_", "mul_"]), a, 1.0))
        else:
            steps.append(("out", w, mix_rng.choice(["add", "mul", "sub"]), a, b))

    scalars = []
    for _ in range(n_ops):
        if mix_rng is not None and mix_rng.random() < 0.2:
            mix_write()
        r = rng.random()
        if r < 0.25:
            src = pick(base=None)
            if src is not None:
                add_view(src)
            continue
        kind = rng.choice(["binary", "binary", "unary", "inplace", "inplace", "inplace", "out",
                           "host_copy", "to_device", "cpu_scalar", "cpu_scalar_change",
                           "read", "sum", "drop", "mix", "int_div", "int_inplace_float",
                           "expand_write", "clone", "mm", "mm", "scatter", "contiguous",
                           "sum_dim", "sum_dim"])
        a = pick()
        if a is None:
            continue
        shape = tuple(env[a][1].shape)
        ab = env[a][0]
        same_dtype = [k for k in dt if dt[k] == dt[ab]]
        fam = same_dtype if kind != "mix" else list(dt)
        b = pick(base=fam, shape=shape) or a
        if kind == "binary":
            op = rng.choice(["add", "sub", "mul", "div", "maximum", "where"])
            if op == "div" and dt[ab] == torch.int64:
                op = "mul"
            name = new_name("t")
            steps.append(("binary", name, op, a, b))
            env[name] = (name, torch.arange(env[a][1].numel()).view(shape), True)
            dt[name] = dt[ab]
        elif kind == "unary":
            op = rng.choice(["neg", "abs", "relu", "floor", "scalar_mul",
                             "scalar_add"])
            if dt[ab] == torch.int64 and op in ("floor", "sqrt_abs"):
                op = "neg"
            name = new_name("t")
            step_c = rng.choice([0.5, 2.0, -3.0, 1.25])
            steps.append(("unary", name, op, a, step_c))
            env[name] = (name, torch.arange(env[a][1].numel()).view(shape), True)
            scalar_int = op.startswith("scalar") and dt[ab] == torch.int64
            dt[name] = torch.float32 if scalar_int else dt[ab]
        elif kind in ("inplace", "out", "host_copy", "clone"):
            w = pick(writable=True, shape=shape) if kind != "clone" else a
            if w is None:
                continue
            if kind == "clone":
                name = new_name("t")
                steps.append(("clone", name, a))
                env[name] = (name, torch.arange(env[a][1].numel()).view(shape), True)
                dt[name] = dt[ab]
                continue
            wb = env[w][0]
            cands = [k for k in env if tuple(env[k][1].shape) == shape
                     and (not overlap(k, w) or same_view(k, w))
                     and dtype(k) == dt[wb]]
            if not cands:
                continue
            src = rng.choice(cands)
            if kind == "inplace":
                op = rng.choice(["add_", "sub_", "mul_", "copy_", "fill_", "zero_", "clamp_",
                                 "relu_", "neg_", "mul_s"])
                steps.append(("inplace", w, op, src, rng.choice([0.5, 2.0, -1.0, 3.0])))
            elif kind == "out":
                others = [k for k in cands if not overlap(k, w) or same_view(k, w)]
                steps.append(("out", w, rng.choice(["add", "mul", "sub"]), src,
                              rng.choice(others)))
            else:
                steps.append(("host_copy", w, rng.randrange(1 << 30)))
        elif kind == "to_device":
            name = new_name("t")
            bb = rng.choice(["f", "big"])
            n = 8 if bb == "f" else 8192
            steps.append(("to_device", name, bb, n, rng.randrange(1 << 30)))
            env[name] = (name, torch.arange(n), True)
            dt[name] = BASES[bb][0]
        elif kind == "cpu_scalar":
            s = f"s{len(scalars)}"
            scalars.append(s)
            name = new_name("t")
            steps.append(("cpu_scalar", name, s, a, rng.choice([2.0, -0.5, 3.0])))
            env[name] = (name, torch.arange(env[a][1].numel()).view(shape), True)
            dt[name] = torch.promote_types(dt[ab], torch.float32)
        elif kind == "cpu_scalar_change" and scalars:
            steps.append(("cpu_scalar_change", rng.choice(scalars), rng.choice([100.0, -7.0])))
        elif kind == "read":
            steps.append(("read", a))
        elif kind == "sum":
            steps.append(("sum", a))
        elif kind == "sum_dim" and env[a][1].dim() >= 1:
            # a sum/mean over dims (adaptive eager joins float ones as calls of plain eager's
            # reduction kernel), then an epilogue recorded after the call
            nd = env[a][1].dim()
            dims = sorted(rng.sample(range(nd), rng.randint(1, nd)))
            if rng.random() < 0.3:
                dims = [d - nd for d in dims]    # negative dims
            op = rng.choice(["sum", "mean"]) if dt[ab].is_floating_point else "sum"
            steps.append(("sum_dim", a, op, dims, rng.random() < 0.5))
        elif kind == "drop":
            if a not in BASES:
                steps.append(("drop", a))
                del env[a]
        elif kind == "mix":
            name = new_name("t")
            steps.append(("binary", name, rng.choice(["add", "mul", "sub"]), a, b))
            env[name] = (name, torch.arange(env[a][1].numel()).view(shape), True)
            dt[name] = torch.promote_types(dt[ab], dtype(b))
        elif kind == "int_div":
            ints = pick(base=["i"])
            if ints is not None:
                shp = tuple(env[ints][1].shape)
                other = pick(base=["i"], shape=shp) or ints
                name = new_name("t")
                steps.append(("int_div", name, ints, other))
                env[name] = (name, torch.arange(env[ints][1].numel()).view(shp), True)
                dt[name] = torch.int64
        elif kind == "int_inplace_float":
            ints = pick(base=["i"], writable=True)
            if ints is not None:
                steps.append(("inplace", ints, "mul_s", ints, 1.5))
        elif kind == "expand_write":
            src = pick(base=["f", "d"])
            if src is not None and env[src][1].dim() == 1:
                steps.append(("expand_write", src))
        elif kind == "mm" and dt[ab] in (torch.float32, torch.float64):
            # x (rows, c) from any float tensor (reshape: a view or a copy) times a weight that
            # is a view of a base (later writes to the base alias it), maybe transposed, maybe
            # with a bias (addmm, broadcast), maybe batched (bmm over an expanded weight)
            n = env[a][1].numel()
            rows = rng.choice([r for r in (1, 2, 4) if n % r == 0])
            c = n // rows
            wb = "f" if dt[ab] == torch.float32 else "d"
            k = rng.choice([1, 3, 4])
            total = BASES[wb][1]
            if c * k + k > total or c > 64:
                continue
            off = rng.randrange(0, total - c * k - k + 1)
            mode = rng.choice(["mm", "mm_t", "addmm", "addmm_t", "bmm"])
            if mode == "bmm" and rows % 2:
                mode = "mm"
            name = new_name("t")
            steps.append(("mm", name, a, rows, wb, off, k, mode))
            shp = (2, rows // 2, k) if mode == "bmm" else (rows, k)
            env[name] = (name, torch.arange(rows * k).view(shp), True)
            dt[name] = dt[ab]
        elif kind == "scatter" and env[a][1].dim() >= 1 and shape[0] >= 2:
            op = rng.choice(["select", "slice"])
            name = new_name("t")
            steps.append(("scatter", name, op, a, rng.randrange(shape[0])))
            offset_free.add(name)
            env[name] = (name, torch.arange(env[a][1].numel()).view(shape), True)
            dt[name] = dt[ab]
        elif kind == "contiguous":
            name = new_name("t")
            steps.append(("contiguous", name, a))
            t_shape = shape[::-1] if len(shape) == 2 else shape
            env[name] = (name, torch.arange(env[a][1].numel()).view(t_shape), True)
            dt[name] = dt[ab]
    return steps


def _init_bases(dev, mix=False):
    g = torch.Generator().manual_seed(1234)
    env = {}
    for b, (dtype, n) in BASES.items():
        if dtype.is_floating_point:
            v = torch.randn(n, generator=g, dtype=torch.float64).mul(4).round().div(4)
            v = v.to(dtype)
        else:
            v = torch.randint(-5, 6, (n,), generator=g)
        env[b] = v.to(dev)
    if mix:
        for b, (dtype, n) in MIX_BASES.items():
            if dtype.is_floating_point:
                v = torch.randn(n, generator=g, dtype=torch.float64) * (1 + 2.0 ** -30)
            else:
                info = torch.iinfo(dtype)
                v = torch.randint(info.min, info.max + 1, (n,), generator=g)
            env[b] = v.to(dtype).to(dev)
    return env


def _host(seed: int, shape, dtype):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).mul(8).round().div(8).to(dtype)


def execute(steps: list, dev: str) -> list:
    """Run a program; returns its observations: ("v", cpu tensor) | ("s", float) | ("e", name)."""
    env = _init_bases(dev, mix=any(isinstance(x, str) and x in MIX_BASES
                                   for step in steps for x in step))
    scalars = {}
    obs = []
    names = []   # final observations' tensor names (for reports)
    execute.names = names

    def cpu(t):
        return t.detach().to("cpu") if t.device.type != "cpu" else t.detach().clone()

    for step in steps:
        kind = step[0]
        try:
            if kind == "slice":
                _, name, src, a, b, s = step
                env[name] = env[src][a:b:s]
            elif kind == "t":
                env[step[1]] = env[step[2]].t()
            elif kind == "view":
                env[step[1]] = env[step[2]].view(*step[3])
            elif kind == "as_strided":
                _, name, base, size, stride, off = step
                env[name] = env[base].as_strided(size, stride, off)
            elif kind == "expand":
                env[step[1]] = env[step[2]][:1].expand(step[3])
            elif kind == "binary":
                _, name, op, a, b = step
                x, y = env[a], env[b]
                if op == "where":
                    env[name] = torch.where(x > y, x, y)
                elif op == "maximum":
                    env[name] = torch.maximum(x, y)
                else:
                    env[name] = getattr(torch, op)(x, y)
            elif kind == "unary":
                _, name, op, a, c = step
                env[name] = _UNARY[op](env[a], c)
            elif kind == "clone":
                env[step[1]] = env[step[2]].clone()
            elif kind == "inplace":
                _, w, op, src, c = step
                t, s = env[w], env[src]
                if op in ("add_", "sub_", "mul_", "copy_"):
                    getattr(t, op)(s)
                elif op == "fill_":
                    t.fill_(c)
                elif op == "zero_":
                    t.zero_()
                elif op == "clamp_":
                    t.clamp_(-1.0, 1.0) if t.is_floating_point() else t.clamp_(-1, 1)
                elif op == "relu_":
                    t.relu_()
                elif op == "neg_":
                    t.neg_()
                else:
                    t.mul_(c)
            elif kind == "out":
                _, w, op, a, b = step
                getattr(torch, op)(env[a], env[b], out=env[w])
            elif kind == "host_copy":
                _, w, seed = step
                t = env[w]
                t.copy_(_host(seed, t.shape, t.dtype))
            elif kind == "to_device":
                _, name, bb, n, seed = step
                env[name] = _host(seed, (n,), BASES[bb][0]).to(dev)
            elif kind == "cpu_scalar":
                _, name, s, a, v = step
                if s not in scalars:
                    scalars[s] = torch.tensor(v)
                env[name] = env[a] * scalars[s]
            elif kind == "cpu_scalar_change":
                scalars[step[1]].fill_(step[2])
            elif kind == "read":
                obs.append(("v", cpu(env[step[1]])))
            elif kind == "sum":
                obs.append(("s", env[step[1]].double().sum().item()))
            elif kind == "sum_dim":
                _, a, op, dims, keep = step
                x = env[a]
                y = getattr(torch, op)(x, dims, keepdim=keep) * 2.0 - 0.5
                # the CPU sums in another order: its bound (|x| summed, the reduced length)
                bound = cpu(x).abs().double().sum(dims, keepdim=keep)
                obs.append(("r", cpu(y), bound, x.numel() // max(1, bound.numel())))
            elif kind == "drop":
                env.pop(step[1], None)
            elif kind == "int_div":
                _, name, a, b = step
                env[name] = env[a] // env[b]
            elif kind == "expand_write":
                env[step[1]][:1].expand(4).add_(1)
            elif kind == "mm":
                _, name, a, rows, wb, off, k, mode = step
                x = env[a].reshape(rows, -1)
                c = x.shape[1]
                w = env[wb][off:off + c * k]
                w = w.view(k, c).t() if mode.endswith("_t") else w.view(c, k)
                if mode.startswith("addmm"):
                    bias = env[wb][off + c * k:off + c * k + k]
                    env[name] = torch.addmm(bias, x, w, beta=0.5 if off % 2 else 1)
                elif mode == "bmm":
                    env[name] = torch.bmm(x.reshape(2, rows // 2, c), w.expand(2, c, k))
                else:
                    env[name] = x @ w
            elif kind == "scatter":
                _, name, op, a, i = step
                x = env[a]
                if op == "select":
                    env[name] = torch.select_scatter(x, x[0] * 1 if i % 2 else x[-1], 0, i)
                else:
                    half = x.shape[0] // 2
                    env[name] = torch.slice_scatter(x, x[:half], 0, x.shape[0] - half)
            elif kind == "contiguous":
                x = env[step[2]]
                env[step[1]] = (x.t() if x.dim() == 2 else x).contiguous()
        except Exception as exc:  # noqa: BLE001 -- compared across modes
            obs.append(("e", _kind(exc)))
    for name in sorted(env):
        obs.append(("v", cpu(env[name])))
        names.append(name)
    return obs


_UNARY = {"neg": lambda x, c: -x, "abs": lambda x, c: x.abs(), "relu": lambda x, c: x.relu(),
          "floor": lambda x, c: x.floor(), "scalar_mul": lambda x, c: x * c,
          "scalar_add": lambda x, c: x + c}


def _kind(exc: Exception) -> str:
    text = str(exc)
    for marker in ("single memory location", "can't be cast", "ZeroDivisionError"):
        if marker in text:
            return f"{type(exc).__name__}: {marker}"
    return type(exc).__name__


def _same(a, b, tol: float = 0.0, sum_tol: float = 1e-9) -> str | None:
    """None when observations a and b agree: values bitwise (within `tol` when it is set),
    sums within `sum_tol` relative (0: bitwise)."""
    if len(a) != len(b):
        return f"{len(a)} observations vs {len(b)}"
    for i, (oa, ob) in enumerate(zip(a, b)):
        (ka, va), (kb, vb) = oa[:2], ob[:2]
        if ka == "r" and kb == "r":
            # a reduction over dims: bitwise when sum_tol is 0 (adaptive vs plain), else
            # within the bound of two summation orders of n values (then * 2 - 0.5)
            if va.dtype != vb.dtype or va.shape != vb.shape:
                return f"observation {i}: {va.dtype}{list(va.shape)} vs {vb.dtype}{list(vb.shape)}"
            if sum_tol == 0.0 and not tol:
                if torch.equal(va.nan_to_num(), vb.nan_to_num()) and \
                        torch.equal(va.isnan(), vb.isnan()):
                    continue
                return (f"observation {i}: reduction differs: {va.reshape(-1)[:6].tolist()} "
                        f"vs {vb.reshape(-1)[:6].tolist()}")
            eps = torch.finfo(va.dtype).eps if va.is_floating_point() else 0.0
            bound, n = oa[2], oa[3]
            lim = 2 * (n + 1) * eps * (2 * bound + va.double().abs() + 1) + max(tol, 0.0)
            err = (va.double() - vb.double()).abs()
            if not bool(((err <= lim) | (va == vb) | (va.isnan() & vb.isnan())).all()):
                return (f"observation {i}: reduction {va.reshape(-1)[:6].tolist()} vs "
                        f"{vb.reshape(-1)[:6].tolist()}")
            continue
        if ka != kb:
            return f"observation {i}: {ka} {va if ka == 'e' else ''} vs {kb} " \
                   f"{vb if kb == 'e' else ''}"
        if ka == "e" and va != vb:
            return f"observation {i}: error {va} vs {vb}"
        if ka == "s" and not (va == vb or abs(va - vb) <= sum_tol * max(1.0, abs(va))
                              or (va != va and vb != vb)):
            return f"observation {i}: sum {va} vs {vb}"
        if ka == "v":
            if va.dtype != vb.dtype or va.shape != vb.shape:
                return f"observation {i}: {va.dtype}{list(va.shape)} vs {vb.dtype}{list(vb.shape)}"
            if tol and va.is_floating_point() and torch.allclose(va, vb, tol, tol,
                                                                 equal_nan=True):
                continue
            if not torch.equal(va, vb) and not (va.is_floating_point() and torch.equal(
                    va.isnan(), vb.isnan()) and torch.equal(va.nan_to_num(), vb.nan_to_num())):
                diff = (va != vb).nonzero()[:3].tolist()
                return (f"observation {i}: values differ at {diff}: "
                        f"{va.reshape(-1)[:6].tolist()} vs {vb.reshape(-1)[:6].tolist()}")
    return None


def check(steps: list) -> str | None:
    """None when CPU, plain eager and adaptive eager agree on the program; else what differs."""
    want = execute(steps, "cpu")
    plain = execute(steps, "neuron")
    # "sync": every group runs its fused kernel (in the default background mode a trace seen
    # once runs op by op, which is plain eager's kernels: nothing fused would be tested)
    prev = _ad.set_compile_mode(COMPILE[0])
    runs = []
    try:
        for _ in range(REPEAT[0]):
            with eager_neuron.adaptive():
                runs.append(execute(steps, "neuron"))
    finally:
        _ad.set_compile_mode(prev)
    # adaptive eager must give plain eager's bits; plain eager the CPU's (BLAS within 1e-5)
    # (sums too: the tolerance for sums is the CPU's, whose order differs; adaptive eager's
    # float64 sum epilogues differed from plain eager in the last bits unseen under it)
    for r, got in enumerate(runs):
        bad = _same(plain, got, sum_tol=0.0)
        if bad:
            return f"adaptive (run {r + 1}) vs plain: " + bad
    bad = _same(want, plain, 1e-5 if any(s[0] == "mm" for s in steps) else 0.0)
    if bad:
        return "plain vs cpu: " + bad
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--programs", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=None, help="print one program and check it")
    ap.add_argument("--compile", choices=("sync", "background"), default="sync",
                    help="adaptive eager's compile mode (sync: every group runs fused)")
    ap.add_argument("--repeat", type=int, default=2,
                    help="adaptive runs per program (the repeats replay runners and traces)")
    ap.add_argument("--mix", action="store_true",
                    help="also in-place and out= writes across dtypes")
    args = ap.parse_args(argv)
    COMPILE[0] = args.compile
    MIX[0] = args.mix
    REPEAT[0] = max(1, args.repeat)
    if args.show is not None:
        steps = generate(args.show)
        for s in steps:
            print(s)
        print(check(steps) or "agree")
        return 0
    t0 = time.time()
    failures = []
    for k in range(args.seed, args.seed + args.programs):
        bad = check(generate(k))
        if bad:
            failures.append(k)
            print(f"program {k}: {bad}", flush=True)
    from eager_neuron import adaptive_calls, adaptive_fast

    print(f"{args.programs} programs, {len(failures)} disagree, {time.time() - t0:.1f} s; "
          f"failing seeds: {failures[:50]}; calls joined {adaptive_calls.COUNTERS['joined']}, "
          f"declined {adaptive_calls.COUNTERS['declined']}, recorded by runners "
          f"{adaptive_fast.COUNTERS['call_hits']}; trace hits "
          f"{eager_neuron.stats()['trace_hits']}; fused launches "
          f"{eager_neuron.stats()['fused_launches']}; groups of one "
          f"{eager_neuron.stats().get('adaptive_singletons')}, ops run alone "
          f"{eager_neuron.stats().get('adaptive_alone')} (needs --repeat 3 or more)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
