"""Adaptive eager's fast path: a repeat of a recorded elementwise call records without the funnel.

(Over 500 lines on purpose: the generators of four kinds of recording runner (elementwise,
call, foreach, declined) share one signature and namespace scheme.)

The plain-eager fast path (eager_neuron/fastpath.py) leaves a runner per (overload, argument
signature) that launches the kernel; under adaptive eager nothing launches per op, so its
runners never run. Here the first recorded call of a signature leaves a *recording runner*:

    unwrap -> allocate the output -> adaptive.record(the same node) -> wrap

with everything the slow path computed for that signature fixed in it (the template's
expression, operand kinds, casts, store), so a repeat call skips classification, schema
binding, meta execution and the elementwise analysis. What stays per call is what can change
between calls of one signature: the buffers (record() finds them in the group, pins them and
checks their overlaps: the trace guard) and the scalars' values. A call the runner cannot take
(another thread's group pending, an operand sharing the written tensor's memory) goes the slow
way. Only the elementwise family on flat operands is learned, never an op that can fault.

>>> import torch, eager_neuron
>>> from eager_neuron import adaptive_fast
>>> x = torch.ones(8, device="neuron")
>>> with eager_neuron.adaptive():
...     for _ in range(3):
...         x = x * 2
...     v = x.sum().item()
>>> v, adaptive_fast.COUNTERS["hits"] >= 1
(64.0, True)
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from . import adaptive as _ad
from . import adaptive_calls as _calls
from . import fastpath as _fp
from . import fastpath_capture as _capture
from . import fastpath_foreach as _foreach
from .blas import blas_threads as _blas_threads
from .config import config
from .launch import HOOKS as _LAUNCH_HOOKS
from .operands import spans as _op_spans
from .tensor import NeuronTensor

TABLES: dict = {}       # func -> (values_matter, {signature: runner})
# batched: foreach elements; light: calls run as plain eager instead of starting a light group
# quiet: host or data-dependent ops run by plain eager's runner while nothing is pending
# plain: plain eager's runners run() took for views and non-fusible ops (while a group is
# pending somewhere: else dispatch takes them itself, see IDLE_PLAIN)
COUNTERS = {"hits": 0, "call_hits": 0, "learned": 0, "batched": 0, "light": 0, "quiet": 0,
            "plain": 0}
_MISS = _fp.MISS
_PENDING = _ad.PENDING
_STATE = _ad.STATE
_PLAN_MOD: list = [None]


def run(func, args, kwargs):
    """dispatch(): the recording runner for this call, or plain eager's runner for a view or
    a non-fusible kernel op (after this thread's group launches), or MISS (the slow path)."""
    if not config.fastpath or config.log or config.cache_verify or _LAUNCH_HOOKS:
        return _MISS
    tab = TABLES.get(func)
    if tab is not None:
        sig = _fp.signature(args, kwargs, tab[0])
        runner = tab[1].get(sig) if sig is not None else None
        if runner is not None:
            if _PENDING:
                key = _SK()
                if len(_PENDING) > 1 or key not in _PENDING:
                    # as dispatch's gate: another thread's group touching this call's
                    # memory launches first
                    _ad.flush_others(_op_spans(args, kwargs))
                    if key not in _PENDING and _runs_plain(runner.sids):
                        return _plain(func, args, kwargs, runner)
            elif _runs_plain(runner.sids):
                prun = runner.plain
                if prun is not None:
                    COUNTERS["light"] += 1
                    return prun(args, kwargs)
                return _plain(func, args, kwargs, runner)
            return runner(args, kwargs)
    kind = _KINDS.get(func)
    if kind is None:
        kind = _kind_of(func)
    if kind is _FOREACH:
        runner = _learn_foreach(func, args, kwargs)
        if runner is None:
            return _MISS
        if _PENDING:
            key = _SK()
            if len(_PENDING) > 1 or key not in _PENDING:
                _ad.flush_others(_op_spans(args, kwargs))
        return runner(args, kwargs)
    if kind is _QUIET:
        # a host or data-dependent op while no group is pending anywhere: adaptive eager has
        # nothing to add (nothing to launch first, nothing to record), plain eager's runner
        if _PENDING:
            return _MISS
        sig, runner = _plain_runner(func, args, kwargs)
        if runner is None:
            return _MISS
        COUNTERS["quiet"] += 1
        return runner(args, kwargs)
    if kind is _SLOW:
        ptab = _fp.TABLES.get(func)
        if ptab is None:
            return _MISS
        sig = _fp.signature(args, kwargs, ptab[0])
        if sig is None:
            return _MISS
        reason = _DECLINED.get((func, sig))
        runner = ptab[1].get(sig) if reason is not None else None
        if runner is None:
            # the slow path may record it; if its lowering launches instead, for a reason its
            # signature decides (adaptive.flush sees the reason: arm() set ctx.watch), a
            # repeat comes here
            return _MISS
        if reason is _EMPTY_OUTPUT:   # touches no memory: every group stays pending
            COUNTERS["plain"] += 1
            return runner(args, kwargs)
        # declined before: what the slow path does, without it (the group launches, then
        # plain eager's runner)
        if _PENDING:
            key = _SK()
            if len(_PENDING) > 1 or key not in _PENDING:
                _ad.flush_others(_op_spans(args, kwargs))
            _ad.flush(reason)
        return runner(args, kwargs)
    sig, runner = _plain_runner(func, args, kwargs)
    if runner is None:
        return _MISS
    if kind is _REDUCE:
        # (_declined reads only what the signature fixes: dtypes, shapes, strides, dims)
        declined = _REDUCE_DECLINED.get((func, sig))
        if declined is None:
            declined = _declined(args, kwargs)
            if len(_REDUCE_DECLINED) < 100_000:
                _REDUCE_DECLINED[(func, sig)] = declined
        if not declined:
            return _MISS   # the slow path may record it (a whole-tensor sum/mean)
    if _PENDING and kind is not _VIEW:
        # as dispatch's gate: another thread's group touching this call's memory launches
        # first; this thread's group launches before a non-fusible op (a view op reads and
        # writes no memory: the ops using the view are gated themselves)
        key = _SK()
        if len(_PENDING) > 1 or key not in _PENDING:
            _ad.flush_others(_op_spans(args, kwargs))
        if key in _PENDING:
            _ad.flush(f"non-fusible op {_NAMES[func]}")
    COUNTERS["plain"] += 1
    return runner(args, kwargs)


_SK = _ad.stream_key
_DECLINED = _ad.DECLINED
_LIGHT = _ad.LIGHT
_light = _ad.light
_ALONE_ON = _ad.ALONE_ON
_alone = _ad.alone
_ALONE_COUNTS = _ad.ALONE_COUNTS


def _runs_plain(sids) -> bool:
    """Would the op start a group that holds it alone (adaptive.ALONE: counted) or that stays
    light (adaptive.LIGHT_NUMEL)? Then plain eager's runner runs it."""
    if _ALONE_ON[0] and _alone(sids):
        _ALONE_COUNTS["adaptive_alone"] += 1
        return True
    return bool(_LIGHT) and _light(sids)
_SKIP = __import__("threading").local()   # .args: the call run() sent to the slow path unrecorded


def _plain_runner(func, args, kwargs) -> tuple:
    """(plain eager's signature of this call, its runner), or (None, None) when it has none."""
    ptab = _fp.TABLES.get(func)
    if ptab is None:
        return None, None
    sig = _fp.signature(args, kwargs, ptab[0])
    return sig, (ptab[1].get(sig) if sig is not None else None)


def _plain(func, args, kwargs, runner):
    """An op that would start a light group (nothing pending on this stream, other streams'
    groups touching its memory launched): plain eager's runner for its signature (kept on the
    recording `runner`, whose signature fixes it: both tables are reset together), or the slow
    path told not to record it (it launches as plain eager does and leaves that runner)."""
    _sig, prun = _plain_runner(func, args, kwargs)
    if prun is not None:
        COUNTERS["light"] += 1
        if _fp.TABLES[func][0] == TABLES[func][0]:   # (the same signature keys both)
            runner.plain = prun
        return prun(args, kwargs)
    if _KINDS.get(func) is not _FOREACH:   # (a foreach op's elements come back one by one)
        _SKIP.args = args
    return _MISS


def skipped(args) -> bool:
    """dispatch's _kernel_setup: did run() send this call to the slow path not to be recorded
    (see _plain)? Asked once per call, which clears it."""
    mine = getattr(_SKIP, "args", None)
    if mine is None:
        return False
    _SKIP.args = None
    if mine is args:
        COUNTERS["light"] += 1
        return True
    return False
# what run() does with an op that has no recording runner, per overload (see _kind_of)
_SLOW, _VIEW, _KERNEL, _REDUCE, _FOREACH = "slow", "view", "kernel", "reduce", "foreach"
_QUIET = "quiet"
_KINDS: dict = {}
_NAMES: dict = {}
# the overloads run() sends to plain eager's runner whenever no group is pending anywhere (a
# view, a host or data-dependent op, a non-fusible kernel op): dispatch takes plain eager's
# fast path for them itself then (run() would only find the same runner, later)
IDLE_PLAIN: set = set()
# the view overloads among them: a view reads and writes no memory (the ops using it are gated
# themselves), so dispatch takes plain eager's view runner for them even while a group is
# pending (run() would only find the same runner, ~2.5 us later)
VIEWS: set = set()


_EMPTY_OUTPUT = "empty output"


def _host_composites() -> frozenset:
    # NOTE: read from sys.modules: lower/host imports (through the cast family) this module
    return sys.modules[__package__ + ".lower.host"].COMPOSITES


def _watched_sig(func, args, kwargs) -> tuple:
    """(plain eager's table for func or None, this call's signature in it) for DECLINED: with
    no table yet, scalars keyed by value (the table learned from the call may key them by type,
    and the next decline is remembered under that signature)."""
    ptab = _fp.TABLES.get(func)
    return ptab, _fp.signature(args, kwargs, ptab[0] if ptab is not None else True)


def declined_empty(func, args, kwargs) -> bool:
    """dispatch's _kernel_setup: a fusible op whose every output is empty computes nothing;
    remember its plain signature (DECLINED, reason _EMPTY_OUTPUT) so run() sends repeats to
    plain eager's runner, learned from this call, without launching any group (they took the
    slow path on every call: 25-40 us, 4-8 a GPT-2/T5 step). False: no signature."""
    if not config.fastpath:
        return False
    _ptab, sig = _watched_sig(func, args, kwargs)
    if sig is None:
        return False
    if len(_DECLINED) < 100_000:
        _DECLINED[(func, sig)] = _EMPTY_OUTPUT
    return True


def _kind_of(func):
    """_SLOW: the slow path always (it may record the op); _QUIET: a host or data-dependent
    op, plain eager's runner while no group is pending anywhere; _VIEW: a view op; _KERNEL: a
    non-fusible kernel op (this thread's group launches, then plain eager's runner);
    _REDUCE: sum/mean, plain eager's runner when _declined says the group cannot take it."""
    plans = _PLAN_MOD[0]
    if plans is None:
        # NOTE: eager_neuron.plan is loaded before any op runs; read from sys.modules, not
        # imported, because plan imports the lowerings, which import this module
        plans = _PLAN_MOD[0] = sys.modules[__package__ + ".plan"]
    plan = plans._PLANS.get(func)
    if plan is None:
        return _SLOW   # not planned yet: the slow path plans it (asked again next time)
    kind = _SLOW
    if plan.kind == "view" or plan.kind == "alloc":
        # (an allocation, empty_like / new_empty, reads and writes no memory either: plain
        # eager's runner even while a group is pending, as for a view; it took the slow path
        # on every call, 26 us against 5.5, 11 a UNet step)
        kind = _VIEW
    elif plan.kind == "host" and plan.name in _host_composites():
        # its device work goes down the funnel as ops of their own, each gated (recorded, or
        # launched after the group): its runner may run with a group pending, as a view's
        kind = _VIEW
    elif plan.kind in ("host", "dynamic"):
        kind = _QUIET
    elif plan.kind == "foreach":
        from .lower.foreach import _per_tensor_op

        try:
            per = _per_tensor_op(func)[0]
        except NotImplementedError:
            per = None
        if isinstance(per, torch._ops.OpOverload):
            kind = _FOREACH
    elif plan.kind == "kernel" and plan.lower not in plans.fusible_lowerings():
        reduction = _ad.REDUCTIONS.get(plan.name)
        if reduction is None:
            kind = _KERNEL
        elif reduction != "call" and func in _REDUCTION_ARGS:
            kind = _REDUCE
    _NAMES[func] = plan.name
    _KINDS[func] = kind
    if kind is _VIEW or kind is _QUIET or kind is _KERNEL:
        IDLE_PLAIN.add(func)
    if kind is _VIEW:
        VIEWS.add(func)
    return kind


_REDUCE_DECLINED: dict = {}  # (func, plain signature) -> _declined's answer
_FOREACH_FAILED: dict = {}   # (func, signature) -> failed attempts to learn a foreach runner


def _learn_foreach(func, args, kwargs):
    """A foreach op (an optimizer's `_foreach_*` update) whose elements all have recording
    runners: the runner calling them in turn (learned on the fly, kept per signature), as
    lower/foreach.py's loop would send the elements down the funnel; None: the slow path."""
    from .lower.foreach import _per_tensor_op

    per, spec, _returns = _per_tensor_op(func)
    tab = TABLES.get(per)
    if tab is None or not args or not isinstance(args[0], (list, tuple)):
        return None
    values = tab[0]
    sig = _fp.signature(args, kwargs, values)
    if sig is None:
        return None
    ftab = TABLES.get(func)
    if ftab is not None and ftab[0] == values:
        run = ftab[1].get(sig)
        if run is not None:
            return run
    if _FOREACH_FAILED.get((func, sig), 0) >= 2 or len(_FOREACH_FAILED) > 10_000:
        return None
    found = _foreach.element_runners(spec, args, kwargs, tab, values)
    if found is None:
        _FOREACH_FAILED[(func, sig)] = _FOREACH_FAILED.get((func, sig), 0) + 1
        return None
    n, pos, kw, runners = found
    plans = _PLAN_MOD[0]
    plan = plans._PLANS.get(func) if plans is not None else None
    if plan is None:
        return None
    from torch.autograd.graph import increment_version

    from .stats import STATS

    ns = {"R": tuple(runners), "N": n, "S": STATS, "MISS": _MISS, "PER": per,
          "D": sys.modules[__package__ + ".tensor"]._dispatch, "incv": increment_version}
    lines = _foreach_lines(func, plan, args, spec, pos, kw, runners, ns)
    if lines is None:
        lines = _foreach.runner_lines(func, plan, args, kwargs, spec, pos, kw)
    runner = _fp._build(plan.name, lines, ns)
    runner.sids = tuple({sid for r in runners for sid in getattr(r, "sids", (None,))})
    runner.plain = None
    with _fp._LOCK:
        ftab = TABLES.get(func)
        if ftab is None:
            ftab = TABLES[func] = (values, {})
        if ftab[0] == values and len(ftab[1]) < _fp.LIMIT:
            ftab[1][sig] = runner
            COUNTERS["learned"] += 1
    return runner


def _foreach_lines(func, plan, args, spec, pos, kw, runners, ns):
    """The body of a runner for an in-place foreach op whose every element has an in-place
    recording runner of one structure (`_Rec`): it records all the elements with one
    `adaptive.record_flat_many` call (what each element runner would record, in order), after
    checking every element as the element runners do (nothing is recorded when one needs the
    slow path). None: another kind of foreach op (the element runners run in turn)."""
    if not plan.mutates or any(plan.ret_alias):
        return None
    recs = [getattr(r, "rec", None) for r in runners]
    r0 = recs[0]
    if r0 is None or any(r is None or r.shape() != r0.shape() for r in recs):
        return None
    kwmap = dict(item.split(": ", 1) for item in kw)

    def tr(ref: str) -> str:   # an element runner's reference -> this call's expression
        def sub(m):
            if m.group(1) is not None:
                return pos[int(m.group(1))]
            return kwmap.get(m.group(2), f"kwargs[{m.group(2)}]")
        return _foreach._REF.sub(sub, ref)

    ns.update(RECM=_ad.record_flat_many, FNP=_fp.flat_np, F=COUNTERS, IDX=r0.index,
              FACTS=tuple(r.facts for r in recs), **r0.consts)
    w = tr(r0.written)
    lines = [f"A{j} = args[{j}]" for j, (is_list, _s, _n) in enumerate(spec[:len(args)])
             if is_list]
    # ATen's partial-overlap check on each written tensor, as each element runner makes it
    checks = [f"{tr(t)}._block is W._block" for t in r0.tensors if t != r0.written]
    if checks:
        lines += ["for i in range(N):", f"    W = {w}", f"    if {' or '.join(checks)}:",
                  "        return MISS"]
    ops = ", ".join(f"(FNP({tr(t)}), {tr(t)}._data, {tr(t)}._block)" for t in r0.tensors)
    scal = "".join(tr(x) + ", " for x in r0.scalars)
    lines += [f"RECM([(FACTS[i], (FNP({w}), {w}._data, {w}._block), [{ops}], ({scal})) "
              "for i in range(N)], IDX)",
              "S.ops += N", "F['hits'] += N", "F['batched'] += N"]
    for j, ((is_list, _s, _n), schema_arg) in enumerate(zip(spec, func._schema.arguments)):
        if is_list and j < len(args) and schema_arg.name in plan.mutates:
            lines.append(f"incv(A{j})")
    lines.append("return None")
    return lines


# sum/mean overloads run() may decline for the group: their (dim, dtype) argument positions
_REDUCTION_ARGS = {torch.ops.aten.sum.default: (None, 1), torch.ops.aten.mean.default: (None, 1),
                   torch.ops.aten.sum.dim_IntList: (1, 3), torch.ops.aten.mean.dim: (1, 3)}


def _declined(args, kwargs) -> bool:
    """Surely not recorded by adaptive.try_record_reduction (which takes only a whole-tensor
    sum/mean of a dtype in adaptive._TORCH_FLOAT (none today) of a contiguous tensor of more
    than one element, no dtype argument): its output has more than one element, or the operand
    does not qualify. False: maybe."""
    if not args or type(args[0]) is not NeuronTensor or len(args) > 4:
        return False
    x = args[0]
    if x.dtype not in _ad._TORCH_FLOAT or x.numel() <= 1 or not x.is_contiguous():
        return True
    if kwargs.get("dtype") is not None or (len(args) > 3 and args[3] is not None):
        return True
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if not dim:
        return False   # every element (dim None or [])
    nd = x.dim()
    try:
        reduced = {d % nd for d in dim} if nd else set()
    except TypeError:
        return False
    kept = 1
    for d, n in enumerate(x.shape):
        if d not in reduced:
            kept *= n
    return kept != 1


def arm(ctx, func, plan, args, kwargs, index, a, outs, leaves, learnable: bool) -> None:
    """dispatch's adaptive block (`_kernel_setup`), for an op adaptive eager may record (a
    fusible op, or a joinable one: adaptive.REDUCTIONS): fill its OpContext so that
    - `learn` / `learn_call` can leave a recording runner if the lowering records the call
      (ctx.call: the call as the slow path has it);
    - a decline reason `adaptive.flush` sees while a fusible op is lowered is remembered for
      its plain fast-path signature (ctx.watch), so run() sends a repeat to plain eager's
      runner; when that signature has no plain runner yet and the op may be learned
      (`learnable`: dispatch's conditions for plain eager's capture), flush also arms the
      capture of the op's own launches, after the group launched, so the funnel leaves that
      runner (an adaptive-only process never had one: a broadcast `add` took the whole slow
      path on every call, ~100 us in a UNet step)."""
    fusible = ctx.recording
    # an elementwise op learn() may learn, or a joinable op (never fusible) learn_call may
    if (fusible and plan.prepare is not None) or (not fusible and func in _CALLS):
        ctx.call = (func, plan, args, kwargs, index, a, outs, leaves)
    if (fusible or func in _CALLS) and config.fastpath:
        ptab, sig = _watched_sig(func, args, kwargs)
        if sig is not None:
            ctx.watch = (func, sig, fusible and learnable and
                         (ptab is None or sig not in ptab[1]))


def learn(out, spec, kinds: tuple, numel: int, op_name: str, ctx) -> None:
    """lower_elementwise, right after it recorded op `op_name` whose output is `out` (flat
    operands, `spec` its armed _Spec; `ctx` the op's context): leave the recording runner for
    its signature."""
    call = ctx.call
    ctx.call = None
    if call is None or call[6][0] is not out or not config.fastpath:
        return
    func, plan, args, kwargs, index, a, outs, leaves = call
    tab = TABLES.get(func)
    if tab is not None and len(tab[1]) >= _fp.LIMIT:
        return
    if plan.out_args or len(outs) != 1 or spec.faults or spec.special:
        return
    facts = plan.lower.fast_facts(func, a, outs)
    if facts is None:
        return
    values = facts[2]
    sig = _fp.signature(args, kwargs, values)
    if sig is None:
        return
    stypes = tuple(bool if isinstance(a[nm], bool) or a[nm] is None else type(a[nm])
                   for nm in spec.scalars)
    ns = {"RECF": _ad.record_flat, "FNP": _fp.flat_np, "PENDING": _PENDING,
          "SK": _ad.stream_key, "NT": NeuronTensor,
          "MISS": _MISS, "IDX": index, "F": COUNTERS, "SIM": _fp.SIM,
          "STATIC": (op_name, spec.expr, kinds, spec.loads, spec.scalar_casts,
                     spec.store), "NUMEL": numel,
          "SID": _ad.static_id(op_name, spec.expr, kinds, spec.loads, spec.scalar_casts,
                               spec.store, None, numel, stypes)}
    # (run() launched every other stream's group touching this call's memory)
    lines = []
    # 1. operands: each tensor's host buffer as a flat numpy array, with its block
    refs = []
    for nm in spec.tensors:
        ref = _fp._ref(func, args, kwargs, nm)
        v = a[nm]
        if ref is None or type(_fp._eval(ref, args, kwargs)) is not NeuronTensor:
            return
        refs.append((ref, ".reshape(-1)" if v.dim() != 1 else ""))
    # 2. scalars: the call's values (types fixed by the signature)
    svals = []
    for j, nm in enumerate(spec.scalars):
        v = a[nm]
        ref = _fp._ref(func, args, kwargs, nm)
        if not isinstance(v, (bool, int, float)) and v is not None:
            return
        if ref is None or v is None:
            ns[f"C{j}"] = bool(v) if (isinstance(v, bool) or v is None) else v
            svals.append(f"C{j}")
        else:
            svals.append(ref)
    # 3. the output: the written argument (in-place) or a fresh buffer
    target = plan.ret_alias[0] if plan.ret_alias else None
    if target is not None:
        wref = _fp._ref(func, args, kwargs, target)
        if wref is None or type(_fp._eval(wref, args, kwargs)) is not NeuronTensor:
            return
        lines.append(f"W = {wref}")
        for ref, _flat in refs:
            if ref != wref:
                # ATen's partial-overlap check on the written tensor: the slow path makes it
                lines.append(f"if {ref}._block is W._block: return MISS")
        lines += ["data = W._data", "block = W._block"]
        ret = "return W"
    else:
        shape, stride, dtype = leaves[0]
        ns.update(SHAPE=shape, STRIDE=stride, DT=dtype)
        lines += _fp._alloc_lines(ns, outs[0], index)
        ret = _fp._wrap_lines(ns, lines, index)
    out_flat = ".reshape(-1)" if len(outs[0].shape) != 1 else ""
    if target is not None:
        out_np = "FNP(W)"
    elif any(ln.startswith("out_np") for ln in lines):
        out_np = "out_np"
    else:
        out_np = f"data.numpy(){out_flat}"
    # operands: their flat numpy views, cached on the tensors (fastpath.flat_np: a view, never
    # a copy, for these flat operands)
    ops = ", ".join(f"(FNP({r}), {r}._data, {r}._block)" for r, _fl in refs)
    # per operand, then the output: the (length, stride, dtype) part of its buffer key
    tails = []
    for arr in [a[nm].numpy().reshape(-1) for nm in spec.tensors] + [outs[0].numpy().reshape(-1)]:
        tails.append((arr.shape[0], arr.strides[0] if arr.shape[0] > 1 else 0, arr.dtype))
    ns["TAILS"] = tuple(tails)
    # a fresh output from the host heap (not the pool, which hands out memory a block-less
    # view in the group may still see) overlaps nothing: record() skips its overlap search
    fresh = target is None and not any(ln.startswith("data, block = alloc(") for ln in lines)
    lines += [f"RECF(*STATIC, ({out_np}, data, block), [{ops}], "
              f"({''.join(s + ', ' for s in svals)}), NUMEL, IDX, SID, TAILS, {fresh})",
              "F['hits'] += 1", ret]
    runner = _fp._build(plan.name, lines, ns)
    runner.sids = (ns["SID"],)
    runner.plain = None   # plain eager's runner of this signature, once _plain found it
    if target is not None:
        # what a foreach runner needs to record this element itself (_foreach_lines)
        runner.rec = _Rec(ns["STATIC"][:6] + (numel, ns["SID"], ns["TAILS"]), index, wref,
                          tuple(r for r, _fl in refs), tuple(svals),
                          {k: v for k, v in ns.items() if k[:1] == "C" and k[1:].isdigit()})
    with _fp._LOCK:
        tab = TABLES.get(func)
        if tab is None:
            tab = TABLES[func] = (values, {})
        if tab[0] == values and len(tab[1]) < _fp.LIMIT:
            tab[1][sig] = runner
            COUNTERS["learned"] += 1


class _Rec:
    """An in-place recording runner's fixed facts: record_flat's static arguments (op, expr,
    kinds, loads, scalar casts, store, numel, static id, buffer-key tails), its core, and the
    source text of its written tensor, tensor operands and scalars in the runner, with the
    constants those name."""

    __slots__ = ("facts", "index", "written", "tensors", "scalars", "consts")

    def __init__(self, facts, index, written, tensors, scalars, consts) -> None:
        self.facts, self.index, self.written = facts, index, written
        self.tensors, self.scalars, self.consts = tensors, scalars, consts

    def shape(self) -> tuple:
        return (self.index, self.written, self.tensors, self.scalars, repr(self.consts))


# ---------------------------------------------------------------------------------------------
# joined calls (adaptive_calls.py): a repeat stages its launches on this call's buffers
# ---------------------------------------------------------------------------------------------

# the joinable ops whose lowering the plain fast path may replay from captured launches
# (fastpath_capture.CAPTURED: reviewed to act on the device only through launch())
_CALLS = {f for n, f in _calls.JOINABLE.items() if n.split(".")[0] in _capture.CAPTURED}


def learn_call(name: str, a: dict, outs: list, staged: list, sids: tuple, core: int,
               ctx) -> None:
    """adaptive.record_call, right after op `name` joined the group with launches `staged`
    (`ctx` the op's context, armed by `arm`): leave a recording runner for its signature that
    allocates the output, re-derives each staged array from this call's buffers (as
    fastpath_capture derives a captured launch's) and joins the launches to the group
    (adaptive.join_calls) with the guards found now."""
    call = ctx.call
    ctx.call = None
    if call is None or not config.fastpath or len(outs) != 1:
        return
    func, args, kwargs = call[0], call[2], call[3]
    if func not in _CALLS or _calls.JOINABLE.get(name) is not func:
        return
    # the call armed in run() is this one: every neuron operand's host view is one of `a`'s
    datas = {id(v) for v in a.values() if isinstance(v, torch.Tensor)}
    # (a list of numbers, a sum's dims, is fixed by the signature, which keys their values)
    inputs = []
    for i, v in enumerate(args):
        if type(v) is NeuronTensor:
            inputs.append((f"args[{i}]", v))
        elif isinstance(v, torch.Tensor) or _holds_tensors(v):
            return
    for k, v in kwargs.items():
        if type(v) is NeuronTensor:
            inputs.append((f"kwargs[{k!r}]", v))
        elif isinstance(v, torch.Tensor) or _holds_tensors(v):
            return
    if not inputs or any(id(v._data) not in datas or v._index != core for _r, v in inputs):
        return
    if len(datas) != len(inputs):
        return
    plans = sys.modules[__package__ + ".plan"]
    plan = plans._PLANS.get(func)
    if plan is None or any(plan.ret_alias) or plan.out_args:
        return
    tab = TABLES.get(func)
    if tab is not None and len(tab[1]) >= _fp.LIMIT:
        return
    sig = _fp.signature(args, kwargs, True)
    if sig is None:
        return
    out = outs[0]
    ns = {"JOIN": _ad.join_calls, "PENDING": _PENDING, "SK": _ad.stream_key, "NT": NeuronTensor,
          "MISS": _MISS, "IDX": core, "F": COUNTERS, "C": _calls.COUNTERS, "SIM": _fp.SIM,
          "FULL": _fp.full_np, "ndarray": np.ndarray, "NAME": name, "SIDS": sids,
          "SHAPE": tuple(out.shape), "STRIDE": out.stride(), "DT": out.dtype}
    lines = _fp._alloc_lines(ns, out, core)
    lines.append("O = data_np" if "NPDT" in ns else "O = data.numpy()")
    # sources: the output and the operands, each with its address expression
    sources = [("O", out.numpy(), "data.data_ptr()")]
    for j, (ref, v) in enumerate(inputs):
        sources.append((f"I{j}", v._data.numpy(), f"{ref}._data.data_ptr()"))
        lines.append(f"I{j} = FULL({ref})")
    spans = sorted(_capture._span(arr) for _e, arr, _p in sources if arr.size)
    if any(x[1] > y[0] for x, y in zip(spans, spans[1:])):
        return   # operands sharing memory: which one the lowering read cannot be told apart
    for e, _arr, pexpr in sources:
        lines.append(f"P{e} = {pexpr}")
    pairs = []   # per staged array: its span, as source pointer + offsets
    launches = []
    for n, st in enumerate(staged):
        key, render, sargs, flops, nbytes, engine, dclass = st
        exprs = []
        for m, x in enumerate(sargs):
            if type(x) is not np.ndarray:
                if not isinstance(x, (bool, int, float, np.generic)):
                    return
                ns[f"C{n}_{m}"] = x
                exprs.append(f"C{n}_{m}")
                continue
            if x.base is None:
                # a small host array the lowering made (adaptive_calls.Stager copied it): each
                # join gets its own copy, as each slow join does
                if x.nbytes > 4096:
                    return
                ns[f"SN{n}_{m}"] = x.copy()
                exprs.append(f"SN{n}_{m}.copy()")
                continue
            e = _capture._array_expr(x, [(se, sa) for se, sa, _p in sources], ns, f"{n}_{m}")
            if e is None:
                return
            lo, hi = _calls._extent(x.__array_interface__["data"][0], x.shape, x.strides,
                                    x.itemsize)
            exprs.append(e)
            if hi <= lo:
                continue
            for se, sa, _p in sources:
                base = sa.__array_interface__["data"][0]
                slo, shi = _capture._span(sa)
                if slo <= lo and hi <= shi:
                    pairs.append(f"(P{se} + {lo - base}, P{se} + {hi - base})")
                    break
            else:
                return
        ns.update({f"K{n}": key, f"R{n}": render, f"E{n}": (flops, nbytes, engine, dclass)})
        launches.append(f"(K{n}, R{n}, ({''.join(x + ', ' for x in exprs)}), *E{n})")
    if name in _calls._MATMUL:
        # the BLAS thread count the lowering sets per product (eager_neuron/blas.py)
        ns["BT"] = _blas_threads
        lines.append(f"BT({float(staged[0][3] / (out.shape[0] if out.dim() == 3 else 1))!r})")
    pins = [f"{ref}._block" for ref, _v in inputs] + ["block"]
    lines += [f"JOIN(NAME, ({''.join(x + ', ' for x in launches)}), "
              f"[{', '.join(pairs)}], ({', '.join(pins)},), SIDS, IDX)",
              f"C['staged'] += {len(staged)}"]
    ret = _fp._wrap_lines(ns, lines, core)
    lines += ["F['call_hits'] += 1", ret]
    runner = _fp._build(plan.name, lines, ns)
    runner.sids = tuple(sids)
    runner.plain = None
    with _fp._LOCK:
        tab = TABLES.get(func)
        if tab is None:
            tab = TABLES[func] = (True, {})
        if tab[0] and len(tab[1]) < _fp.LIMIT:
            tab[1][sig] = runner
            COUNTERS["learned"] += 1


_ad.LEARN_CALL[0] = learn_call


def _holds_tensors(v) -> bool:
    """A list or tuple holding anything but Python numbers (tensors, None): learn_call declines
    it (its runner re-derives tensor operands only)."""
    return isinstance(v, (list, tuple)) and not all(
        type(e) is int or type(e) is bool or type(e) is float for e in v)


def reset() -> None:
    """Forget every recording runner (with the plain fast path's runners)."""
    TABLES.clear()
    IDLE_PLAIN.clear()
    VIEWS.clear()
    _KINDS.clear()
    _REDUCE_DECLINED.clear()
    _FOREACH_FAILED.clear()
    _DECLINED.clear()


_fp.SIM.on_configure.append(reset)
_fp.MEMORY.on_clear.append(reset)
