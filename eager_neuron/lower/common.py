"""Helpers shared by lowerings: schema binding, numpy views, dtype names."""

from __future__ import annotations

import numpy as np
import torch

NP_TYPE = {
    torch.float32: "np.float32", torch.float64: "np.float64", torch.int64: "np.int64",
    torch.int32: "np.int32", torch.int16: "np.int16", torch.int8: "np.int8",
    torch.uint8: "np.uint8", torch.bool: "np.bool_",
}
KERNEL_DTYPES = frozenset(NP_TYPE)
HALF = frozenset({torch.bfloat16, torch.float16})
# complex tensors live on the device; their ops run in lower/complex.py and lower/fft.py
# (complex32 is storage only: casts to and from it, every other op refuses it)
COMPLEX = frozenset({torch.complex64, torch.complex128, torch.complex32})
# unsigned wider than 8 bits: storage only (hash_tensor's uint64 result, copies to and from the
# host); ops computing on them have no kernel: the counted CPU fallback, or an error under
# EAGER_NEURON_FALLBACK=error
UNSIGNED = frozenset({torch.uint16, torch.uint32, torch.uint64})
# float8 (e4m3fn, e5m2 and the fnuz variants): storage, casts and _scaled_mm (lower/fp8.py)
FP8 = frozenset({torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                 torch.float8_e5m2fnuz})
DEVICE_DTYPES = KERNEL_DTYPES | HALF | COMPLEX | UNSIGNED | FP8

_SCHEMA_CACHE: dict = {}


def schema_args(func) -> tuple:
    """[(name, default, kwarg_only)] for func's schema, computed once per overload."""
    info = _SCHEMA_CACHE.get(func)
    if info is None:
        info = tuple(
            (arg.name, arg.default_value if arg.has_default_value() else None, arg.kwarg_only)
            for arg in func._schema.arguments
        )
        _SCHEMA_CACHE[func] = info
    return info


def bind(func, args: tuple, kwargs: dict) -> dict:
    """Map positional and keyword arguments to schema names, filling defaults."""
    out = {}
    names = schema_args(func)
    n = len(args)
    for i, (name, default, _kwonly) in enumerate(names):
        if i < n:
            out[name] = args[i]
        else:
            out[name] = kwargs.get(name, default)
    return out


def np_view(t: torch.Tensor) -> np.ndarray:
    """Zero-copy numpy view of a host-backed buffer (any strides, incl. 0 for broadcast)."""
    return t.numpy()


def flat(t: torch.Tensor) -> np.ndarray:
    return t.numpy().reshape(-1)


def coalesce(shape: tuple, strides_list: list) -> tuple[tuple, list]:
    """Merge adjacent dims that are contiguous in every operand; drop size-1 dims."""
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    if not dims:
        return (1,), [(0,) for _ in strides_list]
    new_shape = [shape[dims[0]]]
    new_strides = [[s[dims[0]]] for s in strides_list]
    for d in dims[1:]:
        size = shape[d]
        if all(ns[-1] == s[d] * size for ns, s in zip(new_strides, strides_list)):
            new_shape[-1] *= size
            for ns, s in zip(new_strides, strides_list):
                ns[-1] = s[d]
        else:
            new_shape.append(size)
            for ns, s in zip(new_strides, strides_list):
                ns.append(s[d])
    return tuple(new_shape), [tuple(ns) for ns in new_strides]


def strided_np(t: torch.Tensor, shape: tuple, strides: tuple) -> np.ndarray:
    """A numpy view of t's buffer with the given (element) shape and strides."""
    return t.as_strided(shape, strides, t.storage_offset()).numpy()


# ---------------------------------------------------------------------------------------------
# Python ints beyond int64 as kernel scalars
# ---------------------------------------------------------------------------------------------

I64_MIN, I64_END = -2 ** 63, 2 ** 63
# c10's names for the types of "value cannot be converted to type X without overflow"
_C10_INT_NAME = {"np.int64": "int64_t", "np.int32": "int", "np.int16": "int16_t",
                 "np.int8": "int8_t", "np.uint8": "uint8_t"}
# ops whose Scalar arguments ATen converts with a range check (`Scalar::to<T>()`), not by
# wrapping them into a tensor of the common dtype
_CHECKED_SCALAR_OPS = frozenset({"aten::clamp", "aten::clamp_min", "aten::clamp_max"})


def kernel_int(v: int, cast: str, op_name: str = ""):
    """A Python int scalar as the kernel argument ATen's conversion to `cast` would make.

    Python's arg parser hands an int in [2**63, 2**64) to ATen as a uint64 Scalar; TensorIterator
    casts it to the common dtype, wrapping modulo 2**64 for integer dtypes (int64 + 2**63 is
    int64 - 2**63). Numba would type such an int as uint64, and the kernel compiled first for a
    signature would decide later calls (a uint64 kernel refuses -2**63): so the value is
    converted here, to an int64, float or bool, whatever is in range.

    >>> kernel_int(2 ** 63 + 1, "np.int64"), kernel_int(2 ** 63, "np.float32"), kernel_int(5, "")
    (-9223372036854775807, 9.223372036854776e+18, 5)
    """
    in_i64 = I64_MIN <= v < I64_END
    if op_name in _CHECKED_SCALAR_OPS and cast in _C10_INT_NAME:
        info = np.iinfo(cast[3:])
        # c10's overflow check: an unsigned type also takes a negative value down to -max
        # (uint8: clamp(min=-1) is accepted and wraps to 255)
        low = -info.max if info.min == 0 else info.min
        if not low <= v <= info.max:
            raise RuntimeError(f"value cannot be converted to type {_C10_INT_NAME[cast]} "
                               f"without overflow (aten::{op_name.split('::')[-1]} on neuron)")
    if in_i64:
        return v
    if cast in ("np.float32", "np.float64"):
        return float(v)
    if cast == "np.bool_":
        return bool(v)
    return (v + 2 ** 63) % 2 ** 64 - 2 ** 63
