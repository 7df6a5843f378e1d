"""Differential fuzzer for the fast path (eager_neuron/fastpath.py): random programs, run so that
the second run replays the runners the first left, compared op by op.
(One file over 500 lines on purpose: a standalone script whose ~30 step kinds, `st_*`, are each
a few lines read against the same Run and compare helpers.)

Each seeded program (a list of steps: new tensors, elementwise ops with numbers, 0-d and
one-element tensors, broadcasting, in-place ops on views of one buffer with exact and partial
aliasing, out=, views, in-place metadata ops, t.data =, reductions, softmax/layer norm, mm with
aliased operands, cat of views of one buffer, dtype promotion under another default dtype,
autograd (grads compared), no_grad/inference_mode, two threads, MEMORY.clear(), NaN/inf/-0.0
numbers, integer division by zero and out-of-range indices) runs:

    A   neuron, fast path on, data seed 1, variant 0        learns runners
    B1  neuron, fast path on, data seed 2, variant v        replays (perturbed signatures and
    B2  neuron, fast path on, data seed 3, variant v         aliasing in variant v)
    C   neuron, fast path off, data seed 3, variant v       the slow path
    and each run's twin on the CPU (same dtypes, same data)

Checks: B2 == C bit for bit (values, dtypes, shapes, strides, errors' type and message) and the
same counters (ops, launches, memory_hits, views, compiles) and simulated device time; every
neuron run equals its CPU twin within dtype-derived bounds (exact for integers and bools) and
raises where the CPU raises.

    python tools/fuzz_fastpath.py --programs 300 --seed 0
    python tools/fuzz_fastpath.py --program 17 -v        # one program, every step printed

Exit status 1 if any program fails; each failure prints its seed and first differing step.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import random
import sys
import threading
import time

import torch

import eager_neuron
from eager_neuron import adaptive_compile, fastpath
from eager_neuron.config import config
from eager_neuron.launch import MEMORY
from eager_neuron.simulator import SIM
from eager_neuron.stats import STATS

FLOATS = [torch.float32, torch.float32, torch.float32, torch.float64, torch.bfloat16,
          torch.float16]
INTS = [torch.int64, torch.int32, torch.int8, torch.uint8]
SHAPES = [(), (1,), (0,), (5,), (3, 4), (4, 3), (2, 3, 4), (1, 4), (3, 1), (6,)]
SPECIAL = [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-3, 2.5, -1.5, 3, -2, 0,
           True, False]

# per dtype: (rtol, atol) of a neuron result against the CPU computing the same program
TOL = {torch.float64: (1e-9, 1e-9), torch.float32: (2e-4, 2e-4), torch.bfloat16: (3e-2, 3e-2),
       torch.float16: (4e-3, 4e-3), torch.complex64: (2e-4, 2e-4),
       torch.complex128: (1e-9, 1e-9)}


class Fail(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# programs
# ---------------------------------------------------------------------------------------------

def make_program(seed: int, n_steps: int, kinds_in_order: list | None = None) -> list:
    """A program: a list of (kind, params) the executor interprets; everything random about a
    program (not its data) is fixed here. kinds_in_order: these step kinds, in this order,
    instead of n_steps random ones."""
    r = random.Random(seed)
    kinds = (["new"] * 3 + ["unary"] * 4 + ["binary"] * 6 + ["inplace"] * 5 + ["out"] * 2
             + ["view"] * 3 + ["reduce"] * 3 + ["norm"] * 2 + ["mm"] * 2 + ["cat"] * 2
             + ["meta"] * 2 + ["data"] + ["memclear"] + ["default"] + ["grad"] * 2
             + ["nograd"] + ["thread"] + ["divzero"] + ["index"] + ["complex"]
             + ["valued"] * 2 + ["cast"] * 2 + ["inplace_any"] * 3 + ["resize"]
             + ["profiled"] * 2 + ["foreach"] * 2 + ["cnn"] + ["embed"] + ["rnn"])
    steps = [("new", {"shape": (3, 4), "dtype": torch.float32}),
             ("new", {"shape": (3, 4), "dtype": torch.float32}),
             ("new", {"shape": (4, 3), "dtype": r.choice(FLOATS)}),
             ("new", {"shape": (6,), "dtype": r.choice(INTS)})]
    for n in range(n_steps if kinds_in_order is None else len(kinds_in_order)):
        k = r.choice(kinds) if kinds_in_order is None else kinds_in_order[n]
        p = {"r": r.random(), "i": r.randrange(1000), "j": r.randrange(1000),
             "k": r.randrange(1000), "perturb": r.random() < 0.35,
             "alt": r.randrange(6)}
        if k == "new":
            kind = r.random()
            p["shape"] = r.choice(SHAPES)
            p["dtype"] = (r.choice(FLOATS) if kind < 0.6 else r.choice(INTS) if kind < 0.85
                          else torch.bool)
        elif k in ("binary", "inplace", "out", "profiled"):
            p["scalar"] = r.choice(SPECIAL) if r.random() < 0.3 else r.choice([2, -1.5, 0.5])
        steps.append((k, p))
    return steps


class Run:
    """One execution of a program on one device."""

    def __init__(self, dev: str, data_seed: int, variant: int, verbose=False):
        self.dev = dev
        self.g = torch.Generator().manual_seed(data_seed)
        self.variant = variant
        self.env: list = []
        self.log: list = []
        self.verbose = verbose

    # data ------------------------------------------------------------------------------------
    def data(self, shape, dtype, low=-4, high=5, requires_grad=False):
        if dtype == torch.bool:
            t = torch.randint(0, 2, shape, generator=self.g).bool()
        elif dtype.is_floating_point:
            t = torch.randn(shape, generator=self.g, dtype=torch.float64).to(dtype)
        elif dtype.is_complex:
            t = torch.randn(shape, generator=self.g, dtype=dtype)
        else:
            lo = 0 if dtype == torch.uint8 else low
            t = torch.randint(lo, high, shape, generator=self.g).to(dtype)
        t = t.to(self.dev)
        if requires_grad:
            t.requires_grad_()
        return t

    def pick(self, n: int, pred=None):
        """The n-th env entry satisfying pred (deterministic across runs: shapes and dtypes
        depend on the program only)."""
        cands = [t for t in self.env if pred is None or pred(t)]
        return cands[n % len(cands)] if cands else None

    def record(self, what: str, fn):
        """Run fn() (returning a tensor, a tuple of them or None) and log its outcome."""
        try:
            out = fn()
        except Exception as exc:   # noqa: BLE001 -- the error is compared across runs
            self.log.append((what, "error", type(exc).__name__, _first_line(exc)))
            if self.verbose:
                print(f"  {self.dev:6} {what}: {type(exc).__name__}: {_first_line(exc)[:90]}")
            return None
        outs = out if isinstance(out, (tuple, list)) else (out,)
        vals = []
        for o in outs:
            if isinstance(o, torch.Tensor):
                vals.append((o.detach().cpu().clone(), tuple(o.shape), o.stride(), o.dtype))
            else:
                vals.append(o)
        self.log.append((what, "ok", vals))
        if self.verbose:
            print(f"  {self.dev:6} {what}: ok")
        return out


def _first_line(exc) -> str:
    s = str(exc)
    # neuron errors name the user's line; keep the message's own first line
    return s.splitlines()[0] if s else ""


def _float_like(t):
    return t.dtype.is_floating_point


def _same_shape(shape):
    return lambda t: tuple(t.shape) == tuple(shape)


def execute(program: list, run: Run) -> None:
    dev = run.dev
    for n, (kind, p) in enumerate(program):
        what = f"{n}:{kind}"
        if kind == "new":
            run.env.append(run.data(p["shape"], p["dtype"]))
            continue
        fn = STEPS[kind]
        fn(run, p, what, dev)


def _scalar_for(t, s):
    """A Python number an op with t may take (bool only with bool/int tensors as ATen allows)."""
    if isinstance(s, bool) and t.dtype.is_floating_point:
        return float(s)
    if not t.dtype.is_floating_point and isinstance(s, float):
        if math.isnan(s) or math.isinf(s):
            return 2
    return s


def st_unary(run, p, what, dev):
    x = run.pick(p["i"])
    ops = [("neg", lambda t: -t if t.dtype != torch.bool else ~t),
           ("abs", lambda t: t.abs() if t.dtype != torch.bool else t.clone()),   # known: bool abs
           ("relu", lambda t: torch.relu(t) if t.dtype != torch.bool else t.clone()),
           ("tanh", lambda t: torch.tanh(t)),
           ("sigmoid", lambda t: torch.sigmoid(t)),
           ("clone", lambda t: t.clone()),
           ("sqrt", lambda t: _iabs(t).sqrt()),
           ("float", lambda t: t.float()),
           ("long", lambda t: t.long() if t.is_floating_point() and not t.isnan().any()
            else t.to(torch.int64) if t.dtype != torch.bool else t.long()),
           ("contig_t", lambda t: t.t().contiguous() if t.dim() == 2 else t.contiguous()),
           ("not", lambda t: torch.logical_not(t))]
    name, op = ops[p["j"] % len(ops)]
    if name == "long" and x.is_floating_point():
        op = lambda t: torch.nan_to_num(t).clamp(-100, 100).long()   # noqa: E731
    src = x
    if p["perturb"] and run.variant and x.dim() == 2:
        src = x.t()   # the same op on a transposed operand: another signature
    out = run.record(f"{what}:{name}", lambda: op(src))
    if out is not None and p["r"] < 0.5:
        run.env.append(out)


def st_binary(run, p, what, dev):
    x = run.pick(p["i"])
    opsf = [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul),
            ("maximum", torch.maximum), ("lt", torch.lt), ("eq", torch.eq),
            ("div", torch.div), ("where", None), ("alpha", None)]
    name, op = opsf[p["j"] % len(opsf)]
    mode = p["k"] % 6
    if run.variant and p["perturb"]:
        mode = p["alt"]
    # the second operand: a number, a 0-d / one-element tensor, a same-shaped tensor, a
    # broadcast one, a transposed view, an expanded one
    if mode == 0:
        y = _scalar_for(x, p["scalar"])
    elif mode == 1:
        y = run.data((), x.dtype if x.dtype != torch.bool else torch.int64)
    elif mode == 2:
        y = run.data((1,), x.dtype)
    elif mode == 3:
        y = run.pick(p["k"], _same_shape(x.shape)) if x.dim() else x
    elif mode == 4:
        y = run.data(tuple(x.shape[-1:]), torch.float32)   # broadcast along leading dims
    else:
        y = run.data(tuple(reversed(x.shape)), x.dtype).t() if x.dim() == 2 \
            else run.data(x.shape, x.dtype)
    if name in ("maximum",) and not isinstance(y, torch.Tensor):
        y = torch.tensor(y, device=dev) if not (isinstance(y, float) and math.isnan(y)) \
            else run.data((), torch.float32)
    if name == "sub" and (x.dtype == torch.bool or getattr(y, "dtype", None) == torch.bool
                          or isinstance(y, bool)):
        name, op = "add", torch.add
    if name == "where":
        def fn():
            return torch.where(x > 0 if x.dtype != torch.bool else x, x, y)
    elif name == "alpha":
        a = 2 if not x.is_floating_point() else -0.5
        def fn():
            return torch.add(x, y, alpha=a)
    elif name == "div":
        def fn():
            return torch.div(x, y) if x.is_floating_point() else torch.div(x, 2)
    else:
        def fn():
            return op(x, y)
    out = run.record(f"{what}:{name}:m{mode}", fn)
    if out is not None and p["r"] < 0.6:
        run.env.append(out)


def _inplace_target(run, p):
    """A written tensor: an env tensor, or a view of one (slice, transpose, select)."""
    x = run.pick(p["i"], lambda t: t.numel() > 1 and t.is_floating_point()
                 and t.dtype != torch.float16)
    if x is None:
        x = run.data((3, 4), torch.float32)
        run.env.append(x)
    v = p["k"] % 4
    if v == 1 and x.dim() >= 1 and x.shape[0] > 1:
        return x, x[1:]
    if v == 2 and x.dim() == 2:
        return x, x.t()
    if v == 3 and x.dim() >= 1:
        return x, x[0]
    return x, x


def st_inplace(run, p, what, dev):
    base, w = _inplace_target(run, p)
    mode = p["j"] % 7
    if run.variant and p["perturb"]:
        mode = 3 + p["alt"] % 4   # aliasing forms
    s = _scalar_for(w, p["scalar"])
    if mode == 0:
        fn, nm = (lambda: w.add_(s)), "add_s"
    elif mode == 1:
        y = run.data(tuple(w.shape), w.dtype)
        fn, nm = (lambda: w.mul_(y)), "mul_t"
    elif mode == 2:
        y = run.data(tuple(w.shape[-1:]) if w.dim() else (), torch.float32)
        fn, nm = (lambda: w.sub_(y)), "sub_bcast"
    elif mode == 3:
        fn, nm = (lambda: w.add_(w)), "exact_alias"
    elif mode == 4:
        if w.dim() >= 1 and w.shape[0] > 1:
            # on a copy no later step reads: for strided views ATen cannot tell the overlap
            # and the CPU's answer follows its loop order (fast vs slow only)
            def fn():
                wc = base.clone().as_strided(w.shape, w.stride(),
                                             w.storage_offset() - base.storage_offset())
                return wc[1:].mul_(wc[:-1])
            nm = "ub_partial_overlap"
        else:
            fn, nm = (lambda: w.mul_(w)), "self"
    elif mode == 5:
        fn, nm = (lambda: w.copy_(w.flip(0) if w.dim() else w)), "copy_flip"
    else:
        if w.dim() == 2 and w.shape[0] == w.shape[1]:
            # x.copy_(x.t()) is undefined on the CPU (it reads what it wrote): neuron fast vs
            # slow only, on a copy that no later step reads
            w2 = w.clone()
            fn, nm = (lambda: w2.copy_(w2.t())), "ub_copy_t"
        else:
            fn, nm = (lambda: w.clamp_(-0.5, 0.5)), "clamp_"
    run.record(f"{what}:{nm}", fn)
    run.record(f"{what}:base", lambda: base)


def st_out(run, p, what, dev):
    x = run.pick(p["i"], _float_like)
    if x is None:
        return
    shape = tuple(x.shape)
    form = p["k"] % 3
    if run.variant and p["perturb"]:
        form = p["alt"] % 3
    if form == 0:
        o = torch.empty(shape, dtype=x.dtype, device=dev)
    elif form == 1:   # a transposed out
        o = torch.empty(tuple(reversed(shape)), dtype=x.dtype, device=dev).t() \
            if x.dim() == 2 else torch.empty(shape, dtype=x.dtype, device=dev)
    else:             # out aliasing the input
        o = x.clone()
        x = o
    s = _scalar_for(x, p["scalar"])
    run.record(f"{what}:add_out{form}", lambda: torch.add(x, s, out=o))
    run.record(f"{what}:mul_out{form}", lambda: torch.mul(x, x, out=o))


def st_view(run, p, what, dev):
    x = run.pick(p["i"])
    ops = [("view", lambda t: t.view(-1)),
           ("t", lambda t: t.t() if t.dim() <= 2 else t.transpose(0, 2)),
           ("unsq", lambda t: t.unsqueeze(0)),
           ("narrow", lambda t: t.narrow(0, 0, max(0, t.shape[0] - 1)) if t.dim() else t),
           ("expand", lambda t: t.expand(2, *t.shape)),
           ("select", lambda t: t[-1] if t.dim() and t.shape[0] else t),
           ("diag", lambda t: t.diagonal() if t.dim() == 2 else t.view(t.shape)),
           ("as_strided", lambda t: t.as_strided((2, 2), (1, 1)) if t.numel() >= 3 and
            t.is_contiguous() else t.view(t.shape)),
           ("split", lambda t: t.split(1)[0] if t.dim() and t.shape[0] else t)]
    name, op = ops[p["j"] % len(ops)]
    v = run.record(f"{what}:{name}", lambda: op(x))
    if v is None:
        return
    if p["r"] < 0.5 and v.numel() and v.is_floating_point() and name not in ("expand",
                                                                            "as_strided"):
        # a write through the view reaches the base
        run.record(f"{what}:write", lambda: v.mul_(2))
        run.record(f"{what}:base", lambda: x)
    if p["r"] < 0.7:
        run.env.append(v)


def st_reduce(run, p, what, dev):
    x = run.pick(p["i"], lambda t: t.is_floating_point() or t.dtype in (torch.int64,
                                                                         torch.bool))
    d = p["k"] % max(1, x.dim()) if x.dim() else None
    if run.variant and p["perturb"] and x.dim() == 2:
        x = x.t()
    ops = [("sum", lambda: x.sum()), ("sum_d", lambda: x.sum(d) if d is not None else x.sum()),
           ("sum_kd", lambda: x.sum(d, keepdim=True) if d is not None else x.sum()),
           ("mean", lambda: x.float().mean() if not x.is_floating_point() else x.mean()),
           ("mean_d", lambda: (x if x.is_floating_point() else x.double()).mean(
               d if d is not None else ())),
           ("amax", lambda: x.amax() if x.numel() else x.sum())]
    name, fn = ops[p["j"] % len(ops)]
    out = run.record(f"{what}:{name}", fn)
    if out is not None and p["r"] < 0.3:
        run.env.append(out)


def st_norm(run, p, what, dev):
    x = run.pick(p["i"], lambda t: t.dim() >= 1 and t.dtype in (torch.float32, torch.float64)
                 and t.numel())
    if x is None:
        return
    if run.variant and p["perturb"] and x.dim() == 2:
        x = x.t()
    d = p["k"] % x.dim()
    which = p["j"] % 4
    if which == 0:
        run.record(f"{what}:softmax{d}", lambda: torch.softmax(x, d))
    elif which == 1:
        run.record(f"{what}:log_softmax{d}", lambda: torch.log_softmax(x, d))
    elif which == 2:
        run.record(f"{what}:layer_norm",
                   lambda: torch.nn.functional.layer_norm(x, x.shape[-1:]))
    else:
        w = run.data(tuple(x.shape[-1:]), x.dtype)
        b = run.data(tuple(x.shape[-1:]), x.dtype)
        run.record(f"{what}:layer_norm_wb",
                   lambda: torch.nn.functional.layer_norm(x, x.shape[-1:], w, b))


def st_mm(run, p, what, dev):
    dt = torch.float64 if p["r"] < 0.3 else torch.float32
    form = p["j"] % 5
    if run.variant and p["perturb"]:
        form = p["alt"] % 5
    a = run.data((3, 4), dt)
    big = run.data((4, 8), dt)
    b = run.data((4, 2), dt)
    if form == 0:
        run.record(f"{what}:mm", lambda: a @ b)
    elif form == 1:
        run.record(f"{what}:mm_aat", lambda: torch.mm(a, a.t()))
    elif form == 2:
        run.record(f"{what}:mm_strided", lambda: big[:, :3].t() @ big[:, 4:6])
    elif form == 3:
        bias = run.data((2,), dt)
        run.record(f"{what}:addmm", lambda: torch.addmm(bias, a, b, beta=0.5, alpha=-0.0
                                                        if p["k"] % 2 else 1.5))
    else:
        x = run.data((2, 3, 4), dt)
        run.record(f"{what}:bmm_self", lambda: torch.bmm(x, x.transpose(1, 2)))


def st_cat(run, p, what, dev):
    x = run.pick(p["i"], lambda t: t.dim() >= 1 and t.shape[0] >= 2)
    if x is None:
        return
    form = p["j"] % 3
    if run.variant and p["perturb"]:
        form = p["alt"] % 3
    if form == 0:
        out = run.record(f"{what}:cat_views", lambda: torch.cat([x[1:], x[:-1], x], 0))
    elif form == 1:
        out = run.record(f"{what}:cat_same", lambda: torch.cat([x, x], -1))
    else:
        out = run.record(f"{what}:stack", lambda: torch.stack([x[0], x[1]]))
    if out is not None and p["r"] < 0.3:
        run.env.append(out)


def st_meta(run, p, what, dev):
    x = run.pick(p["i"], lambda t: t.dim() == 2 and t.is_floating_point())
    if x is None:
        return
    y = x.clone()
    which = p["j"] % 4
    if which == 0:
        run.record(f"{what}:transpose_", lambda: y.transpose_(0, 1))
    elif which == 1:
        run.record(f"{what}:resize_", lambda: y.resize_(y.numel()))
    elif which == 2:
        run.record(f"{what}:as_strided_", lambda: y.as_strided_((y.shape[1], y.shape[0]),
                                                                (1, y.shape[1])))
    else:
        z = run.data(tuple(y.shape), y.dtype)
        run.record(f"{what}:set_", lambda: y.set_(z))
    # the same ops on the re-shaped tensor: a runner learned for one shape must not serve it
    run.record(f"{what}:after_add", lambda: y + 1)
    run.record(f"{what}:after_mul_", lambda: y.mul_(2))
    run.record(f"{what}:after_sum", lambda: y.sum(0))
    run.env.append(y)


def st_data(run, p, what, dev):
    x = run.pick(p["i"], lambda t: t.is_floating_point() and t.dim() >= 1)
    if x is None:
        return
    y = x.clone()
    shape = tuple(x.shape) if p["r"] < 0.5 else tuple(reversed(x.shape)) + (1,)
    z = run.data(shape, x.dtype)
    y.mul(2)
    run.record(f"{what}:data=", lambda: setattr(y, "data", z) or y)
    run.record(f"{what}:after", lambda: y * 2)
    run.record(f"{what}:after_", lambda: y.add_(1))


def st_memclear(run, p, what, dev):
    if dev != "cpu":
        MEMORY.clear()


def st_default(run, p, what, dev):
    x = run.pick(p["i"], lambda t: not t.is_floating_point() and not t.is_complex())
    if x is None:
        x = run.data((4,), torch.int64)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        run.record(f"{what}:int+float", lambda: x + 1.5)
        run.record(f"{what}:int/int", lambda: x / (_iabs(x) + 1))
        run.record(f"{what}:sigmoid_int", lambda: torch.sigmoid(x.to(torch.int64)))
    finally:
        torch.set_default_dtype(prev)
    run.record(f"{what}:int+float32", lambda: x + 1.5)
    run.record(f"{what}:int/int32", lambda: x / (_iabs(x) + 1))


def _iabs(x):
    return x.abs() if x.dtype != torch.bool else x.long()   # known: neuron takes bool abs


def st_grad(run, p, what, dev):
    dt = torch.float64 if p["r"] < 0.5 else torch.float32
    a = run.data((3, 4), dt, requires_grad=True)
    b = run.data((4,), dt, requires_grad=True)
    w = run.data((4, 2), dt, requires_grad=True)
    form = p["j"] % 3

    def fn():
        if form == 0:
            y = torch.tanh(a * b + 1) @ w
        elif form == 1:
            y = torch.softmax(a, 1) * b
        else:
            h = torch.nn.functional.layer_norm(a, (4,)) * b
            y = h.sum(0, keepdim=True) @ w
        (y * y).sum().backward()
        return a.grad, b.grad, (w.grad if w.grad is not None else torch.zeros(()))

    run.record(f"{what}:grad{form}", fn)


def st_nograd(run, p, what, dev):
    x = run.pick(p["i"], lambda t: t.is_floating_point())
    ctx = torch.no_grad() if p["r"] < 0.5 else torch.inference_mode()
    with ctx:
        out = run.record(f"{what}:nograd", lambda: x * 2 + 1)
    if out is not None and p["r"] < 0.5:   # inference tensors stay out of later in-place ops
        run.env.append(out)


def st_thread(run, p, what, dev):
    xs = [run.data((8,), torch.float32) for _ in range(2)]
    results = [None, None]
    errors = []

    def work(i):
        try:
            t = xs[i]
            for _ in range(20):
                t = (t * 0.5 + 1).relu()
                t.add_(xs[1 - i] * 0.25)
            results[i] = t
        except Exception as exc:   # noqa: BLE001
            errors.append(exc)

    ths = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    if errors:
        raise errors[0]
    run.record(f"{what}:threads", lambda: tuple(results))


def st_divzero(run, p, what, dev):
    x = run.data((5,), torch.int64, 1, 9)
    y = run.data((5,), torch.int64, 0, 3)   # zeros in some runs' data, not in others
    run.record(f"{what}:floordiv", lambda: x // y)
    run.record(f"{what}:remainder", lambda: torch.remainder(x, y))


def st_index(run, p, what, dev):
    x = run.data((5, 3), torch.float32)
    idx = run.data((4,), torch.int64, -6, 7)   # out of range in some runs
    run.record(f"{what}:index", lambda: x[idx])
    run.record(f"{what}:index_select", lambda: x.index_select(0, idx.clamp(min=0)))


def st_complex(run, p, what, dev):
    z = run.data((3, 2), torch.complex64)
    w = run.data((3, 2), torch.complex64)
    run.record(f"{what}:cmul", lambda: z * w + 1)
    run.record(f"{what}:cabs", lambda: z.abs())
    run.record(f"{what}:csum", lambda: (z * 2).sum(0))


def st_valued(run, p, what, dev):
    """Ops whose kernel depends on a number's value (pow, round) and numbers' special values."""
    x = run.pick(p["i"], lambda t: t.dtype in (torch.float32, torch.float64))
    if x is None:
        return
    exps = [2, 2.0, 0.5, 3, -1, -0.0, 0.0, 1, float("nan"), float("inf"), -2.5]
    e = exps[p["j"] % len(exps)]
    if run.variant and p["perturb"]:
        e = exps[p["alt"] % len(exps)]
    run.record(f"{what}:pow{e!r}", lambda: x.abs() ** e)
    run.record(f"{what}:rpow", lambda: 2.0 ** x)
    d = p["k"] % 3 - 1
    run.record(f"{what}:round{d}", lambda: torch.round(x * 10, decimals=d))
    run.record(f"{what}:clamp", lambda: x.clamp(min=None if p["r"] < 0.5 else -0.5, max=0.5))
    t = x.t() if x.dim() == 2 else x
    run.record(f"{what}:mulspecial", lambda: t * e)


def st_cast(run, p, what, dev):
    x = run.pick(p["i"])
    dts = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.bfloat16,
           torch.float16, torch.uint8]
    dt = dts[p["j"] % len(dts)]
    if x.is_floating_point() and not dt.is_floating_point and dt != torch.bool:
        x = torch.nan_to_num(x).clamp(-100, 100)
        if dt == torch.uint8:
            x = x.abs()
    run.record(f"{what}:to{dt}", lambda: x.to(dt))
    src = x.t() if x.dim() == 2 and run.variant and p["perturb"] else x
    dst = torch.zeros(tuple(src.shape), dtype=dt, device=dev)
    run.record(f"{what}:copy_{dt}", lambda: dst.copy_(src))
    if src.dim() >= 1 and src.numel():
        run.record(f"{what}:copy_bcast", lambda: dst.copy_(src[..., :1].expand_as(src)))


def st_inplace_any(run, p, what, dev):
    """In-place ops on any dtype, written through views of one buffer."""
    dt = [torch.int64, torch.int32, torch.bool, torch.float16, torch.bfloat16, torch.float64,
          torch.float32][p["i"] % 7]
    base = run.data((4, 6), dt)
    views = [base, base[1:3], base[:, ::2], base.t(), base[0], base.view(24)[3:9],
             base.as_strided((3, 3), (6, 1), 2)]
    w = views[p["j"] % len(views)]
    other = views[p["k"] % len(views)]
    if run.variant and p["perturb"]:
        other = views[p["alt"] % len(views)]
    src = run.data(tuple(w.shape), dt)
    # two different views of one buffer: where ATen cannot tell their overlap (strided) the
    # CPU's answer depends on its loop order, so only fast vs slow compare exactly from here
    ub = "ub_" if other is not w and other.shape == w.shape else ""
    if dt == torch.bool:
        run.record(f"{what}:or_", lambda: w.logical_or_(src))
        run.record(f"{what}:{ub}and_", lambda: w.bitwise_and_(other) if other.shape == w.shape
                   else w.bitwise_and_(src))
    else:
        run.record(f"{what}:add_", lambda: w.add_(src, alpha=2))
        run.record(f"{what}:{ub}mul_other", lambda: w.mul_(other) if other.shape == w.shape
                   else w.mul_(2))
        run.record(f"{what}:{ub}sub_s", lambda: w.sub_(1))
    run.record(f"{what}:{ub}copy_", lambda: w.copy_(other) if other.shape == w.shape else w)
    run.record(f"{what}:{ub}base", lambda: base)


def st_resize(run, p, what, dev):
    x = run.data((3, 4), torch.float32)
    form = p["j"] % 3
    if form == 0:
        # (neuron refuses to grow a tensor that views share, by design: no view here)
        run.record(f"{what}:resize_grow", lambda: x.resize_(5, 4).zero_())
    elif form == 1:
        z = torch.zeros(20, device=dev)
        run.record(f"{what}:set_off", lambda: x.set_(z.untyped_storage(), 4, (3, 4), (4, 1)))
    else:
        y = run.data((2, 4), torch.float32)
        run.record(f"{what}:data_swap", lambda: setattr(x, "data", y[1:]) or x)
    run.record(f"{what}:after_mul_", lambda: x.mul_(2))
    run.record(f"{what}:after_add", lambda: x + x)
    run.record(f"{what}:view_sum", lambda: x.view(-1).sum())


def st_profiled(run, p, what, dev):
    """Other steps' ops under the profiler (its hooks see every op; runners still run)."""
    inner = [st_binary, st_inplace, st_mm, st_norm, st_view, st_cast][p["j"] % 6]
    ctx = eager_neuron.profile() if dev != "cpu" else contextlib.nullcontext()
    with ctx:
        inner(run, p, what + ":prof", dev)


