"""Complex matrix products (mm, bmm, addmm, baddbmm, mv, addmv, dot, vdot, addbmm): one
complex loop kernel over (B, M, K) @ (B, K, N) views (no complex GEMM engine on the device).

>>> import torch, eager_neuron
>>> a = torch.tensor([[1j, 1]], device="neuron")
>>> (a @ a.T).cpu().tolist()
[[0j]]
"""

from __future__ import annotations

import torch

from .. import errors
from ..kernels import compile as kc
from ..kernels import complex as kcx
from .common import COMPLEX, strided_np
from .complex_ew import PARALLEL_MIN, elementwise_steps, load_kind, store_type

# products: base op -> (left, right, added tensor or None); all become (B, M, K) @ (B, K, N)
MATMUL = {
    "aten::mm": ("self", "mat2", None), "aten::bmm": ("self", "mat2", None),
    "aten::addmm": ("mat1", "mat2", "self"), "aten::baddbmm": ("batch1", "batch2", "self"),
    "aten::mv": ("self", "vec", None), "aten::addmv": ("mat", "vec", "self"),
    "aten::dot": ("self", "tensor", None), "aten::vdot": ("self", "other", None),
}


def _as3(t: torch.Tensor, role: str) -> torch.Tensor:
    """A 1-/2-/3-d operand as a (B, rows, cols) view: vectors are rows on the left, columns on
    the right."""
    if t.dim() == 3:
        return t
    if t.dim() == 2:
        return t.unsqueeze(0)
    return t.view(1, 1, -1) if role == "left" else t.view(1, -1, 1)


def matmul(base: str, a: dict, out: torch.Tensor) -> None:
    """Complex matrix products, one loop kernel (no complex GEMM engine on the device); a
    generator of its launch requests (a half operand's float32 copy, the product)."""
    left, right, added = MATMUL[base]
    x, y = a[left], a[right]
    if base == "aten::vdot":
        x = x.conj()
    if out.dtype not in COMPLEX or any(t.dtype != out.dtype for t in (x, y)):
        raise errors.UnsupportedOpError(
            f"{base} with operands {x.dtype}, {y.dtype} into {out.dtype} has no neuron kernel"
            f"\n{errors.where()}\n  fix: cast both operands to {out.dtype} first")
    if out.numel() == 0:
        return
    role = "right" if base in ("aten::mv", "aten::addmv") else "left"   # a vector output
    o3 = out.view(1, 1, 1) if out.dim() == 0 else _as3(out, role)
    kx, x3 = yield from load_kind(_as3(x, "left"))
    ky, y3 = yield from load_kind(_as3(y, "right"))
    alpha = complex(a.get("alpha", 1) if a.get("alpha") is not None else 1)
    beta = complex(a.get("beta", 1) if a.get("beta") is not None else 1)
    args = [strided_np(o3, tuple(o3.shape), o3.stride()),
            strided_np(x3, tuple(x3.shape), x3.stride()),
            strided_np(y3, tuple(y3.shape), y3.stride())]
    ks = ""
    if added is not None and beta != 0:
        s = a[added]
        ks, s = yield from load_kind(s)
        s3 = s.expand(out.shape)
        s3 = s3.view(1, 1, 1) if out.dim() == 0 else _as3(s3, role)
        args.append(strided_np(s3, tuple(s3.shape), s3.stride()))
    store = store_type(out)
    nb, nm, _nn = o3.shape
    parallel = nb * nm > 1 and out.numel() * x3.shape[2] >= PARALLEL_MIN and \
        kc.parallel_allowed()
    key = ("cbmm", kx, ky, bool(ks), ks, store, parallel)

    def render():
        return kcx.render_bmm(kx, ky, bool(ks), ks or "c", store, parallel)

    yield (key, render, tuple(args) + (alpha, beta), float(8 * out.numel() * x3.shape[2]),
           float(x3.numel() * x3.element_size() + y3.numel() * y3.element_size()
                 + out.numel() * out.element_size()), "tensor")


def addbmm(a: dict, out: torch.Tensor) -> None:
    """addbmm: beta * self + alpha * sum_b batch1[b] @ batch2[b], as one (M, B*K) @ (B*K, N)
    product of the batches laid side by side (the same sum, accumulated in complex128)."""
    b1, b2 = a["batch1"], a["batch2"]
    nb, m, k = b1.shape
    n = b2.shape[2]
    left = torch.empty((m, nb, k), dtype=out.dtype)
    yield from elementwise_steps("aten::_to_copy", {"self": b1.permute(1, 0, 2)}, left)
    right = torch.empty((nb, k, n), dtype=out.dtype)
    yield from elementwise_steps("aten::_to_copy", {"self": b2}, right)
    yield from matmul("aten::addmm", {"self": a["self"], "mat1": left.reshape(m, nb * k),
                            "mat2": right.reshape(nb * k, n), "beta": a.get("beta", 1),
                            "alpha": a.get("alpha", 1)}, out)
