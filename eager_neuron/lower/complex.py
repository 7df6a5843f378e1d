"""Complex64/complex128 lowerings (skeleton: every op refuses with a clear error for now)."""

from __future__ import annotations

from .. import errors
from ..adaptive import MODULE as _adaptive


def run_complex(func, plan, a: dict, outs: list) -> None:
    """An op with a complex operand or output (dispatch routes every such kernel call here)."""
    _adaptive.ARMED[0] = False
    raise errors.UnsupportedOpError(
        f"{plan.name} has no neuron kernel for complex tensors\n{errors.where()}\n"
        "  fix: compute on the CPU (x.cpu()) or on torch.view_as_real(x)")


LOWERINGS: dict = {}
