"""PyTorch's OpInfo database as the oracle: every op on `neuron` against the CPU.

For each OpInfo in `op_db` (all of it, not only the ops with a neuron kernel) and each dtype of
float32, int64, bool and bfloat16 that the op supports on the CPU, the first few samples run on
`neuron` and on the CPU with the same seed:
    1. forward: outputs compared with torch.testing.assert_close (exact dtype, NaN == NaN),
       at the op's own tolerances (its toleranceOverride decorators) or the dtype's defaults;
    2. backward (float32, ops that support autograd): gradients of every input that requires
       grad, for the same random grad_outputs, compared the same way;
    3. a sample that reaches the counted CPU fallback fails, whatever its numbers.
The result of each (op, dtype, phase) is checked against `opinfo_xfail.txt`, strictly: a listed
triple that passes fails the test, so the list can only shrink.

test_op_adaptive[...] runs the same sweep in adaptive eager (EAGER_NEURON_ADAPTIVE=1 in its
workers) and requires the same verdict as plain eager for every (op, dtype, phase): adaptive
eager must not change a result. ADAPTIVE_XFAIL (below) lists adaptive-only gaps, strictly.

    make test                                   # this file runs with the rest (bounded samples)
    .venv/bin/python tools/op_coverage.py          # the whole sweep, pass rates, failure reasons
    .venv/bin/python tools/op_coverage.py --update-xfail   # regenerate opinfo_xfail.txt

The ops run in worker processes (the Sweep engine below; tools/op_coverage.py --worker), so two
cores share the work and an op that aborts its process is reported as a crash, not the end of
the session; each test_op[...] waits for its op's result. Kernels are cached in each worker's
memory and in the disk cache, which later runs reuse.

Environment: EAGER_NEURON_OPINFO_SAMPLES (default 3), EAGER_NEURON_OPINFO_MAX_NUMEL (2**16),
EAGER_NEURON_OPINFO_JOBS (worker processes, default the core count up to 4; 0 runs in the pytest
process, for pdb), EAGER_NEURON_OPINFO_TIMEOUT (seconds without progress, default 300).
"""

from __future__ import annotations

import collections
import json
import os
import re
import sys
import time
import warnings
import zlib
from dataclasses import dataclass, field

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

from eager_neuron.stats import STATS

HERE = os.path.dirname(os.path.abspath(__file__))
XFAIL_FILE = os.path.join(HERE, "opinfo_xfail.txt")

DTYPES = (torch.float32, torch.int64, torch.bool, torch.bfloat16)
DTYPE_NAMES = {torch.float32: "float32", torch.int64: "int64", torch.bool: "bool",
               torch.bfloat16: "bfloat16"}
NAME_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}
PHASES = ("fwd", "bwd")

MAX_SAMPLES = int(os.environ.get("EAGER_NEURON_OPINFO_SAMPLES", "3"))
MAX_NUMEL = int(os.environ.get("EAGER_NEURON_OPINFO_MAX_NUMEL", str(2 ** 16)))
SEED = 1234

# Ops whose outputs are not a function of their inputs (uninitialised memory), or of the
# sample's storage beyond the view the harness moves to the device (as_strided on a view); they
# are not compared. Random ops ARE compared: the CPU generator serves both devices, same seed.
NOT_COMPARABLE = {
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
}
NOT_COMPARABLE_VARIANTS = {"as_strided.partial_views"}


# (op, dtype, phase) whose CPU result depends on the CPU's instruction set: oneDNN's AMX path
# rounds bfloat16 transposed convolutions differently from the AVX2 one; the AVX-512 and MKL
# float32 kernels move matrix_exp's backward by 1e-4 and linalg.cond's SVD gradient by 7e-5.
# Their reference is the same sample run in float64 on the CPU (which does not depend on the
# ISA), judged by a bound derived from the dtype (`_isa_bound`); tests/test_isa.py reruns
# these ops under each ATEN_CPU_CAPABILITY the machine has.
#   "terms": a bilinear op (convolution): |ours - exact| <= (taps + 2) * u * op(|x|, |w|, |b|)
#            (the forward error of a sum rounded at each of its taps + 2 steps; u: unit roundoff)
#   "normwise": a matrix function: max|ours - exact| <= 8 * n * eps * max|exact| (n: matrix size)
ISA_SENSITIVE = {
    ("nn.functional.conv_transpose1d", "bfloat16", "fwd"): "terms",
    ("nn.functional.conv_transpose2d", "bfloat16", "fwd"): "terms",
    ("nn.functional.conv_transpose3d", "bfloat16", "fwd"): "terms",
    # float16 too: on an AMD EPYC (AVX-512, no AMX) the CPU's float16 transposed convolution
    # rounds its sums elsewhere than ours (0.03 apart at |y| ~ 10; PyTorch's 1e-3 fails)
    ("nn.functional.conv_transpose1d", "float16", "fwd"): "terms",
    ("nn.functional.conv_transpose2d", "float16", "fwd"): "terms",
    ("nn.functional.conv_transpose3d", "float16", "fwd"): "terms",
    ("matrix_exp", "float32", "bwd"): "normwise",
    ("linalg.cond", "float32", "bwd"): "normwise",
    # on an AMD EPYC the CPU's float32 gradient is 1.9e-5 from ours (PyTorch's 1e-5 fails)
    ("linalg.householder_product", "float32", "bwd"): "normwise",
}


