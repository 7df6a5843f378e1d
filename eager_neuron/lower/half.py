"""bfloat16 / float16: stored as such, computed in float32, rounded to nearest even.

Every half operand is cast up to float32 on the device, the float32 lowering runs, and half
outputs are cast back (round to nearest even, as PyTorch's CPU kernels do).
"""

from __future__ import annotations

import torch

from .common import HALF


def _dense(t: torch.Tensor) -> bool:
    """Strides that cover the elements exactly once (torch 2.13 has no Python method for it)."""
    return torch._prims_common.is_non_overlapping_and_dense_or_false(t)


def _up(t: torch.Tensor, index_like: torch.Tensor) -> torch.Tensor:
    from ..dispatch import alloc
    from .. import ops

    if t.dtype not in HALF:
        return t
    out = torch.empty_strided(t.shape, t.stride(), dtype=torch.float32) if not \
        _dense(t) else alloc_like(t, torch.float32)
    ops.KERNELS["aten::_to_copy"](torch.ops.aten._to_copy.default, {"self": t}, [out])
    return out


def alloc_like(t: torch.Tensor, dtype) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=dtype)


def run_upcast(func, plan, a: dict, outs: list) -> None:
    from .. import ops

    # NOTE: temporaries are host-backed scratch, like SBUF tiles; only outputs touch HBM.
    up = {}
    for k, v in a.items():
        if isinstance(v, torch.Tensor) and v.dtype in HALF:
            up[k] = _up(v, v)
        elif isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
            up[k] = type(v)(_up(x, x) if x.dtype in HALF else x for x in v)
        else:
            up[k] = v
    tmp_outs = []
    for o in outs:
        if isinstance(o, torch.Tensor) and o.dtype in HALF:
            tmp_outs.append(alloc_like(o, torch.float32))
        else:
            tmp_outs.append(o)
    # in-place on a half tensor: the upcast self is the float32 output
    for i, target in enumerate(plan.ret_alias):
        if target is not None and isinstance(outs[i], torch.Tensor) and outs[i].dtype in HALF:
            tmp_outs[i] = up[target]
    plan.lower(func, up, tmp_outs)
    for o, t in zip(outs, tmp_outs):
        if o is not t and isinstance(o, torch.Tensor) and o.dtype in HALF:
            ops.KERNELS["aten::_to_copy"](torch.ops.aten._to_copy.default, {"self": t}, [o])
