"""PyTorch's decompositions, the route for an op with no kernel (or whose lowering declines an
argument pattern): the core ATen set first, then torch's global table. Read by plan.py once per
overload, by dispatch when a lowering declines, and by lowerings that decline only when a
decomposition exists (lower/complex.py); it imports nothing of ours, so any of them may.

>>> import torch
>>> decomposition(torch.ops.aten.addcmul.default) is not None
True
"""

from __future__ import annotations

_DECOMP = None


def decomposition(func):
    """PyTorch's decomposition for func (an OpOverload), or None."""
    global _DECOMP
    if _DECOMP is None:
        from torch._decomp import core_aten_decompositions, decomposition_table

        table = dict(decomposition_table)
        table.update(core_aten_decompositions())
        _DECOMP = table
    return _DECOMP.get(func)
