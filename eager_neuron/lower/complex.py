"""Complex64/complex128 lowerings: every kernel call with a complex operand or output.

dispatch routes such calls here (`run_complex`) whatever family the op name maps to, unless that
lowering sets `handles_complex` (the FFT family does). This module routes each op by concern:

- complex_ew.py: an op as an expression over its schema argument names (kernels/complex.py
  evaluates it in complex128/float64 and rounds once at the store);
- complex_reduce.py: sum/mean over `view_as_real` pairs with the reduce family, var/std,
  prod/cumprod;
- complex_matmul.py: matrix products as one complex loop kernel;
- complex_parts.py: data-movement ops (SPLIT) run their own real kernel on the real parts, then
  on the imaginary parts; complex32 is storage only (casts); put.

Any other complex op declines to PyTorch's decomposition if it has one, else raises
UnsupportedOpError.

>>> import torch, eager_neuron
>>> z = torch.tensor([1 + 2j, 3 - 1j], device="neuron")
>>> (z * z.conj()).real.tolist()
[5.0, 10.0]
"""

from __future__ import annotations

import torch

from .. import context as _context
from .. import errors
from ..adaptive import MODULE as _adaptive
from ..launch import launch
from . import complex_matmul as _mm
from . import complex_parts as _parts
from . import complex_reduce as _red
from .common import HALF
from .complex_ew import (
    OPS,
    RUN,
    dtypes,
    elementwise,
    elementwise_steps,
    is_complex,
    real_steps,
)

__all__ = ["OPS", "SPLIT", "LOWERINGS", "elementwise", "run_complex"]
SPLIT = _parts.SPLIT
_NAMES: dict = {}


def _base(plan_name: str) -> str:
    """'aten::add_.Tensor' -> 'aten::add'; '.out' and in-place forms share the functional op."""
    base = _NAMES.get(plan_name)
    if base is None:
        base = plan_name.split(".")[0]
        if base.endswith("_") and base not in OPS:
            base = base[:-1]
        _NAMES[plan_name] = base
    return base


def run_complex(func, plan, a: dict, outs: list) -> None:
    """An op with a complex operand or output (dispatch routes every such kernel call here).
    It launches the op's steps itself (dispatch -> run_complex -> launch); a step that runs a
    real family's lowering without a request builder launches below it."""
    for req in complex_steps(func, plan, a, outs):
        if req[0] is RUN:   # a real family's lowering that launches itself
            req[1](*req[2:])
        else:
            launch(*req)


def complex_steps(func, plan, a: dict, outs: list):
    """run_complex's work as a generator of launch requests, each built when the one before it
    has run, and RUN steps (a real family's lowering its driver calls). dispatch could drive it
    itself: a RUN step's lowering would then launch two calls below dispatch, as a plain op's."""
    # NOTE: these launches are not recorded by adaptive eager: flush what is pending first
    ctx = _context.current()   # these launches run now: adaptive eager may not record them
    if ctx is not None:
        ctx.recording = False
    _adaptive.flush(f"complex op {plan.name}")
    base = _base(plan.name)
    refusal = CPU_REFUSES.get(base)
    if refusal is not None:
        raise RuntimeError(refusal)
    if base in ("aten::sub", "aten::rsub"):
        # ATen's sub_check refuses a bool operand whatever the other's dtype (bool - 1j)
        from .elementwise import _check_sub
        _check_sub(a)
    return (yield from _steps(func, plan, base, a, outs))


