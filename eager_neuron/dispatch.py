"""The funnel: every aten op on a neuron tensor, under NeuronMode, or a factory on the device.

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

import sys
import threading
import warnings

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import backward as _backward, errors, launch as _launch
from .adaptive import MODULE as _adaptive
from .config import config
from .lower.common import COMPLEX, DEVICE_DTYPES, HALF, bind, schema_args
from .simulator import SIM
from .stats import STATS
from .tensor import NeuronTensor
from . import tensor as _tensor_mod

aten = torch.ops.aten

def flush(reason: str) -> None:
    """Adaptive eager: launch any pending fused group before a value can be observed."""
    if _adaptive.STATE.group is not None:
        _adaptive.flush(reason)


# ---------------------------------------------------------------------------------------------
# unwrap / wrap
# ---------------------------------------------------------------------------------------------

def _unwrap(x, state):
    if type(x) is NeuronTensor:
        idx = x.device.index
        if state[0] is None:
            state[0] = idx
        elif state[0] != idx:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"neuron:{state[0]} and neuron:{idx}! Move one with .to('neuron:{state[0]}').")
        return x._data
    if isinstance(x, (list, tuple)) and x and not isinstance(x[0], (int, float, bool)):
        return type(x)(_unwrap(v, state) for v in x)
    if isinstance(x, torch.Tensor) and x.dtype not in DEVICE_DTYPES:
        _check_tensor(x)
    return x


def _check_tensor(x: torch.Tensor) -> None:
    if x.is_complex():
        raise errors.UnsupportedTensorError(
            f"{x.dtype} tensors are not supported on neuron (complex64 and complex128 are)\n"
            f"{errors.where()}\n  fix: convert with x.to(torch.complex64)")
    if x.layout != torch.strided:
        raise errors.UnsupportedTensorError(
            f"{x.layout} tensors are not supported on neuron\n{errors.where()}\n"
            "  fix: call .to_dense() first")
    if x.is_quantized:
        raise errors.UnsupportedTensorError(
            f"quantized tensors ({x.dtype}) are not supported on neuron\n{errors.where()}\n"
            "  fix: dequantize() first")


def unwrap_args(args, kwargs):
    state = [None]
    uargs = tuple(_unwrap(a, state) for a in args)
    ukw = {k: _unwrap(v, state) for k, v in kwargs.items()} if kwargs else {}
    return uargs, ukw, state[0]


def alloc(index: int | None, shape, stride, dtype) -> tuple[torch.Tensor, object]:
    """A fresh device buffer: (host-backed view, block). index None means plain CPU (the mode)."""
    if index is None:
        return torch.empty_strided(shape, stride, dtype=dtype), None
    if dtype not in DEVICE_DTYPES:
        raise errors.UnsupportedTensorError(
            f"{dtype} tensors are not supported on neuron (supported: float32, float64, "
            f"bfloat16, float16, int64, int32, int16, int8, uint8, bool, complex64, "
            f"complex128; uint16/uint32/uint64 as storage)\n{errors.where()}\n"
            "  fix: keep this tensor on the CPU, or convert it (e.g. complex32 -> "
            "x.to(torch.complex64)) before moving it to neuron")
    numel = 1
    for s in shape:
        numel *= s
    if numel == 0:
        extent = 0
    else:
        extent = 1 + sum((sz - 1) * st for sz, st in zip(shape, stride))
    itemsize = _ITEMSIZE.get(dtype) or _ITEMSIZE.setdefault(dtype, dtype.itemsize)
    nbytes = extent * itemsize
    if nbytes < _POOLED_BYTES:
        # small: the host allocator is cheap; the block only accounts the bytes
        block = SIM.core(index).alloc(nbytes, want_storage=False)
        return torch.empty_strided(shape, stride, dtype=dtype), block
    block = SIM.core(index).alloc(nbytes)
    data = torch.empty(0, dtype=dtype).set_(block.storage, 0, shape, stride)
    return data, block


_ITEMSIZE: dict = {}
_POOLED_BYTES = 1 << 16   # from here up, buffers come from the core's caching pool


def wrap(data: torch.Tensor, block, index: int | None):
    if index is None:
        return data
    return NeuronTensor(data, block, index)


def to_host(t: NeuronTensor, reason: str = "host read") -> torch.Tensor:
    """Copy a neuron tensor to a fresh CPU tensor (a DMA transfer on the simulated device)."""
    flush(reason)
    host = t._data.clone()
    SIM.cores[t.device.index].transfer(host.numel() * host.element_size())
    return host


# ---------------------------------------------------------------------------------------------
# classification, once per overload
# ---------------------------------------------------------------------------------------------

class Plan:
    __slots__ = ("kind", "lower", "mutates", "ret_alias", "name", "decomp", "out_args",
                 "cpu_meta")

    def __init__(self, kind, lower=None, mutates=(), ret_alias=(), name="", decomp=None,
                 out_args=()):
        self.kind = kind
        self.lower = lower
        self.mutates = mutates        # names of args the op writes
        self.ret_alias = ret_alias    # per return: name of the written arg it aliases, or None
        self.name = name
        self.decomp = decomp
        self.out_args = out_args      # names of out= args (resized to the result's shape first)
        # where PyTorch's meta function and its CPU kernel disagree on an output's shape/dtype
        # (bfloat16 batch-norm statistics, eval-mode saved stats), the lowering's
        # `cpu_meta(a, leaves) -> leaves` says what the CPU returns
        self.cpu_meta = getattr(lower, "cpu_meta", None)


_PLANS: dict = {}


def _plan(func) -> Plan:
    from . import ops

    schema = func._schema
    name = schema.name                                    # "aten::add_"
    full = f"{name}.{schema.overload_name}" if schema.overload_name else name
    mutates = tuple(a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write)
    ret_alias = []
    for r in schema.returns:
        target = None
        if r.alias_info is not None and r.alias_info.is_write:
            for a in schema.arguments:
                if a.alias_info and a.alias_info.before_set == r.alias_info.before_set:
                    target = a.name
        ret_alias.append(target)
    out_args = tuple(a.name for a in schema.arguments if a.is_out)
    kw = dict(name=full, mutates=mutates, ret_alias=tuple(ret_alias), out_args=out_args)
    if full in ops.HOST or name in ops.HOST:
        return Plan("host", lower=ops.HOST.get(full) or ops.HOST[name], **kw)
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        # reached us from inside a decomposition (e.g. aten::to): PyTorch's own composite
        return Plan("decomp", decomp=func.decompose, **kw)
    if torch.Tag.inplace_view in func.tags:
        return Plan("inplace_view", **kw)
    if func.is_view or full in ops.VIEW_LIKE:
        return Plan("view", **kw)
    if full in ops.ALLOC:
        return Plan("alloc", **kw)
    if name.startswith("aten::_foreach_"):
        return Plan("foreach", **kw)
    dynamic = ops.DYNAMIC.get(full) or ops.DYNAMIC.get(name)
    if dynamic is not None:
        return Plan("dynamic", lower=dynamic, **kw)
    lower = ops.KERNELS.get(full) or ops.KERNELS.get(name)
    if lower is not None and not (schema.overload_name.startswith("out") and
                                  name not in ops.OUT_OK):
        return Plan("kernel", lower=lower, **kw)
    if name.startswith("prims::") and hasattr(func, "impl_aten"):
        # PyTorch's refs decompose into prims; each prim has an aten implementation
        return Plan("decomp", decomp=func.impl_aten, **kw)
    if full not in ops.NO_DECOMP:
        decomp = ops.decomposition(func)
        if decomp is not None:
            return Plan("decomp", decomp=decomp, **kw)
    if lower is not None:
        return Plan("kernel", lower=lower, **kw)
    impl = _custom_op_impl(name)
    if impl is not None:
        return Plan("decomp", decomp=impl, **kw)
    return Plan("fallback", **kw)


def _custom_op_impl(name: str):
    """A torch.library.custom_op's device-agnostic Python implementation (e.g. torch.nn's
    chunked linear_cross_entropy): written in torch ops, so it runs as a decomposition."""
    from torch._library import custom_ops

    opdef = custom_ops.OPDEFS.get(name)
    if opdef is None:
        return None
    return opdef._backend_fns.get("neuron") or opdef._backend_fns.get(None)


# ---------------------------------------------------------------------------------------------
# meta: output metadata per argument signature
# ---------------------------------------------------------------------------------------------

_META: dict = {}
_META_LIMIT = 50_000


def _spec(x):
    if isinstance(x, torch.Tensor):
        return (x.shape, x.stride(), x.dtype)
    if isinstance(x, (list, tuple)):
        return tuple(_spec(v) for v in x)
    if isinstance(x, float) and x != x:
        return "nan"
    return x


def _to_meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, (list, tuple)):
        return type(x)(_to_meta(v) for v in x)
    return x


def meta_outputs(func, args, kwargs):
    """(leaf specs, treespec) of func's outputs: each leaf (shape, stride, dtype) or a value."""
    try:
        key = (func, _spec(args), _spec(tuple(kwargs.items())) if kwargs else None)
        hit = _META.get(key)
    except TypeError:
        key, hit = None, None
    if hit is not None:
        return hit
    margs = _to_meta(args)
    mkw = {k: _to_meta(v) for k, v in kwargs.items()}
    if "device" in mkw and mkw["device"] is not None:
        mkw["device"] = "meta"
    out = func(*margs, **mkw)
    leaves, spec = tree_flatten(out)
    leaves = [(tuple(v.shape), v.stride(), v.dtype) if isinstance(v, torch.Tensor) else v
              for v in leaves]
    result = (leaves, spec)
    if key is not None:
        if len(_META) > _META_LIMIT:
            _META.clear()
        _META[key] = result
    return result


