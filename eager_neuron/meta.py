"""Output metadata of an aten call without running it: meta execution, cached per argument
signature (shapes, strides, dtypes, Python values and the default dtype). dispatch() sizes every
op's outputs here; DYNAMIC lowerings that size an output after counting (lower/index's x[mask])
call it directly (this module imports nothing of ours).

>>> import torch
>>> leaves, spec = meta_outputs(torch.ops.aten.add.Tensor, (torch.ones(2, 3), torch.ones(3)), {})
>>> leaves
[((2, 3), (3, 1), torch.float32)]
"""

from __future__ import annotations

import threading
import warnings

import torch
from torch.utils._pytree import tree_flatten

_META: dict = {}
_META_LIMIT = 50_000


def _nan_to_num_inplace(self, nan=None, posinf=None, neginf=None):
    # torch's meta for nan_to_num_ is its Python ref, which calls isneginf and so refuses
    # complex; the out= overload writing self has the same checks and result (the CPU runs it)
    return torch.ops.aten.nan_to_num.out(self, nan, posinf, neginf, out=self)


def _cpu_memory_format(x, w, bias_sizes, stride, padding, dilation, transposed,
                       output_padding, groups):
    """The memory format the CPU's convolution gives its outputs and gradients: its backend's
    (channels_last when the input or the weight is, where that backend has it: not float64
    3-d). Asked of torch on CPU tensors of the operands' layouts, never written or read."""
    empty = torch._C._VariableFunctions.empty_strided
    try:
        xc = empty(x.shape, x.stride(), dtype=x.dtype)
        wc = empty(w.shape, w.stride(), dtype=w.dtype)
        backend = torch._C._select_conv_backend(xc, wc, None, stride, padding, dilation,
                                                transposed, output_padding, groups, bias_sizes)
        if w.dim() == 3:   # 1-d: asked as 2-d, the input contiguous (what ATen does)
            xc = torch.empty(x.shape, dtype=x.dtype).unsqueeze(2)
            wc = wc.unsqueeze(2)
        return torch._C._conv_determine_backend_memory_format(xc, wc, backend)
    except RuntimeError:   # torch's meta accepted the call: its layout stands (never an error)
        return None


def _in_format(t, fmt):
    if t is None or fmt is None:
        return t
    if t.dim() == 3 and fmt != torch.contiguous_format:
        return t.unsqueeze(2).contiguous(memory_format=fmt).squeeze(2)
    return t.contiguous(memory_format=fmt)


def _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                 groups):
    # torch's meta convolution leaves its output contiguous ("meta tensors have no device");
    # the CPU's is in its backend's memory format
    out = torch.ops.aten.convolution.default(input, weight, bias, stride, padding, dilation,
                                             transposed, output_padding, groups)
    sizes = None if bias is None else list(bias.shape)
    return _in_format(out, _cpu_memory_format(input, weight, sizes, stride, padding, dilation,
                                              transposed, output_padding, groups))


def _convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                          transposed, output_padding, groups, output_mask):
    gi, gw, gb = torch.ops.aten.convolution_backward.default(
        grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
        output_padding, groups, output_mask)
    fmt = _cpu_memory_format(input, weight, bias_sizes, stride, padding, dilation, transposed,
                             output_padding, groups)
    return _in_format(gi, fmt), _in_format(gw, fmt), gb


def _batch_norm_backward(grad_out, input, *rest):
    # torch's meta gives grad_input the input's strides as they fall (contiguous for a
    # channels_last input); the CPU's kernel takes empty_like(input, suggest_memory_format)
    from torch._prims_common import suggest_memory_format

    gi, gw, gb = torch.ops.aten.native_batch_norm_backward.default(grad_out, input, *rest)
    if gi is not None and input.dim() in (4, 5):
        gi = gi.contiguous(memory_format=suggest_memory_format(input))
    return gi, gw, gb


def iteration_strides(*args, **kwargs) -> tuple:
    """The strides of a CPU TensorIterator result over the tensor arguments in order (a binary
    op's (self, other), a backward's (grad_output, self)), broadcast as it does.

    >>> a = torch.empty(2, 3, 4, 5)
    >>> iteration_strides(a, a.contiguous(memory_format=torch.channels_last))
    (60, 20, 5, 1)
    """
    from torch._prims_common import compute_elementwise_output_strides

    ts = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    shape = torch.broadcast_shapes(*(t.shape for t in ts))
    return compute_elementwise_output_strides(*(t.expand(shape) for t in ts))


def _iteration_order(op):
    """CPU kernels that iterate their tensor arguments in schema order, where torch's meta is a
    Python reference led by another operand (copysign, xlogy, floor division: a where() or a
    sign of `other`; hardtanh/softplus/hardswish/hardsigmoid backward: a mask of `self`): a
    contiguous `self` with a channels_last `other` came out channels_last (the CPU's is not)."""
    return _with_strides(op, iteration_strides)