def _steps(func, plan, base: str, a: dict, outs: list):
    """The routing by concern (see the module docstring), as steps."""
    if _parts.has_chalf(a, outs):
        return (yield from _parts.chalf(plan, base, a, outs))
    if base in ("aten::sum", "aten::mean"):
        return (yield from _red.sum_mean(base, a, outs))
    if base == "aten::_adaptive_avg_pool2d" and outs[0].numel() == 0:
        # the only complex pool the CPU answers (an empty output: nothing to average; any
        # other is refused in refusals.py); the decomposition divides by the output size
        return
    if base in _mm.MATMUL:
        return (yield from _mm.matmul(base, a, outs[0]))
    if base == "aten::addbmm":
        return (yield from _mm.addbmm(a, outs[0]))
    if base == "aten::put" and is_complex(a.get("self")) and is_complex(a.get("source")):
        return (yield from _parts.put(a, outs[0]))
    if base == "aten::as_strided_scatter":
        return (yield from _parts.as_strided_scatter(a, outs[0]))
    if base == "aten::masked_scatter_backward":
        return (yield from _parts.masked_scatter_backward(func, plan, a, outs[0]))
    if base == "aten::linalg_vector_norm":
        # a norm depends on |z| only: the real lowering over abs(z)
        x = a["self"]
        mag = torch.empty(x.shape, dtype=outs[0].dtype)
        yield from elementwise_steps("aten::abs", {"self": x}, mag)
        return (yield from real_steps(plan.lower, func, dict(a, self=mag), outs))
    if base in ("aten::any", "aten::all", "aten::nonzero_static") and is_complex(a.get("self")):
        # truthiness of z is z != 0: the real lowering over that mask
        x = a["self"]
        mask = torch.empty(x.shape, dtype=torch.bool)
        yield from elementwise_steps("aten::ne", {"self": x, "other": 0}, mask)
        return (yield from real_steps(plan.lower, func, dict(a, self=mask), outs))
    if base in _red.VARIANCE and is_complex(a.get("self")):
        return (yield from _red.variance(base, a, outs))
    if base in ("aten::prod", "aten::cumprod", "aten::logcumsumexp", "aten::_logcumsumexp") \
            and is_complex(a.get("self")):
        return (yield from _red.prod(base, a, outs[0]))
    if base not in OPS and base in SPLIT and (yield from _parts.split(func, plan, a, outs)):
        return
    if base not in OPS or (base == "aten::div" and a.get("rounding_mode") is not None):
        if _decomposes(func):
            # PyTorch's decomposition runs it as complex ops this family has (addr, cross,
            # logsumexp, ...): dispatch takes that route on NotImplementedError
            raise NotImplementedError(f"{plan.name}: complex operands, via the decomposition")
        raise errors.UnsupportedOpError(
            f"{plan.name} has no neuron kernel for complex tensors "
            f"({', '.join(dtypes(a, outs))})\n{errors.where()}\n"
            "  fix: compute it on the CPU (x.cpu()), or on torch.view_as_real(x) pairs; "
            "complex kernels live in eager_neuron/lower/complex*.py")
    out = outs[0]
    if out.dtype in HALF:
        from .cast import cast_steps

        tmp = torch.empty(out.shape, dtype=torch.float32)
        yield from elementwise_steps(base, a, tmp)
        yield from cast_steps(tmp, out)
        return
    yield from elementwise_steps(base, a, out)


def _decomposes(func) -> bool:
    """Whether PyTorch has a decomposition for func (dispatch runs it when we decline)."""
    from ..decomps import decomposition

    try:
        return func is not None and decomposition(func) is not None
    except Exception:   # a name lookup the table does not know: no decomposition
        return False


class _Named:
    """What run_complex reads off a dispatch Plan, for the ops registered below."""
    __slots__ = ("lower", "name", "ret_alias")

    def __init__(self, func):
        schema = func._schema
        self.name = f"{schema.name}.{schema.overload_name}" if schema.overload_name \
            else schema.name
        self.ret_alias = (None,) * len(schema.returns)
        self.lower = None


def lower_complex_only(func, a, outs) -> None:
    """Ops that only make sense with complex numbers (complex, polar, conj_physical)."""
    run_complex(func, _Named(func), a, outs)


# complex ops the CPU refuses though a decomposition would run them: its RuntimeError text
CPU_REFUSES = {"aten::nansum": "nansum on CPU does not support complex inputs"}


def lower_refused_complex(func, a, outs) -> None:
    """Ops in CPU_REFUSES: complex operands reach run_complex (which raises the CPU's error);
    real ones decline to PyTorch's decomposition (nanmean's nansum among them)."""
    raise NotImplementedError(f"{func._schema.name}: real operands, via the decomposition")


# ops no other family has; the rest reach run_complex through dispatch's dtype check
LOWERINGS: dict = {name: lower_complex_only for name in (
    "aten::complex", "aten::polar", "aten::conj_physical", "aten::_conj_physical")}
LOWERINGS.update({name: lower_refused_complex for name in CPU_REFUSES})