# ---------------------------------------------------------------------------------------------
# the funnel
# ---------------------------------------------------------------------------------------------

# Profiler hooks: each is a context-manager factory hook(plan, args, kwargs) entered around an op.
OP_HOOKS: list = []


def dispatch(func, args, kwargs, mode=None):
    """Run one aten op. `mode` is the NeuronMode when entered through it (CPU in, CPU out)."""
    STATS.ops += 1
    plan = _PLANS.get(func)
    if plan is None:
        plan = _PLANS[func] = _plan(func)
    if "ops" in config.log:
        _log_op(plan, args, kwargs)
    try:
        if OP_HOOKS:
            with OP_HOOKS[0](plan, args, kwargs):
                return _dispatch_plan(func, plan, args, kwargs, mode)
        return _dispatch_plan(func, plan, args, kwargs, mode)
    except Exception as exc:
        if mode is None and _backward.in_backward():
            return _placeholder_outputs(func, plan, args, kwargs, exc)
        raise


def _placeholder_outputs(func, plan, args, kwargs, exc):
    """An op failed on autograd's worker thread, where raising kills the process in torch 2.13:
    stash the error (raised after backward returns, see backward.py) and let the engine finish
    with NaN-filled outputs of the right metadata."""
    _backward.stash(exc)
    uargs, ukw, index = unwrap_args(args, kwargs)
    leaves, spec = meta_outputs(func, uargs, ukw)
    out = []
    for i, leaf in enumerate(leaves):
        target = plan.ret_alias[i] if i < len(plan.ret_alias) else None
        if target is not None:
            out.append(_original(func, args, kwargs, target))
        elif isinstance(leaf, tuple):
            data, block = alloc(index, *leaf)
            data.fill_(float("nan") if data.is_floating_point() else 0)
            out.append(wrap(data, block, index))
        else:
            out.append(leaf)
    return tree_unflatten(out, spec)


