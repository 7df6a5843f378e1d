"""The funnel: every aten op on a neuron tensor, under NeuronMode, or a factory on the device.

(Over 500 lines on purpose: the funnel's every route is here so that a kernel op's lowering is
called in dispatch()'s own frame; meta, plans, buffers, operands and the written-tensor checks
are their own modules.)

    1. classify (once per overload): view | alloc | host | foreach | kernel | decomp | fallback
    2. decompositions re-enter here op by op
    3. outputs' shape/dtype/strides from meta execution, cached per argument signature
    4. lowering -> launch (memory cache -> disk cache -> compile) on the simulated core

>>> import torch, eager_neuron
>>> x = torch.ones(2, 3, device="neuron")
>>> (x * 2).sum().item()
12.0
"""

from __future__ import annotations

import threading
import types
import warnings

import torch
from torch.utils._pytree import tree_unflatten

from . import adaptive_fast as _adaptive_fast
from . import backward as _backward
from . import context as _context
from . import errors
from . import fastpath as _fast
from . import fastpath_capture as _capture
from . import fastpath_foreach as _fast_foreach
from . import tensor as _tensor_mod
from .adaptive import MODULE as _adaptive
from .buffers import _ITEMSIZE, _POOLED_BYTES, _span, alloc, to_host  # noqa: F401 -- API
from .buffers import device_index as _device_index
from .compile.tracing import run_outside_fake
from .config import config
from .context import OpContext
from .cpu_check import cpu_raises, shares_written
from .fallback import log_op, run_fallback
from .inplace import composite_versions, resize_out, resize_outs, run_inplace_view, warn_resized
from .launch import launch
from .lower import host as _host
from .lower.cast import RUN as _RUN
from .lower.common import COMPLEX, FP8, HALF, bind
from .operands import _check_tensor, _original, _unwrap, unwrap_args  # noqa: F401 -- API
from .operands import spans as _op_spans
from .placement import DEVICE_AT as _DEVICE_AT
from .placement import check_placement
from .placement import elsewhere as _elsewhere
from .plan import _PLANS, Plan, _plan, _to_meta, meta_outputs  # noqa: F401 -- API
from .plan import fusible_lowerings as _fusible
from .refusals import REFUSE as _REFUSE
from .stats import STATS
from .tensor import NeuronTensor, wrap
from .written import (
    _check_decomp_written,
    _check_partial_overlap,
    _check_written,
)

aten = torch.ops.aten

# Adaptive eager: launch this thread's pending fused group before a value can be observed
# (adaptive.flush itself: one call less on every flush path)
flush = _adaptive.flush


# ---------------------------------------------------------------------------------------------
# the funnel
# ---------------------------------------------------------------------------------------------

# Profiler hooks: each is a context-manager factory hook(plan, args, kwargs) entered around an op.
OP_HOOKS: list = []
# errors the funnel raises unchanged; any other error of a lowering (or of a runner replaying
# it: a captured index check) is raised as errors.kernel_error words it
_RAISED_AS_IS = (errors.UnsupportedOpError, errors.UnsupportedTensorError, torch.OutOfMemoryError)
_FAST_TABLES = _fast.TABLES
_STATE = _adaptive.STATE
# adaptive eager on, no group pending anywhere: ops adaptive eager would run with plain eager's
# runner anyway take the fast path above directly (adaptive_fast.IDLE_PLAIN)
_IDLE_PLAIN = _adaptive_fast.IDLE_PLAIN
_VIEWS = _adaptive_fast.VIEWS   # ... and views even while a group is pending


_GATED_KINDS = frozenset({"kernel", "decomp", "dynamic"})
_PLAIN_DTYPES = frozenset({torch.float32, torch.float64})
_DTYPES_RAN: set = set()   # (op, its operands' dtypes) the CPU ran (a refusal is asked again)
# ops whose real dtypes follow CUDA's kernels, not the CPU's: integer histc (transformers' MoE
# layers count tokens per expert with it on the device; the CPU's histogram_cpu refuses them)
_GATE_EXEMPT = frozenset({torch.ops.aten.histc.default, torch.ops.aten.histc.out})


def _operand_dtypes(args, kwargs) -> list:
    out = []
    for group in (args, kwargs.values()):
        for a in group:
            if isinstance(a, torch.Tensor):
                out.append(a.dtype)
            elif type(a) is list or type(a) is tuple:
                out.extend(v.dtype for v in a if isinstance(v, torch.Tensor))
    return out


def _probe(func, args, kwargs):
    """cpu_raises on a thread of its own: a warning the CPU's kernel gives there (var's degrees
    of freedom, index_reduce's beta notice) stays there. On this thread, inside the user's op,
    ATen holds a nested call's warnings until the outer op returns, past any filter: the user
    saw them twice."""
    box: list = []
    worker = threading.Thread(target=lambda: box.append(cpu_raises(func, args, kwargs)),
                              name="eager_neuron dtype probe")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        worker.start()
        worker.join()
    return box[0] if box else None