def st_foreach(run, p, what, dev):
    # an optimizer's foreach ops on lists that may hold one tensor twice or views of one buffer
    dt = torch.float64 if p["r"] < 0.25 else torch.float32
    base = run.data((6, 4), dt)
    ts = [run.data((3, 4), dt), run.data((5,), dt), base[:2], base[2:5]]
    form = p["alt"] % 3 if run.variant and p["perturb"] else p["j"] % 3
    if form == 1:
        ts = [ts[0], ts[0], ts[1]]          # the same tensor twice: element by element
    elif form == 2:
        ts = [base[:3], base[3:], base.t()[:2]]
    grads = [run.data(tuple(t.shape), dt) for t in ts]
    steps = [0.01 * (i + 1) * (1 + p["k"] % 3) for i in range(len(ts))]

    def step():
        torch._foreach_mul_(ts, 0.9)
        torch._foreach_add_(ts, grads, alpha=0.1)
        denom = torch._foreach_sqrt([t.abs() for t in ts])
        torch._foreach_addcdiv_(ts, grads, torch._foreach_add(denom, 1.0), steps)
        torch._foreach_lerp_(ts, grads, 0.25)
        return tuple(t.clone() for t in ts)

    run.record(f"{what}:foreach", step)


def st_cnn(run, p, what, dev):
    # convolution, batch norm and pooling (captured runners), forward and backward
    dt = torch.float64 if p["r"] < 0.25 else torch.float32
    F = torch.nn.functional
    x = run.data((2, 3, 6, 6), dt)
    if (p["j"] if not (run.variant and p["perturb"]) else p["alt"]) % 2:
        x = x.to(memory_format=torch.channels_last)
    w = run.data((4, 3, 3, 3), dt, requires_grad=True)
    rm, rv = run.data((4,), dt), run.data((4,), dt).abs() + 1
    xg = x.clone().requires_grad_()

    def fwd():
        y = F.conv2d(xg, w, padding=1, stride=1 + p["k"] % 2)
        y = F.batch_norm(y, rm, rv, training=p["i"] % 2 == 0, momentum=0.3)
        y = F.max_pool2d(y, 2, ceil_mode=True) + F.avg_pool2d(y, 2, ceil_mode=True)
        y.square().sum().backward()
        return y.detach(), xg.grad, w.grad, rm.clone(), rv.clone()

    run.record(f"{what}:cnn", fwd)


