"""The fast path: a repeat call of an (overload, argument signature) seen before.

The first call of a signature goes down the whole funnel (dispatch.py: classification, schema
binding, meta execution, the lowering's analysis, the kernel lookup). Where the result of all
that is fixed by the signature, the funnel leaves a *runner* here: a small Python function,
generated for that one signature, that does only what a repeat call needs:

    unwrap -> allocate the output -> call the compiled kernel -> charge the core -> wrap

The signature is everything the slow path's decisions read: per tensor operand its dtype,
sizes, strides and device; per Python scalar its type (and its value where the kernel depends
on it); lists, dtypes, strings and the default dtype by value. A call whose signature was never
seen, or whose operands the runner cannot take (CPU tensors, aliasing between a written tensor
and another operand), goes the slow way. Everything observable stays: `stats()` counts the op,
the launch and the memory-cache hit as the slow path does, the simulated core is charged the
same cost, and a runner never runs while something needs to watch the op (the profiler's
hooks, EAGER_NEURON_LOG, adaptive eager, NeuronMode, cache verification).

Families that leave runners: the elementwise family on flat operands (same shape, contiguous,
or a single element) and view ops. Others always take the slow path.

>>> import torch, eager_neuron
>>> from eager_neuron import fastpath
>>> a = torch.ones(4, device="neuron")
>>> _ = a + a; _ = a + a             # the first call learns, the second runs the runner
>>> fastpath.STATS_FAST["hits"] > 0
True
"""

from __future__ import annotations

import os
import threading
import time
from math import copysign

import numpy as np
import torch

from .launch import HOOKS as _LAUNCH_HOOKS
from .launch import MEMORY, full_key
from .simulator import SIM
from .stats import STATS
from .tensor import NeuronTensor

# func -> (values_matter, {signature: runner}); values_matter: Python scalars are keyed by value
# (their value changes the kernel or the output), else by type (they are kernel arguments)
TABLES: dict = {}
LIMIT = 512          # signatures per overload: a loop over ever-new shapes stops learning
MISS = object()      # a runner's answer when this call's operands need the slow path
STATS_FAST = {"hits": 0, "learned": 0}
# torch's own factory, not the pin_memory wrapper pinned.py installs as torch.empty_strided
_EMPTY_STRIDED = torch._C._VariableFunctions.empty_strided
_KW = object()       # marks where the keyword arguments start in a signature
_LOCK = threading.Lock()
_SCALARS = (float, int, bool)
_NP_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64,
              torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
              torch.uint8: np.uint8, torch.bool: np.bool_}
_ATOMS = (str, torch.dtype, torch.memory_format, torch.layout, torch.device)
_I64 = 1 << 63
_NEG_ZERO = ("-0.0",)     # -0.0 in a values-keyed signature (it compares equal to 0.0)


def signature(args: tuple, kwargs: dict, values: bool):
    """The call's signature as a tuple, or None when an operand cannot be taken fast."""
    sig = [len(args)]
    app = sig.append
    for a in args:
        t = type(a)
        if t is NeuronTensor:
            d = a._data
            app(d.dtype)
            app(d.shape)
            app(d.stride())
            app(a._index)
        elif t is float or t is int or t is bool:
            app(t)
            if values:
                if t is float and (a == 0.0 or a != a):
                    if a != a:
                        return None   # a NaN never equals itself: its key would never hit
                    a = _NEG_ZERO if copysign(1.0, a) < 0 else 0.0   # x * -0.0 is not x * 0.0
                app(a)
            elif t is int and not -_I64 <= a < _I64:
                return None   # out of int64: the kernel entry would refuse what ATen takes
        elif a is None:
            app(None)
        elif not _other(a, t, app):
            return None
    if kwargs:
        app(_KW)
        for k, a in kwargs.items():
            app(k)
            t = type(a)
            if t is NeuronTensor:
                d = a._data
                app(d.dtype)
                app(d.shape)
                app(d.stride())
                app(a._index)
            elif t is float or t is int or t is bool:
                app(t)
                if values:
                    if t is float and (a == 0.0 or a != a):
                        if a != a:
                            return None   # a NaN never equals itself: its key would never hit
                        a = _NEG_ZERO if copysign(1.0, a) < 0 else 0.0
                    app(a)
                elif t is int and not -_I64 <= a < _I64:
                    return None
            elif a is None:
                app(None)
            elif not _other(a, t, app):
                return None
    # the default dtype: a Python number's result dtype follows it (int tensor + 1.5), and so
    # does an integer op's float result without any number (int / int, sqrt of an int tensor)
    app(torch.get_default_dtype())
    return tuple(sig)


