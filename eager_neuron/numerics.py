"""The numerics debugger: find the first op whose neuron result leaves the CPU's, or the first op
that makes a NaN/Inf, and name it with its arguments and the user's line.

    EAGER_NEURON_CHECK=1    python train.py   # every op also on the CPU, compared
    EAGER_NEURON_CHECK=nan  python train.py   # the first op (forward or backward) making NaN/Inf

or in code:

    with eager_neuron.check_numerics(rtol=1e-4, atol=1e-5):
        loss = model(x).sum(); loss.backward()
    with eager_neuron.check_numerics(mode="nan"):
        ...

How: a TorchDispatchMode sees every aten op after autograd (forward and backward, the ops the
user's code issues; their decompositions and kernels run inside the op). For mode="compare" it
copies the op's neuron inputs to the CPU before the op runs, runs the op on neuron, runs the same
op on the copies, and compares every output and every written argument at (rtol, atol)
(per-dtype defaults below; integer and bool results must be equal). Ops whose result is not a
function of their inputs (random sampling, uninitialised memory) are not re-run, so the CPU
generator's state and every result are unchanged. In adaptive eager each op's outputs are read,
so recorded groups flush op by op: the op named is the one that diverged, not a fused kernel.

mode="nan" reports an op whose output has a NaN although no input had one, or an Inf although
no input had a NaN or Inf (a -inf mask filled from a scalar -inf is not reported).

A finding raises NumericsError (a RuntimeError) at the op: in forward at the op's line, in
backward from backward() (the message names the backward op and the line of backward()), like
torch.autograd.detect_anomaly but naming the op. `action="warn"` warns and goes on instead;
every finding is kept in `checker.findings`.

>>> import torch, eager_neuron
>>> with eager_neuron.numerics.check_numerics() as chk:
...     y = (torch.arange(4.0, device="neuron") * 2).sum()
>>> chk.ops_checked >= 2, chk.findings
(True, [])
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from . import errors

# (rtol, atol) per result dtype, when the caller gives none: a few ulps of the dtype for one op
DEFAULT_TOL = {
    torch.float64: (1e-9, 1e-12), torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-2), torch.float16: (2e-3, 1e-3),
    torch.complex64: (1e-4, 1e-5), torch.complex128: (1e-9, 1e-12),
}

# ops whose result is not a function of their inputs: never re-run on the CPU
_UNINIT = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
    "aten::new_empty_strided", "aten::empty_permuted", "aten::set_", "aten::resize_",
    "aten::_local_scalar_dense", "aten::lift_fresh", "aten::detach", "aten::alias",
})


class NumericsError(RuntimeError):
    """An op's neuron result diverged from the CPU's, or made a NaN/Inf."""


def _is_neuron(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "neuron"


def _to_cpu(x):
    if isinstance(x, torch.Tensor) and x.device.type == "neuron":
        return x.detach().cpu()
    if isinstance(x, torch.device) and x.type == "neuron":
        return torch.device("cpu")
    if isinstance(x, str) and x.startswith("neuron"):
        return "cpu"
    return x


def _copy_in(x):
    """A CPU copy of a neuron tensor argument (taken before the op writes anything)."""
    if isinstance(x, torch.Tensor) and x.device.type == "neuron":
        return x.detach().cpu().clone()
    return _to_cpu(x)


def _written(func) -> list:
    """Positions/names of the arguments the op writes (in-place and out=)."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            out.append((i, arg.name))
    return out


def _arg(args, kwargs, i, name):
    if name in kwargs:
        return kwargs[name]
    return args[i] if i < len(args) else None


def _finite_stats(t: torch.Tensor) -> tuple[bool, bool]:
    """(has NaN, has Inf) of a float/complex tensor."""
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return False, False
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    if bool(torch.isfinite(t).all()):   # the common case: one reduction
        return False, False
    nan = bool(torch.isnan(t).any())
    inf = bool(torch.isinf(t).any())
    return nan, inf


def _number_flags(v) -> tuple[bool, bool]:
    if isinstance(v, float):
        return math.isnan(v), math.isinf(v)
    if isinstance(v, complex):
        return (math.isnan(v.real) or math.isnan(v.imag),
                math.isinf(v.real) or math.isinf(v.imag))
    return False, False