def st_embed(run, p, what, dev):
    # embedding, gather and nll_loss with indices and targets out of range in some runs
    F = torch.nn.functional
    w = run.data((7, 3), torch.float32)
    idx = run.data((2, 3), torch.int64, -1 if p["k"] % 3 == 0 else 0, 8)
    run.record(f"{what}:embedding", lambda: F.embedding(idx, w))
    run.record(f"{what}:gather", lambda: torch.gather(w, 1, idx.clamp(min=0) % 4))
    logp = run.data((4, 5), torch.float32).log_softmax(1)
    tgt = run.data((4,), torch.int64, 0, 6 if p["i"] % 2 else 5)
    run.record(f"{what}:nll", lambda: F.nll_loss(logp, tgt))


def st_rnn(run, p, what, dev):
    # an LSTM over a batch-first input, with grads: the sequence kernels, and with proj_size
    # the per-step decomposition
    torch.manual_seed(p["i"])
    lstm = torch.nn.LSTM(4, 3, batch_first=True).double()
    lstm = lstm.to(dev)
    x = run.data((2, 5, 4), torch.float64, requires_grad=True)

    def fwd():
        out, _ = lstm(x)
        out.sum().backward()
        return out.detach(), x.grad, lstm.weight_hh_l0.grad

    run.record(f"{what}:lstm", fwd)   # (the sequence kernels, lower/rnn_seq.py)
    # the per-step decomposition (strided mm operands, the fused cells): proj_size keeps it
    plstm = torch.nn.LSTM(4, 3, batch_first=True, proj_size=2).double().to(dev)
    x2 = run.data((2, 5, 4), torch.float64, requires_grad=True)

    def fwd_proj():
        out, _ = plstm(x2)
        out.sum().backward()
        return out.detach(), x2.grad, plstm.weight_hh_l0.grad

    run.record(f"{what}:lstm_proj", fwd_proj)


