"""Checks on the tensors an op writes (in-place self, out=), as ATen makes them.

- partial overlap: an input that partly overlaps the written tensor (TensorIterator ops)
- internal overlap: a written tensor whose elements share memory (expanded, stride 0)
- result type: the op's result dtype must cast to the written tensor's dtype

>>> import torch, eager_neuron
>>> try:
...     torch.arange(5, device="neuron").mul_(1.5)
... except RuntimeError as e:
...     print(str(e).splitlines()[0])
result type Float can't be cast to the desired output type Long
"""

from __future__ import annotations

import torch

from . import errors
from .lower.common import schema_args
from .plan import _to_meta
from .plan import fusible_lowerings as _fusible


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: contiguous up to a permutation of dims (x.t() is dense)."""
    if t.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _byte_span(t: torch.Tensor) -> tuple:
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def _check_partial_overlap(a: dict, outs: list) -> None:
    """ATen's assert_no_partial_overlap for elementwise in-place / out= writes and copy_.

    The host views share the device memory, so an input that partly overlaps the written tensor
    would be read after some of its elements were overwritten: the CPU refuses it, so do we.
    Like ATen, only dense operands are judged (strided ones are "too hard" and pass).
    """
    for o in outs:
        if not isinstance(o, torch.Tensor) or o.numel() == 0 or not _dense(o):
            continue
        o_lo, o_hi = _byte_span(o)
        for v in a.values():
            if v is o or not isinstance(v, torch.Tensor) or v.numel() == 0 or not _dense(v):
                continue
            v_lo, v_hi = _byte_span(v)
            if v_lo < o_hi and o_lo < v_hi and ((v_lo, v_hi) != (o_lo, o_hi)
                                                 or v.stride() != o.stride()):
                raise RuntimeError(
                    "unsupported operation: some elements of the input tensor and the "
                    "written-to tensor refer to a single memory location. Please clone() the "
                    f"tensor before performing the operation.\n{errors.where()}")


_CAN_CAST: dict = {}   # (func, argument types) -> the functional op's result dtype or None


def _check_written(plan, a: dict) -> None:
    """ATen's check on a tensor a TensorIterator op (the elementwise and cast families) writes:
    no element may be shared by two indices (an expanded or stride-0 view). The result-type
    check is _check_decomp_written's, made earlier."""
    names = _OVERLAP_CHECKED.get(id(plan))
    if names is None:
        names = _OVERLAP_CHECKED[id(plan)] = (
            plan.mutates if plan.lower in _fusible() and plan.name not in _NO_OVERLAP_CHECK
            else ())
    for name in names:
        t = a.get(name)
        if isinstance(t, torch.Tensor) and 0 in t.stride() and t.numel() > 1 and \
                torch._debug_has_internal_overlap(t) == 1:
            raise RuntimeError(
                "unsupported operation: more than one element of the written-to tensor "
                "refers to a single memory location. Please clone() the tensor before "
                f"performing the operation.\n{errors.where()}\n  op: {plan.name}")


def _check_result_type(func, plan, args, kwargs, out_dtype) -> None:
    key = (func, *(v.dtype if isinstance(v, torch.Tensor) else type(v)
                   for v in (*args, *kwargs.values())))
    result = _CAN_CAST.get(key, False)
    if result is False:
        result = _CAN_CAST[key] = _functional_dtype(func, plan, args, kwargs)
    if result is not None and not torch.can_cast(result, out_dtype):
        raise RuntimeError(
            f"result type {_TYPE_NAMES.get(result, result)} can't be cast to the desired output "
            f"type {_TYPE_NAMES.get(out_dtype, out_dtype)}\n{errors.where()}\n"
            f"  op: {plan.name}")


def _check_decomp_written(func, plan, args, kwargs, real_too: bool = False) -> None:
    """The result-type check for an in-place/out= op with one written tensor, made before
    PyTorch's meta function or decomposition runs (their wrappers word it otherwise)."""
    pos = _WRITTEN.get(id(func))   # NOTE: id: OpOverload.__hash__ is Python code
    if pos is None:
        pos = _WRITTEN[id(func)] = _written_position(func, plan)
    if not pos:
        return
    t = args[pos[0]] if pos[0] < len(args) else kwargs.get(pos[1])
    if not isinstance(t, torch.Tensor):
        return
    if real_too or t.dtype not in _FLOATING:
        # NOTE: a float written tensor (the hot case: optimizers' add_/mul_) takes any real
        # result; a complex operand into it is refused by PyTorch's meta function
        _check_result_type(func, plan, args, kwargs, t.dtype)


_WRITTEN: dict = {}   # func -> (position, name) of its one written argument, or ()
_FLOATING = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})


def _written_position(func, plan) -> tuple:
    if len(plan.mutates) != 1:
        return ()
    for i, (name, _d, _k) in enumerate(schema_args(func)):
        if name == plan.mutates[0]:
            return (i, name)
    return ()


_OVERLAP_CHECKED: dict = {}   # id(plan) -> the written args _check_written judges (plans live on)
# ATen's fill_/zero_ write expanded tensors without complaint (masked_fill_ only warns)
_NO_OVERLAP_CHECK = ("aten::fill_.Scalar", "aten::fill_.Tensor", "aten::zero_",
                     "aten::masked_fill_.Scalar", "aten::masked_fill_.Tensor")
_TYPE_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
               torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int",
               torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool",
               torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}
# ops whose written tensor takes any result (copies and fills cast; comparisons write bools)
_ANY_RESULT = ("aten::copy_", "aten::fill_", "aten::zero_", "aten::masked_fill_",
               "aten::index_put_", "aten::_index_put_impl_", "aten::index_fill_",
               "aten::masked_scatter_", "aten::set_", "aten::resize_")


def _functional_dtype(func, plan, uargs, ukw):
    """The dtype the op's functional form returns for these arguments (meta), or None when
    there is none or the check does not apply."""
    schema = func._schema
    base = schema.name
    if base in _ANY_RESULT or not schema.name.startswith("aten::"):
        return None
    inplace = base.endswith("_") and not base.endswith("__")
    if not inplace and not plan.out_args:
        return None
    fname = base.split("::")[1].rstrip("_") if inplace else base.split("::")[1]
    packet = getattr(torch.ops.aten, fname, None)
    if packet is None:
        return None
    out_names = set(plan.out_args)
    names = [x.name for x in schema.arguments if x.name not in out_names]
    for ov in packet.overloads():
        f = getattr(packet, ov)
        fs = f._schema
        if fs.returns and len(fs.returns) == 1 and not any(
                x.alias_info is not None and x.alias_info.is_write for x in fs.arguments) \
                and [x.name for x in fs.arguments] == names:
            break
    else:
        return None
    try:
        margs = _to_meta(list(uargs[:len(names)]))
        mkw = {k: _to_meta(v) for k, v in ukw.items() if k not in out_names}
        r = f(*margs, **mkw)
    except Exception:  # the functional form declines these arguments: no verdict
        return None
    return r.dtype if isinstance(r, torch.Tensor) else None