def _compare(got: torch.Tensor, want: torch.Tensor, rtol, atol) -> str | None:
    """None if equal within tolerance, else a one-line description of the divergence."""
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} on neuron, {tuple(want.shape)} on the CPU"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} on neuron, {want.dtype} on the CPU"
    if got.numel() == 0:
        return None
    if not (got.is_floating_point() or got.is_complex()):
        bad = got != want
        n = int(bad.sum())
        if n:
            i = int(bad.reshape(-1).nonzero()[0])
            return (f"{n} of {got.numel()} elements differ (first at flat index {i}: "
                    f"{got.reshape(-1)[i].item()} on neuron, {want.reshape(-1)[i].item()} "
                    "on the CPU)")
        return None
    r, a = DEFAULT_TOL.get(got.dtype, (1e-4, 1e-5))
    rtol = r if rtol is None else rtol
    atol = a if atol is None else atol
    g = got.to(torch.complex128 if got.is_complex() else torch.float64)
    w = want.to(g.dtype)
    gn, wn = torch.isnan(g), torch.isnan(w)
    nan_bad = gn != wn
    both_inf = torch.isinf(g) & torch.isinf(w) & (g == w)
    diff = (g - w).abs()
    diff = torch.where(gn | wn | both_inf, torch.zeros_like(diff), diff)
    limit = atol + rtol * w.abs().nan_to_num(posinf=0.0, neginf=0.0)
    bad = nan_bad | (diff > limit) | (torch.isinf(g) != torch.isinf(w))
    n = int(bad.sum())
    if not n:
        return None
    max_abs = float(diff[~(gn | wn)].max()) if bool((~(gn | wn)).any()) else 0.0
    rel = diff / w.abs().clamp_min(torch.finfo(torch.float64).tiny)
    max_rel = float(rel[bad & ~(gn | wn)].max()) if bool((bad & ~(gn | wn)).any()) else 0.0
    i = int(bad.reshape(-1).nonzero()[0])
    return (f"{n} of {got.numel()} elements beyond rtol={rtol:g}, atol={atol:g}; max abs error "
            f"{max_abs:.3g}, max rel error {max_rel:.3g}; first at flat index {i}: "
            f"{g.reshape(-1)[i].item()} on neuron, {w.reshape(-1)[i].item()} on the CPU"
            + (f"; NaN on one side only in {int(nan_bad.sum())} elements"
               if bool(nan_bad.any()) else ""))


class _Finding:
    __slots__ = ("op", "phase", "args", "detail", "where")

    def __init__(self, op, phase, args, detail, where):
        self.op, self.phase, self.args, self.detail, self.where = op, phase, args, detail, where

    def message(self, kind: str) -> str:
        return (f"{kind} in {self.op} ({self.phase})\n{self.where}\n  args: {self.args}\n"
                f"  {self.detail}")

    def __repr__(self) -> str:
        return f"<{self.op} {self.phase}: {self.detail[:60]}>"


class _CheckMode(TorchDispatchMode):
    def __init__(self, checker: "Checker"):
        super().__init__()
        self.checker = checker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        chk = self.checker
        if getattr(chk._busy, "active", False):   # the checker's own reads and CPU runs
            return func(*args, **kwargs)
        chk._busy.active = True
        try:
            return chk._run(func, args, kwargs)
        finally:
            chk._busy.active = False


