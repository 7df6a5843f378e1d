"""PyTorch's decompositions, the route for an op with no kernel (or whose lowering declines an
argument pattern): the core ATen set first, then torch's global table. Read by plan.py once per
overload, by dispatch when a lowering declines, and by lowerings that decline only when a
decomposition exists (lower/complex.py); it imports nothing of ours, so any of them may.

>>> import torch
>>> decomposition(torch.ops.aten.addcmul.default) is not None
True
"""

from __future__ import annotations

import torch

_DECOMP = None


def decomposition(func):
    """PyTorch's decomposition for func (an OpOverload), or None."""
    global _DECOMP
    if _DECOMP is None:
        from torch._decomp import core_aten_decompositions, decomposition_table

        table = dict(decomposition_table)
        table.update(core_aten_decompositions())
        for op in (torch.ops.aten.channel_shuffle.default,
                   torch.ops.aten.native_channel_shuffle.default):
            if op in table:
                table[op] = _keeps_memory_format(table[op])
        table[torch.ops.aten.slice_backward.default] = _slice_backward
        # the CPU's layout where torch's decomposition lays its result out otherwise
        aten = torch.ops.aten
        for op in (aten.elu_backward.default, aten.special_xlog1py.default):
            table[op] = _laid_out(table[op], _iteration_strides)
        for op in (aten.reflection_pad2d_backward.default, aten.reflection_pad3d_backward.default):
            table[op] = _laid_out(table[op], _input_strides)
        for op in (aten.smooth_l1_loss_backward.default, aten.huber_loss_backward.default,
                   aten.glu_backward.default):
            table[op] = _laid_out(table[op], lambda *a, **k: None)
        table[torch.ops.aten.select_backward.default] = _select_backward
        table[torch.ops.aten.new_zeros.default] = _new_filled(0)
        table[torch.ops.aten.new_ones.default] = _new_filled(1)
        table[torch.ops.aten._is_all_true.default] = _bool_reduction("all")
        table[torch.ops.aten._is_any_true.default] = _bool_reduction("any")
        table[torch.ops.aten._weight_norm_interface_backward.default] = _weight_norm_backward
        table[torch.ops.aten._nested_tensor_from_mask_left_aligned.default] = _left_aligned
        table.update(_shift_dunders())
        for op, fn in _view_copies().items():
            table.setdefault(op, fn)
        # TorchScript-traced models call the backend-selecting _convolution (a CPU fallback)
        for ov in ("default", "deprecated"):
            op = getattr(torch.ops.aten._convolution, ov, None)
            if op is not None:
                table.setdefault(op, _convolution)
        _DECOMP = table
    return _DECOMP.get(func)


def _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                 groups, *_backend_flags):
    """aten::_convolution (benchmark, deterministic, cudnn_enabled, allow_tf32: backend choices
    the CPU ignores) is aten::convolution: ATen's convolution calls it with the same arguments."""
    return torch.ops.aten.convolution.default(input, weight, bias, stride, padding, dilation,
                                              transposed, output_padding, groups)


def _view_copies() -> dict:
    """The *_copy form of views torch's tables leave out (select_copy, slice_copy, detach_copy,
    split_copy, view_as_real_copy, ...: functionalized graphs, torch.export and HOP autograd
    traces are made of them), which ran as CPU fallbacks: the view, each result cloned into a
    contiguous tensor, as ATen's generated copy kernels and torch's refs for the others do."""
    import torch.utils._pytree as pytree

    aten = torch.ops.aten

    def copy_of(view):
        def run(*args, **kwargs):
            return pytree.tree_map_only(
                torch.Tensor, lambda t: t.clone(memory_format=torch.contiguous_format),
                view(*args, **kwargs))
        return run

    pairs = [("select_copy", "int", aten.select.int), ("slice_copy", "Tensor", aten.slice.Tensor),
             ("detach_copy", "default", aten.detach.default),
             ("split_copy", "Tensor", aten.split.Tensor),
             ("split_with_sizes_copy", "default", aten.split_with_sizes.default),
             ("view_as_real_copy", "default", aten.view_as_real.default),
             ("view_as_complex_copy", "default", aten.view_as_complex.default),
             ("_reshape_copy", "default", aten.reshape.default)]
    out = {}
    for name, overload, view in pairs:
        packet = getattr(aten, name, None)
        op = getattr(packet, overload, None) if packet is not None else None
        if op is not None:
            out[op] = copy_of(view)
    return out


