"""Complex ops that act on the real and imaginary parts independently (data movement, linear
backward sums): the op's own real lowering runs on the real parts, then on the imaginary parts;
complex32 as storage only; `put` as index_put of (real, imag) rows. Each is a generator of
launch requests that run_complex launches (lower/complex.py).

>>> import torch, eager_neuron
>>> z = torch.tensor([1 + 2j, 3 - 1j], device="neuron")
>>> torch.flip(z, [0]).cpu().tolist()
[(3-1j), (1+2j)]
"""

from __future__ import annotations

import torch

from .. import errors
from .common import COMPLEX
from .complex_ew import COPIES, dtypes, elementwise_steps, real_steps

# ops that act on the real and imaginary parts independently (data movement, sums): they run as
# the op's own real kernel twice, over the (strided) real parts and then the imaginary parts
SPLIT = frozenset({
    "aten::constant_pad_nd", "aten::cat", "aten::stack", "aten::index_select", "aten::flip",
    "aten::roll", "aten::repeat", "aten::slice_scatter", "aten::select_scatter",
    "aten::diagonal_scatter", "aten::gather", "aten::scatter",
    "aten::scatter_add", "aten::index", "aten::index_put", "aten::index_add", "aten::masked_fill",
    "aten::tril", "aten::triu", "aten::cumsum", "aten::narrow_copy", "aten::unfold_backward",
    "aten::reflection_pad1d", "aten::reflection_pad2d", "aten::replication_pad1d",
    "aten::col2im", "aten::im2col", "aten::embedding_dense_backward", "aten::_unsafe_index",
    "aten::_unsafe_index_put", "aten::expand_copy", "aten::permute_copy", "aten::view_copy",
    "aten::unfold_copy", "aten::new_zeros", "aten::zeros_like", "aten::trace",
    "aten::diag_embed", "aten::diagonal_copy", "aten::squeeze_copy", "aten::unsqueeze_copy",
    "aten::transpose_copy", "aten::t_copy", "aten::select_copy", "aten::slice_copy",
    "aten::nan_to_num",   # the CPU replaces NaN and infinities in each part on its own
    "aten::index_copy", "aten::masked_scatter", "aten::take", "aten::put",
    # backward ops that sum gradients: linear, so real and imaginary parts separately
    "aten::replication_pad1d_backward", "aten::replication_pad2d_backward",
    "aten::replication_pad3d_backward", "aten::reflection_pad1d_backward",
    "aten::reflection_pad2d_backward", "aten::reflection_pad3d_backward",
    "aten::replication_pad3d", "aten::reflection_pad3d",
    "aten::replication_pad2d",
})
_SPLIT_SCALARS = ("value", "fill_value")   # Scalars that split into real and imaginary parts


def _part(v, i: int):
    """Part i (0 real, 1 imaginary) of a complex tensor as a strided real view; others kept."""
    if isinstance(v, torch.Tensor) and v.dtype in COMPLEX:
        return torch.view_as_real(v)[..., i]
    if isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
        return type(v)(_part(t, i) for t in v)
    return v


def split(func, plan, a: dict, outs: list) -> bool:
    """Run the op's real lowering on the real parts, then on the imaginary parts; False if
    the operands do not allow it (a real float operand, a complex alpha, a conj view)."""
    flat = [v for v in a.values() if isinstance(v, torch.Tensor)]
    flat += [t for v in a.values() if isinstance(v, (list, tuple)) for t in v
             if isinstance(t, torch.Tensor)]
    flat += [o for o in outs if isinstance(o, torch.Tensor)]
    if any((t.is_floating_point() and t.dtype not in COMPLEX) or t.is_conj() or t.is_neg()
           for t in flat) or not any(t.dtype in COMPLEX for t in flat):
        return False
    if isinstance(a.get("alpha"), complex):
        return False
    for i in (0, 1):
        part = {k: _part(v, i) for k, v in a.items()}
        for k in _SPLIT_SCALARS:
            if k in part and isinstance(part[k], (int, float, complex)) \
                    and not isinstance(part[k], bool):
                part[k] = complex(part[k]).real if i == 0 else complex(part[k]).imag
        part_outs = [_part(o, i) for o in outs]
        # written arguments (in-place, out=) must be the same objects in `a` and `outs`
        for j, target in enumerate(plan.ret_alias):
            if target is not None and j < len(part_outs):
                part_outs[j] = part[target]
        yield from real_steps(plan.lower, func, part, part_outs)
    return True