STEPS = {"unary": st_unary, "binary": st_binary, "inplace": st_inplace, "out": st_out,
         "view": st_view, "reduce": st_reduce, "norm": st_norm, "mm": st_mm, "cat": st_cat,
         "meta": st_meta, "data": st_data, "memclear": st_memclear, "default": st_default,
         "grad": st_grad, "nograd": st_nograd, "thread": st_thread, "divzero": st_divzero,
         "index": st_index, "complex": st_complex, "valued": st_valued, "cast": st_cast,
         "inplace_any": st_inplace_any, "resize": st_resize, "profiled": st_profiled,
         "foreach": st_foreach, "cnn": st_cnn, "embed": st_embed, "rnn": st_rnn}


# ---------------------------------------------------------------------------------------------
# comparisons
# ---------------------------------------------------------------------------------------------

def _counters() -> dict:
    gc.collect()   # memory_allocated counts blocks a cycle still holds: collect them first
    out = {k: getattr(STATS, k) for k in ("ops", "launches", "memory_hits", "views",
                                           "compiles", "disk_hits")}
    out["allocated"] = sum(torch.neuron.memory_allocated(i) for i in range(len(SIM.cores)))
    out["busy_us"] = sum(sum(c.busy_us.values()) for c in SIM.cores)
    out["clock_us"] = max(c.clock_us for c in SIM.cores)
    return out