def _dtype_gate(func, args, kwargs) -> None:
    """The CPU's refusal of a dtype its kernel is not built for ('"GeluKernelImpl" not
    implemented for 'Long'', a special function in bfloat16, linalg.lu of an integer matrix, a
    loss of complex inputs, ...), where neuron's kernel or decomposition would answer: the first
    call of each (op, operand dtypes) with an operand that is not float32/float64 is asked of
    the CPU (on copies, cpu_check), its answer kept; a refusal is raised in its words, the op
    and the user's line after them. Slow path only (a refused call never leaves a fast-path
    runner); float32/float64 calls and ops the CPU is not asked about (views, copies,
    allocations, CPU fallbacks: they raise as the CPU does; ops with a refusals.py rule, which
    words its own fix) pass at once."""
    dts = _operand_dtypes(args, kwargs)
    if not dts or _PLAIN_DTYPES.issuperset(dts):
        return
    key = (func, tuple(dts))
    if key in _DTYPES_RAN or (func in _GATE_EXEMPT and not any(d.is_complex for d in dts)):
        return
    cpu = _probe(func, args, kwargs)
    if cpu is None:
        _DTYPES_RAN.add(key)
    elif isinstance(cpu, NotImplementedError) and "not implemented for" in str(cpu):
        odd = next(d for d in dts if d not in _PLAIN_DTYPES)
        ours = (f"no {odd} kernel on the CPU either; fix: cast the operand to a dtype the op "
                "takes first (x.float(), x.to(torch.float32))")
        raise errors.cpu_worded(func.name(), cpu, args, kwargs, ours) or cpu


def dispatch(func, args, kwargs, mode=None, plan=None):
    """Run one aten op. `mode` is the NeuronMode when entered through it (CPU in, CPU out).

    A kernel op is one call from here to its lowering and two to its launch: the lowering is
    called in this frame, between `_kernel_setup` (outputs, context) and `_kernel_results`.
    A dynamic op's lowering is called in this frame too; one written as a generator of launch
    requests (count, allocate, fill) has each launch made here.
    `plan`: the funnel's own re-entry into the kernel path (an op under the profiler's hook, a
    same-core copy lower/host.py routes to the copy kernels): no fast path, not counted again.
    """
    entry = plan is None
    if entry:
        STATS.ops += 1
        # the fast path: a repeat of a signature a runner was left for (see fastpath.py), while
        # nothing watches ops one by one
        tab = _FAST_TABLES.get(func)
        if (tab is not None and mode is None
                and ((not _STATE.enabled or func in _IDLE_PLAIN) and not _adaptive.PENDING
                     or func in _VIEWS)
                and not config.log and not config.cache_verify and config.fastpath):
            sig = _fast.signature(args, kwargs, tab[0])
            run = tab[1].get(sig) if sig is not None else None
            if run is not None:
                if OP_HOOKS:   # the profiler: the op's record around the runner's launches
                    try:
                        return _run_hooked(func, run, args, kwargs)
                    except Exception as exc:
                        if _backward.in_backward():
                            return _backward.failed(exc)
                        raise
                try:
                    out = run(args, kwargs)
                except Exception as exc:   # as the funnel raises it: the op, your line, its args
                    # NOTE: no local holds the new error (its traceback would hold this frame: a
                    # cycle keeping the runner's output blocks allocated until the next collection)
                    if isinstance(exc, _RAISED_AS_IS):
                        if _backward.in_backward():
                            return _backward.failed(exc)
                        raise
                    plan = _PLANS.get(func) or _plan(func)
                    if _backward.in_backward():
                        return _backward.failed(_kernel_error(func, plan, exc, args, kwargs))
                    raise _kernel_error(func, plan, exc, args, kwargs) from exc
                if out is not _fast.MISS:
                    return out
        if _STATE.enabled and mode is None and not OP_HOOKS:
            # adaptive eager's fast path: a repeat of a recorded call records (adaptive_fast.py)
            try:
                out = _adaptive_fast.run(func, args, kwargs)
            except Exception as exc:
                if _backward.in_backward():
                    return _backward.failed(exc)
                raise
            if out is not _fast.MISS:
                return out
        plan = _PLANS.get(func)
        if plan is None:
            plan = _PLANS[func] = _plan(func)
        at = _DEVICE_AT.get(func)
        if at is not None and mode is None:
            # zeros_like(x, device="cpu"), x.new_ones(2, device="neuron:1"): made where asked
            out = _elsewhere(func, at, args, kwargs)
            if out is not NotImplemented:
                return out
        if "ops" in config.log:
            log_op(plan, args, kwargs)
        refuse = _REFUSE.get(func)   # what the CPU refuses before any kernel (refusals.py)
        if (refuse is None or getattr(refuse, "gated", False)) and plan.kind in _GATED_KINDS:
            _dtype_gate(func, args, kwargs)   # a dtype the CPU's kernel is not built for
        if OP_HOOKS or _adaptive.PENDING or plan.kind != "kernel" or refuse is not None:
            refused = refuse is not None
            try:
                if refuse is not None:
                    refuse(args, kwargs)
                    refused = False
                if OP_HOOKS:
                    with OP_HOOKS[0](plan, args, kwargs):
                        return _dispatch_plan(func, plan, args, kwargs, mode)
                if _adaptive.PENDING:
                    _adaptive_gate(plan, args, kwargs, mode)
                if plan.kind == "dynamic":
                    # a data-dependent op (_run_dynamic, inlined): its lowering is called from
                    # here, and a lowering written as steps has each launch made here
                    a, index = _dynamic_setup(func, plan, args, kwargs)
                    dctx = OpContext(index or 0, mode)
                    if mode is None and index is not None and not _STATE.enabled and \
                            config.fastpath and _capture.dynamic_capturable(plan, a) and \
                            not _fast.declined(func, args, kwargs):
                        dctx.capture = []   # x[int index]: sized by shapes, learned as captured
                    prev = _context.swap(dctx)
                    try:
                        produced = _dynamic_lowering(plan, a)(func, a, index)
                        if type(produced) is _GENERATOR:
                            steps = produced
                            while True:
                                try:
                                    req = next(steps)
                                except StopIteration as stop:
                                    produced = stop.value
                                    break
                                if req[0] is _RUN:
                                    req[1](*req[2:])
                                else:
                                    launch(*req)
                    except NotImplementedError as exc:
                        return _lowering_declined(func, plan, args, kwargs, mode, exc)
                    except _DYNAMIC_AS_IS:
                        raise
                    except Exception as exc:
                        raise _kernel_error(func, plan, exc, args, kwargs) from exc
                    finally:
                        _context.swap(prev)
                    if dctx.capture:
                        _capture.learn_dynamic(func, plan, args, kwargs, index, produced,
                                               dctx.capture)
                    return _dynamic_results(produced, index)
                if plan.kind != "kernel":
                    return _dispatch_plan(func, plan, args, kwargs, mode, gated=True)
            except Exception as exc:
                worded = None if refused or plan.kind == "kernel" else \
                    _cpu_words(func, plan, exc, args, kwargs)
                if mode is None and _backward.in_backward():
                    return _placeholder_outputs(func, plan, args, kwargs, worded or exc)
                if worded is not None:
                    raise worded from exc
                raise
    # the kernel path: 1-2. outputs and the op's context; 3. the lowering, called from here
    # (half types computed in float32, rounded to nearest even); 4. the results
    try:
        try:
            call = _kernel_setup(func, plan, args, kwargs, mode)
        except _RAISED_AS_IS:
            raise
        except Exception as exc:   # a meta function's or a written-tensor check's refusal
            worded = _cpu_words(func, plan, exc, args, kwargs)
            if worded is None:
                raise
            raise worded from exc
        ctx = call[0]
        if ctx is None:   # adaptive eager recorded the op: its result
            return call[1]
        _, a, outs, blocks, leaves, spec, index, dtypes = call
        tls = _TLS_CTX
        prev = getattr(tls, "ctx", None)
        tls.ctx = ctx
        try:
            lower = plan.lower
            if plan.prepare is not None and dtypes.isdisjoint(_WIDENED):
                # the hot path: the lowering hands back its launch; dispatch -> launch
                req = plan.prepare(func, a, outs)
                if req is not None:
                    launch(*req)
                    if ctx.capture and not _fast.learn_elementwise(
                            func, plan, args, kwargs, index, a, outs, leaves, req):
                        _learn_captured(func, plan, args, kwargs, index, outs, leaves, spec,
                                        ctx.capture)
                elif ctx.capture is not None:   # nothing to launch: an empty output
                    _learn_captured(func, plan, args, kwargs, index, outs, leaves, spec,
                                    ctx.capture)
            elif not dtypes.isdisjoint(_WIDENED) and (route := _route_of(dtypes, lower)):
                # float8 (the CPU's rules, lower/fp8.py), complex operands (their own family),
                # half types (computed in float32, lower/half.py): the route's steps, launched
                # here; a RUN step is a lowering without a request builder (it launches itself)
                for req in _route(route)(func, plan, a, outs):
                    if req[0] is _RUN:
                        req[1](*req[2:])
                    else:
                        launch(*req)
                if ctx.capture:
                    _learn_captured(func, plan, args, kwargs, index, outs, leaves, spec,
                                    ctx.capture)
            else:
                lower(func, a, outs)
                if ctx.capture:
                    _learn_captured(func, plan, args, kwargs, index, outs, leaves, spec,
                                    ctx.capture)
        except (errors.UnsupportedOpError, errors.UnsupportedTensorError, torch.OutOfMemoryError):
            raise
        except NotImplementedError as exc:
            return _lowering_declined(func, plan, args, kwargs, mode, exc)
        except Exception as exc:
            raise _kernel_error(func, plan, exc, args, kwargs) from exc
        finally:
            tls.ctx = prev
        return _kernel_results(func, plan, args, kwargs, outs, blocks, index, spec)
    except Exception as exc:
        if entry and mode is None and _backward.in_backward():
            return _placeholder_outputs(func, plan, args, kwargs, exc)
        raise