def _dispatch_plan(func, plan, args, kwargs, mode):
    kind = plan.kind
    if _adaptive.STATE.group is not None and (
            mode is not None or kind not in ("view", "alloc", "decomp", "foreach", "host",
                                             "kernel") or
            (kind == "kernel" and plan.lower not in _fusible()
             and plan.name not in _adaptive.REDUCTIONS)):
        flush(f"non-fusible op {plan.name}")
    if kind == "view":
        return _run_view(func, args, kwargs, mode)
    if kind == "kernel":
        return _run_kernel(func, plan, args, kwargs, mode)
    if kind == "decomp":
        return _run_decomp(func, plan, plan.decomp, args, kwargs, mode)
    if kind == "host":
        if plan.out_args and mode is None:
            _resize_outs(func, plan, args, kwargs)
        return plan.lower(func, args, kwargs, mode)
    if kind == "dynamic":
        return _run_dynamic(func, plan, args, kwargs, mode)
    if kind == "alloc":
        return _run_alloc(func, args, kwargs, mode)
    if kind == "foreach":
        from .lower.foreach import run_foreach

        return run_foreach(func, plan, args, kwargs, mode)
    if kind == "inplace_view":
        return _run_inplace_view(func, plan, args, kwargs, mode)
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


def _run_inplace_view(func, plan, args, kwargs, mode):
    """unsqueeze_, t_, as_strided_, resize_, set_ ... (schema tag inplace_view): the op runs on
    a fresh alias of the host view, then the wrapper's own sizes/strides/offset follow it."""
    if mode is not None:
        return func(*args, **kwargs)
    self = args[0] if args else kwargs.get("self")
    if type(self) is not NeuronTensor:
        raise RuntimeError(
            f"{plan.name}: self is {errors.describe(self)} but another argument is on neuron\n"
            f"{errors.where()}\n  args: {errors.describe_args(args, kwargs)}\n"
            "  fix: move both tensors to the same device first")
    for a in list(args[1:]) + list(kwargs.values()):
        if isinstance(a, (torch.UntypedStorage, torch.TypedStorage)):
            raise RuntimeError(  # noqa: TRY004 -- as PyTorch's own device/storage errors
                f"{plan.name} with a storage argument is not supported on neuron (a neuron "
                f"tensor's storage holds no host data)\n{errors.where()}\n"
                f"  args: {errors.describe_args(args, kwargs)}\n"
                "  fix: use x.set_(other_tensor) or allocate a new tensor")
    flush(f"in-place view {plan.name}")
    uargs, ukw, _index = unwrap_args(args, kwargs)
    data, block = self._data, self._block
    storage = torch.Tensor.untyped_storage(self)
    source = args[1] if len(args) > 1 else kwargs.get("source")
    if plan.name.startswith("aten::set_") and type(source) is NeuronTensor:
        block = source._block                  # self now aliases source's block and storage
        storage = torch.Tensor.untyped_storage(source)
    else:
        need = _bytes_needed(func, data, uargs, ukw)
        if need > data.untyped_storage().nbytes():   # resize_ past the block's end
            # NOTE: other views of the block would stop aliasing it (the CPU grows a storage in
            # place): refuse rather than answer wrong. Refs: self._block, `block`, the call's.
            if sys.getrefcount(block) > 3:
                raise RuntimeError(
                    f"{plan.name} would grow a neuron tensor whose memory other tensors (views) "
                    f"share; they would stop aliasing it\n{errors.where()}\n"
                    f"  args: {errors.describe_args(args, kwargs)}\n"
                    "  fix: resize a fresh tensor (x = x.clone(); x.resize_(...)) or allocate "
                    "the final size up front")
            data, block = _regrow(self._data, need, self.device.index)
    # NOTE: a fresh alias, not `data` itself: the op must not move another wrapper's view
    alias = data.as_strided(data.size(), data.stride(), data.storage_offset())
    func(alias, *uargs[1:], **ukw)
    self._data, self._block = alias, block
    _set_meta(self, storage, alias.storage_offset(), alias.size(), alias.stride())
    return self