def _other(a, t, app) -> bool:
    if t is list or t is tuple:
        if a and type(a[0]) is NeuronTensor:   # cat's tensors, a foreach op's lists
            app(t)
            app(len(a))
            for v in a:
                if type(v) is not NeuronTensor:
                    return False
                d = v._data
                app(d.dtype)
                app(d.shape)
                app(d.stride())
                app(v._index)
            return True
        kind = type(a[0]) if a else int
        if kind is not int and kind is not bool:
            return False
        for v in a:
            if type(v) is not kind:
                return False
        app(t)
        app(kind)   # [1, 0] and [True, False] hash alike: the element type tells them apart
        app(tuple(a))
        return True
    if isinstance(a, _ATOMS):
        app(a)
        return True
    return False


def reset() -> None:
    """Forget every runner (the memory cache was cleared, the chip rebuilt, or a fork)."""
    with _LOCK:
        TABLES.clear()


os.register_at_fork(after_in_child=reset)   # a forked child must not run parallel kernels
SIM.on_configure.append(reset)
MEMORY.on_clear.append(reset)


def _add(func, values: bool, sig: tuple, run, call: tuple | None = None) -> None:
    with _LOCK:
        tab = TABLES.get(func)
        if tab is None:
            tab = TABLES[func] = (values, {})
        if tab[0] and not values and call is not None:
            # the overload's table keys scalars by value (a captured call learned first): a
            # runner that takes any value may serve this one value (never the other way)
            sig = signature(*call, True)
            values = sig is not None
        if tab[0] != values or len(tab[1]) >= LIMIT:
            return
        tab[1][sig] = run
        STATS_FAST["learned"] += 1


def _ref(func, args: tuple, kwargs: dict, name: str):
    """Source text reading schema argument `name` from the call, or None if it was defaulted."""
    from .lower.common import schema_args

    for i, (arg_name, _d, _k) in enumerate(schema_args(func)):
        if arg_name == name:
            if i < len(args):
                return f"args[{i}]"
            if name in kwargs:
                return f"kwargs[{name!r}]"
            return None
    return None


def emit(t0: float, device_us: float, key, flops, nbytes, engine, extra) -> None:
    """A replayed launch, told to launch.HOOKS (the profiler) as launch() tells a memory hit."""
    event = {"key": key, "outcome": "memory", "compile_s": 0.0,
             "host_us": (time.perf_counter() - t0) * 1e6, "device_us": device_us,
             "bytes": nbytes, "flops": flops, "engine": engine}
    if extra:
        event.update(extra)
    for hook in _LAUNCH_HOOKS:
        hook(event)


def _build(name: str, lines: list, ns: dict):
    src = "def run(args, kwargs):\n" + "".join(f"    {ln}\n" for ln in lines)
    ns.update(LH=_LAUNCH_HOOKS, perf=time.perf_counter, emit=emit)
    code = compile(src, f"<eager_neuron fast {name}>", "exec")
    exec(code, ns)   # noqa: S102 -- our own generated source, one function per signature
    return ns["run"]


# ---------------------------------------------------------------------------------------------
# learning: called by dispatch after a slow call that a repeat may skip
# ---------------------------------------------------------------------------------------------