def _run_hooked(func, run, args, kwargs):
    """A runner under the profiler's op hook (a runner tells launch.HOOKS its launches); a call
    the runner declines goes down the funnel inside the same op record."""
    plan = _PLANS.get(func)
    if plan is None:
        plan = _PLANS[func] = _plan(func)
    with OP_HOOKS[0](plan, args, kwargs):
        try:
            out = run(args, kwargs)
        except _RAISED_AS_IS:
            raise
        except Exception as exc:   # the runner's own error, worded as the funnel words it
            raise _kernel_error(func, plan, exc, args, kwargs) from exc
        if out is _fast.MISS:
            return _dispatch_plan(func, plan, args, kwargs, None)
        return out


def _placeholder_outputs(func, plan, args, kwargs, exc):
    """An op failed on autograd's side, where raising aborts the process in torch 2.13: see
    backward.py (the error is stashed; backward() raises it; nothing is written to .grad)."""
    return _backward.failed(exc)


def _adaptive_gate(plan, args, kwargs, mode) -> None:
    """Adaptive eager, before an op runs while groups are pending: another thread's group that
    touches this op's tensors launches first; this thread's group launches first unless the op
    may join it (see docs/ARCHITECTURE.md, adaptive eager)."""
    pending = _adaptive.PENDING
    key = _adaptive.stream_key()
    if len(pending) > 1 or key not in pending:
        _adaptive.flush_others(_op_spans(args, kwargs))
    kind = plan.kind
    if key in pending and not _adaptive.STATE.enabled:
        # adaptive eager turned off while this stream's group was pending (another thread's
        # block closed as this one recorded): nothing records any more, so it launches first
        flush("adaptive toggled")
    elif key in pending and (
            mode is not None or kind not in ("view", "alloc", "decomp", "foreach", "host",
                                             "kernel") or
            (kind == "kernel" and plan.lower not in _fusible()
             and plan.name not in _adaptive.REDUCTIONS)):
        flush(f"non-fusible op {plan.name}")


