"""The fast path's foreach runners: an optimizer's `_foreach_*` op replayed element by element.

In plain eager a `_foreach_*` op (lower/foreach.py) sends one per-element op per list element
down the funnel; each of those is a repeat the flat elementwise runners of fastpath.py already
serve. A repeat of the whole foreach call (same lists of the same shapes, dtypes and strides:
an optimizer's step) goes straight to those element runners, found once when the foreach call
was learned, without the foreach lowering's per-element argument building, the funnel's entry
or an element signature per element. An element whose runner declines (MISS: an aliasing
operand) goes down the funnel on its own, as the foreach lowering would send it; the elements
before it have run, exactly as in the lowering's loop. `stats()["ops"]` counts the elements as
the funnel does; version counters of the written lists are bumped once per tensor.

>>> import torch, eager_neuron
>>> from eager_neuron import fastpath
>>> ps = [torch.ones(3, device="neuron"), torch.ones(2, device="neuron")]
>>> for _ in range(3):
...     _ = torch._foreach_mul_(ps, 0.5)
>>> ps[1].tolist(), torch.ops.aten._foreach_mul_.Scalar in fastpath.TABLES
([0.125, 0.125], True)
"""

from __future__ import annotations

import re

from torch.autograd.graph import increment_version

from .fastpath import MISS, STATS_FAST, TABLES, _add, _build, failed, flat_np, signature
from .launch import HOOKS as _LAUNCH_HOOKS
from .stats import STATS


def learn_foreach(func, plan, args, kwargs, dispatch) -> None:
    """After a plain-eager foreach call ran every element down the funnel: leave a runner that
    calls the element runners this call's elements have (none learned while one is missing;
    the next call tries again, `fastpath.failed` caps the attempts)."""
    from .lower.foreach import _per_tensor_op

    try:
        per, spec, _returns = _per_tensor_op(func)
    except NotImplementedError:
        return
    tab = TABLES.get(per)
    if tab is None or not args or not isinstance(args[0], (list, tuple)):
        return
    values = tab[0]
    found = element_runners(spec, args, kwargs, tab, values)
    if found is None:
        failed(func, args, kwargs)
        return
    n, pos, kw, runners = found
    sig = signature(args, kwargs, values)
    if sig is None:
        return
    run = _flat_runner(func, plan, args, spec, pos, kw, runners)
    if run is None:
        ns = {"R": tuple(runners), "N": n, "S": STATS, "MISS": MISS, "D": dispatch, "PER": per,
              "incv": increment_version}
        run = _build(plan.name, runner_lines(func, plan, args, kwargs, spec, pos, kw), ns)
    _add(func, values, sig, run)


_REF = re.compile(r"args\[(\d+)\]|kwargs\[('[^']*')\]")


def _flat_runner(func, plan, args, spec, pos, kw, runners):
    """An in-place foreach op whose every element has an in-place flat runner (fastpath.Flat):
    a runner that calls the elements' kernels itself, in one loop, with no element runner, no
    per-element argument tuples and one charge call for all its launches (the launches, the
    counters and the simulated cost are the element runners' own). None when an element's
    runner is of another kind or the elements differ in structure."""
    if not plan.mutates or any(plan.ret_alias):
        return None
    flats = [getattr(r, "flat", None) for r in runners]
    f0 = flats[0]
    if f0 is None:
        return None
    shape = (f0.written, f0.tensors, f0.scalars, repr(f0.consts), f0.index, f0.engine)
    for f in flats:
        if f is None or (f.written, f.tensors, f.scalars, repr(f.consts), f.index,
                         f.engine) != shape:
            return None
    kwmap = dict(item.split(": ", 1) for item in kw)

    def tr(ref: str) -> str:   # an element runner's reference -> this call's expression
        def sub(m):
            if m.group(1) is not None:
                return pos[int(m.group(1))]
            return kwmap.get(m.group(2), f"kwargs[{m.group(2)}]")
        return _REF.sub(sub, ref)

    from .simulator import SIM

    core = SIM.cores[f0.index]
    prof = core.profile
    costs = [core.cost_of(f.flops, f.nbytes, f.engine) for f in flats]
    ns = {"KS": tuple(f.kernel for f in flats), "N": len(flats), "S": STATS, "F": STATS_FAST,
          "MISS": MISS, "FNP": flat_np, "LH": _LAUNCH_HOOKS, "CORE": core, "PROF": prof,
          "OV": costs[0][1], "BODIES": tuple(c[2] for c in costs), "ENG": f0.engine,
          "NBYTES": tuple(f.nbytes for f in flats), "LS": tuple((f.flops, f.nbytes, f.engine)
                                                                  for f in flats),
          "incv": increment_version, **f0.consts}
    lines = [f"A{j} = args[{j}]" for j, (is_list, _s, _n) in enumerate(spec[:len(args)])
             if is_list]
    # under the profiler the elements go down the funnel, inside the op's record
    lines += ["if LH: return MISS", "for i in range(N):", f"    W = {tr(f0.written)}"]
    # an operand sharing the written tensor's buffer may overlap it partly: the slow path
    # makes ATen's overlap check (checked for every element first: nothing is half-written)
    lines += [f"    if {tr(t)}._block is W._block: return MISS"
              for t in f0.tensors if t != f0.written]
    operands = ", ".join([f"FNP({tr(f0.written)})"] + [f"FNP({tr(t)})" for t in f0.tensors] +
                         [tr(x) for x in f0.scalars])
    lines += ["for i in range(N):", f"    KS[i]({operands})",
              "S.ops += N", "S.launches += N", "S.memory_hits += N", "F['hits'] += N",
              "if CORE.profile is PROF:", "    CORE.charge_many(OV, BODIES, ENG, NBYTES)",
              "else:", "    for c in LS: CORE.launch(*c)"]
    for j, ((is_list, _s, _n), schema_arg) in enumerate(zip(spec, func._schema.arguments)):
        if is_list and j < len(args) and schema_arg.name in plan.mutates:
            lines.append(f"incv(A{j})")
    lines.append("return None")
    return _build(plan.name, lines, ns)