def _shift_dunders() -> dict:
    """Python's `x >> n` / `x << n` / `>>=` / `<<=` are aten::__rshift__ & co., which ran as CPU
    fallbacks: ATen computes them with the same kernels (rshift/lshift stubs) as
    bitwise_right_shift / bitwise_left_shift, which have neuron kernels; same dtypes, same
    promotion, same refusal of floating operands."""
    aten = torch.ops.aten
    table = {}
    for dunder, target in (("__rshift__", "bitwise_right_shift"),
                           ("__lshift__", "bitwise_left_shift"),
                           ("__irshift__", "bitwise_right_shift_"),
                           ("__ilshift__", "bitwise_left_shift_")):
        packet, op = getattr(aten, dunder), getattr(aten, target)
        table[packet.Tensor] = op.Tensor
        table[packet.Scalar] = op.Tensor_Scalar
    return table


def _zero_padded(grad, input_sizes, dim, start, end):
    """slice_backward of a unit-step slice [start, end) along `dim` as one constant_pad_nd of
    zeros (one kernel, ~11 us, against ~80-100 us for zeros, a slice and a copy), or None
    where that is not exactly the CPU's result (`_pad_of`)."""
    pad = _pad_of(grad, input_sizes, dim, start, end)
    if pad is None:
        return None
    out = torch.ops.aten.constant_pad_nd.default(grad, pad, 0)
    return out if out.is_contiguous() else None


def _pad_of(grad, input_sizes, dim, start, end):
    """The pad `_zero_padded` gives constant_pad_nd, or None where that is not exactly the
    CPU's result: the CPU's is a contiguous tensor (new_zeros), and constant_pad_nd lays its
    result out in its input's suggested memory format (a transposed or sliced gradient, Llama's
    rotate_half, pads into a contiguous result; a channels-last one would not); a grad that does
    not fill the slice keeps the copy's own error. Start and end are normalized as a slice's.
    Reads only grad's shape and strides."""
    try:
        sizes = [int(s) for s in input_sizes]
        nd = len(sizes)
        if nd == 0 or grad.dim() != nd or not (
                grad.is_contiguous() or _suggests_contiguous(grad)):
            return None
        d = dim % nd
        n = sizes[d]
        lo, hi = slice_bounds(n, start, end)
        if list(grad.shape) != sizes[:d] + [hi - lo] + sizes[d + 1:]:
            return None
    except (TypeError, ValueError, ZeroDivisionError):   # a symbolic or odd argument
        return None
    return [0, 0] * (nd - 1 - d) + [lo, n - hi]


def slice_bounds(n: int, start: int, end: int) -> tuple[int, int]:
    """[start, end) of a unit-step slice of a dim of size n, normalized as Python's slice does
    (negative from the end, clamped to [0, n], end no less than start).

    >>> slice_bounds(5, -2, 2**62), slice_bounds(5, 3, 1)
    ((3, 5), (3, 3))
    """
    lo = start + n if start < 0 else start
    hi = end + n if end < 0 else end
    lo = min(max(lo, 0), n)
    return lo, min(max(hi, lo), n)


def select_at(grad, input_sizes, dim, index):
    """(dim, index) of a select_backward normalized, when its gradient is the input less that
    dim and the index lies in it, else None (then zeros and a strided copy: its own error)."""
    try:
        nd = len(input_sizes)
        d = dim % nd if nd else 0
        n = int(input_sizes[d]) if nd else 0
        i = index + n if index < 0 else index
        ok = nd > 0 and grad.dim() == nd - 1 and 0 <= i < n
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    return (d, i) if ok else None


def _suggests_contiguous(t) -> bool:
    """Does the CPU lay out a result "in t's memory format" (suggest_memory_format) as a
    contiguous tensor? Only a 4-d or 5-d tensor with channels-last strides suggests another."""
    if t.dim() not in (4, 5):
        return True
    from torch._prims_common import suggest_memory_format

    return suggest_memory_format(t) == torch.contiguous_format


def _slice_backward(grad, input_sizes, dim, start, end, step):
    """slice_backward: a unit step as one zero pad (`_zero_padded`), else zeros and one strided
    copy (torch's reference builds it from index arithmetic: ~2x slower on neuron); the CPU's
    result, a contiguous tensor."""
    if step == 1:
        out = _zero_padded(grad, input_sizes, dim, start, end)
        if out is not None:
            return out
    out = grad.new_zeros(input_sizes)
    torch.ops.aten.slice.Tensor(out, dim, start, end, step).copy_(grad)
    return out


