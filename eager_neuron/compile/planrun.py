"""A learned plan's repeat call as one generated function (straight-line Python).

`Plan.run` (compile/planned.py) interprets a plan: per step a tuple unpacked, a method called,
the step object's attributes read, loops over its operand and store lists with their flags
(`FastRows.run`: ~10 us of Python a row kernel step in a tight loop, 2-3x that inside a training
step). All of it is the same every call. Here a plan becomes the source of one function: each
kernel step's operand reads, guards, stores, kernel call (its compiled entry point), BLAS
thread setting and simulator charge (its cost computed once) written out, its constants bound
in the function's namespace; a value a kernel step stores and a later kernel step reads (no
other step reading it in between) is the local numpy array it was allocated as; a
multi-output op's `getitem` is one subscript; host and eager steps call the plan's own step
functions (`Plan._sequence`); the kernel steps' counters are added once when the call ends
(in a `finally`: the steps that ran, whatever ends the call).

Everything observable is Plan.run's: the same launches, allocations, charges and frees in the
same order, the same guards (a failing one drops the plan at the same step, before that step
writes anything), the same counters, results and errors. `GENERATED[0] = False` takes Plan.run's
loop again (in-process A/B; docs/COMPILE.md, Session 13).
"""

from __future__ import annotations

import operator
import weakref

import numpy as np
import torch
from torch.fx import Node

from .. import tensor as _tensor_mod
from ..adaptive import MODULE as _adaptive
from ..backward import POISON as _POISON
from ..blas import BLAS_THREADED_MIN, blas_threads
from ..simulator import SIM
from ..stats import STATS
from ..tensor import NeuronTensor
from . import faststep
from .faststep import FastFused, _flat_out, _scalar
from .stats import CSTATS

GENERATED = [True]     # False: Plan.run interprets its step list (measurements)
DIRECT_EAGER = [True]  # False: a plan's eager nodes through torch's dispatcher (planned.py)
BUILT = [0]            # generated plan functions built (a test counts them)


class Generated:
    """One plan's generated function and what it was built for (its validity key)."""

    __slots__ = ("fn", "key", "src")

    def __init__(self, fn, key, src) -> None:
        self.fn, self.key, self.src = fn, key, src


def key(seq, core: int) -> tuple:
    """What a generated function binds that may change between calls: the step list, the
    core, the chip's cores, the store allocator and its numpy-view flag."""
    return (seq, core, SIM.cores, faststep.ALLOC[0], faststep.NPC[0])


def build(plan, seq: list, core: int) -> Generated:
    """The generated function of `plan` over its step list `seq` (Plan._sequence) on `core`:
    fn(env) -> None when done, else the step index the interpreter resumes at."""
    ns: dict = {"NT": NeuronTensor, "FLUSH": _adaptive.flush, "SC": _scalar,
                "FLO": _flat_out, "NPE": np.empty, "FNP": torch.from_numpy, "BT": blas_threads}
    alloc = faststep.ALLOC[0]
    inline_alloc = alloc is faststep._alloc_store and faststep.NPC[0]
    ns["AL"] = alloc
    co = SIM.cores[core]
    prof = co.profile
    ns.update(CO=co, PF=prof, OV=prof.launch_overhead_us)
    pref = weakref.ref(plan)

    def drop(env, i):
        p = pref()
        if p is not None:
            p._drop(env, i)
        return i
    ns["DROP"] = drop
    lines = ["def _plan(env):", "    pop = env.pop", "    k = 0", "    try:"]
    ind = "        "
    names: dict = {}            # node -> its namespace name

    def nm(node):
        n = names.get(node)
        if n is None:
            n = names[node] = f"N{len(names)}"
            ns[n] = node
        return n

    def const(val, hint):
        n = f"{hint}{len(ns)}"
        ns[n] = val
        return n

    local: dict = {}            # node -> (full, flat, shape, numpy dtype) of a store made here
    prefix = [(0, 0)]           # per kernel steps run: (fused nodes, row kernels)
    after_kernel = False
    for op, fs, i, frees in seq:
        out: list = []
        if op is None:
            if not after_kernel:       # (a kernel step after a kernel step: nothing pending)
                out.append('FLUSH("compiled graph")')
            fail = f"return DROP(env, {i})"
            if isinstance(fs, FastFused):
                _fused(fs, i, out, ns, nm, const, local, fail, inline_alloc)
            else:
                _rows(fs, i, out, ns, nm, const, local, fail, inline_alloc)
            prefix.append((prefix[-1][0] + fs.n_nodes,
                           prefix[-1][1] + (0 if isinstance(fs, FastFused) else 1)))
            out.append(f"k = {len(prefix) - 1}")
            after_kernel = True
        else:
            after_kernel = False
            inline = getattr(op, "inline", None)
            if inline is not None and inline[0] == "getitem":
                _k, x, src, item = inline
                out.append(f"env[{nm(x)}] = env[{nm(src)}][{item!r}]")
                reads = ()
            elif inline is not None and inline[0] == "view":
                _view(inline, out, ns, nm, const)
                reads = ()
            elif inline is not None and inline[0] == "eager" and _eager(inline, op, out, ns,
                                                                          nm, const):
                reads = ()
            else:
                out.append(f"{const(op, 'O')}(env)")
                reads = _mutated(plan.plan_list[i])
            # a store a step may rebind (set_, resize_: a mutating op's operand) is taken from
            # env again by the kernel steps after it, with their guards (other steps write
            # only their own value; one written in place is the same memory)
            for n in reads:
                local.pop(n, None)
        for n in frees:
            out.append(f"pop({nm(n)}, None)")
            local.pop(n, None)
        lines += [ind + ln for ln in out]
    nodes = tuple(p[0] for p in prefix)
    rows = tuple(p[1] for p in prefix)

    def count(n):
        STATS.launches += n
        STATS.memory_hits += n
        CSTATS.fused_kernel_launches += n
        CSTATS.fused_nodes += nodes[n]
        CSTATS.direct_launches += n
        CSTATS.row_kernel_launches += rows[n]
    ns.update(COUNT=count, CS=CSTATS, NV=len(plan.views))
    if len(lines) == 4:
        lines.append(ind + "pass")
    lines += ["    finally:", "        if k:", "            COUNT(k)",
              "    CS.planned_runs += 1", "    CS.arena_values += NV"]
    src = "\n".join(lines) + "\n"
    exec(compile(src, "<eager_neuron plan>", "exec"), ns)   # noqa: S102 -- our own source
    BUILT[0] += 1
    return Generated(ns["_plan"], key(seq, core), src)


