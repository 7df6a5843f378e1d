"""Errors that name the op, its arguments, the user's line and the fix."""

from __future__ import annotations

import linecache
import os
import sys

import torch

_TORCH_DIR = os.path.dirname(torch.__file__)
_OUR_DIR = os.path.dirname(os.path.abspath(__file__))
# kernels/ and cache/ install as eager_neuron.kernels/.cache but live at the repository top
_REPO = os.path.dirname(_OUR_DIR)
_SKIP = tuple(d + os.sep for d in (
    _TORCH_DIR, _OUR_DIR, os.path.join(_REPO, "kernels"), os.path.join(_REPO, "cache"),
    os.path.dirname(os.__file__)))


def user_frame():
    """(filename, lineno, function, source line) of the first frame outside torch/eager_neuron."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_SKIP) and not fn.startswith("<eager_neuron"):
            line = linecache.getline(fn, f.f_lineno).strip()
            return fn, f.f_lineno, f.f_code.co_name, line
        f = f.f_back
    return None


def where() -> str:
    frame = user_frame()
    if frame is None:
        return "  at <unknown location>"
    fn, lineno, func, line = frame
    return f"  at {os.path.basename(fn)}:{lineno} in {func}: {line}"


def describe(x) -> str:
    """f32[8, 256]@neuron:0 style description of an argument."""
    if isinstance(x, torch.Tensor):
        from torch.utils._dtype_abbrs import dtype_abbrs

        dt = dtype_abbrs.get(x.dtype, str(x.dtype))
        return f"{dt}{list(x.shape)}@{x.device}"
    if isinstance(x, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in x):
        return "[" + ", ".join(describe(v) for v in x) + "]"
    return repr(x)


def describe_args(args, kwargs) -> str:
    parts = [describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


class UnsupportedOpError(RuntimeError):
    """An op with no neuron kernel and no decomposition, with the CPU fallback disabled."""


class UnsupportedTensorError(TypeError):
    """A dtype or layout (complex, sparse, quantized, ...) the neuron device does not support."""


class KernelError(RuntimeError):
    """A kernel failed to compile or run; names the op and the user's line."""