def _bytes_needed(func, data, uargs, ukw) -> int:
    """The storage bytes self needs after the op, from running it on a meta alias (0 when the
    op points self at another storage)."""
    size = data.untyped_storage().nbytes()
    m = torch.empty(-(-size // data.element_size()), dtype=data.dtype, device="meta")
    m = m.as_strided(data.size(), data.stride(), data.storage_offset())
    before = m.untyped_storage()._cdata
    func(m, *_to_meta(uargs[1:]), **{k: _to_meta(v) for k, v in ukw.items()})
    return m.untyped_storage().nbytes() if m.untyped_storage()._cdata == before else 0


def _regrow(old, need, index):
    """A bigger block for a tensor that resize_ grows: (a view like `old` on it, the block),
    old's storage bytes copied in first (resize_ keeps them)."""
    data, new_block = alloc(index, (need,), (1,), torch.uint8)
    data[:old.untyped_storage().nbytes()].copy_(
        torch.empty(0, dtype=torch.uint8).set_(old.untyped_storage()))
    data = torch.empty(0, dtype=old.dtype).set_(
        data.untyped_storage(), old.storage_offset(), old.size(), old.stride())
    return data, new_block


def _resize_out(t, shape) -> torch.Tensor:
    """ATen's resize_output for an out= tensor of another shape: warn if it held elements,
    resize it (an in-place view op on the wrapper); returns its new host view."""
    if t.numel() != 0:
        warnings.warn(
            f"An output with one or more elements was resized since it had shape {list(t.shape)}"
            f", which does not match the required output shape {list(shape)}. This behavior is "
            "deprecated; resize outputs explicitly with t.resize_(0) first.", stacklevel=4)
    func = aten.resize_.default
    plan = _PLANS.get(func) or _PLANS.setdefault(func, _plan(func))
    _run_inplace_view(func, plan, (t, list(shape)), {}, None)
    return t._data


def _resize_outs(func, plan, args, kwargs) -> None:
    """Host ops (arange, RNG into out=) write the host view directly: size their out= first."""
    uargs, ukw, _index = unwrap_args(args, kwargs)
    leaves, _spec = meta_outputs(func, uargs, ukw)
    for i, target in enumerate(plan.ret_alias):
        if target in plan.out_args and i < len(leaves) and isinstance(leaves[i], tuple):
            t = _original(func, args, kwargs, target)
            if type(t) is NeuronTensor and t.shape != leaves[i][0]:
                _resize_out(t, leaves[i][0])


# NOTE: the Meta kernel of set_ rewrites a tensor's sizes, strides and offset and grows its
# storage's byte count; it touches no data, which a wrapper's storage does not have.
_META_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def _set_meta(t, storage, offset, size, stride):
    aten.set_.source_Storage_storage_offset.redispatch(_META_KEYS, t, storage, offset, size,
                                                       stride)


def _run_alloc(func, args, kwargs, mode):
    uargs, ukw, index = unwrap_args(args, kwargs)
    if mode is not None and index is None:
        return func(*uargs, **ukw)
    if index is None:
        index = _device_index(ukw.get("device"))
    leaves, spec = meta_outputs(func, uargs, ukw)
    shape, stride, dtype = leaves[0]
    data, block = alloc(index, shape, stride, dtype)
    return wrap(data, block, index)


def _device_index(device) -> int:
    if device is None:
        return torch.neuron.current_device() if hasattr(torch, "neuron") else 0
    device = torch.device(device)
    if device.type != "neuron":
        return None
    return device.index if device.index is not None else torch.neuron.current_device()


def _run_kernel(func, plan, args, kwargs, mode):
    uargs, ukw, index = unwrap_args(args, kwargs)   # index None: CPU in, CPU out (the mode)
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
            if isinstance(leaf, tuple) and a[target].shape != leaf[0]:
                if index is None:   # NeuronMode: a CPU out= tensor resizes itself
                    a[target].resize_(leaf[0])
                else:
                    a[target] = _resize_out(_original(func, args, kwargs, target), leaf[0])
            outs.append(a[target])
            blocks.append(None)
        elif isinstance(leaf, tuple):
            data, block = alloc(index, *leaf)
            outs.append(data)
            blocks.append(block)
        else:
            outs.append(leaf)
            blocks.append(None)
    # 3. run the lowering (half types computed in float32, rounded to nearest even)
    prev = _launch._current_core[0]
    _launch._current_core[0] = index or 0
    armed = _adaptive.STATE.enabled and mode is None and index is not None
    if armed:
        _adaptive.ARG_BLOCKS = _blocks_of(args, kwargs, outs, blocks)
        if plan.name in _adaptive.REDUCTIONS and not plan.lower in _fusible():
            if _adaptive.try_record_reduction(plan.name, a, outs, _adaptive.ARG_BLOCKS):
                _launch._current_core[0] = prev
                return wrap(outs[0], blocks[0], index)
            flush(f"non-fusible op {plan.name}")
        _adaptive.ARMED[0] = plan.lower in _fusible()
    try:
        dtypes = {v.dtype for v in a.values() if isinstance(v, torch.Tensor)}
        dtypes.update(o.dtype for o in outs if isinstance(o, torch.Tensor))
        if not dtypes.isdisjoint(COMPLEX) and not getattr(plan.lower, "handles_complex", False):
            from .lower.complex import run_complex   # complex operands: their own family

            run_complex(func, plan, a, outs)
        elif not dtypes.isdisjoint(HALF) and not getattr(plan.lower, "handles_half", False):
            from .lower.half import run_upcast

            run_upcast(func, plan, a, outs)
        else:
            plan.lower(func, a, outs)
    except (errors.UnsupportedOpError, errors.UnsupportedTensorError, torch.OutOfMemoryError):
        raise
    except NotImplementedError as exc:
        return _lowering_declined(func, plan, args, kwargs, mode, exc)
    except Exception as exc:
        raise _kernel_error(plan, exc, args, kwargs) from exc
    finally:
        _launch._current_core[0] = prev
        if armed:
            _adaptive.ARMED[0] = False
            _adaptive.ARG_BLOCKS = {}
    # 4. results: written args come back as the caller's own objects
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


_KEEP_TYPE = (IndexError, ValueError, TypeError, ZeroDivisionError, torch.linalg.LinAlgError)


def _kernel_error(plan, exc, args, kwargs) -> Exception:
    """The error a user sees: the op, its arguments, their line. PyTorch's own error types
    (IndexError for an out-of-range index, ...) are kept so `except IndexError` still works."""
    detail = (f"{plan.name} failed on neuron: {type(exc).__name__}: {exc}\n{errors.where()}\n"
              f"  args: {errors.describe_args(args, kwargs)}")
    if isinstance(exc, _KEEP_TYPE):
        try:
            return type(exc)(detail)
        except Exception:  # an exception type with a custom constructor
            pass
    return errors.KernelError(detail)


_FUSIBLE = None


def _fusible() -> frozenset:
    """Lowerings whose launches adaptive eager may record (the elementwise and cast families)."""
    global _FUSIBLE
    if _FUSIBLE is None:
        from . import ops

        _FUSIBLE = frozenset(fn for name, fn in ops.KERNELS.items()
                             if name in ops.FUSIBLE_OPS)
    return _FUSIBLE


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
    lowering counts first, then allocates and fills; it returns [(data, block), ...]."""
    uargs, ukw, index = unwrap_args(args, kwargs)
    a = bind(func, uargs, ukw)
    prev = _launch._current_core[0]
    _launch._current_core[0] = index or 0
    try:
        produced = plan.lower(func, a, index)
    except NotImplementedError as exc:
        return _lowering_declined(func, plan, args, kwargs, mode, exc)
    except (errors.UnsupportedOpError, errors.UnsupportedTensorError, torch.OutOfMemoryError,
            IndexError):
        raise
    except Exception as exc:
        raise _kernel_error(plan, exc, args, kwargs) from exc
    finally:
        _launch._current_core[0] = prev
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


def _original(func, args, kwargs, name):
    for i, (arg_name, _d, _k) in enumerate(schema_args(func)):
        if arg_name == name:
            return args[i] if i < len(args) else kwargs[name]
    raise KeyError(name)


# ---------------------------------------------------------------------------------------------
# the fenced CPU fallback
# ---------------------------------------------------------------------------------------------

_WARNED: set = set()


def run_fallback(func, plan, args, kwargs, mode, why: str = ""):
    name = plan.name
    if config.fallback == "error":
        raise errors.UnsupportedOpError(
            f"{name} has no neuron kernel and no decomposition"
            + (f" ({why})" if why else "") + f"\n{errors.where()}\n"
            f"  args: {errors.describe_args(args, kwargs)}; "
            "set EAGER_NEURON_FALLBACK=cpu to run it on the CPU")
    STATS.fallbacks[name] += 1
    flush("cpu fallback")
    if name not in _WARNED:
        _WARNED.add(name)
        warnings.warn(
            f"{name} has no neuron kernel; running it on the CPU (counted in "
            f"eager_neuron.stats()['fallbacks']; EAGER_NEURON_FALLBACK=error makes this raise)"
            + (f" [{why}]" if why else ""), stacklevel=3)
    uargs, ukw, index = unwrap_args(args, kwargs)
    if "device" in ukw and ukw["device"] is not None and torch.device(ukw["device"]).type == \
            "neuron":
        ukw["device"] = "cpu"
    out = func(*uargs, **ukw)
    if mode is not None and index is None:
        return out
    if index is None:
        index = 0
    core = SIM.cores[index]
    # inputs go to the host and outputs come back: both charged as DMA transfers
    for x in uargs:
        if isinstance(x, torch.Tensor):
            core.transfer(x.numel() * x.element_size())

    def back(x):
        if isinstance(x, torch.Tensor) and not isinstance(x, NeuronTensor):
            for i, target in enumerate(plan.ret_alias):
                if target is not None:
                    orig = _original(func, args, kwargs, target)
                    if isinstance(orig, NeuronTensor) and orig._data is x:
                        return orig
            data, block = alloc(index, x.shape, x.stride(), x.dtype)
            data.copy_(x)
            core.transfer(x.numel() * x.element_size())
            return wrap(data, block, index)
        return x

    leaves, spec = tree_flatten(out)
    return tree_unflatten([back(v) for v in leaves], spec)


def _log_op(plan, args, kwargs) -> None:
    print(f"[eager_neuron] op {plan.name} ({plan.kind}) {errors.describe_args(args, kwargs)}",
          file=sys.stderr)


_tensor_mod._dispatch = dispatch

_IMPL_LIB = None


def install_privateuse1_impls() -> None:
    """Explicit PrivateUse1 kernels for the copies PyTorch's C++ issues with the Python key
    excluded (torch.tensor(data, device="neuron") ends in _to_copy/copy_ there): the boxed
    fallback cannot serve those (an internal assert in torch 2.13), a registered impl can."""
    global _IMPL_LIB
    if _IMPL_LIB is not None:
        return
    _IMPL_LIB = torch.library.Library("aten", "IMPL")
    for name in ("_to_copy", "copy_", "_copy_from", "_copy_from_and_resize"):
        op = getattr(aten, name).default

        def impl(*args, _op=op, **kwargs):
            return dispatch(_op, args, kwargs)

        _IMPL_LIB.impl(name, impl, "PrivateUse1")
