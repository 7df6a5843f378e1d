"""Complex reductions: sum/mean over the (real, imag) pairs with the reduce family,
var/std(_mean) from the parts' variances, prod/cumprod as a complex128 scan kernel. Each is a
generator of launch requests that run_complex launches (lower/complex.py).

>>> import torch, eager_neuron
>>> z = torch.tensor([1 + 2j, 3 - 1j], device="neuron")
>>> complex(z.sum().cpu())
(4+1j)
"""

from __future__ import annotations

import torch

from .. import errors
from ..kernels import complex as kcx
from .common import COMPLEX
from .complex_ew import elementwise_steps, real_steps


def sum_mean(base: str, a: dict, outs: list) -> None:
    """sum/mean of a complex tensor: the reduce family over its (real, imag) pairs."""
    from .reduce import LOWERINGS as RED
    from .reduce import red_dims

    x, out = a["self"], outs[0]
    if x.dtype not in COMPLEX or out.dtype not in COMPLEX:
        raise errors.UnsupportedOpError(
            f"{base} of {x.dtype} into {out.dtype} has no neuron kernel\n{errors.where()}\n"
            "  fix: sum the complex tensor into a complex dtype")
    if x.dim() == 0:   # the sum (and mean) of one number is that number
        return (yield from elementwise_steps("aten::_to_copy", {"self": x}, out))
    conj = x.is_conj()
    raw = x.conj() if conj else x
    if raw.is_neg():
        raise NotImplementedError("complex sum of a negative-bit view")
    if raw.dtype != out.dtype:
        tmp = torch.empty(raw.shape, dtype=out.dtype)
        yield from elementwise_steps("aten::_to_copy", {"self": raw}, tmp)
        raw = tmp
    dims = red_dims(x, a.get("dim"))
    func = torch.ops.aten.sum.dim_IntList if base == "aten::sum" else torch.ops.aten.mean.dim
    lower = RED.get(f"{base}.dim_IntList" if base == "aten::sum" else "aten::mean.dim")
    if lower is None:
        raise errors.UnsupportedOpError(f"{base}: no real reduction kernel to pair with")
    yield from real_steps(lower, func, {"self": torch.view_as_real(raw), "dim": dims,
                                        "keepdim": bool(a.get("keepdim")), "dtype": None},
                          [torch.view_as_real(out)])
    if conj:
        yield from elementwise_steps("aten::conj_physical", {"self": out}, out)


VARIANCE = frozenset({"aten::var", "aten::std", "aten::var_mean", "aten::std_mean"})


def variance(base: str, a: dict, outs: list) -> None:
    """var/std(_mean) of a complex tensor: var(z) = var(re z) + var(im z) (the real lowering on
    each part; a conj or neg view changes signs only, not variances); std is its square root;
    the mean is the complex mean."""
    from .elementwise import LOWERINGS as EW
    from .reduce import LOWERINGS as RED

    x = a["self"]
    raw = x.conj() if x.is_conj() else x
    if raw.is_neg():
        raise NotImplementedError(f"complex {base} of a negative-bit view")
    pair = torch.view_as_real(raw)
    var_lower = RED.get("aten::var.correction")
    if var_lower is None:
        raise errors.UnsupportedOpError(f"{base}: no real variance kernel to pair with")
    out = outs[0]
    parts = []
    for i in (0, 1):
        tmp = torch.empty(out.shape, dtype=out.dtype)
        yield from real_steps(var_lower, torch.ops.aten.var.correction,
                              {"self": pair[..., i], "dim": a.get("dim"),
                               "correction": a.get("correction"),
                               "keepdim": bool(a.get("keepdim"))}, [tmp])
        parts.append(tmp)
    add = EW["aten::add"]
    if base.startswith("aten::std"):
        total = torch.empty(out.shape, dtype=out.dtype)
        yield from real_steps(add, torch.ops.aten.add.Tensor,
                              {"self": parts[0], "other": parts[1], "alpha": 1}, [total])
        yield from real_steps(EW["aten::sqrt"], torch.ops.aten.sqrt.default, {"self": total},
                              [out])
    else:
        yield from real_steps(add, torch.ops.aten.add.Tensor,
                              {"self": parts[0], "other": parts[1], "alpha": 1}, [out])
    if base.endswith("_mean"):
        yield from sum_mean("aten::mean", {"self": x, "dim": a.get("dim"),
                                           "keepdim": a.get("keepdim")},
             [outs[1]])


def prod(base: str, a: dict, out: torch.Tensor) -> None:
    """prod / cumprod / logcumsumexp of a complex tensor along one dim (or all of it), in
    complex128."""
    x = a["self"]
    dim = a.get("dim")
    if out.numel() == 0:
        return
    if x.dim() == 0:
        return (yield from elementwise_steps("aten::_to_copy", {"self": x}, out))
    if x.numel() == 0:   # prod over an empty dim is 1 (scans of an empty x have no output)
        return (yield from elementwise_steps("aten::ones_like", {"self": out}, out))
    if dim is None:   # prod of everything
        x, d = x.reshape(-1), 0
    else:
        d = dim % x.dim()
    moved = x.movedim(d, -1)
    rows = torch.empty(moved.shape, dtype=torch.complex128)
    yield from elementwise_steps("aten::_to_copy", {"self": moved}, rows)
    n = rows.shape[-1] if rows.dim() else 1
    x2 = rows.reshape(-1, n)
    if base == "aten::prod":
        res = torch.empty(x2.shape[0], dtype=torch.complex128)
        view = res.reshape(moved.shape[:-1])
        if a.get("keepdim") and dim is not None:
            view = view.unsqueeze(d)
    else:
        res = torch.empty(x2.shape, dtype=torch.complex128)
        view = res.reshape(moved.shape).movedim(-1, d)
    kind = base.split("::")[1].lstrip("_")   # prod, cumprod, logcumsumexp
    yield (("cscan", base, 2), lambda: kcx.render_scan(kind), (x2.numpy(), res.numpy()),
           float(6 * x2.numel()), float(32 * x2.numel()))
    yield from elementwise_steps("aten::_to_copy", {"self": view.reshape(out.shape)}, out)