def _delta(a: dict, b: dict) -> dict:
    return {k: b[k] - a[k] for k in a}


def compare_exact(la: list, lb: list, what: str) -> None:
    """Two neuron runs: the same outcomes, bit for bit."""
    if len(la) != len(lb):
        raise Fail(f"{what}: {len(la)} vs {len(lb)} logged steps")
    for ea, eb in zip(la, lb):
        if ea[0] != eb[0] or ea[1] != eb[1]:
            raise Fail(f"{what}: step {ea[0]}: {ea[1:]} vs {eb[0]} {eb[1:]}"[:600])
        if ea[1] == "error":
            if ea[2:] != eb[2:]:
                raise Fail(f"{what}: step {ea[0]}: errors differ: {ea[2:]} vs {eb[2:]}")
            continue
        for va, vb in zip(ea[2], eb[2]):
            if isinstance(va, tuple):
                ta, tb = va[0], vb[0]
                if va[1:] != vb[1:]:
                    raise Fail(f"{what}: step {ea[0]}: metadata {va[1:]} vs {vb[1:]}")
                if not _bits_equal(ta, tb):
                    raise Fail(f"{what}: step {ea[0]}: values differ\n{ta}\n{tb}")
            elif va != vb and not (va != va and vb != vb):
                raise Fail(f"{what}: step {ea[0]}: {va} vs {vb}")


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point() or a.is_complex():
        # NaN == NaN, and the sign of zero counts
        a2, b2 = torch.view_as_real(a) if a.is_complex() else a, \
            torch.view_as_real(b) if b.is_complex() else b
        return bool(((a2 == b2) | (a2.isnan() & b2.isnan())).all()) and \
            torch.equal(torch.signbit(a2), torch.signbit(b2) | (a2.isnan() & b2.isnan()
                                                                 & torch.signbit(a2)))
    return torch.equal(a, b)