def _dispatch_plan(func, plan, args, kwargs, mode, gated=False):
    kind = plan.kind
    if not gated and _adaptive.PENDING:
        _adaptive_gate(plan, args, kwargs, mode)
    if kind == "view":
        return _run_view(func, args, kwargs, mode)
    if kind == "kernel":
        return dispatch(func, args, kwargs, mode, plan)
    if kind == "decomp":
        if plan.mutates and mode is None:
            _check_decomp_written(func, plan, args, kwargs)
            if plan.out_args:
                _refuse_shared_out(func, plan, args, kwargs)
                if _out_dtypes_differ(func, plan, args, kwargs):
                    _refuse_via_cpu(func, plan, args, kwargs)   # some out= must match exactly
            if not getattr(_TLS, "decomps", None):   # top level: bump versions as the CPU
                with composite_versions(func):
                    return _run_decomp(func, plan, plan.decomp, args, kwargs, mode)
        return _run_decomp(func, plan, plan.decomp, args, kwargs, mode)
    if kind == "host":
        if plan.out_args and mode is None:
            resize_outs(func, plan, args, kwargs)
        out = plan.lower(func, args, kwargs, mode)
        if mode is None and plan.name in _COMPOSITES and not plan.out_args and \
                config.fastpath:
            _fast.learn_composite(func, args, kwargs, plan.lower)
        return out
    if kind == "dynamic":
        return _run_dynamic(func, plan, args, kwargs, mode)
    if kind == "alloc":
        return _run_alloc(func, args, kwargs, mode)
    if kind == "foreach":
        from .lower.foreach import run_foreach

        out = run_foreach(func, plan, args, kwargs, mode)
        if mode is None and not _STATE.enabled and config.fastpath and \
                not _fast.declined(func, args, kwargs):
            _fast_foreach.learn_foreach(func, plan, args, kwargs, dispatch)
        return out
    if kind == "inplace_view":
        return run_inplace_view(func, plan, args, kwargs, mode)
    return run_fallback(func, plan, args, kwargs, mode)


def _run_view(func, args, kwargs, mode):
    STATS.views += 1
    if mode is not None:
        return func(*args, **kwargs)
    uargs, ukw, index = unwrap_args(args, kwargs)
    out = func(*uargs, **ukw)
    base = args[0] if args and type(args[0]) is NeuronTensor else None
    if base is None:
        for a in args:
            if isinstance(a, (list, tuple)) and a and type(a[0]) is NeuronTensor:
                base = a[0]
                break
    block = base._block if base is not None else None
    if _INFERENCE_MODE():
        if base is not None and not base.is_inference() and func is not _VIEW_DTYPE:
            # a view of a normal tensor made under torch.inference_mode() is a normal tensor
            # (ATen's views take their base's dispatch keys); a wrapper made here would be an
            # inference tensor, and autograd's view bookkeeping refused it: "Cannot set
            # version_counter for inference tensor" on x.detach(), x[0], x.split(...)
            with torch.inference_mode(False):
                return _view_wraps(out, block, index)
        return _view_wraps(out, block, index)
    if base is args[0]:   # (adaptive eager's fast path serves view runners too)
        _fast.learn_view(func, args, kwargs, out)
    return _view_wraps(out, block, index)


_INFERENCE_MODE = torch.is_inference_mode_enabled
# x.view(dtype) is no autograd view: under inference mode ATen returns an inference tensor
_VIEW_DTYPE = torch.ops.aten.view.dtype


def _view_wraps(out, block, index):
    if isinstance(out, torch.Tensor):
        return _view_wrap(out, block, index)
    return type(out)(_view_wrap(o, block, index) if isinstance(o, torch.Tensor) else o
                     for o in out)


def _view_wrap(data: torch.Tensor, block, index) -> NeuronTensor:
    t = NeuronTensor(data, block, index)
    # the conj/neg bits live on the wrapper too, so PyTorch's math-bits fallback resolves them
    if data.is_conj():
        torch._C._set_conj(t, True)
    if data.is_neg():
        torch._C._set_neg(t, True)
    return t


# (size, stride) positions of the strided factories: torch's meta kernel makes a tensor of
# negative strides contiguous, the CPU refuses them (computeStorageNbytes)
_STRIDE_ARG = {aten.empty_strided.default: (0, 1), aten.new_empty_strided.default: (1, 2)}


def _check_strides(size, stride) -> None:
    size, stride = [int(n) for n in size], [int(n) for n in stride]
    if 0 not in size and any(t < 0 and n > 1 for n, t in zip(size, stride)):
        raise RuntimeError(f"Storage size calculation overflowed with sizes={size} and "
                           f"strides={stride}")