def learn_elementwise(func, plan, args, kwargs, index: int, a: dict, outs: list, leaves: list,
                      req: tuple) -> bool:
    """After a plain-eager elementwise call ran through launch(*req): leave its runner (False:
    not this way; the caller may learn it from the captured launch instead)."""
    facts = plan.lower.fast_facts(func, a, outs)
    if facts is None or plan.out_args or len(outs) != 1:
        return False
    tensors, scalars, values = facts
    key = req[0]
    kinds, rank = key[3], key[4]
    if rank != 1 or "nd" in kinds:
        return False
    sig = signature(args, kwargs, values)
    if sig is None:
        return False
    kernel = MEMORY.get(full_key(req[0], req[2]))
    if kernel is None:
        return False
    ns = {"K": kernel, "S": STATS, "F": STATS_FAST, "SIM": SIM, "NT": NeuronTensor,
          "MISS": MISS, "IDX": index}
    lines = []
    # 1. operands: each tensor's host buffer as a flat numpy array
    arrays = []
    refs = {}
    for nm in tensors:
        ref = _ref(func, args, kwargs, nm)
        v = a[nm]
        if ref is None or type(_eval(ref, args, kwargs)) is not NeuronTensor:
            return False
        refs[nm] = ref
        flat = ".reshape(-1)" if v.dim() != 1 else ""
        arrays.append(f"{ref}._data.numpy(){flat}")
    # 2. scalars: runtime kernel arguments
    svals = []
    for j, nm in enumerate(scalars):
        v = a[nm]
        ref = _ref(func, args, kwargs, nm)
        if isinstance(v, torch.Tensor):
            if ref is None or type(_eval(ref, args, kwargs)) is not NeuronTensor:
                return False
            svals.append(f"{ref}._data.item()")
        elif ref is None or v is None:
            ns[f"C{j}"] = bool(v) if (isinstance(v, bool) or v is None) else v
            svals.append(f"C{j}")
        else:
            svals.append(ref)   # same type as the first call: the signature holds it
    # 3. the output: the written argument (in-place) or a fresh buffer
    target = plan.ret_alias[0] if plan.ret_alias else None
    if target is not None:
        wref = _ref(func, args, kwargs, target)
        if wref is None or type(_eval(wref, args, kwargs)) is not NeuronTensor:
            return False
        lines.append(f"W = {wref}")
        for ref in refs.values():
            if ref != wref:
                # an operand sharing the written tensor's buffer may overlap it partly: the
                # slow path makes ATen's overlap check
                lines.append(f"if {ref}._block is W._block: return MISS")
        lines.append("data = W._data")
        ret = "return W"
    else:
        shape, stride, dtype = leaves[0]
        ns.update(SHAPE=shape, STRIDE=stride, DT=dtype)
        lines += _alloc_lines(ns, outs[0], index)
        ret = _wrap_lines(ns, lines, index)
    out_flat = ".reshape(-1)" if len(outs[0].shape) != 1 else ""
    out_np = "out_np" if any(ln.startswith("out_np") for ln in lines) else \
        f"data.numpy(){out_flat}"
    lines.append(f"K({out_np}, {', '.join(arrays + svals)})")
    flops = req[3] if len(req) > 3 else 0.0
    nbytes = req[4] if len(req) > 4 else 0.0
    engine = req[5] if len(req) > 5 else "vector"
    ns.update(FLOPS=flops, NBYTES=nbytes, ENGINE=engine, E=(req[0], flops, nbytes, engine, None))
    lines.insert(len(lines) - 1, "t0 = perf() if LH else 0.0")
    lines += ["S.launches += 1", "S.memory_hits += 1", "F['hits'] += 1",
              "d = SIM.cores[IDX].launch(FLOPS, NBYTES, ENGINE, 'fp32')",
              "if LH: emit(t0, d, *E)", ret]
    _add(func, values, sig, _build(plan.name, lines, ns), (args, kwargs))
    return True