def compare_cpu(ln: list, lc: list, what: str) -> None:
    """A neuron run against its CPU twin: same dtypes/shapes, values within dtype bounds,
    errors where the CPU errors."""
    if len(ln) != len(lc):
        raise Fail(f"{what}: {len(ln)} vs {len(lc)} logged steps")
    for en, ec in zip(ln, lc):
        if en[0].split(":")[-1].startswith("ub_"):
            continue   # undefined on the CPU (overlapping operands it cannot check)
        if en[1] != ec[1]:
            raise Fail(f"{what}: step {en[0]}: neuron {en[1:]} cpu {ec[1:]}"[:800])
        if en[1] == "error":
            continue
        for vn, vc in zip(en[2], ec[2]):
            if not isinstance(vn, tuple):
                continue
            tn, tc = vn[0], vc[0]
            if tn.dtype != tc.dtype or tn.shape != tc.shape:
                raise Fail(f"{what}: step {en[0]}: neuron {tn.dtype}{list(tn.shape)} vs cpu "
                           f"{tc.dtype}{list(tc.shape)}")
            if tn.is_floating_point() or tn.is_complex():
                # a float64 result may carry float32 rounding from earlier steps (x.sum() in
                # float32, then .double()): float32's bound at least
                rtol, atol = (max(a, b) for a, b in zip(TOL[tn.dtype], TOL[torch.float32]))
                scale = max(1.0, float(tc.abs().nan_to_num(0, 0, 0).max())) if tc.numel() \
                    else 1.0
                try:
                    torch.testing.assert_close(tn.to(torch.complex128 if tn.is_complex()
                                                     else torch.float64),
                                               tc.to(torch.complex128 if tc.is_complex()
                                                     else torch.float64),
                                               rtol=rtol, atol=atol * scale, equal_nan=True)
                except AssertionError as exc:
                    raise Fail(f"{what}: step {en[0]}: {exc}"[:800]) from None
            elif not torch.equal(tn, tc):
                raise Fail(f"{what}: step {en[0]}: neuron {tn} cpu {tc}")