def element_runners(spec, args, kwargs, tab, values):
    """(n, pos, kw, runners) for a foreach call whose every element has a runner in `tab` (the
    per-element op's table): pos/kw the source text of each element's arguments in a runner
    (`A{j}[i]` for a list, `args[{j}]` for a shared argument); None when an argument is a
    `.Tensor` overload's CPU scalar list, a list of another length, or an element has no
    runner yet."""
    n = len(args[0])
    pos, kw = [], []
    for j, ((is_list, scalars, name), a) in enumerate(zip(spec, args)):
        if scalars or (is_list and (not isinstance(a, (list, tuple)) or len(a) != n)):
            return None   # `.Tensor` overloads read one CPU scalar per element
        expr = f"A{j}[i]" if is_list else f"args[{j}]"
        if name is None:
            pos.append(expr)
        else:
            kw.append(f"{name!r}: {expr}")
    runners = []
    for i in range(n):
        call, call_kw = [], dict(kwargs)
        for (is_list, _scalars, name), a in zip(spec, args):
            v = a[i] if is_list else a
            if name is None:
                call.append(v)
            else:
                call_kw[name] = v
        sig = signature(tuple(call), call_kw, values)
        run = tab[1].get(sig) if sig is not None else None
        if run is None:
            return None
        runners.append(run)
    return n, pos, kw, runners


def runner_lines(func, plan, args, kwargs, spec, pos, kw) -> list:
    """The body of a foreach runner: element i calls its runner R[i]; one that declines (MISS)
    goes down the funnel D(PER, ...) on its own; the written lists' versions are bumped once.
    Shared with adaptive eager's foreach recording runners (adaptive_fast.py)."""
    lines = [f"A{j} = args[{j}]" for j, (is_list, _s, _n) in enumerate(spec[:len(args)])
             if is_list]
    call = f"({', '.join(pos)},)" if pos else "()"
    kwd = ("dict(kwargs, " if kwargs else "{") + ", ".join(kw) + ("})" if kwargs else "}")
    if not kw:
        kwd = "dict(kwargs)" if kwargs else "{}"
    keep = not (plan.mutates and not any(plan.ret_alias))
    lines += ["S.ops += N"]
    if keep:
        lines.append("out = []")
    lines += ["for i in range(N):",
              f"    c = {call}",
              f"    k = {kwd}",
              "    r = R[i](c, k)",
              "    if r is MISS:",
              "        S.ops -= 1   # the funnel counts this element itself",
              "        r = D(PER, c, k)"]
    if keep:
        lines.append("    out.append(r)")
    for j, ((is_list, _s, _n), schema_arg) in enumerate(zip(spec, func._schema.arguments)):
        if is_list and j < len(args) and schema_arg.name in plan.mutates:
            lines.append(f"incv(A{j})")
    lines.append("return out" if keep else "return None")
    return lines