def _alloc_lines(ns: dict, out: torch.Tensor, index: int, suffix: str = "",
                 numpy_ok: bool = True) -> list:
    """Source allocating output buffer `data{suffix}` (and `block{suffix}`; `out_np` too in the
    numpy form): a small one straight from the core's accounting and a host allocator (what
    buffers.alloc does for it), a large one via buffers.alloc (the pool, and an OOM that
    flushes adaptive groups). SHAPE/STRIDE/DT{suffix} must be in ns."""
    from . import buffers

    x = suffix
    extent = 0 if out.numel() == 0 else 1 + sum((sz - 1) * st for sz, st in
                                                zip(out.shape, out.stride()))
    nbytes = extent * out.element_size()
    if nbytes < buffers._POOLED_BYTES:
        ns[f"NB{x}"] = max(512, (nbytes + 511) // 512 * 512)
        lines = [f"block{x} = SIM.cores[IDX].alloc_small(NB{x})"]
        if numpy_ok and out.is_contiguous() and out.dtype in _NP_DTYPES:
            # numpy's allocator and one from_numpy: half the cost of torch.empty + .numpy()
            ns.update({"np_empty": np.empty, "from_numpy": torch.from_numpy,
                       f"NPDT{x}": _NP_DTYPES[out.dtype], f"NUMEL{x}": out.numel()})
            if out.dim() == 1:
                lines += [f"out_np{x} = np_empty(NUMEL{x}, NPDT{x})",
                          f"data{x} = from_numpy(out_np{x})"]
            else:
                lines += [f"data_np{x} = np_empty(SHAPE{x}, NPDT{x})",
                          f"data{x} = from_numpy(data_np{x})",
                          f"out_np{x} = data_np{x}.reshape(-1)"]
            return lines
        ns["empty_strided"] = _EMPTY_STRIDED
        return lines + [f"data{x} = empty_strided(SHAPE{x}, STRIDE{x}, dtype=DT{x})"]
    ns["alloc"] = buffers.alloc
    return [f"data{x}, block{x} = alloc(IDX, SHAPE{x}, STRIDE{x}, DT{x})"]


def _wrap_lines(ns: dict, lines: list, index: int) -> str:
    """Source of the return statement wrapping `data` (SHAPE/STRIDE/DT known): the wrapper made
    directly, as NeuronTensor.__new__ makes it, without reading the metadata back."""
    from .tensor import DEVICES

    ns.update(make=torch.Tensor._make_wrapper_subclass, DEV=DEVICES[index])
    lines += ["r = make(NT, SHAPE, strides=STRIDE, storage_offset=0, dtype=DT, device=DEV, "
              "requires_grad=False)",
              "r._data = data", "r._block = block", "r._index = IDX"]
    return "return r"


def learn_view(func, args, kwargs, out) -> None:
    """After a plain-eager view op on one neuron tensor (args[0]): leave its runner."""
    if not args or type(args[0]) is not NeuronTensor:
        return
    for v in (*args[1:], *kwargs.values()):
        if isinstance(v, torch.Tensor) or (isinstance(v, (list, tuple)) and v and
                                           isinstance(v[0], torch.Tensor)):
            return
    if args[0].dtype.is_complex:
        return
    single = isinstance(out, torch.Tensor)
    outs = [out] if single else list(out)
    if not outs or not all(isinstance(o, torch.Tensor) and not o.dtype.is_complex
                           for o in outs):
        return
    sig = signature(args, kwargs, True)
    if sig is None:
        return
    from .tensor import DEVICES

    ns = {"OP": func._op, "S": STATS, "F": STATS_FAST, "NT": NeuronTensor, "MISS": MISS,
          "make": torch.Tensor._make_wrapper_subclass}
    call = "OP(x._data" + "".join(f", args[{i}]" for i in range(1, len(args)))
    call += ", **kwargs)" if kwargs else ")"
    lines = ["x = args[0]", f"out = {call}"]
    if single:
        # sizes, strides and dtype are the signature's: only the offset is read back
        ns.update(SHAPE=tuple(out.shape), STRIDE=out.stride(), DT=out.dtype,
                  DEV=DEVICES[args[0]._index], IDX=args[0]._index)
        lines += ["if out.is_neg(): return MISS",
                  "r = make(NT, SHAPE, strides=STRIDE, storage_offset=out.storage_offset(), "
                  "dtype=DT, device=DEV, requires_grad=False)",
                  "r._data = out", "r._block = x._block", "r._index = IDX",
                  "S.views += 1", "F['hits'] += 1", "return r"]
    else:
        lines += ["for o in out:",
                  "    if o.is_neg(): return MISS",
                  "S.views += 1", "F['hits'] += 1",
                  "b = x._block", "i = x._index",
                  f"return {type(out).__name__}(NT(o, b, i) for o in out)"]
    _add(func, True, sig, _build(func.__name__, lines, ns))


def _eval(ref: str, args, kwargs):
    if ref.startswith("args["):
        return args[int(ref[5:-1])]
    return kwargs[ref[8:-2]]


# ---------------------------------------------------------------------------------------------
# captured ops: the launches (and replayable host calls) one slow call made, replayed
# ---------------------------------------------------------------------------------------------

# Ops whose lowerings act on the device only through launch() (and blas_threads, which the
# capture replays): no host-side writes, no reads of tensor values on the host. Reviewed one by
# one; a lowering that uses a scratch array or a constant array is never learned (its arrays
# must all be views of the op's own operands and outputs).
CAPTURED = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
    "aten::sum", "aten::mean",
    # the cast family (lower/cast.py): elementwise copies; half types go through scratch
    # buffers or reinterpreted views, which are never learned
    "aten::clone", "aten::_to_copy", "aten::copy_", "aten::cat",
    "aten::_softmax", "aten::_log_softmax", "aten::_softmax_backward_data",
    "aten::_log_softmax_backward_data",
    "aten::native_layer_norm", "aten::native_layer_norm_backward",
    # fused attention (lower/attention.py): launch only; an absent mask is a constant array
    "aten::_scaled_dot_product_fused_attention_overrideable",
    "aten::_scaled_dot_product_fused_attention_overrideable_backward",
})