def _run_alloc(func, args, kwargs, mode):
    uargs, ukw, index = unwrap_args(args, kwargs)
    if mode is not None and index is None:
        return func(*uargs, **ukw)
    if index is None:
        index = _device_index(ukw.get("device"))
    at = _STRIDE_ARG.get(func)
    if at is not None:
        _check_strides(uargs[at[0]] if len(uargs) > at[0] else ukw["size"],
                       uargs[at[1]] if len(uargs) > at[1] else ukw["stride"])
    leaves, spec = meta_outputs(func, uargs, ukw)
    shape, stride, dtype = leaves[0]
    data, block = alloc(index, shape, stride, dtype)
    out = wrap(data, block, index)
    if mode is None:
        _fast.learn_alloc(func, args, kwargs, out)
    return out


def _kernel_setup(func, plan, args, kwargs, mode) -> tuple:
    """Steps 1-2 of a kernel op (see dispatch): (ctx, bound args, outputs, their blocks, meta
    leaves, output spec, device index, dtypes); (None, result) when adaptive eager recorded
    the op instead."""
    uargs, ukw, index = unwrap_args(args, kwargs)   # index None: CPU in, CPU out (the mode)
    if index is not None:   # CUDA's rule: no non-scalar CPU tensor next to device ones
        check_placement(func, args, kwargs, index)
    if plan.mutates:   # ATen's result-type check first (PyTorch's meta functions word it else)
        _check_decomp_written(func, plan, uargs, ukw)
        if plan.out_args and index is not None:
            _refuse_shared_out(func, plan, args, kwargs)
    # 1. output metadata (validates shapes and dtypes exactly as PyTorch would)
    leaves, spec = meta_outputs(func, uargs, ukw)
    a = bind(func, uargs, ukw)
    if plan.cpu_meta is not None:
        leaves = plan.cpu_meta(a, leaves)
    # 2. outputs: written args for in-place / out= ops, fresh buffers otherwise
    outs = []
    blocks = []
    for i, leaf in enumerate(leaves):
        target = plan.ret_alias[i] if i < len(plan.ret_alias) else None
        if target is not None:
            if plan.out_args and index is not None and isinstance(leaf, tuple) and \
                    a[target].dtype != leaf[2]:
                _refuse_via_cpu(func, plan, args, kwargs)   # some out= must match exactly
            if isinstance(leaf, tuple) and a[target].shape != leaf[0]:
                if index is None:   # NeuronMode: a CPU out= tensor resizes itself
                    warn_resized(a[target], leaf[0])
                    a[target].resize_(leaf[0])
                else:
                    a[target] = resize_out(_original(func, args, kwargs, target), leaf[0])
            outs.append(a[target])
            blocks.append(None)
        elif isinstance(leaf, tuple):
            data, block = alloc(index, *leaf)
            outs.append(data)
            blocks.append(block)
        else:
            outs.append(leaf)
            blocks.append(None)
    if plan.mutates:   # in-place / out=: ATen's checks on the written tensors
        _check_written(plan, a)

        if plan.lower in _fusible():
            _check_partial_overlap(a, outs)
    dtypes = {v.dtype for v in a.values() if isinstance(v, torch.Tensor)}
    dtypes.update(o.dtype for o in outs if isinstance(o, torch.Tensor))
    if plan.mutates and not dtypes.isdisjoint(COMPLEX):
        # a complex operand into a real written tensor (the float fast path skipped it)
        _check_decomp_written(func, plan, uargs, ukw, real_too=True)
    if plan.mutates and plan.lower in _fusible():
        functional = _functional_of_other_dtype(func, plan, uargs, ukw, leaves)
        if functional is not None:   # add(int8, int8, out=int64): in int8, then cast
            if plan.out_args:   # (in-place: ATen's result-type check already ran)
                # neg(int8, out=int64) must match exactly; asked here, outside NeuronMode
                _refuse_via_cpu(func, plan, args, kwargs)
            decomp = _via_functional(func, plan, functional)
            return None, _run_decomp(func, plan, decomp, args, kwargs, mode)
    # the op's context: its core, its mode, whether adaptive eager may record it
    if _adaptive.STATE.enabled and mode is None and index is not None:
        # (skipped: adaptive_fast.run found the op's groups light; it runs as plain eager)
        skip = _adaptive_fast.skipped(args)
        fusible = plan.lower in _fusible() and not skip
        if fusible and outs and all(type(o) is _TENSOR and not o.numel() for o in outs):
            # nothing to compute (an empty gradient's zero_): never recorded; plain eager's
            # runner is learned below and repeats take it with the group left pending
            fusible = not _adaptive_fast.declined_empty(func, args, kwargs)
        ctx = OpContext(index, None, fusible, _blocks_of(args, kwargs, outs, blocks))
        copied = _capture_host_operands(a, ctx.blocks)
        if (fusible or plan.name in _adaptive.REDUCTIONS) and not skip:
            # what adaptive eager learns from the call rides in ctx (its call, its signature,
            # whether plain eager's runner may be learned if the op declines to be recorded)
            _adaptive_fast.arm(ctx, func, plan, args, kwargs, index, a, outs, leaves,
                               fusible and not copied and _capture.capturable(plan)
                               and dtypes.isdisjoint(_WIDENED)
                               and not _fast.declined(func, args, kwargs))
        if plan.name in _adaptive.REDUCTIONS and not fusible and not skip:
            prev = _context.swap(ctx)
            try:
                if _adaptive.try_record_reduction(plan.name, a, outs, ctx.blocks):
                    return None, wrap(outs[0], blocks[0], index)
            finally:
                _context.swap(prev)
            flush(f"non-fusible op {plan.name}")
            ctx.recording = False
            if not copied and _capture.capturable(plan) and config.fastpath and \
                    dtypes.isdisjoint(_WIDENED) and not _fast.declined(func, args, kwargs):
                # not recorded (a sum over some dims, a matmul the group did not take): the
                # group launched, the lowering launches its own kernels now, and plain eager's
                # runner is learned from them, for adaptive_fast.run to take after a flush
                # (was learned only when adaptive eager was off: every backward bias-gradient
                # sum took the whole slow path, ~230 us a call in a BART step)
                ctx.capture = []
        elif not fusible and not copied and _capture.capturable(plan) and config.fastpath \
                and dtypes.isdisjoint(_WIDENED) and not _fast.declined(func, args, kwargs):
            # a non-fusible op (its group launched at the gate): nothing of adaptive eager
            # launches inside its lowering, so the capture holds only the op's own launches,
            # and adaptive_fast.run uses the learned runner (after a flush) from the next call
            ctx.capture = []
    elif mode is None:
        if _capture.capturable(plan) and config.fastpath and \
                dtypes.isdisjoint(_NOT_HALF) and not _fast.declined(func, args, kwargs):
            ctx = OpContext(index)   # the fast path learns this op from its launches
            ctx.capture = []
        else:
            ctx = _PLAIN_CTX.get(index)
            if ctx is None:
                ctx = _PLAIN_CTX[index] = OpContext(index or 0)
    else:
        ctx = OpContext(index or 0, mode)
    return ctx, a, outs, blocks, leaves, spec, index, dtypes