def _mutated(step) -> tuple:
    """The values a host or eager plan step may rebind or mutate: a mutating op's operands
    (any operand of an op that is not a functional aten overload)."""
    kind, x = step[0], step[1]
    if kind == "host":
        return ()       # (host scalar steps and blocks read 0-d host values only)
    t = x.target
    if t is operator.getitem or (isinstance(t, torch._ops.OpOverload) and
                                 not t._schema.is_mutable):
        return ()
    return tuple(x.all_input_nodes)


def _view(inline, out, ns, nm, const) -> None:
    """planned._step_fn's view of constant arguments written out (its fallback: the
    interpreter's step)."""
    _k, x, src, meth, cargs, fallback = inline
    call = ", ".join(["d"] + [const(a, "V") for a in cargs])
    out += [f"b = env[{nm(src)}]",
            "if type(b) is NT and not (d := b._data).is_conj() and not d.is_neg():",
            f"    try: o = {const(meth, 'M')}({call})",
            "    except Exception: o = None",     # (dispatch gives the error its neuron form)
            "else: o = None",
            f"if o is not None: env[{nm(x)}] = NT(o, b._block, b._index); CS.graph_views += 1",
            f"else: {const(fallback, 'O')}(env)"]


def _eager(inline, fn, out, ns, nm, const) -> bool:
    """planned._direct_fn's eager node written out: its arguments read from env as its loader
    reads them (FX's immutable lists handed over as plain lists), neuron dispatch called
    directly on the same conditions; else (or when they fail at run time) its own step. False:
    arguments this does not write out (a node in the keyword arguments, a nested list)."""
    _k, x, t, name = inline
    if not x.args or type(x.args[0]) is not Node:
        return False
    if any(_has_node(v) or isinstance(v, (list, tuple)) for v in x.kwargs.values()):
        return False
    args = []
    for a in x.args:
        if type(a) is Node:
            args.append(f"env[{nm(a)}]")
        elif isinstance(a, (list, tuple)):
            if any(isinstance(v, (list, tuple, dict)) for v in a):
                return False
            args.append("[" + ", ".join(f"env[{nm(v)}]" if type(v) is Node else const(v, "E")
                                        for v in a) + "]" if _has_node(a) else
                        f"list({const(a, 'E')})")
        elif isinstance(a, dict):
            return False
        else:
            args.append(const(a, "E"))
    ns.update(TM=_tensor_mod, PROFILING=torch._C._autograd._profiler_enabled,
              GRAD=torch._C.is_grad_enabled, DE=DIRECT_EAGER, POISON=_POISON)
    first = "a0"
    rest = ", ".join([first] + args[1:])
    out += [f"{first} = {args[0]}",
            f"if type({first}) is NT and DE[0] and not PROFILING() and not GRAD():",
            f"    CS.eager_ops[{name!r}] += 1; CS.direct_eager += 1",
            f"    o = TM._dispatch({const(t, 'E')}, ({rest},), {const(dict(x.kwargs), 'E')})",
            "    if o is POISON: raise RuntimeError(\"a neuron op failed during backward\")",
            f"    env[{nm(x)}] = o",
            f"else: {const(fn, 'O')}(env)"]
    return True