def capturable(plan) -> bool:
    """May the fast path learn this op from its captured launches? The CAPTURED ops, and the
    elementwise family (lower/elementwise.py poisons the capture of a call it cannot replay:
    a kernel that can raise, a scalar read from a tensor)."""
    if plan.out_args:
        return False
    return plan.name.split(".")[0] in CAPTURED or \
        getattr(plan.lower, "fast_facts", None) is not None


def _span(arr: np.ndarray) -> tuple:
    lo = hi = arr.__array_interface__["data"][0]
    for size, stride in zip(arr.shape, arr.strides):
        if size == 0:
            return lo, lo
        if stride < 0:
            lo += (size - 1) * stride
        else:
            hi += (size - 1) * stride
    return lo, hi + arr.itemsize


def learn_captured(func, plan, args, kwargs, index: int, outs: list, leaves: list, spec,
                   capture: list) -> None:
    """After a plain-eager call of a CAPTURED op whose launches were recorded: leave a runner
    that allocates the same outputs and replays the launches on this call's buffers."""
    if not capture or any(not isinstance(o, (torch.Tensor, int, float, bool, type(None)))
                          for o in outs):
        return
    values, runtime = True, {}
    if getattr(plan.lower, "fast_facts", None) is not None:
        # the elementwise family keys scalars as its flat runners do (by type): one table
        # kind per overload, or whichever learner came first would lock the other one out
        found = _scalar_args(func, plan, args, kwargs, outs, capture)
        if found is None:
            return
        values, runtime = found
    sig = signature(args, kwargs, values)
    if sig is None:
        return
    ns = {"S": STATS, "F": STATS_FAST, "SIM": SIM, "NT": NeuronTensor, "MISS": MISS,
          "IDX": index, "ndarray": np.ndarray}
    wlines, guards, lines = [], [], []
    # 1. sources: the outputs (fresh or written) and the neuron operands, by memory
    sources = []   # (expression of a numpy view, its numpy array at learn time)
    written = {}
    for i, out in enumerate(outs):
        target = plan.ret_alias[i] if i < len(plan.ret_alias) else None
        if not isinstance(out, torch.Tensor):
            if target is not None:
                return
            ns[f"R{i}"] = out   # a number or None the op returns (fixed by the signature)
            continue
        if target is not None:
            ref = _ref(func, args, kwargs, target)
            if ref is None or type(_eval(ref, args, kwargs)) is not NeuronTensor:
                return
            written[i] = ref
            wlines.append(f"W{i} = {ref}")
            lines.append(f"O{i} = W{i}._data.numpy()")
            sources.append((f"O{i}", out.numpy()))
            continue
        shape, stride, dtype = leaves[i]
        ns.update({f"SHAPE{i}": shape, f"STRIDE{i}": stride, f"DT{i}": dtype})
        lines += _alloc_lines(ns, out, index, str(i), numpy_ok=False)
        lines.append(f"O{i} = data{i}.numpy()")
        sources.append((f"O{i}", out.numpy()))
    inputs = []
    for i, v in enumerate(args):
        if type(v) is NeuronTensor:
            inputs.append((f"args[{i}]", v))
        elif isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            if not all(type(x) is NeuronTensor for x in v):
                return
            inputs += [(f"args[{i}][{j}]", x) for j, x in enumerate(v)]
    for k, v in kwargs.items():
        if type(v) is NeuronTensor:
            inputs.append((f"kwargs[{k!r}]", v))
    for j, (ref, v) in enumerate(inputs):
        if v.dtype.is_complex or v._data.is_neg():
            return
        if ref in written.values():
            continue   # the written tensor is source O{i} already
        sources.append((f"I{j}", v._data.numpy()))
        lines.append(f"I{j} = {ref}._data.numpy()")
    # two sources sharing memory: the lowering's choice between them cannot be told apart
    spans = sorted(_span(arr) for _e, arr in sources if arr.size)
    if any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
        return
    for i, wref in written.items():
        for ref, _v in inputs:
            if ref != wref:
                guards.append(f"if {ref}._block is W{i}._block: return MISS")
    lines = wlines + guards + lines
    # 2. the recorded work, in order
    scratch = []   # spans of the arrays replayed from snapshots (none may be shared)
    for n, entry in enumerate(capture):
        if entry[0] == "call":
            _tag, fn, cargs = entry
            ns[f"H{n}"], ns[f"HA{n}"] = fn, cargs
            lines.append(f"H{n}(*HA{n})")
            continue
        _tag, kernel, kargs, flops, nbytes, engine, dclass, core, snaps, lkey, extra = entry
        if core != index:
            return
        exprs = []
        for m, x in enumerate(kargs):
            if isinstance(x, np.ndarray):
                e = _array_expr(x, sources, ns, f"{n}_{m}")
                if e is None:
                    # not the op's memory: a lowering's own small constant or scratch array
                    # (a stand-in for an absent operand) starts each replay as it started here
                    xlo, xhi = _span(x)
                    if snaps[m] is None or any(xlo < hi and lo < xhi for lo, hi in spans):
                        return
                    if any(xlo < hi and lo < xhi for lo, hi in scratch):
                        # one scratch array handed from launch to launch (mm's contiguous
                        # copy of a strided operand, then the product): each replay copy
                        # would start from the learn call's values
                        return
                    scratch.append((xlo, xhi))
                    ns[f"SN{n}_{m}"] = snaps[m]
                    e = f"SN{n}_{m}.copy()"
                exprs.append(e)
            elif m in runtime:
                exprs.append(runtime[m])   # this call's scalar (its type is the signature's)
            elif isinstance(x, (bool, int, float, np.generic)):
                ns[f"C{n}_{m}"] = x
                exprs.append(f"C{n}_{m}")
            else:
                return
        ns.update({f"K{n}": kernel, f"L{n}": (flops, nbytes, engine, dclass),
                   f"E{n}": (lkey, flops, nbytes, engine, extra)})
        lines += ["t0 = perf() if LH else 0.0",
                  f"K{n}({', '.join(exprs)})", "S.launches += 1", "S.memory_hits += 1",
                  f"d = SIM.cores[IDX].launch(*L{n})",
                  f"if LH: emit(t0, d, *E{n})"]
    # 3. results, shaped as the op returns them
    results = []
    for i, out in enumerate(outs):
        if not isinstance(out, torch.Tensor):
            results.append(f"R{i}")
        else:
            results.append(f"W{i}" if i in written else f"NT(data{i}, block{i}, IDX)")
    lines.append("F['hits'] += 1")
    if len(results) == 1 and spec.num_leaves == 1 and spec.type is None:
        lines.append(f"return {results[0]}")
    else:
        from torch.utils._pytree import tree_unflatten

        ns.update(unflatten=tree_unflatten, SPEC=spec)
        lines.append(f"return unflatten([{', '.join(results)}], SPEC)")
    _add(func, values, sig, _build(plan.name, lines, ns))