def _kernel_results(func, plan, args, kwargs, outs, blocks, index, spec):
    """Step 4 of a kernel op: written args come back as the caller's own objects, fresh
    buffers as new device tensors."""
    results = []
    for i, out in enumerate(outs):
        target = plan.ret_alias[i] if i < len(plan.ret_alias) else None
        if target is not None:
            results.append(_original(func, args, kwargs, target))
        elif isinstance(out, torch.Tensor):
            results.append(wrap(out, blocks[i], index))
        else:
            results.append(out)
    if len(results) == 1 and spec.num_leaves == 1 and spec.type is None:
        return results[0]
    return tree_unflatten(results, spec)


def _learn_captured(func, plan, args, kwargs, index, outs, leaves, spec, capture) -> None:
    """Learn a runner from the captured launches; a signature that fails to learn twice (its
    operands share memory, a scratch array passes between launches...) is not tried again."""
    learned = _fast.STATS_FAST["learned"]
    _capture.learn_captured(func, plan, args, kwargs, index, outs, leaves, spec, capture)
    if _fast.STATS_FAST["learned"] == learned:
        _fast.failed(func, args, kwargs)


_TLS_CTX = _context._TLS
_ROUTES: dict = {}
_COMPOSITES = _host.COMPOSITES
_TENSOR = torch.Tensor


def _route_of(dtypes, lower) -> str | None:
    """The dtype route an op's operands take (fp8, complex, half), or None when its lowering
    handles them itself."""
    if not dtypes.isdisjoint(FP8) and not getattr(lower, "handles_fp8", False):
        return "fp8"
    if not dtypes.isdisjoint(COMPLEX) and not getattr(lower, "handles_complex", False):
        return "complex"
    if not dtypes.isdisjoint(HALF) and not getattr(lower, "handles_half", False):
        return "half"
    return None


def _route(kind: str):
    """The steps of a dtype route (fp8, complex, half), a generator of launch requests and
    RUN steps dispatch drives: imported on first use."""
    fn = _ROUTES.get(kind)
    if fn is None:
        if kind == "fp8":
            from .lower.fp8 import fp8_steps as fn
        elif kind == "complex":
            from .lower.complex import complex_steps as fn
        else:
            from .lower.half import upcast_steps as fn
        _ROUTES[kind] = fn
    return fn


_WIDENED = COMPLEX | HALF | FP8   # dtypes whose ops take the complex / half / fp8 routes
# plain eager learns kernel ops with half-type operands from their launches too (casts, and
# the half route's casts up, float32 op and casts down, over scratch marked context.scratch)
_NOT_HALF = COMPLEX | FP8
_PLAIN_CTX: dict = {}   # core -> the shared context of plain-eager ops on it (never recording)
_KEEP_TYPE = (IndexError, ValueError, TypeError, ZeroDivisionError, torch.linalg.LinAlgError)


def _kernel_error(func, plan, exc, args, kwargs) -> Exception:
    """The error a user sees: the op, its arguments, their line, with the CPU's exception type
    (see errors.kernel_error); the CPU's own exception and words when the CPU refuses the call
    too."""
    worded = _cpu_words(func, plan, exc, args, kwargs)
    return worded if worded is not None else errors.kernel_error(plan.name, exc, args, kwargs)


def _cpu_words(func, plan, exc, args, kwargs):
    """The CPU's exception for a call that failed here, worded with the op and the user's line,
    when the CPU refuses the call too (run on copies: cpu_check.py); None otherwise."""
    if isinstance(exc, _RAISED_AS_IS) or isinstance(exc, errors.NotImplementedForDtype):
        return None
    if _adaptive.PENDING:
        try:
            flush(f"error in {plan.name}")   # the CPU reads values the group may yet write
        except Exception:   # noqa: BLE001 -- then the CPU is not asked
            return None
    cpu = cpu_raises(func, args, kwargs)
    return None if cpu is None else errors.cpu_worded(plan.name, cpu, args, kwargs, exc)


