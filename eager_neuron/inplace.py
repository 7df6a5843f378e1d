"""In-place view ops on a neuron tensor (resize_, set_, unsqueeze_, as_strided_ ...) and the
resizing of out= tensors of another shape: the wrapper's own sizes/strides/offset follow its
host view, and its block grows when resize_ needs more bytes."""

from __future__ import annotations

import contextlib
import sys

import torch

from . import errors
from .adaptive import flush
from .buffers import alloc
from .operands import _original, unwrap_args
from .plan import _PLANS, _plan, _to_meta, meta_outputs
from .tensor import NeuronTensor

aten = torch.ops.aten


_AD_INPLACE = torch._C.DispatchKey.ADInplaceOrView


def composite_versions(func):
    """The guard a top-level composite in-place op's decomposition runs under (swapdims_,
    absolute_, clip_ ... reach dispatch whole only when autograd is off: inference_mode).
    Inside __torch_dispatch__ the ADInplaceOrView key is excluded, so the decomposition's
    transpose_/abs_/clamp_ would bump no version counter; the CPU runs the composite below
    that key and each inner in-place op bumps its tensors' counters (an inference tensor has
    none). Re-admitting the key does the same here; other ops: no guard."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    if not exclude.has(_AD_INPLACE) or not torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), "CompositeImplicitAutograd"):
        return contextlib.nullcontext()
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(),
                                           exclude.remove(_AD_INPLACE))


def run_inplace_view(func, plan, args, kwargs, mode):
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
    neuron_source = _neuron_storage_source(args, kwargs)
    for a in list(args[1:]) + list(kwargs.values()):
        if isinstance(a, (torch.UntypedStorage, torch.TypedStorage)) and neuron_source is None:
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
    if neuron_source is not None:                 # set_(neuron storage): alias its buffer
        # NOTE: the wrapper keeps its own (resizable, data-less) storage: set_'s meta kernel
        # refuses a fixed-size one; Python callers see the neuron storage via untyped_storage()
        host, block, _neuron = neuron_source
        uargs = (uargs[0], host, *uargs[2:])
        ukw = {k: (host if k == "source" else v) for k, v in ukw.items()}
    elif plan.name.startswith("aten::set_") and type(source) is NeuronTensor:
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


def _neuron_storage_source(args, kwargs):
    """(host storage, block, neuron storage) when set_ is given a neuron storage made by
    eager_neuron.storage (torch.load, storage.copy_, DataLoader's _new_shared), else None."""
    from .storage import host_of

    source = args[1] if len(args) > 1 else kwargs.get("source")
    if isinstance(source, (torch.UntypedStorage, torch.TypedStorage)):
        return host_of(source)
    return None


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


def warn_resized(t, shape) -> None:
    """ATen's resize_output warning for an out= tensor of another shape that held elements."""
    if t.numel() != 0:
        errors.warn(
            f"An output with one or more elements was resized since it had shape {list(t.shape)}"
            f", which does not match the required output shape {list(shape)}. This behavior is "
            "deprecated; resize outputs explicitly with t.resize_(0) first.")


def resize_out(t, shape) -> torch.Tensor:
    """ATen's resize_output for an out= tensor of another shape: warn if it held elements,
    resize it (an in-place view op on the wrapper); returns its new host view."""
    warn_resized(t, shape)
    func = aten.resize_.default
    plan = _PLANS.get(func) or _PLANS.setdefault(func, _plan(func))
    run_inplace_view(func, plan, (t, list(shape)), {}, None)
    return t._data


def resize_outs(func, plan, args, kwargs) -> None:
    """Host ops (arange, RNG into out=) write the host view directly: size their out= first."""
    uargs, ukw, _index = unwrap_args(args, kwargs)
    leaves, _spec = meta_outputs(func, uargs, ukw)
    for i, target in enumerate(plan.ret_alias):
        if target in plan.out_args and i < len(leaves) and isinstance(leaves[i], tuple):
            t = _original(func, args, kwargs, target)
            if type(t) is NeuronTensor and t.shape != leaves[i][0]:
                resize_out(t, leaves[i][0])


# NOTE: the Meta kernel of set_ rewrites a tensor's sizes, strides and offset and grows its
# storage's byte count; it touches no data, which a wrapper's storage does not have.
_META_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def _set_meta(t, storage, offset, size, stride):
    aten.set_.source_Storage_storage_offset.redispatch(_META_KEYS, t, storage, offset, size,
                                                       stride)