def _scalar_args(func, plan, args, kwargs, outs: list, capture: list):
    """An elementwise call learned from its one launch: (values_matter, {kernel argument
    position: source text of that scalar in a call}), or None when it cannot be told."""
    from .lower.common import bind
    from .operands import unwrap_args

    if len(capture) != 1 or capture[0][0] != "launch":
        return None
    kargs = capture[0][2]
    uargs, ukw, _index = unwrap_args(args, kwargs)
    a = bind(func, uargs, ukw)
    facts = plan.lower.fast_facts(func, a, outs)
    if facts is None:
        return None
    _tensors, scalars, values = facts
    if values:
        return True, {}   # the kernel depends on the value: constants, keyed by value
    first = len(kargs) - len(scalars)
    runtime = {}
    for j, nm in enumerate(scalars):
        v = a[nm]
        ref = _ref(func, args, kwargs, nm)
        if isinstance(v, torch.Tensor) or kargs[first + j] is not v and v is not None:
            return None
        if ref is not None and v is not None:
            runtime[first + j] = ref
    return False, runtime


def _array_expr(x: np.ndarray, sources: list, ns: dict, tag: str):
    """Source text giving array x from one of the sources' numpy views, or None."""
    ptr = x.__array_interface__["data"][0]
    lo, hi = _span(x)
    for expr, base in sources:
        if base.dtype != x.dtype:
            continue
        bptr = base.__array_interface__["data"][0]
        if ptr == bptr and x.shape == base.shape and x.strides == base.strides:
            return expr
        if not base.flags.c_contiguous:
            continue
        blo, bhi = _span(base)
        if ptr == bptr and x.flags.c_contiguous and x.size == base.size:
            ns[f"SH{tag}"] = x.shape
            return f"{expr}.reshape(SH{tag})"
        if blo <= lo and hi <= bhi and x.size:
            ns.update({f"SH{tag}": x.shape, f"ST{tag}": x.strides, f"OF{tag}": ptr - bptr})
            return f"ndarray(SH{tag}, {expr}.dtype, {expr}, OF{tag}, ST{tag})"
    return None