def _refuse_shared_out(func, plan, args, kwargs) -> None:
    """An out= tensor sharing memory with an operand: refused where the CPU refuses it."""
    if shares_written(func, plan, args, kwargs):
        _refuse_via_cpu(func, plan, args, kwargs)


def _out_dtypes_differ(func, plan, args, kwargs) -> bool:
    """Is an out= tensor of another dtype than the call's first tensor operand?"""
    first = next((v for v in args if isinstance(v, torch.Tensor)), None)
    if first is None:
        return False
    for name in plan.out_args:
        try:
            w = _original(func, args, kwargs, name)
        except KeyError:
            continue
        if isinstance(w, torch.Tensor) and w.dtype != first.dtype:
            return True
    return False


_FUNCTIONAL: dict = {}   # out= overload -> its functional overload (None: none found)


def _functional_of(func):
    """add.out -> add.Tensor, add_.Tensor -> add.Tensor: the overload of the op taking the
    same arguments but the out= ones and writing nothing (read off the schemas, once)."""
    hit = _FUNCTIONAL.get(func, False)
    if hit is not False:
        return hit
    schema = func._schema
    want = [(a.name, str(a.type).replace("(a!)", "")) for a in schema.arguments
            if not a.is_out]
    n_out = len(schema.returns)
    ns, _, name = schema.name.partition("::")
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]                     # add_ -> add
    packet = getattr(getattr(torch.ops, ns, None), name, None)
    hit = None
    for ov in (packet.overloads() if packet is not None else ()):
        op = getattr(packet, ov)
        s = op._schema
        if not s.is_mutable and len(s.returns) == n_out and \
                [(a.name, str(a.type)) for a in s.arguments] == want:
            hit = op
            break
    _FUNCTIONAL[func] = hit
    return hit


def _functional_of_other_dtype(func, plan, uargs, ukw, leaves):
    """The functional overload of an elementwise in-place or out= call whose written tensors'
    dtypes are not the functional result's (None otherwise). ATen's TensorIterator computes in
    the operands' common dtype and casts the result into the written tensor: bool + bool is a
    logical or even into an int64 out, int8 products wrap in int8, sin(int64) rounds to float32
    before a float64 out, uint8.floor_divide_(int64 -1) divides in int64."""
    if not all(t is not None for t in plan.ret_alias):
        return None
    written = {o[2] for o in leaves if isinstance(o, tuple)}
    n_in = sum(not a.is_out for a in func._schema.arguments)
    if len(written) == 1 and all(
            v.dtype in written for v in (*uargs[:n_in], *ukw.values())
            if isinstance(v, torch.Tensor)):
        return None   # (the common case: every operand of the written dtype)
    functional = _functional_of(func)
    if functional is None:
        return None
    fkw = {k: v for k, v in ukw.items() if k not in plan.out_args}
    try:
        fleaves, _ = meta_outputs(functional, uargs[:n_in], fkw)
    except Exception:   # noqa: BLE001 -- the functional's own refusal: the out= call decides
        return None
    if len(fleaves) != len(leaves) or all(
            not isinstance(f, tuple) or not isinstance(o, tuple) or f[2] == o[2]
            for f, o in zip(fleaves, leaves)):
        return None
    return functional


def _via_functional(func, plan, functional):
    """A decomposition of an in-place or out= call of another dtype than its result (the
    caller asked the CPU's refusal first): the functional op and a copy (a cast) into each
    written tensor, resized as ATen resizes an out= tensor."""
    n_in = sum(not a.is_out for a in func._schema.arguments)

    def decomp(*args, **kwargs):
        outs = [_original(func, args, kwargs, nm) for nm in plan.ret_alias]
        fkw = {k: v for k, v in kwargs.items() if k not in plan.out_args}
        res = functional(*args[:n_in], **fkw)
        results = res if isinstance(res, (tuple, list)) else (res,)
        for o, r in zip(outs, results):
            if o.shape != r.shape:
                warn_resized(o, r.shape)
                o.resize_(r.shape)
            o.copy_(r)
        return tuple(outs) if isinstance(res, (tuple, list)) else outs[0]

    return decomp


def _refuse_via_cpu(func, plan, args, kwargs) -> None:
    """A call some CPU kernels refuse (what it writes overlaps what it reads, an out= of
    another dtype than the result's): raise what the CPU raises, if it does."""
    cpu = cpu_raises(func, args, kwargs)
    if cpu is not None:
        worded = errors.cpu_worded(plan.name, cpu, args, kwargs)
        raise worded if worded is not None else cpu


def _capture_host_operands(a: dict, blocks: dict) -> bool:
    """A CPU tensor operand (a 0-d tensor next to neuron ones) is read when the op is
    recorded, not when the group launches: later writes to it must not reach the op.
    True when there was one (a copy the fast path could not trace back to the operand)."""
    copied = False
    for k, v in a.items():
        if isinstance(v, torch.Tensor) and id(v) not in blocks:
            a[k] = v.clone()
            copied = True
    return copied


def _blocks_of(args, kwargs, outs, blocks) -> dict:
    found = {}
    for x in list(args) + list(kwargs.values()):
        if type(x) is NeuronTensor:
            found[id(x._data)] = x._block
        elif isinstance(x, (list, tuple)):
            for v in x:
                if type(v) is NeuronTensor:
                    found[id(v._data)] = v._block
    for o, b in zip(outs, blocks):
        if b is not None:
            found[id(o)] = b
    return found