def _select_backward(grad, input_sizes, dim, index):
    """select_backward as one zero pad of the gradient with `dim` put back, else zeros and one
    strided copy into the selected slice (torch's reference: new_zeros, then select_scatter
    through the Python refs, ~170 us on neuron)."""
    at = select_at(grad, input_sizes, dim, index)
    if at is not None:
        d, i = at
        out = _zero_padded(torch.ops.aten.unsqueeze.default(grad, d), input_sizes, d, i, i + 1)
        if out is not None:
            return out
    out = grad.new_zeros(input_sizes)
    torch.ops.aten.select.int(out, dim, index).copy_(grad)
    return out


def _new_filled(value: int):
    """new_zeros / new_ones as new_empty and fill_ (torch's reference goes through the
    Python refs to torch.full: ~50 us on neuron); 0 and 1 fit every dtype, as in full."""
    def run(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
        out = torch.ops.aten.new_empty.default(self, size, dtype=dtype, layout=layout,
                                               device=device, pin_memory=pin_memory)
        return out.fill_(value)

    return run


def _iteration_strides(*args, **kwargs):
    # elu_backward / xlog1py: the CPU iterates the tensors in order; torch's decomposition is a
    # where() led by a mask of the input (a contiguous gradient of a channels_last input came
    # out channels_last)
    from .meta import iteration_strides

    return iteration_strides(*args, **kwargs)


def _input_strides(grad_output, input, *args, **kwargs):
    # reflection padding's backward: zeros_like(input, input.suggest_memory_format())
    from .meta import suggested_strides

    return suggested_strides(input)


def _laid_out(decomp, strides_of):
    """torch's decomposition, its result copied into the CPU kernel's layout where that differs
    (`strides_of(*args)`; None: contiguous, as the smooth losses' backward (zeros_like(input,
    LEGACY_CONTIGUOUS_MEMORY_FORMAT)) and glu_backward (resized from empty) make it)."""
    def run(*args, **kwargs):
        out = decomp(*args, **kwargs)
        want = strides_of(*args, **kwargs)
        if want is None:
            return out.contiguous()
        if tuple(out.stride()) == tuple(want) or out.numel() <= 1:
            return out
        return torch.empty_strided(out.shape, want, dtype=out.dtype,
                                   device=out.device).copy_(out)

    return run


def _keeps_memory_format(decomp):
    """torch's decomposition, its result in the input's suggested memory format as the CPU's
    kernel gives it (channel_shuffle of a channels_last input is channels_last)."""
    def run(self, *args, **kwargs):
        from torch._prims_common import suggest_memory_format

        out = decomp(self, *args, **kwargs)
        fmt = suggest_memory_format(self)
        return out if fmt == torch.contiguous_format else out.contiguous(memory_format=fmt)

    return run


def _bool_reduction(name: str):
    """_is_all_true / _is_any_true (torch.distributions' argument checks call them on every
    construction): all() / any() of a bool tensor, as a 0-d bool tensor."""
    def run(self):
        if self.dtype != torch.bool:
            raise RuntimeError(f"_is_{name}_true: expected a bool tensor, got {self.dtype} "
                               "(the CPU fails the same internal assert: "
                               "self.scalar_type() == at::kBool)")
        return getattr(torch.ops.aten, name).default(self)

    return run


def _weight_norm_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    """The fused weight_norm's backward (w = v * g / ||v||, the norm over every dim but `dim`,
    which is the first or the last; `saved_norms` and `saved_g` keep that dim, size 1
    elsewhere), as the CPU kernel computes it: grad_g = sum(grad_w * v) / norm and
    grad_v = (g / norm) * (grad_w - v * grad_g / norm)."""
    dim = dim % saved_v.dim()
    rest = [d for d in range(saved_v.dim()) if d != dim]
    grad_g = (grad_w * saved_v).sum(rest, keepdim=True) / saved_norms
    grad_v = (saved_g / saved_norms) * (grad_w - saved_v * (grad_g / saved_norms))
    return grad_v, grad_g.view(saved_g.shape)


def _left_aligned(t, mask):
    """TransformerEncoder's mask check: every row of the (batch, seq) bool mask is a run of
    True then a run of False (no True after a False)."""
    if mask.dtype != torch.bool:
        raise RuntimeError("Expected mask to be of type bool")
    if mask.dim() != 2 or t.dim() < 2 or tuple(mask.shape) != tuple(t.shape[:2]):
        raise RuntimeError(f"_nested_tensor_from_mask_left_aligned: a (batch, seq) mask "
                           f"matching the input, got {tuple(mask.shape)} for "
                           f"{tuple(t.shape)}")
    if mask.shape[1] < 2:
        return True
    return not bool((mask[:, 1:] & ~mask[:, :-1]).any().item())