def run_program(seed: int, n_steps: int = 14, verbose: bool = False,
                kinds_in_order: list | None = None) -> dict:
    """Run program `seed` as described in the module docstring; raise Fail on a difference.
    Returns the fast-path hits each run made ({"A": .., "B1": .., "B2": .., "C": 0})."""
    program = make_program(seed, n_steps, kinds_in_order)
    variant = 1 + seed % 3
    prev_fast = config.fastpath
    prev_default = torch.get_default_dtype()
    hits = {}
    try:
        logs = {}
        for name, dev, data, var, fast in (("A", "neuron", 1, 0, True),
                                           ("B1", "neuron", 2, variant, True),
                                           ("B2", "neuron", 3, variant, True),
                                           ("C", "neuron", 3, variant, False)):
            config.fastpath = fast
            run = Run(dev, seed * 10 + data, var, verbose)
            h0 = fastpath.STATS_FAST["hits"]
            # kernels queued for the background worker build first: its disk loads and
            # compiles count in STATS when they land, inside whichever run is being compared
            adaptive_compile.wait(600)
            c0 = _counters()
            execute(program, run)
            torch.neuron.synchronize()
            hits[name] = fastpath.STATS_FAST["hits"] - h0
            logs[name] = (run.log, _delta(c0, _counters()))
            config.fastpath = prev_fast
            cpu = Run("cpu", seed * 10 + data, var, verbose)
            execute(program, cpu)
            compare_cpu(run.log, cpu.log, f"seed {seed} run {name} vs cpu")
        compare_exact(logs["B2"][0], logs["C"][0], f"seed {seed} fast B2 vs slow C")
        cb, cc = logs["B2"][1], logs["C"][1]
        threads = any(k == "thread" for k, _p in program)
        if threads:
            # two threads missing the memory cache at once both load a kernel from disk
            for c in (cb, cc):
                c["memory_hits"] += c.pop("disk_hits")
        for k in cb:
            if k == "clock_us" and threads:
                continue   # two threads' launches interleave differently on the clock
            if k in ("busy_us", "clock_us"):
                ok = math.isclose(cb[k], cc[k], rel_tol=1e-9, abs_tol=1e-6)
            else:
                ok = cb[k] == cc[k]
            if not ok:
                raise Fail(f"seed {seed}: counter {k}: fast {cb[k]} slow {cc[k]} "
                           f"(fast {cb}, slow {cc})")
    finally:
        config.fastpath = prev_fast
        torch.set_default_dtype(prev_default)
    return hits


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--program", type=int, default=None, help="run this one seed")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    import warnings

    warnings.simplefilter("ignore")
    seeds = [args.program] if args.program is not None else \
        range(args.seed, args.seed + args.programs)
    failures = 0
    total_hits = 0
    t0 = time.time()
    for s in seeds:
        try:
            with contextlib.redirect_stderr(sys.stderr):
                hits = run_program(s, args.steps, args.verbose)
            total_hits += hits.get("B2", 0)
        except Fail as exc:
            failures += 1
            print(f"FAIL {exc}")
        except Exception as exc:   # noqa: BLE001 -- an error outside a recorded step
            failures += 1
            print(f"ERROR seed {s}: {type(exc).__name__}: {exc}"[:600])
    n = len(seeds) if not isinstance(seeds, range) else len(seeds)
    print(f"{n} programs, {failures} failing, {total_hits} fast-path hits in the B2 replays, "
          f"{time.time() - t0:.0f} s; fastpath {fastpath.STATS_FAST}, stats ops {STATS.ops}")
    return 1 if failures else 0


if __name__ == "__main__":
    eager_neuron.reset_stats()
    sys.exit(main())