def has_chalf(a: dict, outs: list) -> bool:
    return any(isinstance(v, torch.Tensor) and v.dtype == torch.complex32
               for v in list(a.values()) + list(outs))


def chalf(plan, base: str, a: dict, outs: list) -> None:
    """complex32 is storage only: casts to and from it go through complex64 (its float16 pairs
    convert with the cast family's float16 path); any other op refuses it."""
    from .cast import cast_steps

    if base == "aten::complex" and outs[0].dtype == torch.complex32:
        # torch.complex(half, half): the pairs themselves (float16 values, exactly)
        pair = torch.view_as_real(outs[0])
        yield from cast_steps(a["real"].expand(outs[0].shape), pair[..., 0])
        yield from cast_steps(a["imag"].expand(outs[0].shape), pair[..., 1])
        return
    name = "src" if base in ("aten::copy", "aten::copy_") else "self"
    src, out = a.get(name), outs[0]
    if base not in COPIES or not isinstance(src, torch.Tensor) or src.is_conj() or \
            src.is_neg():
        raise errors.UnsupportedOpError(
            f"{plan.name} has no neuron kernel for complex32 tensors "
            f"({', '.join(dtypes(a, outs))})\n{errors.where()}\n"
            "  fix: convert to complex64 first (x.to(torch.complex64)); complex32 is supported "
            "on neuron as storage only")
    if src.dtype == torch.complex32:
        up = torch.empty(src.shape, dtype=torch.complex64)
        yield from cast_steps(torch.view_as_real(src), torch.view_as_real(up))
        src = up
    if out.dtype != torch.complex32:
        yield from elementwise_steps(base, {name: src}, out)
        return
    tmp = torch.empty(out.shape, dtype=torch.complex64)
    yield from elementwise_steps(base, {name: src}, tmp)
    yield from cast_steps(torch.view_as_real(tmp), torch.view_as_real(out))


def put(a: dict, out: torch.Tensor) -> None:
    """put on complex: index_put of (real, imag) rows into the flattened pairs of the result
    (negative indices wrap in both; accumulate adds both parts)."""
    from .index import lower_index_put  # the family, not ops.py (which imports this module)

    if out is not a["self"]:
        yield from elementwise_steps("aten::_to_copy", {"self": a["self"]}, out)
    if not out.is_contiguous() or out.is_conj() or out.is_neg():
        raise NotImplementedError("complex put into a strided or conj/neg view")
    src = a["source"]
    pairs = torch.empty(tuple(src.shape) + (2,), dtype=out.dtype.to_real())
    yield from elementwise_steps("aten::_to_copy", {"self": src}, torch.view_as_complex(pairs))
    rows = torch.view_as_real(out).view(-1, 2)
    index = a["index"].reshape(-1)
    yield from real_steps(lower_index_put, torch.ops.aten.index_put_.default,
                          {"self": rows, "indices": [index], "values": pairs.view(-1, 2),
                           "accumulate": bool(a["accumulate"])}, [rows])


def as_strided_scatter(a: dict, out: torch.Tensor) -> None:
    """as_strided_scatter on complex: out = self, then src copied into out's as_strided view
    (sizes, strides and offset count complex elements, so the view is taken on the complex
    tensor itself; the offset counts in out's storage, as ATen's clone, see lower/shape.py)."""
    from .shape import as_strided_dst

    if out is not a["self"]:
        yield from elementwise_steps("aten::_to_copy", {"self": a["self"]}, out)
    dst = as_strided_dst(out, a)
    if dst.numel():
        yield from elementwise_steps("aten::_to_copy", {"self": a["src"]}, dst)


def masked_scatter_backward(func, plan, a: dict, out: torch.Tensor) -> None:
    """The source's gradient grad[mask], zero-padded: the real lowering over the (re, im) pairs
    (the mask widened to them), so each selected element's pair lands in order in the
    contiguous pairs of out."""
    g = a["grad_output"]
    if g.is_conj() or g.is_neg():   # the pairs of the values, not of the raw memory
        tmp = torch.empty(g.shape, dtype=g.dtype)
        yield from elementwise_steps("aten::_to_copy", {"self": g}, tmp)
        g = tmp
    pair = torch.view_as_real(g)
    mask = a["mask"].expand(g.shape).unsqueeze(-1).expand(pair.shape)
    yield from real_steps(plan.lower, func, {"grad_output": pair, "mask": mask,
                                             "sizes": list(a["sizes"]) + [2]},
                          [torch.view_as_real(out)])