def _with_strides(op, strides_of):
    """op's meta, its result laid out with `strides_of(*args, **kwargs)` where they differ."""
    def meta(*args, **kwargs):
        out = op(*args, **kwargs)
        stride = strides_of(*args, **kwargs)
        if tuple(out.stride()) == tuple(stride):
            return out
        return torch.empty_strided(out.shape, stride, dtype=out.dtype, device=out.device)
    return meta


def suggested_strides(t) -> tuple:
    """The strides of a tensor of t's shape in t's suggested memory format (ATen's
    empty_like(t, t.suggest_memory_format())): channels_last(_3d) for such 4-d/5-d layouts.

    >>> suggested_strides(torch.empty(2, 3, 4, 5).contiguous(memory_format=torch.channels_last))
    (60, 1, 15, 3)
    """
    from torch._prims_common import suggest_memory_format

    probe = torch.empty(t.shape, device="meta")
    return probe.contiguous(memory_format=suggest_memory_format(t)).stride()


def _like_input(op):
    """Padding backward (grad_input = zeros_like(input, input.suggest_memory_format())): the
    meta function's result is contiguous for a channels_last input."""
    return _with_strides(op, lambda grad_output, input, *a, **k: suggested_strides(input))


def _contiguous(op):
    """CPU kernels that make their output with LEGACY_CONTIGUOUS_MEMORY_FORMAT (mse_loss's
    backward: zeros_like(input, ...), fractional max pooling's gradInput)."""
    def meta(*args, **kwargs):
        return op(*args, **kwargs).contiguous()
    return meta


def _long_target(op):
    """nll_loss's meta (torch's decomposition, through gather) refuses a uint8 target, which
    the CPU's 1-d kernels take (F.nll_loss with byte labels): the shapes do not depend on the
    target's dtype, so the meta runs on an int64 one (the lowering checks the dtype as the
    CPU does)."""
    def meta(*args, **kwargs):
        args = tuple(a.long() if isinstance(a, torch.Tensor) and a.dtype == torch.uint8 else a
                     for a in args)
        if isinstance(kwargs.get("target"), torch.Tensor):
            kwargs["target"] = kwargs["target"].long()
        return op(*args, **kwargs)
    return meta


def _empty_on_cpu(op):
    """Nearest upsampling's meta functions pass an int to torch._check for an empty batch
    (`numel() != 0 or multiply_integers(...)`: a TypeError in torch 2.13) where the CPU runs:
    an empty input's output layout is the CPU's own, asked of an empty CPU tensor (no data to
    read; the CPU's refusals are its own)."""
    def meta(input, *args, **kwargs):
        if input.numel():
            return op(input, *args, **kwargs)
        cpu = torch.empty_strided(input.shape, input.stride(), dtype=input.dtype)
        out = op(cpu, *args, **kwargs)
        return torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device="meta")
    return meta


def _lerp_inplace(self, end, weight):
    # torch's meta for lerp_ calls the overload packet aten.lerp, whose overload matching tries
    # lerp.Scalar first and words its mismatch with repr(weight). Under forward-mode AD
    # (torch.func.jvp/jacfwd: quantile's lerp_) a repr below autograd asserts in unpack_dual,
    # and the failed assert left the dispatcher's state broken for the process (every later
    # jvp, on the CPU too, raised an INTERNAL ASSERT): the overload itself, then the same check
    from torch._meta_registrations import check_inplace_broadcast

    out = torch.ops.aten.lerp.Tensor(self, end, weight)
    check_inplace_broadcast(self.shape, out.shape)
    return self


