"""The fast path's captured ops: the launches one slow call made, replayed on a repeat's buffers.

While the funnel runs an op listed in CAPTURED (or an elementwise op the flat runner of
fastpath.py does not take), launch() records each launch (kernel, arguments, cost) and the host
calls a lowering marks replayable (blas_threads). If every array argument is a view of one of
the op's own operands or outputs (found by address) or a small constant/scratch array of the
lowering used by one launch only, the op leaves a runner that allocates the same outputs and
replays the launches with arrays re-derived from this call's buffers (see docs/PERFORMANCE.md).
Operands that share memory (attention's q, k, v: interleaved views of one projection) are
taken when each array lies in one operand's span only; one tensor passed twice (cat((f, f)),
m @ m) when its runner is guarded to see one tensor there again. A written operand sharing
memory with another is never learned. `x[int index]` (a dynamic op whose size the shapes fix)
is learned here too (learn_dynamic); a boolean mask never is.

>>> import torch, eager_neuron
>>> from eager_neuron import fastpath_capture
>>> "aten::mm" in fastpath_capture.CAPTURED
True
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from numpy.lib.stride_tricks import as_strided as _as_strided

from .fastpath import (
    MISS,
    SIM,
    STATS,
    STATS_FAST,
    TABLES,
    NeuronTensor,
    _add,
    _alloc_lines,
    _build,
    _charge_lines,
    _entry_point,
    _eval,
    _known,
    _out_part,
    _ref,
    failed,
    full_np,
    signature,
)

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
    # the other reductions of lower/reduce.py: one launch on views of the operand and the
    # outputs (argmax's values go to a scratch array); shape checks only on the host
    "aten::prod", "aten::amax", "aten::amin", "aten::max", "aten::min", "aten::argmax",
    "aten::argmin", "aten::any", "aten::all", "aten::var", "aten::std", "aten::var_mean",
    "aten::std_mean", "aten::logsumexp", "aten::linalg_vector_norm",
    # the cast family (lower/cast.py): elementwise copies; half types go through scratch
    # buffers or reinterpreted views, which are never learned
    "aten::clone", "aten::_to_copy", "aten::copy_", "aten::cat", "aten::stack",
    # scans (lower/reduce.py _scan, _scan_index): one launch on views of the operand and the
    # outputs; an empty output launches nothing (never learned)
    "aten::cumsum", "aten::cumprod", "aten::logcumsumexp", "aten::cummax", "aten::cummin",
    # remaps (lower/shape.py remap_request): one launch on views, its per-dim modes and
    # parameters small constant arrays fixed by the signature (pad, shifts, dims, diagonal by
    # value), the fill value a constant; half operands are never captured
    "aten::constant_pad_nd", "aten::flip", "aten::roll", "aten::repeat", "aten::tril",
    "aten::triu", "aten::slice_backward", "aten::select_backward",
    "aten::_softmax", "aten::_log_softmax", "aten::_safe_softmax", "aten::_softmax_backward_data",
    "aten::_log_softmax_backward_data",
    "aten::native_layer_norm", "aten::native_layer_norm_backward",
    "aten::native_group_norm", "aten::native_group_norm_backward",
    # fused attention (lower/attention.py): launch only; an absent mask is a constant array
    "aten::_scaled_dot_product_fused_attention_overrideable",
    "aten::_scaled_dot_product_fused_attention_overrideable_backward",
    # fused RNN cells (lower/cells.py): one launch on views of the operands and outputs, an
    # absent bias an empty constant; the empty-input paths write on the host but launch
    # nothing, and a call that launched nothing is never learned
    "aten::_thnn_fused_lstm_cell", "aten::_thnn_fused_lstm_cell_backward_impl",
    "aten::_thnn_fused_gru_cell", "aten::_thnn_fused_gru_cell_backward",
    # index and loss kernels flag a bad index or value in an error array their lowering
    # checks through launch.checked (replayed on the replay's flags); launch only otherwise
    "aten::embedding", "aten::embedding_dense_backward", "aten::gather",
    "aten::nll_loss_forward", "aten::nll_loss_backward", "aten::nll_loss2d_forward",
    "aten::nll_loss2d_backward", "aten::mse_loss", "aten::mse_loss_backward",
    "aten::binary_cross_entropy", "aten::binary_cross_entropy_backward",
    # convolution, batch norm, pooling (lower/conv.py, norm.py, pool.py): launches on views;
    # a strided operand's contiguous copy and a half operand's float32 copy are scratch
    # arrays (replayed only when small: launch.py snapshots <= 256 bytes)
    "aten::convolution", "aten::convolution_backward",
    "aten::native_batch_norm", "aten::_native_batch_norm_legit",
    "aten::_native_batch_norm_legit_no_training", "aten::_batch_norm_with_update",
    "aten::_batch_norm_no_update", "aten::native_batch_norm_backward",
    # sort rows (lower/sort.py `rows`): one launch on views; k, dim and the flags are keyed
    # by value
    "aten::sort", "aten::topk", "aten::kthvalue",
    # histc (lower/sort.py): one launch, its range flags checked through launch's `check`
    "aten::histc",
    # index_put / scatter / index_add (lower/index.py put): one launch on views with its error
    # flags checked through launch.checked; a boolean mask's coordinates are counted on the
    # host (lower/mask.py count_steps), which ends the capture: never learned
    "aten::index_put", "aten::index_put_", "aten::_index_put_impl_", "aten::scatter",
    "aten::scatter_", "aten::scatter_add", "aten::scatter_add_", "aten::index_add",
    "aten::index_add_",
    # resampling (lower/resample.py): one launch on views (the index/weight tables are built
    # inside the kernel); half operands' float32 copies are scratch (see above)
    *(f"aten::{op}{r}d{sfx}" for r in (1, 2, 3) for op in ("upsample_nearest",
                                                           "_upsample_nearest_exact")
      for sfx in ("", "_backward")),
    *(f"aten::upsample_{op}{sfx}" for op in ("linear1d", "bilinear2d", "trilinear3d",
                                             "bicubic2d") for sfx in ("", "_backward")),
    *(f"aten::{op}{r}d{sfx}" for r in (1, 2, 3) for op, sfx in (
        ("max_pool", "_with_indices"), ("max_pool", "_with_indices_backward"),
        ("avg_pool", ""), ("avg_pool", "_backward"), ("_adaptive_avg_pool", ""),
        ("_adaptive_avg_pool", "_backward"), ("adaptive_max_pool", ""),
        ("adaptive_max_pool", "_backward"))),
})


def capturable(plan) -> bool:
    """May the fast path learn this op from its captured launches? The CAPTURED ops, and the
    elementwise family (lower/elementwise.py poisons the capture of a call it cannot replay:
    a kernel that can raise, a scalar read from a tensor)."""
    if plan.out_args:
        return False
    return plan.name.split(".")[0] in CAPTURED or \
        getattr(plan.lower, "fast_facts", None) is not None


def host_np(t: torch.Tensor) -> np.ndarray:
    """A host view as numpy: bfloat16 (which numpy lacks) as its int16 bits, as the cast
    kernels read and write it."""
    return t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()


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
    if any(not isinstance(o, (torch.Tensor, int, float, bool, type(None))) for o in outs):
        return
    if not capture and not (outs and all(isinstance(o, torch.Tensor) and o.numel() == 0
                                         for o in outs)):
        return   # only an op with nothing to compute (every output empty) launches nothing
    values, runtime, half_runtime, half_ns, half_pre = True, {}, {}, {}, []
    # the lowering's marks (context.scratch, context.rounded), apart from its launches
    marks = [e for e in capture if e[0] in _MARKS]
    if marks:
        capture = [e for e in capture if e[0] not in _MARKS]
    fresh = [e[1] for e in marks if e[0] == "scratch"]
    fresh_spans = [_span(host_np(t)) for t in fresh if t.numel()]
    if fresh or _half_call(args, kwargs):
        # a half-type op (lower/half.py: float32 scratch, some numbers rounded to the half type
        # on the host). The table's kind is the overload's, and an elementwise overload's
        # float32 flat runners key numbers by type: a half call without numbers (h + h,
        # gelu(h)) joins the table as it is, or starts it keyed by type; one with numbers the
        # route passes on unrounded (h * 2) reads them at run time (_half_runtime); else it
        # bakes its numbers and joins only a table already keyed by value, never starting one
        if getattr(plan.lower, "fast_facts", None) is not None:
            tab = TABLES.get(func)
            if _has_numbers(args, kwargs) and (tab is None or not tab[0]):
                found = _f32_facts(func, plan, args, kwargs, outs)
                if found is None:
                    return
                if tab is not None or not found[1][2]:
                    # (never start an elementwise overload's table keyed by value unless its
                    # float32 runners key by value too: fill_, pow): numbers the half route
                    # passes on unrounded are read at run time, as float32's
                    rounders = {}
                    for e in marks:
                        if e[0] == "rounded":
                            if e[2] is None:
                                return
                            rounders.update(dict.fromkeys(e[1], e[2]))
                    half_runtime = _half_runtime(found, func, plan, args, kwargs, capture,
                                                 rounders, half_ns, half_pre)
                    if half_runtime is None:
                        return
                    values = False
            else:
                values = tab[0] if tab is not None else False
    elif getattr(plan.lower, "fast_facts", None) is not None:
        # the elementwise family keys scalars as its flat runners do (by type): one table
        # kind per overload, or whichever learner came first would lock the other one out
        found = _scalar_args(func, plan, args, kwargs, outs, capture)
        if found is None:
            return
        values, runtime = found
    sig = signature(args, kwargs, values)
    if sig is None or _known(func, values, sig):
        return
    ns = {"S": STATS, "F": STATS_FAST, "SIM": SIM, "NT": NeuronTensor, "MISS": MISS,
          "IDX": index, "ndarray": np.ndarray, "FULL": full_np, "HNP": host_np, **half_ns}
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
            # (numpy has no bfloat16: its int16 bits, as the casts write them)
            lines.append(f"O{i} = HNP(W{i}._data)" if out.dtype == torch.bfloat16 else
                         f"O{i} = FULL(W{i})")
            sources.append((f"O{i}", host_np(out)))
            continue
        shape, stride, dtype = leaves[i]
        ns.update({f"SHAPE{i}": shape, f"STRIDE{i}": stride, f"DT{i}": dtype})
        lines += _alloc_lines(ns, out, index, str(i), recycle=True)
        # the numpy form allocates the array first (np.empty + from_numpy): its full view
        lines.append(f"O{i} = data_np{i}" if f"NPDT{i}" in ns or f"POOLNP{i}" in ns
                     else f"O{i} = HNP(data{i})")
        sources.append((f"O{i}", host_np(out)))
    inputs = []
    for i, v in enumerate(args):
        if type(v) is NeuronTensor:
            inputs.append((f"args[{i}]", v))
        elif isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            if not all(x is None or type(x) is NeuronTensor for x in v):
                return
            # (a None in index's Tensor?[] is where the signature has None: never a tensor)
            inputs += [(f"args[{i}][{j}]", x) for j, x in enumerate(v) if x is not None]
    for k, v in kwargs.items():
        if type(v) is NeuronTensor:
            inputs.append((f"kwargs[{k!r}]", v))
    refs_of = {}   # source name -> the call's argument it reads
    for j, (ref, v) in enumerate(inputs):
        if v.dtype.is_complex or v._data.is_neg():
            return
        if ref in written.values():
            continue   # the written tensor is source O{i} already
        sources.append((f"I{j}", host_np(v._data)))
        lines.append(f"I{j} = HNP({ref}._data)" if v.dtype == torch.bfloat16 else
                     f"I{j} = FULL({ref})")
        refs_of[f"I{j}"] = ref
    # two sources sharing memory: the lowering's choice between them cannot be told apart by
    # address alone. Read-only operands that only interleave (attention's q, k, v: views of
    # one projection) are taken when every array a launch gets lies in one source's span and
    # no other's (`strict`); a written tensor sharing memory with another source never is
    spans = sorted(_span(arr) for _e, arr in sources if arr.size)
    strict = any(a[1] > b[0] for a, b in zip(spans, spans[1:]))
    if strict and not _inputs_overlap_only(sources):
        return
    for i, wref in written.items():
        for ref, _v in inputs:
            if ref != wref:
                guards.append(f"if {ref}._block is W{i}._block: return MISS")
    lines = wlines + guards + lines
    # one tensor passed twice (cat((freqs, freqs))): its arrays are taken from either, and
    # the runner serves only calls passing one tensor there again (`same`: guards added last)
    same, at = ({} if strict else None), len(wlines) + len(guards)
    # 2. the recorded work, in order
    scratch = []   # spans of the arrays replayed from snapshots (none may be shared)
    entries = 0    # launches calling their kernel's compiled entry point
    for n, entry in enumerate(capture):
        if entry[0] == "call":
            _tag, fn, cargs = entry
            ns[f"H{n}"], ns[f"HA{n}"] = fn, cargs
            lines.append(f"H{n}(*HA{n})")
            continue
        if entry[0] == "check":
            # a host check of a launch's error flags (launch.checked): on this replay's flags
            _tag, fn, cargs = entry
            exprs = []
            for m, x in enumerate(cargs):
                if isinstance(x, np.ndarray):
                    e = _array_expr(x, sources, ns, f"{n}_{m}", same)
                    if e is None:
                        return
                    exprs.append(e)
                else:
                    ns[f"C{n}_{m}"] = x
                    exprs.append(f"C{n}_{m}")
            ns[f"H{n}"] = fn
            lines.append(f"H{n}({', '.join(exprs)})")
            continue
        _tag, kernel, kargs, flops, nbytes, engine, dclass, core, snaps, lkey, extra = entry
        if core != index:
            return
        exprs = []
        for m, x in enumerate(kargs):
            if isinstance(x, np.ndarray):
                e = _array_expr(x, sources, ns, f"{n}_{m}", same)
                if e is None and fresh_spans:
                    e = _fresh_expr(x, fresh, sources, ns, lines, f"{n}_{m}", same)
                    if e is None and any(xlo < hi and lo < xhi for lo, hi in fresh_spans
                                         for xlo, xhi in (_span(x),)):
                        return   # in the lowering's scratch, but not a view the replay makes
                if e is None:
                    # not the op's memory: a lowering's own small constant or scratch array
                    # (a stand-in for an absent operand) starts each replay as it started here
                    xlo, xhi = _span(x)
                    if snaps[m] is None or any(xlo < hi and lo < xhi for lo, hi in spans):
                        return
                    if any(xlo < hi and lo < xhi for lo, hi in scratch):
                        return   # part of a scratch array seen before, not found as a view
                    scratch.append((xlo, xhi))
                    ns[f"SN{n}_{m}"] = snaps[m]
                    e = f"X{n}_{m}"
                    lines.append(f"{e} = SN{n}_{m}.copy()")
                    # a scratch array handed from launch to launch (mm's contiguous copy of
                    # a strided operand, then the product): later launches of this replay
                    # use this replay's copy, found as a source like the op's own memory
                    sources.append((e, x))
                exprs.append(e)
            elif m in runtime:
                exprs.append(runtime[m])   # this call's scalar (its type is the signature's)
            elif (n, m) in half_runtime:
                exprs.append(half_runtime[n, m])
            elif isinstance(x, (bool, int, float, np.generic)):
                ns[f"C{n}_{m}"] = x
                exprs.append(f"C{n}_{m}")
            else:
                return
        # the kernel's compiled entry point for the types every replay passes: its arrays have
        # this signature's dtypes, shapes and strides (views of aligned buffers, or copies of
        # snapshots), its other arguments are constants or this call's scalar of the
        # signature's type; an int scalar is left to the dispatcher (Numba types one past
        # int64 as uint64). The dispatcher's type matching: ~0.3 us a call warm, ~1.3 us with
        # the caches cold after a big kernel (measured on its own; docs/THROUGHPUT.md)
        # (counted in STATS_FAST["entry_points"] with the flat runners')
        ep = None
        if not any(type(kargs[m]) is int for m in runtime) and \
                not any(type(kargs[mm]) is int or f"RND{mm}" in half_ns
                        for nn, mm in half_runtime if nn == n):
            ep = _entry_point(kernel, kargs)
            entries += ep is not None
        ns.update({f"K{n}": kernel if ep is None else ep,
                   f"E{n}": (lkey, flops, nbytes, engine, extra)})
        lines += ["t0 = perf() if LH else 0.0",
                  f"K{n}({', '.join(exprs)})", "S.launches += 1", "S.memory_hits += 1",
                  _charge_lines(ns, index, flops, nbytes, engine, dclass, str(n)),
                  f"if LH: emit(t0, d, *E{n})"]
    if same:
        lines[at:at] = [f"if {refs_of[x]} is not {refs_of[y]}: return MISS"
                        for x, y in sorted(same.items())]
    # 3. results, shaped as the op returns them
    results = []
    from .tensor import DEVICES

    ns.update(make=torch.Tensor._make_wrapper_subclass, DEV=DEVICES[index], STRIDED=torch.strided)
    for i, out in enumerate(outs):
        if not isinstance(out, torch.Tensor):
            results.append(f"R{i}")
        elif i in written:
            results.append(f"W{i}")
        else:
            # the wrapper made directly from the signature's metadata (NeuronTensor.__new__
            # reads it back from the host view), with its numpy view cached (fastpath.full_np)
            lines += [f"r{i} = make(NT, SHAPE{i}, STRIDE{i}, 0, None, DT{i}, STRIDED, DEV)",
                      f"r{i}._data = data{i}", f"r{i}._block = block{i}", f"r{i}._index = IDX",
                      f"r{i}._npc = (data{i}, O{i}, None)", f"r{i}._sgc = (data{i}, PART{i})"]
            ns[f"PART{i}"] = _out_part(ns, str(i), index)
            results.append(f"r{i}")
    lines.append("F['hits'] += 1")
    if len(results) == 1 and spec.num_leaves == 1 and spec.type is None:
        lines.append(f"return {results[0]}")
    elif spec.type is tuple and spec.num_leaves == len(results) and \
            all(c.is_leaf() for c in spec.children()):
        # a flat tuple of results (attention's nine, layer norm's three): built directly
        # (tree_unflatten walks the spec in Python: ~5 us for nine leaves)
        lines.append(f"return ({', '.join(results)},)")
    else:
        from torch.utils._pytree import tree_unflatten

        ns.update(unflatten=tree_unflatten, SPEC=spec)
        lines.append(f"return unflatten([{', '.join(results)}], SPEC)")
    lines[0:0] = half_pre   # numbers rounded at run time, before anything is allocated
    if _add(func, values, sig, _build(plan.name, lines, ns)) and entries:
        STATS_FAST["entry_points"] += 1


_INDEX_DTYPES = (torch.int64, torch.int32)


def dynamic_capturable(plan, a: dict) -> bool:
    """May the fast path learn this dynamic op's call? Only `self[indices]` by integer index
    tensors: its output size is fixed by the operands' shapes (the signature), not their
    values. A boolean or uint8 mask (nonzero's count: a size read from the data) never is.
    And _grouped_mm (its output's shape is the operands'): its one-launch kernel reads the
    group ends itself; the per-group route reads them on the host and ends the capture."""
    if plan.name == "aten::_grouped_mm":
        return True
    if plan.name != "aten::index.Tensor":
        return False
    self, indices = a["self"], a["indices"]
    if self.dtype.is_complex or self.dtype.itemsize < 4 and self.dtype.is_floating_point:
        return False   # half and complex operands take scratch copies (never learned)
    return any(t is not None for t in indices) and \
        all(t is None or t.dtype in _INDEX_DTYPES for t in indices)


def learn_dynamic(func, plan, args, kwargs, index: int, produced: list, capture: list) -> None:
    """After a dynamic op's slow call dynamic_capturable allowed (its launches recorded, its
    outputs [(data, block), ...] as the lowering sized them): leave a captured runner, as
    for a kernel op. A signature that fails to learn twice is not tried again."""
    from torch.utils._pytree import tree_flatten

    outs = [data for data, _block in produced]
    leaves = [(tuple(d.shape), d.stride(), d.dtype) for d in outs]
    spec = tree_flatten(outs[0] if len(outs) == 1 else tuple(outs))[1]
    learned = STATS_FAST["learned"]
    learn_captured(func, plan, args, kwargs, index, outs, leaves, spec, capture)
    if STATS_FAST["learned"] == learned:
        failed(func, args, kwargs)


def _scalar_args(func, plan, args, kwargs, outs: list, capture: list):
    """An elementwise call learned from its one launch: (values_matter, {kernel argument
    position: source text of that scalar in a call}), or None when it cannot be told."""
    from .lower.common import bind
    from .operands import unwrap_args

    if len(capture) > 1 or capture and capture[0][0] != "launch":
        return None
    uargs, ukw, _index = unwrap_args(args, kwargs)
    a = bind(func, uargs, ukw)
    facts = plan.lower.fast_facts(func, a, outs)
    if facts is None:
        return None
    _tensors, scalars, values = facts
    if not capture:
        return values, {}   # an empty output: no kernel, no scalar to read
    kargs = capture[0][2]
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


def _f32_facts(func, plan, args, kwargs, outs: list):
    """(bound arguments, the family's fast_facts for the float32 op the half route launches) or
    None: computed on float32 stand-ins of the half operands and outputs."""
    from .lower.common import bind
    from .operands import unwrap_args

    uargs, ukw, _index = unwrap_args(args, kwargs)
    a = bind(func, uargs, ukw)
    try:
        facts = plan.lower.fast_facts(func, {k: _as_f32(v) for k, v in a.items()},
                                      [_as_f32(o) for o in outs])
    except NotImplementedError:
        return None
    return None if facts is None else (a, facts)


def _half_runtime(found: tuple, func, plan, args, kwargs, capture: list, rounders: dict,
                  half_ns: dict, half_pre: list):
    """{(launch, kernel argument position): source text of the call's number} for a half-type
    elementwise call whose numbers all reach the float32 op's launch as they were passed, or
    rounded to the half type by the function the lowering marked (context.rounded: `rounders`,
    name -> function; the runner's first lines round the call's number, `half_pre`, with the
    function in `half_ns`); none folded into the template (the family's `fast_facts` names them
    as kernel scalars, keyed by type), or None. `found`: _f32_facts of the call."""
    op_name = getattr(plan.lower.fast_facts, "keywords", {}).get("op_name")
    a, facts = found
    if facts[2] or op_name is None:
        return None
    _tensors, scalars, _values = facts
    numbers = {nm for nm, v in a.items() if isinstance(v, (int, float))}
    if not numbers <= set(scalars):
        return None   # a number the lowering bakes into its template
    ops = [n for n, e in enumerate(capture) if e[0] == "launch" and e[9][1] == op_name]
    if len(ops) != 1:
        return None
    n = ops[0]
    kargs = capture[n][2]
    first = len(kargs) - len(scalars)
    out = {}
    for j, nm in enumerate(scalars):
        v = a[nm]
        ref = _ref(func, args, kwargs, nm)
        if isinstance(v, torch.Tensor) or first + j < 0:
            return None
        if v is None or ref is None:
            continue   # a default: the same on every call of the signature
        fn = rounders.get(nm)
        if fn is not None:
            want = fn(v)
            got = kargs[first + j]
            if got is not want and (type(got) is not type(want) or got != want):
                return None   # not what the lowering's rounding gives (a NaN: unequal)
            r = f"RND{first + j}"
            half_ns[r] = functools.partial(_rounded_at_run_time, fn)
            half_pre += [f"R{first + j} = {r}({ref})", f"if R{first + j} is MISS: return MISS"]
            out[n, first + j] = f"R{first + j}"
        elif kargs[first + j] is not v:
            return None   # changed on its way (a cast): only its value would do
        else:
            out[n, first + j] = ref
    return out


def _rounded_at_run_time(fn, v):
    """A replay's value for the number v the lowering rounds with fn: the slow path's, but an
    int stays an int (the value the kernel takes is the same; its compiled types do not change
    from call to call), and an int the half type cannot hold (inf) is left to the slow path."""
    r = fn(v)
    if type(v) is int and type(r) is not int:
        return int(r) if math.isfinite(r) else MISS
    return r


_MARKS = ("scratch", "rounded")


def _as_f32(v):
    from .lower.common import HALF

    if isinstance(v, torch.Tensor) and v.dtype in HALF:
        return torch.empty_strided(v.shape, v.stride(), dtype=torch.float32)
    return v


def _half_call(args: tuple, kwargs: dict) -> bool:
    """Does the call pass a bfloat16/float16 tensor (the half route, whether it ran as three
    kernels with float32 scratch or as one: lower/elementwise.py prepare_half)?"""
    from .lower.common import HALF

    for v in (*args, *kwargs.values()):
        for x in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(x, torch.Tensor) and x.dtype in HALF:
                return True
    return False


def _has_numbers(args: tuple, kwargs: dict) -> bool:
    """Does the call pass a Python number (bools included), alone or in a list?"""
    for v in (*args, *kwargs.values()):
        for x in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(x, (int, float)):
                return True
    return False


def _fresh_expr(x: np.ndarray, fresh: list, sources: list, ns: dict, lines: list, tag: str,
                same):
    """Source text giving array x from scratch the lowering allocated uninitialized for this
    call (context.scratch): each replay allocates its own of the same layout when the first
    launch reaches it (host scratch, as the slow path's), or None when x lies in none."""
    lo, hi = _span(x)
    for k, t in enumerate(fresh):
        if t is None:
            continue
        arr = host_np(t)
        tlo, thi = _span(arr)
        if tlo <= lo and hi <= thi:
            fresh[k] = None   # from now on a source like the op's own memory
            name = f"Z{tag}"
            ns.update({f"ZSH{tag}": tuple(t.shape), f"ZST{tag}": t.stride(),
                       f"ZDT{tag}": t.dtype, "EMPTY": torch.empty_strided})
            lines.append(f"{name} = HNP(EMPTY(ZSH{tag}, ZST{tag}, dtype=ZDT{tag}))")
            sources.append((name, arr))
            return _array_expr(x, sources, ns, tag, same)
    return None


def _inputs_overlap_only(sources: list) -> bool:
    """Do only operands (I*: read, never written by the op) share memory among the sources?"""
    spans = sorted((*_span(arr), e) for e, arr in sources if arr.size)
    for j, (_lo, hi, e) in enumerate(spans):
        for lo2, _hi2, e2 in spans[j + 1:]:
            if lo2 >= hi:
                break
            if e[0] != "I" or e2[0] != "I":
                return False
    return True


def _array_expr(x: np.ndarray, sources: list, ns: dict, tag: str, same: dict | None = None):
    """Source text giving array x from one of the sources' numpy views, or None. `same` not
    None (sources share memory): x must lie in exactly one source's span, and come from that
    one; or in several identical views of operands (one tensor passed twice), then from the
    first, and `same` records that the runner must see one tensor in those places again."""
    ptr = x.__array_interface__["data"][0]
    lo, hi = _span(x)
    if same is not None:
        owners = [(e, b) for e, b in sources if _span(b)[0] <= lo and hi <= _span(b)[1]]
        if not owners:
            return None
        if len(owners) > 1:
            e0, b0 = owners[0]
            look = (b0.__array_interface__["data"][0], b0.shape, b0.strides, b0.dtype)
            if any(e[0] != "I" or (b.__array_interface__["data"][0], b.shape, b.strides,
                                   b.dtype) != look for e, b in owners):
                return None
            for e, _b in owners[1:]:
                same[e] = e0
        sources = owners[:1]
    for expr, base in sources:
        if base.dtype != x.dtype:
            if base.dtype.itemsize != x.dtype.itemsize:
                continue
            # the operand's bits reinterpreted (a half cast reads float32 as int32 and writes
            # bfloat16/float16 as int16): found in the same view of this call's operand
            ns[f"VD{tag}"] = x.dtype
            expr, base = f"{expr}.view(VD{tag})", base.view(x.dtype)
        bptr = base.__array_interface__["data"][0]
        if ptr == bptr and x.shape == base.shape and x.strides == base.strides:
            return expr
        if not base.flags.c_contiguous:
            blo, bhi = _span(base)
            if ptr == bptr and blo <= lo and hi <= bhi and x.size:
                # a strided operand re-viewed by the lowering from its first element (dims
                # coalesced, a broadcast dim added): the same view of this call's operand
                ns.update({f"SH{tag}": x.shape, f"ST{tag}": x.strides, "as_strided": _as_strided})
                return f"as_strided({expr}, SH{tag}, ST{tag})"
            continue
        blo, bhi = _span(base)
        if ptr == bptr and x.flags.c_contiguous and x.size == base.size:
            ns[f"SH{tag}"] = x.shape
            return f"{expr}.reshape(SH{tag})"
        if blo <= lo and hi <= bhi and x.size:
            ns.update({f"SH{tag}": x.shape, f"ST{tag}": x.strides, f"OF{tag}": ptr - bptr})
            return f"ndarray(SH{tag}, {expr}.dtype, {expr}, OF{tag}, ST{tag})"
    return None