def _run_dynamic(func, plan, args, kwargs, mode):
    """Ops whose output size depends on the data (nonzero, masked_select, x[mask]): the
    lowering counts first, then allocates and fills; it returns [(data, block), ...], or it is
    a generator of launch requests (and RUN steps) that returns them. dispatch() runs this
    inline (its launches two calls below it); this copy serves the profiler's hooked path."""
    a, index = _dynamic_setup(func, plan, args, kwargs)
    prev = _context.swap(OpContext(index or 0, mode))
    try:
        produced = _dynamic_lowering(plan, a)(func, a, index)
        if type(produced) is _GENERATOR:
            produced = _drive(produced)
    except NotImplementedError as exc:
        return _lowering_declined(func, plan, args, kwargs, mode, exc)
    except _DYNAMIC_AS_IS:
        raise
    except Exception as exc:
        raise _kernel_error(func, plan, exc, args, kwargs) from exc
    finally:
        _context.swap(prev)
    return _dynamic_results(produced, index)


# errors of a dynamic lowering raised unchanged (an IndexError is the CPU's own: x[mask] of a
# mask of another shape); any other is worded by _kernel_error
_DYNAMIC_AS_IS = (errors.UnsupportedOpError, errors.UnsupportedTensorError,
                  torch.OutOfMemoryError, IndexError)
_GENERATOR = types.GeneratorType


def _dynamic_setup(func, plan, args, kwargs) -> tuple:
    """A dynamic op's checks before its lowering (placement, an out= sharing an operand's
    memory) and its bound arguments: (bound args, device index or None)."""
    uargs, ukw, index = unwrap_args(args, kwargs)
    if index is not None:
        check_placement(func, args, kwargs, index)
        if plan.out_args:
            _refuse_shared_out(func, plan, args, kwargs)
    return bind(func, uargs, ukw), index


def _dynamic_lowering(plan, a: dict):
    """The dynamic op's lowering; for float8 operands, wrapped in the CPU's rules (fp8.py)."""
    if any(isinstance(v, torch.Tensor) and v.dtype in FP8 for v in a.values()):
        from .lower.fp8 import dynamic_fp8

        return dynamic_fp8(plan.lower)
    return plan.lower


def _drive(steps):
    """Run a generator of launch requests and RUN steps to its end; its return value."""
    while True:
        try:
            req = next(steps)
        except StopIteration as stop:
            return stop.value
        if req[0] is _RUN:
            req[1](*req[2:])
        else:
            launch(*req)


def _dynamic_results(produced, index):
    """The device tensors of a dynamic lowering's [(data, block), ...]."""
    outs = [wrap(data, block, index) for data, block in produced]
    return outs[0] if len(outs) == 1 else tuple(outs)


def _lowering_declined(func, plan, args, kwargs, mode, exc):
    """A lowering raises NotImplementedError for argument patterns it does not cover."""
    decomp = plan.decomp
    if decomp is None:
        from . import ops

        decomp = ops.decomposition(func)
    if decomp is not None:
        return _run_decomp(func, plan, decomp, args, kwargs, mode)
    return run_fallback(func, plan, args, kwargs, mode, why=str(exc))


_TLS = threading.local()   # autograd runs backward for a device on its own worker thread


def _run_decomp(func, plan, decomp, args, kwargs, mode):
    """Run PyTorch's decomposition; its ops re-enter dispatch. A decomposition that reaches
    its own op again (refs -> prims -> aten loops) goes to the fallback instead."""
    active = getattr(_TLS, "decomps", None)
    if active is None:
        active = _TLS.decomps = set()
    if func in active:
        return run_fallback(func, plan, args, kwargs, mode, why="decomposition loops")
    from .lower.fp8 import refuse_like_cpu  # float8 operands: the CPU decides which ops run

    refuse_like_cpu(func, args, kwargs)
    STATS.decompositions[plan.name] += 1
    active.add(func)
    try:
        if mode is not None:
            with mode:
                out = decomp(*args, **kwargs)
        else:
            out = decomp(*args, **kwargs)
    finally:
        active.discard(func)
    if out is NotImplemented:  # some decompositions decline argument patterns on purpose
        return run_fallback(func, plan, args, kwargs, mode, why="decomposition declined")
    return out


_tensor_mod.set_dispatcher(dispatch)
# lower/host.py sits below dispatch in the import graph: it is handed the kernel path it runs
# same-core copies through, as tensor.py is handed the funnel
_host.set_kernel_path(dispatch, Plan, _PLANS)

_IMPL_LIB = None


def install_privateuse1_impls() -> None:
    """Explicit PrivateUse1 kernels for the ops PyTorch's C++ issues with the Python key
    excluded (torch.tensor(data, device="neuron") ends in _to_copy/copy_ there, and
    torch.tensor([neuron 0-d tensor, 2.0]) reads each element's value by _local_scalar_dense):
    the boxed fallback cannot serve those (an internal assert in torch 2.13), a registered impl
    can."""
    global _IMPL_LIB
    if _IMPL_LIB is not None:
        return
    _IMPL_LIB = torch.library.Library("aten", "IMPL")
    for name in ("_to_copy", "copy_", "_copy_from", "_copy_from_and_resize",
                 "_local_scalar_dense"):
        op = getattr(aten, name).default

        def impl(*args, _op=op, **kwargs):
            errors.refuse_foreign(_op, args, kwargs)
            # under a tracer's fake mode (dynamo tracing torch.tensor(..., device="neuron")),
            # the copy still allocates real device memory, as a CUDA copy does
            return run_outside_fake(dispatch, _op, args, kwargs)

        _IMPL_LIB.impl(name, impl, "PrivateUse1")
