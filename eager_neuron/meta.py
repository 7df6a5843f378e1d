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

import torch
from torch.utils._pytree import tree_flatten

_META: dict = {}
_META_LIMIT = 50_000


def _nan_to_num_inplace(self, nan=None, posinf=None, neginf=None):
    # torch's meta for nan_to_num_ is its Python ref, which calls isneginf and so refuses
    # complex; the out= overload writing self has the same checks and result (the CPU runs it)
    return torch.ops.aten.nan_to_num.out(self, nan, posinf, neginf, out=self)


# in-place ops whose torch meta function wrongly refuses operands the CPU accepts
_META_VIA_OUT = {torch.ops.aten.nan_to_num_.default: _nan_to_num_inplace}


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
    out = _META_VIA_OUT.get(func, func)(*margs, **mkw)
    leaves, spec = tree_flatten(out)
    leaves = [(tuple(v.shape), v.stride(), v.dtype) if isinstance(v, torch.Tensor) else v
              for v in leaves]
    result = (leaves, spec)
    if key is not None:
        if len(_META) > _META_LIMIT:
            _META.clear()
        _META[key] = result
    return result