def _has_node(a) -> bool:
    if type(a) is Node:
        return True
    if isinstance(a, (list, tuple)):
        return any(_has_node(v) for v in a)
    return isinstance(a, dict) and any(_has_node(v) for v in a.values())


def _operand_env(fs, k, node, out, ns, nm, fail, var):
    """Lines reading input k of kernel step `fs` from env into `var` (fs.operand's path:
    a kept view of a graph input, else the tensor's numpy view made the kernel's operand)."""
    keep = fs.ins[k][-1]
    f = f"FS{id(fs)}"
    ns[f] = fs
    out.append(f"t = env[{nm(node)}]")
    if keep:
        ca = f"CA{id(fs)}"
        ns[ca] = fs.cache
        out.append(f"c = {ca}[{k}]")
        out.append(f"if c is not None and c[0]() is t and t._data is c[1] and "
                   f"c[1].data_ptr() == c[2]: {var} = c[3]")
        out.append(f"else: {var} = {f}.operand({k}, t)")
        out.append(f"if {var} is None: {fail}")
        return
    out.append(f"if type(t) is not NT: {fail}")
    out.append("c = t._npc")
    out.append(f"{var} = c[1] if c is not None and c[0] is t._data else t._data.numpy()")
    if isinstance(fs, FastFused):
        _j, _node, n, dt, _keep = fs.ins[k]
        dn = f"DT{len(ns)}"
        ns[dn] = dt
        out.append(f"if {var}.dtype != {dn} or {var}.size != {n} or not "
                   f"{var}.flags.c_contiguous: {fail}")
        out.append(f"{var} = {var}.reshape(-1)")
        return
    q = fs.quick[k]
    chain = fs.ins[k][3]
    if q is not None and chain is None:
        dn, q0, q1 = f"DT{len(ns)}", f"Q{len(ns)}a", f"Q{len(ns)}b"
        ns.update({dn: fs.ins[k][5], q0: q[0], q1: q[1]})
        out.append(f"if {var}.shape == {q0} and {var}.dtype == {dn} and "
                   f"{var}.flags.c_contiguous: {var} = {var}.reshape({q1})")
        out.append(f"else: {var} = {f}.shaped({k}, {var})")
    else:
        out.append(f"{var} = {f}.shaped({k}, {var})")
    out.append(f"if {var} is None: {fail}")


def _store(node, shape, dtype, index, out, ns, nm, local, inline_alloc, put):
    """Lines allocating an escaping store into locals T<n>, L<n> (its flat numpy view) and,
    allocated here, F<n> (its full numpy array); returns (T, L)."""
    base = nm(node)[1:]
    t, f, fl = f"T{base}", f"F{base}", f"L{base}"
    form = faststep.small_form(shape, dtype, index) if inline_alloc else None
    sh = f"SH{base}"
    ns[sh] = shape
    if form is not None and form[2] is not None:
        # faststep._alloc_store's small form: numpy's allocator, one from_numpy, the core's
        # alloc_small, the wrapper, its kept numpy views
        c, r, d = f"AS{index}", f"RS{base}", f"ND{base}"
        ns.update({c: SIM.cores[index].alloc_small, r: form[1], d: form[2]})
        out.append(f"{f} = NPE({sh}, {d}); d = FNP({f}); {t} = NT(d, {c}({r}), {index}); "
                   f"{fl} = {f}.reshape(-1); {t}._npc = (d, {f}, {fl})")
        if put:
            local[node] = (f, fl, tuple(shape), np.dtype(form[2]))
    else:
        dn = f"D{base}"
        ns[dn] = dtype
        out.append(f"{t} = AL({sh}, {dn}, {index}); {fl} = FLO({t})")
    return t, fl