def _to_f64(x, absolute: bool = False):
    if isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
        t = x.detach().to(torch.float64)
        return (t.abs() if absolute else t).requires_grad_(x.requires_grad)
    return x


def _isa_bound(kind: str, actual, exact, mag, dtype, taps: int = 1) -> str:
    """'' if the neuron results `actual` are within the bound of `kind` (see ISA_SENSITIVE) of
    the float64 results `exact`, else why not. `mag`: float64 results of |inputs| ("terms");
    `taps`: the products summed into one output per input channel (prod of the kernel size)."""
    act, _ = tree_flatten(tree_map(_to_cpu, actual))
    ref, _ = tree_flatten(exact)
    mags = tree_flatten(mag)[0] if mag is not None else [None] * len(ref)
    if len(act) != len(ref) or len(mags) != len(ref):
        return f"mismatch: {len(act)} outputs, the float64 reference has {len(ref)}"
    fi = torch.finfo(dtype)
    u = fi.eps / 2   # unit roundoff
    for i, (a, r, m) in enumerate(zip(act, ref, mags)):
        if not isinstance(r, torch.Tensor):
            continue
        if not isinstance(a, torch.Tensor) or a.shape != r.shape or a.dtype != dtype:
            return f"mismatch: output {i} is not a {dtype} {tuple(r.shape)}"
        a, r = a.double(), r.detach().double()
        if not torch.equal(a.isnan(), r.isnan()):
            return f"mismatch: output {i}: NaN where the float64 reference has none (or back)"
        err = (a - r).abs().nan_to_num(0.0)
        if kind == "terms":
            bound = (taps + 2) * u * m.detach().double() + fi.tiny
        else:
            n = r.shape[-1] if r.dim() else 1
            bound = 16 * n * u * float(r.abs().nan_to_num(0.0).max()) + fi.tiny
        bad = err > bound
        if bool(bad.any()):
            j = int(bad.flatten().nonzero()[0])
            return (f"mismatch: output {i} element {j}: {float(a.flatten()[j]):g} vs float64 "
                    f"{float(r.flatten()[j]):g} (the {kind} bound for {dtype})")
    return ""


def comparable(op) -> bool:
    return op.name not in NOT_COMPARABLE and op_id(op) not in NOT_COMPARABLE_VARIANTS

DEFAULT_TOL = {  # (atol, rtol): torch.testing.assert_close's own defaults, bf16 per the brief
    torch.float32: (1e-5, 1.3e-6),
    torch.bfloat16: (1e-2, 1.6e-2),
}