# in-place ops whose torch meta function wrongly refuses operands the CPU accepts (or cannot run
# under forward-mode AD), and ops whose meta output layout is not the CPU's
_META_VIA_OUT = {torch.ops.aten.nan_to_num_.default: _nan_to_num_inplace,
                 torch.ops.aten.lerp_.Tensor: _lerp_inplace,
                 torch.ops.aten.convolution.default: _convolution,
                 torch.ops.aten.convolution_backward.default: _convolution_backward,
                 torch.ops.aten.native_batch_norm_backward.default: _batch_norm_backward,
                 **{op: _iteration_order(op) for op in (
                     torch.ops.aten.copysign.Tensor,
                     torch.ops.aten.xlogy.Tensor,
                     torch.ops.aten.floor_divide.default,
                     torch.ops.aten.div.Tensor_mode,
                     torch.ops.aten.hardtanh_backward.default,
                     torch.ops.aten.softplus_backward.default,
                     torch.ops.aten.hardswish_backward.default,
                     torch.ops.aten.hardsigmoid_backward.default)},
                 **{op: _like_input(op) for op in (
                     torch.ops.aten.replication_pad2d_backward.default,
                     torch.ops.aten.replication_pad3d_backward.default)},
                 **{op: _contiguous(op) for op in (
                     torch.ops.aten.mse_loss_backward.default,
                     torch.ops.aten.fractional_max_pool2d_backward.default,
                     torch.ops.aten.fractional_max_pool3d_backward.default,
                     # the CPU's log_softmax backward is contiguous whatever grad's layout
                     # (softmax's backward already was here)
                     torch.ops.aten._log_softmax_backward_data.default)},
                 **{getattr(torch.ops.aten, f"{name}{r}d").default: _empty_on_cpu(
                     getattr(torch.ops.aten, f"{name}{r}d").default)
                    for name in ("upsample_nearest", "_upsample_nearest_exact") for r in (1, 2, 3)},
                 **{op: _long_target(op) for op in (
                     torch.ops.aten.nll_loss_forward.default,
                     torch.ops.aten.nll_loss2d_forward.default,
                     torch.ops.aten.nll_loss_backward.default,
                     torch.ops.aten.nll_loss2d_backward.default)}}


class _Hint(threading.local):
    cpu = False   # True while meta_outputs runs a meta function for a neuron op


_HINT = _Hint()


# ops whose meta keeps torch's accelerator rule: the device runs what the CPU refuses
# (integer histc, which HF's Mixtral router counts experts with, as on CUDA)
_DEVICE_RULES = frozenset({torch.ops.aten.histc.default, torch.ops.aten.histc.out})


def _install_cpu_hint() -> None:
    """torch's Python meta functions branch on `device_hint(t)`, which calls every meta tensor
    "cuda" (cuFFT's output strides for fft, row-major eigenvectors, a contiguous reflection or
    replication pad of a channels_last input, ...). A neuron op is the CPU's: while meta_outputs
    runs one, a meta tensor's hint is "cpu" (except _DEVICE_RULES). Fake tensors and other
    threads' meta calls are untouched."""
    import torch._meta_registrations as mr

    torch_hint = mr.device_hint
    if getattr(torch_hint, "neuron_cpu_hint", False):
        return

    def device_hint(tensor) -> str:
        hint = torch_hint(tensor)
        if hint == "cuda" and _HINT.cpu and getattr(tensor, "is_meta", False):
            return "cpu"
        return hint

    device_hint.neuron_cpu_hint = True
    mr.device_hint = device_hint


def _spec(x):
    if isinstance(x, torch.Tensor):
        return (x.shape, x.stride(), x.dtype)
    if isinstance(x, (list, tuple)):
        return tuple(_spec(v) for v in x)
    if isinstance(x, float) and x != x:
        return "nan"
    if isinstance(x, (bool, int, float, complex)):
        # by type too: 2 == 2.0 == True hash alike, and int64 * 2.0 is float32 where int64 * 2
        # is int64 (a key of the value alone served one's output dtype for the other)
        return (type(x), x)
    return x


def _to_meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, (list, tuple)):
        return type(x)(_to_meta(v) for v in x)
    return x


_RESIZED = "An output with one or more elements was resized"


def meta_outputs(func, args, kwargs):
    """(leaf specs, treespec) of func's outputs: each leaf (shape, stride, dtype) or a value."""
    try:
        # the default dtype decides a Python number's result type (int tensor + 1.5)
        key = (func, _spec(args), _spec(tuple(kwargs.items())) if kwargs else None,
               torch.get_default_dtype())
        hit = _META.get(key)
    except TypeError:
        key, hit = None, None
    if hit is not None:
        return hit
    margs = _to_meta(args)
    mkw = {k: _to_meta(v) for k, v in kwargs.items()}
    if "device" in mkw and mkw["device"] is not None:
        mkw["device"] = "meta"
    if not _HINT.cpu:
        _install_cpu_hint()
    outer, _HINT.cpu = _HINT.cpu, func not in _DEVICE_RULES
    try:
        if func._schema.is_mutable:
            # an out= tensor of another shape: torch's Python reference warns that it resizes
            # it, and so does the neuron op itself (inplace.resize_out), at the user's line
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_RESIZED)
                out = _META_VIA_OUT.get(func, func)(*margs, **mkw)
        else:
            out = _META_VIA_OUT.get(func, func)(*margs, **mkw)
    finally:
        _HINT.cpu = outer
    leaves, spec = tree_flatten(out)
    leaves = [(tuple(v.shape), v.stride(), v.dtype) if isinstance(v, torch.Tensor) else v
              for v in leaves]
    result = (leaves, spec)
    if key is not None:
        if len(_META) > _META_LIMIT:
            _META.clear()
        _META[key] = result
    return result