class Checker:
    """What check_numerics returns: findings, counters, and the seconds spent checking."""

    def __init__(self, mode: str = "compare", rtol=None, atol=None, action: str = "raise"):
        if mode not in ("compare", "nan"):
            raise ValueError(f"check_numerics: mode={mode!r}; expected 'compare' or 'nan'")
        if action not in ("raise", "warn"):
            raise ValueError(f"check_numerics: action={action!r}; expected 'raise' or 'warn'")
        self.mode, self.rtol, self.atol, self.action = mode, rtol, atol, action
        self.findings: list = []
        self.ops_checked = 0
        self.seconds = 0.0
        self._busy = threading.local()   # per thread: backward runs on the engine's threads
        self._dm = None

    # -- one op --------------------------------------------------------------------------------
    def _run(self, func, args, kwargs):
        flat, _ = tree_flatten((args, kwargs))
        if not any(_is_neuron(t) for t in flat) and not _device_kwarg(kwargs):
            return func(*args, **kwargs)
        if self.mode == "nan":
            return self._run_nan(func, args, kwargs, flat)
        name = func._schema.name
        skip = (name in _UNINIT or torch.Tag.nondeterministic_seeded in func.tags
                or torch.Tag.inplace_view in func.tags or func.is_view)
        t0 = time.perf_counter()
        if not skip:
            cargs, ckw = tree_map(_copy_in, args), tree_map(_copy_in, kwargs)
        self.seconds += time.perf_counter() - t0
        out = func(*args, **kwargs)
        if skip:
            return out
        t0 = time.perf_counter()
        try:
            want = func(*cargs, **ckw)
        except Exception:   # the CPU refuses what neuron ran: not a numerics question
            self.seconds += time.perf_counter() - t0
            return out
        self.ops_checked += 1
        problems = []
        got_l, _ = tree_flatten(out)
        want_l, _ = tree_flatten(want)
        for k, (g, w) in enumerate(zip(got_l, want_l)):
            if isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor):
                msg = _compare(g.detach().cpu(), w, self.rtol, self.atol)
                if msg:
                    problems.append(f"output {k}: {msg}")
        for i, nm in _written(func):
            g, w = _arg(args, kwargs, i, nm), _arg(cargs, ckw, i, nm)
            if isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor):
                msg = _compare(g.detach().cpu(), w, self.rtol, self.atol)
                if msg:
                    problems.append(f"written argument {nm!r}: {msg}")
        self.seconds += time.perf_counter() - t0
        if problems:
            return self._report(func, args, kwargs, "\n  ".join(problems),
                                "neuron result differs from the CPU", out)
        return out

    def _run_nan(self, func, args, kwargs, flat):
        t0 = time.perf_counter()
        in_nan = in_inf = False
        for v in flat:
            n, i = _finite_stats(v) if isinstance(v, torch.Tensor) else _number_flags(v)
            in_nan, in_inf = in_nan or n, in_inf or i
        self.seconds += time.perf_counter() - t0
        out = func(*args, **kwargs)
        if in_nan:
            return out
        t0 = time.perf_counter()
        self.ops_checked += 1
        outs, _ = tree_flatten(out)
        outs += [_arg(args, kwargs, i, nm) for i, nm in _written(func)]
        found = []
        for k, v in enumerate(outs):
            if isinstance(v, torch.Tensor) and _is_neuron(v):
                n, i = _finite_stats(v)
                if n:
                    found.append(f"output {k} has NaN ({int(torch.isnan(v).sum())} of "
                                 f"{v.numel()} elements) and no input has one")
                elif i and not in_inf:
                    found.append(f"output {k} has Inf ({int(torch.isinf(v).sum())} of "
                                 f"{v.numel()} elements) and no input has NaN or Inf")
        self.seconds += time.perf_counter() - t0
        if found:
            return self._report(func, args, kwargs, "; ".join(found), "NaN/Inf created", out)
        return out

    def _report(self, func, args, kwargs, detail, kind, out):
        from . import backward as _backward

        back = _backward.in_backward()
        phase = "backward" if back else "forward"
        where = _backward_where() if back else errors.where()
        f = _Finding(func._schema.name + (f".{func._schema.overload_name}"
                                          if func._schema.overload_name else ""),
                     phase, errors.describe_args(args, kwargs), detail, where)
        self.findings.append(f)
        msg = f.message(kind)
        if self.action == "warn":
            warnings.warn("eager_neuron.check_numerics: " + msg, stacklevel=2)
            return out
        exc = NumericsError("eager_neuron.check_numerics: " + msg)
        if back:   # raising on autograd's side aborts torch 2.13: backward() raises it
            return _backward.failed(exc)
        raise exc

    # -- context -------------------------------------------------------------------------------
    def __enter__(self):
        # anomaly mode (without its NaN check) keeps each autograd node's forward stack: a
        # backward finding names the forward line that made the node
        self._anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
        torch.set_anomaly_enabled(True, False)
        self._dm = _CheckMode(self)
        self._dm.__enter__()
        return self

    def __exit__(self, *exc):
        dm, self._dm = self._dm, None
        try:
            return dm.__exit__(*exc)
        finally:
            torch.set_anomaly_enabled(*self._anomaly)


def _backward_where() -> str:
    """The autograd node running this backward op and the user line of its forward op."""
    node = torch._C._current_autograd_node()
    name = type(node).__name__ if node is not None else "?"
    if hasattr(node, "name"):
        name = node.name()
    stack = (getattr(node, "metadata", None) or {}).get("traceback_") if node else None
    for entry in reversed(stack or []):
        m = re.match(r'\s*File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', entry)
        if m and not m.group(1).startswith(errors._SKIP):
            fn, lineno, func, src = m.groups()
            return (f"  in {name}, the backward of the forward op at {os.path.basename(fn)}:"
                    f"{lineno} in {func}: {src.strip()}")
    return f"  in {name} (its forward line was not recorded)\n{errors.where()}"


def _device_kwarg(kwargs) -> bool:
    d = kwargs.get("device")
    return d is not None and torch.device(d).type == "neuron"


def check_numerics(rtol: float | None = None, atol: float | None = None, mode: str = "compare",
                   action: str = "raise") -> Checker:
    """Check every op in the block: mode="compare" against the CPU at (rtol, atol) (per-dtype
    defaults in DEFAULT_TOL), mode="nan" for the first op making a NaN/Inf. action="raise"
    raises NumericsError at the first finding; "warn" warns and keeps going.

    >>> import torch, eager_neuron
    >>> with eager_neuron.numerics.check_numerics(mode="nan", action="warn") as chk:
    ...     y = torch.ones(2, device="neuron").log()
    >>> chk.findings
    []
    """
    return Checker(mode, rtol, atol, action)


_GLOBAL: list = []


def install_from_env(environ=None) -> Checker | None:
    """EAGER_NEURON_CHECK=1 (compare with the CPU) or =nan: a checker for the whole process."""
    env = os.environ if environ is None else environ
    value = env.get("EAGER_NEURON_CHECK", "").strip().lower()
    if value in ("", "0", "false", "off", "no"):
        return None
    if value in ("1", "true", "on", "yes", "cpu", "compare"):
        chk = check_numerics()
    elif value in ("nan", "inf", "naninf"):
        chk = check_numerics(mode="nan")
    else:
        raise ValueError(f"EAGER_NEURON_CHECK={value!r}: expected 1 (compare every op with the "
                         "CPU) or nan (report the first op making a NaN/Inf)")
    chk.__enter__()
    _GLOBAL.append(chk)
    return chk