def op_id(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def all_ops() -> list:
    from torch.testing._internal.common_methods_invocations import op_db

    return list(op_db)


# ---------------------------------------------------------------------------------------------
# the xfail list: "op dtype phase  # reason", one per line
# ---------------------------------------------------------------------------------------------

def load_xfail(path: str = XFAIL_FILE, names=None) -> tuple[dict, dict]:
    """({(op, dtype, phase): reason} expected failures, {...: reason} phases that crash).

    A line is `op dtype phase  # reason`, or `op dtype phase crash  # reason` for a phase that
    aborts the process (never run by the test; tools/op_coverage.py runs it in a child process).
    """
    xfail, crash = {}, {}
    if not os.path.exists(path):
        return xfail, crash
    with open(path) as f:
        for line in f:
            body, _, reason = line.partition("#")
            parts = body.split()
            if not parts:
                continue
            if len(parts) not in (3, 4) or parts[1] not in (names or NAME_DTYPES) or \
                    parts[2] not in PHASES or (len(parts) == 4 and parts[3] != "crash"):
                raise ValueError(f"{path}: bad line {line!r}: expected 'op dtype fwd|bwd [crash]'")
            (crash if len(parts) == 4 else xfail)[tuple(parts[:3])] = reason.strip()
    return xfail, crash


def write_xfail(failures: dict, crashes: dict, path: str = XFAIL_FILE) -> None:
    """Rewrite the data file from {(op, dtype, phase): reason} failures and crashes."""
    header = (
        "# OpInfo triples (op, dtype, phase) that currently fail on neuron; strict: a listed\n"
        "# triple that passes fails tests/test_opinfo.py, so the list can only shrink.\n"
        "# 'crash' marks a phase that aborts the process: the test does not run it.\n"
        "# Regenerate with: .venv/bin/python tools/op_coverage.py --update-xfail\n"
        "# (the test's bounded run: EAGER_NEURON_OPINFO_SAMPLES samples per dtype, samples up to\n"
        "# EAGER_NEURON_OPINFO_MAX_NUMEL elements). Text after '#' is the first failure seen.\n")
    rows = [(k, "", r) for k, r in failures.items()] + [(k, " crash", r) for k, r in
                                                          crashes.items()]
    width = max((len(" ".join(k) + c) for k, c, _ in rows), default=0)
    with open(path, "w") as f:
        f.write(header)
        for key, c, reason in sorted(rows):
            reason = re.sub(r"\s+", " ", reason)[:110]
            f.write(f"{' '.join(key) + c:<{width}}  # {reason}\n")


# ---------------------------------------------------------------------------------------------
# running one op
# ---------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    """The verdict for one (op, dtype, phase) over its samples."""

    status: str = "skip"          # pass | fail | skip (no sample ran)
    reason: str = ""
    samples: int = 0
    passed: int = 0
    fallbacks: collections.Counter = field(default_factory=collections.Counter)

    def add(self, ok: bool, reason: str = "") -> None:
        self.samples += 1
        if ok:
            self.passed += 1
            if self.status == "skip":
                self.status = "pass"
        else:
            if self.status != "fail":
                self.reason = reason
            self.status = "fail"


def tolerances(op, dtype) -> tuple:
    """(atol, rtol): the largest of the dtype's default and the op's CPU-applicable overrides;
    (None, None) without an override lets assert_close pick by each *output's* dtype (cos of an
    int64 tensor is float32 and compares at float32 tolerance, argmax is exact)."""
    found = dtype == torch.bfloat16
    atol, rtol = DEFAULT_TOL.get(dtype, (0.0, 0.0))
    for info in getattr(op, "decorators", ()) or ():
        if getattr(info, "device_type", None) not in (None, "cpu"):
            continue
        if getattr(info, "active_if", True) is False:
            continue
        for dec in getattr(info, "decorators", ()):
            d = getattr(dec, "d", None)   # toleranceOverride: tol(atol, rtol); precisionOverride:
            if isinstance(d, dict) and dtype in d:   # a float, used as atol
                t = d[dtype]
                atol = max(atol, getattr(t, "atol", t))
                rtol = max(rtol, getattr(t, "rtol", 0.0))
                found = True
    return (atol, rtol) if found else (None, None)


def _numel(sample) -> int:
    leaves, _ = tree_flatten((sample.input, sample.args, sample.kwargs))
    return sum(t.numel() for t in leaves if isinstance(t, torch.Tensor))


def _to_neuron(x):
    if isinstance(x, torch.Tensor) and x.device.type == "cpu":
        t = x.detach().to("neuron")
        if x.requires_grad:
            t.requires_grad_(True)
        return t
    if isinstance(x, torch.device) and x.type == "cpu":
        return torch.device("neuron")
    if isinstance(x, str) and x == "cpu":
        return "neuron"
    return x


# positional sample.args that PyTorch requires on the CPU whatever the device (the sample
# functions make them on the CPU on purpose; moving them would test a user error)
CPU_ARGS = {"tensor_split": (0,)}


def _move_sample(sample, name: str = ""):
    """(input, args, kwargs) on neuron; device='cpu' arguments become 'neuron'."""
    inp = tree_map(_to_neuron, sample.input)
    keep = CPU_ARGS.get(name, ())
    args = tuple(v if i in keep and isinstance(v, torch.Tensor) else tree_map(_to_neuron, v)
                 for i, v in enumerate(sample.args))
    kwargs = {k: tree_map(_to_neuron, v) for k, v in sample.kwargs.items()}
    return inp, args, kwargs


def _to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    return x


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    head = text[0] if text else ""
    return f"{type(exc).__name__}: {head}"[:200]


def _fallback_snapshot() -> collections.Counter:
    return collections.Counter(STATS.fallbacks)


def _fallback_delta(before: collections.Counter) -> collections.Counter:
    after = collections.Counter(STATS.fallbacks)
    after.subtract(before)
    return +after


def _names_neuron(moved) -> bool:
    """Whether a moved sample holds a neuron tensor or names the neuron device. A sample that
    does neither (`torch.arange(2)`: a factory op with no device argument) runs on the default
    device, the CPU, on both sides, as in PyTorch's test_compare_cpu: its output is not expected
    on neuron."""
    leaves, _ = tree_flatten(moved)
    return any((isinstance(v, torch.Tensor) and v.device.type == "neuron")
               or (isinstance(v, torch.device) and v.type == "neuron")
               or (isinstance(v, str) and v.startswith("neuron")) for v in leaves)


def _check_devices(out) -> str:
    """'' if every tensor output is a neuron tensor, else why not."""
    leaves, _ = tree_flatten(out)
    for v in leaves:
        if isinstance(v, torch.Tensor) and v.device.type != "neuron":
            return f"output on {v.device}, expected neuron"
    return ""


def _compare(actual, expected, atol, rtol) -> str:
    """'' if equal within tolerance, else the first line of assert_close's message."""
    try:
        torch.testing.assert_close(tree_map(_to_cpu, actual), expected, atol=atol, rtol=rtol,
                                   equal_nan=True, check_dtype=True, check_layout=False,
                                   check_stride=False)
    except Exception as exc:   # AssertionError or a structure/type mismatch (TypeError)
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        return "mismatch: " + " | ".join(lines[:3])[:200]
    return ""


def _diff_leaves(out) -> list:
    """Float tensor outputs that carry a graph (what backward starts from)."""
    leaves, _ = tree_flatten(out)
    return [i for i, v in enumerate(leaves)
            if isinstance(v, torch.Tensor) and v.requires_grad
            and (v.dtype.is_floating_point or v.dtype.is_complex)]


def _grad_inputs(inp, args, kwargs) -> list:
    leaves, _ = tree_flatten((inp, args, kwargs))
    return [v for v in leaves if isinstance(v, torch.Tensor) and v.requires_grad]


def _noop(*_args) -> None:
    pass


def _run_f64(op, sample, absolute: bool = False):
    """The sample's outputs computed in float64 on the CPU (the ISA-independent reference)."""
    inp, args, kwargs = tree_map(lambda x: _to_f64(x, absolute),
                                 (sample.input, sample.args, sample.kwargs))
    torch.manual_seed(SEED)
    out = sample.output_process_fn_grad(op(inp, *args, **kwargs))
    return out, _grad_inputs(inp, args, kwargs)


def _isa_forward(op, sample, actual, dtype, kind: str) -> str:
    exact, _ = _run_f64(op, sample)
    mag, taps = None, 1
    if kind == "terms":
        with torch.no_grad():
            mag, _ = _run_f64(op, sample, absolute=True)
        w = next((a for a in sample.args if isinstance(a, torch.Tensor)), None)
        taps = int(torch.tensor(w.shape[2:]).prod()) if w is not None and w.dim() > 2 else 1
    return _isa_bound(kind, actual, tree_map(lambda t: t.detach() if isinstance(
        t, torch.Tensor) else t, exact), mag, dtype, taps)


def _isa_backward(op, sample, idx, gouts, grads, dtype, kind: str) -> str:
    exact, inputs = _run_f64(op, sample)
    leaves, _ = tree_flatten(exact)
    ref = torch.autograd.grad([leaves[i] for i in idx], inputs, [g.double() for g in gouts],
                              allow_unused=True)
    if any((g is None) != (r is None) for g, r in zip(grads, ref)):
        return "mismatch: which inputs get a gradient differs from the float64 reference"
    return _isa_bound(kind, [g for g in grads if g is not None],
                      [r for r in ref if r is not None], None, dtype)


def run_sample(op, sample, dtype, do_bwd: bool, atol: float, rtol: float,
               progress=_noop) -> dict:
    """{'fwd': (ok, reason, fallbacks), 'bwd': ...} for one sample; absent phase = not run.

    `progress(phase)` is called before each phase runs on neuron (tools/op_coverage.py uses it to
    name the phase that crashed a worker process).
    """
    result = {}
    # 1. the CPU reference (a sample the CPU rejects is not ours to judge)
    torch.manual_seed(SEED)
    try:
        expected = op(sample.input, *sample.args, **sample.kwargs)
        expected = sample.output_process_fn_grad(expected)
    except Exception:
        return result
    exp_cpu = tree_map(_to_cpu, expected)
    isa = {ph: ISA_SENSITIVE.get((op_id(op), DTYPE_NAMES.get(dtype), ph)) for ph in PHASES}
    # 2. the same on neuron
    progress("fwd")
    inp, args, kwargs = _move_sample(sample, op.name)
    before = _fallback_snapshot()
    torch.manual_seed(SEED)
    try:
        actual = op(inp, *args, **kwargs)
        actual = sample.output_process_fn_grad(actual)
        reason = (_check_devices(actual) if _names_neuron((inp, args, kwargs)) else "") or (
            _isa_forward(op, sample, actual, dtype, isa["fwd"]) if isa["fwd"]
            else _compare(actual, exp_cpu, atol, rtol))
    except Exception as exc:
        actual, reason = None, _short(exc)
    fallbacks = _fallback_delta(before)
    if fallbacks and not reason:
        reason = "fallback: " + ", ".join(sorted(fallbacks))
    result["fwd"] = (not reason, reason, fallbacks)
    if not do_bwd:
        return result
    # 3. backward: same random grad_outputs for every differentiable output, compare input grads
    exp_idx = _diff_leaves(expected)
    cpu_inputs = _grad_inputs(sample.input, sample.args, sample.kwargs)
    if not exp_idx or not cpu_inputs:
        return result
    exp_leaves, _ = tree_flatten(expected)
    torch.manual_seed(SEED + 1)
    gouts = [torch.randn_like(exp_leaves[i].detach()) for i in exp_idx]
    try:
        exp_grads = torch.autograd.grad([exp_leaves[i] for i in exp_idx], cpu_inputs, gouts,
                                        allow_unused=True)
    except Exception:
        return result
    if actual is None:
        result["bwd"] = (False, "forward failed: " + reason, collections.Counter())
        return result
    progress("bwd")
    before = _fallback_snapshot()
    try:
        act_leaves, _ = tree_flatten(actual)
        act_idx = _diff_leaves(actual)
        if act_idx != exp_idx:
            raise RuntimeError(f"differentiable outputs {act_idx} != cpu {exp_idx}")
        n_inputs = _grad_inputs(inp, args, kwargs)
        grads = torch.autograd.grad([act_leaves[i] for i in act_idx], n_inputs,
                                    [g.to("neuron") for g in gouts], allow_unused=True)
        reason = _check_devices([g for g in grads if g is not None]) or (
            _isa_backward(op, sample, exp_idx, gouts, grads, dtype, isa["bwd"]) if isa["bwd"]
            else _compare(list(grads), list(exp_grads), atol, rtol))
    except Exception as exc:
        reason = _short(exc)
    fallbacks = _fallback_delta(before)
    if fallbacks and not reason:
        reason = "fallback: " + ", ".join(sorted(fallbacks))
    result["bwd"] = (not reason, reason, fallbacks)
    return result


def run_op(op, dtypes=DTYPES, max_samples: int | None = MAX_SAMPLES,
           max_numel: int | None = MAX_NUMEL, skip=frozenset(), progress=_noop,
           bwd_dtypes=(torch.float32,), tol=None) -> dict:
    """{(dtype name, phase): Outcome} for one OpInfo.

    `skip` holds (dtype name, phase) pairs not to run (known to crash the process);
    `progress(dtype name, phase, sample index)` is called before each phase runs;
    `bwd_dtypes`: the dtypes whose gradients are compared too; `tol(op, dtype)` -> (atol, rtol)
    replaces `tolerances` (tests/test_opinfo_dtypes.py uses test_compare_cpu's).
    """
    results = {}
    supported = op.supported_dtypes("cpu")
    for dtype in dtypes:
        name = DTYPE_NAMES[dtype]
        if dtype not in supported or (name, "fwd") in skip:
            continue
        do_bwd = dtype in bwd_dtypes and op.supports_autograd and \
            dtype in op.supported_backward_dtypes("cpu") and (name, "bwd") not in skip
        fwd = results[(name, "fwd")] = Outcome()
        bwd = None
        if do_bwd:
            bwd = results[(name, "bwd")] = Outcome()
        atol, rtol = (tol or tolerances)(op, dtype)
        try:
            # NOTE: sample_inputs_func directly: OpInfo.sample_inputs wraps it in a tracker that
            # calls inspect.stack() twice per call (~0.5 s in a deep pytest stack)
            torch.manual_seed(zlib.crc32(f"{op_id(op)} {name}".encode()))
            samples = op.sample_inputs_func(op, "cpu", dtype, do_bwd)
            taken = 0
            for sample in samples:
                if max_samples is not None and taken >= max_samples:
                    break
                if max_numel is not None and _numel(sample) > max_numel:
                    continue
                taken += 1
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    res = run_sample(op, sample, dtype, do_bwd, atol, rtol,
                                     lambda phase: progress(name, phase, taken - 1))  # noqa: B023
                for phase, outcome in (("fwd", fwd), ("bwd", bwd)):
                    if outcome is not None and phase in res:
                        ok, reason, fb = res[phase]
                        outcome.add(ok, reason)
                        outcome.fallbacks.update(fb)
        except Exception as exc:   # the sample generator itself failed: not ours to judge
            if fwd.samples == 0:
                fwd.reason = "sample_inputs failed: " + _short(exc)
        if bwd is not None and bwd.status == "skip":
            del results[(name, "bwd")]
    return results


def adaptive_verdict(opname: str, plain: dict, adaptive: dict, listed: dict) -> list:
    """Where adaptive eager's verdict differs from plain eager's, for one op (messages).

    Each (dtype, phase) must pass in both modes or in neither; `listed` holds the adaptive-only
    gaps allowed to differ (plain passes, adaptive does not), strictly: an entry whose
    triple does not differ in that way fails too, so the list can only shrink."""
    bad = []
    for dt, phase in sorted(set(plain) | set(adaptive)):
        p = plain.get((dt, phase), Outcome())
        a = adaptive.get((dt, phase), Outcome())
        if p.status == "skip" and a.status == "skip":
            continue
        key = (opname, dt, phase)
        gap = p.status == "pass" and a.status != "pass"
        if key in listed:
            if not gap:
                bad.append(f"{opname} {dt} {phase}: listed in ADAPTIVE_XFAIL but adaptive eager "
                           f"now gives plain eager's verdict ({p.status}): remove the entry")
        elif gap:
            bad.append(f"{opname} {dt} {phase}: passes in plain eager, {a.status} in adaptive "
                       f"eager (a bug in adaptive eager): {a.reason}")
        elif a.status == "pass" and p.status != "pass":
            bad.append(f"{opname} {dt} {phase}: passes in adaptive eager but {p.status} in plain "
                       f"eager ({p.reason}): the modes must agree")
    return bad


def verdict(opname: str, results: dict, xfail: dict) -> tuple[list, list]:
    """(unexpected failures, unexpected passes) of one op against the xfail list."""
    bad, fixed = [], []
    for (dt, phase), outcome in sorted(results.items()):
        key = (opname, dt, phase)
        if outcome.status == "fail" and key not in xfail:
            bad.append(f"{opname} {dt} {phase}: {outcome.reason}")
        elif outcome.status == "pass" and key in xfail:
            fixed.append(f"{opname} {dt} {phase}")
    return bad, fixed


# ---------------------------------------------------------------------------------------------
# the sweep engine: ops in worker processes (tools/op_coverage.py --worker), one JSON line per
# event. Two cores do twice the work, and a phase that aborts its process (std::terminate in
# an autograd thread, say) is reported as a crash instead of ending the test session.
# ---------------------------------------------------------------------------------------------

ROOT = os.path.dirname(HERE)
WORKER = os.path.join(ROOT, "tools", "op_coverage.py")
TIMING = ("seconds", "cpu_seconds", "compiles", "compile_seconds")


class Sweep:
    """Run `op_ids` over `jobs` worker processes; results arrive as the workers report.

    >>> sw = Sweep(["add", "mul"], jobs=2, samples=1, max_numel=2 ** 16).start()
    >>> sorted(sw.wait("add"))            # {"float32 fwd": {...}, ...} for one op
    """

    def __init__(self, op_ids, jobs: int, samples, max_numel, skip=(), adaptive=None,
                 timeout: float = 600.0, log=None) -> None:
        self.op_ids = list(op_ids)
        self.jobs = max(1, jobs)
        self.samples, self.max_numel = samples, max_numel
        self.skip = {tuple(k) for k in skip}
        self.adaptive = adaptive       # None: inherit EAGER_NEURON_ADAPTIVE
        self.timeout = timeout
        self.log = log                 # fn(str) for progress lines, or None
        self.results: dict = {}        # op -> {"dtype phase": {status, reason, ...}}
        self.timing: dict = {}         # op -> [wall s, cpu s, compiles, compile s]
        self.crashed: dict = {}        # (op, dtype, phase) -> "crash (...)" | "timeout"
        self._workers: list = []
        self._tmp = None

    # 1. start one worker per shard (interleaved, so results come back roughly in order)
    def start(self) -> "Sweep":
        import tempfile

        self._tmp = tempfile.mkdtemp(prefix="en_opinfo_")
        for i in range(self.jobs):
            queue = self.op_ids[i::self.jobs]
            if queue:
                self._spawn(queue, os.path.join(self._tmp, f"w{i}.jsonl"))
        return self

    def _spawn(self, queue: list, path: str) -> None:
        import subprocess

        env = dict(os.environ)
        if self.adaptive is not None:
            env["EAGER_NEURON_ADAPTIVE"] = "1" if self.adaptive else "0"
        spec = path + ".spec.json"
        with open(spec, "w") as f:
            json.dump({"ops": queue, "skip": sorted(self.skip), "samples": self.samples,
                       "max_numel": self.max_numel}, f)
        open(path, "w").close()
        proc = subprocess.Popen([sys.executable, WORKER, "--worker", path, spec], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # [process, queue, events file, read position, current progress, last event time]
        self._workers.append([proc, queue, path, 0, None, time.time()])

    # 2. read what the workers wrote; restart a worker that died, skipping the phase it was in
    def poll(self) -> bool:
        """Process new events; False once every worker has finished."""
        for w in list(self._workers):
            self._read(w)
            proc, queue, path = w[0], w[1], w[2]
            rc = proc.poll()
            stuck = rc is None and time.time() - w[5] > self.timeout
            if rc is None and not stuck:
                continue
            if stuck:
                proc.kill()
                proc.wait()
            self._read(w)
            self._workers.remove(w)
            if not queue:
                continue
            cur = w[4]
            if cur is not None and cur[0] in queue:
                key = (cur[0], cur[1], cur[2])
                self.crashed[key] = "timeout" if stuck else f"crash (exit code {rc})"
                self.skip.add(key)
                if self.log:
                    self.log(f"{self.crashed[key]} in {' '.join(key)} (sample {cur[3]})")
            else:   # died between ops (or at import): give up on the next op
                key = (queue[0], "float32", "fwd")
                self.crashed[key] = f"crash (exit code {rc}) outside any sample"
                self.results.setdefault(queue.pop(0), {})
            if queue:
                self._spawn(queue, path + ".r")
        return bool(self._workers)

    def _read(self, w) -> None:
        with open(w[2]) as f:
            f.seek(w[3])
            data = f.read()
        end = data.rfind("\n") + 1
        w[3] += len(data[:end].encode())
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            ev = json.loads(line)
            w[5] = time.time()
            if "progress" in ev:
                w[4] = ev["progress"]
                continue
            self.results[ev["op"]] = ev["results"]
            self.timing[ev["op"]] = [ev.get(k, 0) for k in TIMING]
            if ev["op"] in w[1]:
                w[1].remove(ev["op"])
            w[4] = None
            if self.log:
                self.log(f"[{len(self.results)}/{len(self.op_ids)}] {ev['op']} "
                         f"{ev['seconds']:.1f}s")

    def wait(self, op: str | None = None) -> dict | None:
        """Block until `op` has a result (or, with None, until every worker is done)."""
        while (op is None or op not in self.results) and self.poll():
            time.sleep(0.05)
        return self.results.get(op) if op is not None else None

    def crashes_of(self, op: str) -> dict:
        return {k: v for k, v in self.crashed.items() if k[0] == op}

    def stop(self) -> None:
        for w in self._workers:
            if w[0].poll() is None:
                w[0].kill()
                w[0].wait()
        self._workers.clear()


def outcomes_from_json(res: dict) -> dict:
    """{(dtype, phase): Outcome} from a worker's {"dtype phase": {...}}."""
    out = {}
    for key, r in res.items():
        dt, ph = key.split()
        out[(dt, ph)] = Outcome(status=r["status"], reason=r["reason"], samples=r["samples"],
                                passed=r["passed"],
                                fallbacks=collections.Counter(r.get("fallbacks", {})))
    return out


# ---------------------------------------------------------------------------------------------
# the test: one per OpInfo
# ---------------------------------------------------------------------------------------------

_OPS = all_ops()
_XFAIL, _CRASH = load_xfail()
# Adaptive-only gaps: (op, dtype, phase) -> why adaptive eager cannot give plain eager's verdict
# yet. Strict (adaptive_verdict): an entry that no longer differs fails the test. Empty: every
# triple gives the same verdict in both modes.
ADAPTIVE_XFAIL: dict = {}
# EAGER_NEURON_OPINFO_ADAPTIVE=0 skips test_op_adaptive (the second sweep)
ADAPTIVE = os.environ.get("EAGER_NEURON_OPINFO_ADAPTIVE", "1") != "0"
# worker processes for the sweep: 0 runs every op inside the pytest process (for pdb)
JOBS = int(os.environ.get("EAGER_NEURON_OPINFO_JOBS", str(min(os.cpu_count() or 1, 4))))
TIMEOUT = float(os.environ.get("EAGER_NEURON_OPINFO_TIMEOUT", "300"))
# every fallback the sweep met, for the terminal summary (conftest.py prints it)
FALLBACKS_SEEN: collections.Counter = collections.Counter()


@pytest.fixture(scope="session")
def opinfo_sweep(request):
    """The selected test_op cases, run by JOBS worker processes, started on first use."""
    if JOBS == 0:
        yield None
        return
    yield from _session_sweep(request, "test_op", adaptive=False)


@pytest.fixture(scope="session")
def opinfo_sweep_adaptive(request):
    """The same sweep in adaptive eager; started on first use, i.e. after the plain tests ran
    (pytest runs test_op[...] first), so the two sweeps do not share the cores."""
    if JOBS == 0:
        yield None
        return
    yield from _session_sweep(request, "test_op_adaptive", adaptive=True)


def _session_sweep(request, test_name: str, adaptive: bool):
    # the plain sweep also serves test_op_adaptive, which compares against it: its ops run
    # even when only the adaptive tests are selected (`-k adaptive`)
    names = (test_name,) if adaptive else (test_name, "test_op_adaptive")
    ops = [item.callspec.params["op"] for item in request.session.items
           if getattr(item, "originalname", None) in names and hasattr(item, "callspec")
           and item.module is sys.modules[__name__]]
    ids = list(dict.fromkeys(op_id(op) for op in ops if comparable(op)))
    sweep = Sweep(ids, JOBS, MAX_SAMPLES, MAX_NUMEL, skip=_CRASH, adaptive=adaptive,
                  timeout=TIMEOUT).start()
    yield sweep
    sweep.stop()


def _sweep_results(sweep, name: str) -> dict:
    """{(dtype, phase): Outcome} of one op from a sweep, crashes as failures."""
    results = outcomes_from_json(sweep.wait(name) or {})
    for (o, dt, ph), how in sweep.crashes_of(name).items():
        results[(dt, ph)] = Outcome(
            status="fail", reason=f"{how}: the process aborted; if it cannot be fixed now, "
            f"list it as '{o} {dt} {ph} crash'")
    return results


def _run_in_process(op, adaptive: bool) -> dict:
    name = op_id(op)
    skip = {(dt, ph) for (o, dt, ph) in _CRASH if o == name}
    from eager_neuron.adaptive import MODULE as ad

    prev = ad.STATE.enabled
    ad.set_adaptive(adaptive)
    try:
        return run_op(op, skip=skip)
    finally:
        ad.set_adaptive(prev)


@pytest.mark.opinfo
@pytest.mark.parametrize("op", _OPS, ids=[op_id(op) for op in _OPS])
def test_op(op, opinfo_sweep):
    name = op_id(op)
    if not comparable(op):
        pytest.skip("output is not a function of the inputs (uninitialised memory or storage "
                    "outside the sample's view)")
    if opinfo_sweep is None:
        results = _run_in_process(op, adaptive=False)
    else:
        results = _sweep_results(opinfo_sweep, name)
    for outcome in results.values():
        FALLBACKS_SEEN.update(outcome.fallbacks)
    bad, fixed = verdict(name, results, _XFAIL)
    msg = []
    if bad:
        msg.append("failures not in tests/opinfo_xfail.txt:\n  " + "\n  ".join(bad))
    if fixed:
        msg.append("now passing: remove from tests/opinfo_xfail.txt (strict xfail):\n  "
                   + "\n  ".join(fixed) + "\n(or: .venv/bin/python tools/op_coverage.py "
                   f"--update-xfail --ops '^{re.escape(name)}$')")
    if msg:
        pytest.fail("\n".join(msg), pytrace=False)
    if not any(o.status == "pass" for o in results.values()):
        if any(o.status == "fail" for o in results.values()):
            first = min(o.reason for o in results.values() if o.status == "fail")
            pytest.xfail(f"every phase is a listed failure, e.g. {first[:70]}")
        pytest.skip("no sample ran: " + ("; ".join(
            f"{dt} {ph}: {o.reason or 'no supported sample'}" for (dt, ph), o in results.items())
            if results else "no dtype of float32/int64/bool/bfloat16 supported"))


@pytest.mark.opinfo
@pytest.mark.skipif(not ADAPTIVE, reason="EAGER_NEURON_OPINFO_ADAPTIVE=0")
@pytest.mark.parametrize("op", _OPS, ids=[op_id(op) for op in _OPS])
def test_op_adaptive(op, opinfo_sweep, opinfo_sweep_adaptive):
    """Adaptive eager gives plain eager's verdict on every (dtype, phase) of the op."""
    name = op_id(op)
    if not comparable(op):
        pytest.skip("output is not a function of the inputs")
    if opinfo_sweep_adaptive is None:
        plain, adaptive = _run_in_process(op, False), _run_in_process(op, True)
    else:
        plain = _sweep_results(opinfo_sweep, name)
        adaptive = _sweep_results(opinfo_sweep_adaptive, name)
    bad = adaptive_verdict(name, plain, adaptive, ADAPTIVE_XFAIL)
    if bad:
        pytest.fail("adaptive eager differs from plain eager:\n  " + "\n  ".join(bad),
                    pytrace=False)
    if not any(o.status == "pass" for o in adaptive.values()):
        pytest.skip("no phase passes in either mode (see tests/opinfo_xfail.txt)")


def test_xfail_list_names_real_ops():
    """Every listed op exists in op_db (a renamed OpInfo must not leave a dead entry)."""
    names = {op_id(op) for op in _OPS}
    unknown = sorted({k[0] for k in list(_XFAIL) + list(_CRASH) + list(ADAPTIVE_XFAIL)} - names)
    assert not unknown, f"tests/opinfo_xfail.txt or ADAPTIVE_XFAIL name ops not in op_db: {unknown}"