def _fused(fs, i, out, ns, nm, const, local, fail, inline_alloc) -> None:
    args = [None] * len(fs.tmpl)
    for p, v in enumerate(fs.tmpl):
        if v is not None:
            args[p] = const(v, "A")
    for k, (j, node, n, dt, _keep) in enumerate(fs.ins):
        got = local.get(node)
        if got is not None and int(np.prod(got[2], dtype=np.int64)) == n and got[3] == dt:
            args[j] = got[1]
            continue
        var = f"x{k}"
        _operand_env(fs, k, node, out, ns, nm, fail, var)
        args[j] = var
    _scalars(fs, args, out, ns, nm, fail)
    made = []
    for j, node, shape, dtype, index in fs.outs:
        t, fl = _store(node, shape, dtype, index, out, ns, nm, local, inline_alloc, True)
        made.append((node, t))
        args[j] = fl
    _launch(fs, i, args, out, ns)
    for node, t in made:
        out.append(f"env[{nm(node)}] = {t}")
    for src, dst, cp in fs.absorbed:
        out.append(f"env[{nm(src)}] = env[{nm(cp)}] = env[{nm(dst)}]")
        for n in (src, cp):
            local.pop(n, None)


def _rows(fs, i, out, ns, nm, const, local, fail, inline_alloc) -> None:
    args = [None] * len(fs.tmpl)
    for p, v in enumerate(fs.tmpl):
        if v is not None:
            args[p] = const(v, "A")
    for k, (pos, node, *_rest) in enumerate(fs.ins):
        var = f"x{k}"
        got = local.get(node)
        if got is not None:
            # a store made by an earlier step of this call: its full array's shape, dtype and
            # layout are the plan's, so the operand's form is too (found on a sample)
            sample = np.empty(got[2], got[3])
            arr = fs.shaped(k, sample)
            if arr is not None and arr.flags.c_contiguous and arr.size == sample.size and \
                    arr.__array_interface__["data"][0] == sample.__array_interface__["data"][0]:
                args[pos] = got[0] if arr.shape == sample.shape else \
                    f"{got[0]}.reshape({const(arr.shape, 'S')})"
                continue
            out.append(f"{var} = FS{id(fs)}.shaped({k}, {got[0]})")
            ns[f"FS{id(fs)}"] = fs
            out.append(f"if {var} is None: {fail}")
            args[pos] = var
            continue
        _operand_env(fs, k, node, out, ns, nm, fail, var)
        args[pos] = var
    _scalars(fs, args, out, ns, nm, fail)
    made: dict = {}
    for pos, node, shape, dtype, index, flat, put in fs.outs:
        got = made.get(node)
        if got is None:
            got = made[node] = _store(node, shape, dtype, index, out, ns, nm, local,
                                      inline_alloc, put)
        numel = int(np.prod(shape, dtype=np.int64))
        args[pos] = got[1] if tuple(flat) == (numel,) else \
            f"{got[1]}.reshape({const(tuple(flat), 'S')})"
    for fl in fs.blas:
        if fl < BLAS_THREADED_MIN:
            out.append(f"if BT.current != 1: BT({fl!r})")    # (blas_threads: one thread)
        else:
            out.append(f"BT({fl!r})")
    _launch(fs, i, args, out, ns)
    done = set()
    for _pos, node, _shape, _dtype, _index, _flat, put in fs.outs:
        if put and node not in done:
            done.add(node)
            out.append(f"env[{nm(node)}] = {made[node][0]}")


def _scalars(fs, args, out, ns, nm, fail) -> None:
    for pos, a, typ in fs.scalars:
        ty = f"TY{len(ns)}"
        ns[ty] = typ
        out.append(f"s{pos} = SC(env[{nm(a)}])")
        out.append(f"if type(s{pos}) is not {ty}: {fail}")
        args[pos] = f"s{pos}"


def _launch(fs, i, args, out, ns) -> None:
    """The kernel call (its entry point when resolved) and the simulator's charge (launch()'s
    cost, computed once for the core's profile; its own computation if the profile changed)."""
    k = f"K{i}"
    ns[k] = fs.entry if fs.entry is not None else fs.kernel
    out.append(f"{k}({', '.join(args)})")
    co = ns["CO"]
    _prof, overhead, body = co.cost_of(fs.flops, fs.nbytes, "vector")
    assert overhead == ns["OV"]
    b, nb, fl = f"B{i}", f"NB{i}", f"FL{i}"
    ns.update({b: body, nb: fs.nbytes, fl: fs.flops})
    out.append(f'if CO.profile is PF: CO.charge(OV, {b}, "vector", {nb})')
    out.append(f'else: CO.launch({fl}, {nb}, "vector")')


__all__ = ["GENERATED", "build", "key", "Generated"]
