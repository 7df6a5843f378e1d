"""Errors that name the op, its arguments, the user's line and the fix."""

from __future__ import annotations

import linecache
import os
import sys
import threading
import warnings

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
        if _is_user(fn):
            line = linecache.getline(fn, f.f_lineno).strip()
            return fn, f.f_lineno, f.f_code.co_name, line
        f = f.f_back
    return None


def _is_user(fn: str) -> bool:
    return not fn.startswith(_SKIP) and not fn.startswith("<eager_neuron")


_ONCE: set = set()
_ONCE_LOCK = threading.Lock()


def warn(message: str, category=UserWarning, once: bool = False) -> None:
    """warnings.warn at the user's line (the first frame outside torch/eager_neuron), as ATen's
    C++ warnings name the Python line that called the op; where no such frame exists (autograd's
    device thread), at our caller's. `once`: ATen's TORCH_WARN_ONCE, once per process and
    message whatever the warning filters say, unless torch.set_warn_always(True)."""
    if once and not torch.is_warn_always_enabled():
        with _ONCE_LOCK:
            if message in _ONCE:
                return
            _ONCE.add(message)
    f, level = sys._getframe(1), 2
    while f is not None and not _is_user(f.f_code.co_filename):
        f, level = f.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if f is not None else 2)


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


def refuse_foreign(op, args, kwargs) -> None:
    """Raise for a plain torch.Tensor on a neuron device among an op's arguments whose storage
    is not over neuron memory: a tensor eager_neuron did not make
    (torch.utils.dlpack.from_dlpack of a capsule exported from a neuron tensor makes one), with
    no device buffer behind it. It reaches the PrivateUse1 kernels directly (it has no Python
    key); unchecked, the op recursed until RecursionError. (Plain tensors over a neuron storage
    are PyTorch's own, from pickling and legacy torch.save: lower/host.py copies those.)"""
    for v in (*args, *kwargs.values()):
        vs = v if isinstance(v, (list, tuple)) else (v,)
        for t in vs:
            if type(t) is torch.Tensor and t.device.type == "neuron" and not _ours(t):
                raise RuntimeError(
                    f"{getattr(op, '__name__', op)}: an argument is a tensor on {t.device} that "
                    "eager_neuron did not make (a plain torch.Tensor with a neuron device, as "
                    "torch.utils.dlpack.from_dlpack of an exported neuron tensor gives); it has "
                    "no device buffer.\n" + where() + "\n  fix: make neuron tensors with "
                    "eager_neuron (t.to('neuron'), torch.empty(..., device='neuron')); to "
                    "exchange data through DLPack, go through the CPU (t.cpu())")


def _ours(t: torch.Tensor) -> bool:
    # a storage PyTorch's C++ made over neuron memory has a data pointer (host memory, read in
    # place by lower/host.py); a DLPack import's storage is invalid for Python
    try:
        return t.untyped_storage().data_ptr() != 0 or t.numel() == 0
    except RuntimeError:
        return False


class UnsupportedOpError(RuntimeError):
    """An op with no neuron kernel and no decomposition, with the CPU fallback disabled."""


class UnsupportedTensorError(TypeError):
    """A dtype or layout (complex, sparse, quantized, ...) the neuron device does not support."""


class KernelError(RuntimeError):
    """A kernel failed to compile or run; names the op and the user's line."""


# PyTorch's names for dtypes in "not implemented for 'Float'" messages (c10's toString)
_SCALAR_NAME = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
                torch.bfloat16: "BFloat16", torch.bool: "Bool", torch.complex64: "ComplexFloat",
                torch.complex128: "ComplexDouble", torch.complex32: "ComplexHalf",
                torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short", torch.int32: "Int",
                torch.int64: "Long"}


class NotImplementedForDtype(Exception):
    """A lowering refuses a dtype the CPU kernel refuses too; kernel_error raises it as the
    CPU's NotImplementedError. (A NotImplementedError raised by a lowering means "declined, try
    a decomposition or the fallback", so lowerings raise this instead.)

    >>> print(NotImplementedForDtype("bitwise_and_cpu", torch.float32))
    "bitwise_and_cpu" not implemented for 'Float'
    """

    def __init__(self, kernel: str, dtype) -> None:
        self.kernel, self.dtype = kernel, dtype
        name = _SCALAR_NAME.get(dtype, str(dtype))
        super().__init__(f'"{kernel}" not implemented for \'{name}\'')


def _user_dtype(exc: NotImplementedForDtype, args) -> NotImplementedForDtype:
    """Half/bfloat16 operands reach a lowering upcast to float32: name the user's dtype."""
    if exc.dtype != torch.float32:
        return exc
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    dts = {a.dtype for a in tensors}
    half = dts & {torch.float16, torch.bfloat16}
    if len(half) == 1 and not dts & {torch.float32, torch.float64}:
        return NotImplementedForDtype(exc.kernel, half.pop())
    if len(tensors) == 2 and half:
        # a half tensor with a 0-d float32/float64 one (a CPU scalar): the half type is the
        # common dtype the CPU names ('"bitwise_and_cpu" not implemented for 'Half'')
        common = torch.result_type(*(torch.empty(() if t.dim() == 0 else (1,), dtype=t.dtype)
                                     for t in tensors))
        if common in half:
            return NotImplementedForDtype(exc.kernel, common)
    return exc


# ---------------------------------------------------------------------------------------------
# the CPU's exception type for an error raised by a neuron lowering or kernel
# ---------------------------------------------------------------------------------------------

# Types a lowering may raise that PyTorch itself raises; others become KernelError.
_KEEP_TYPE = (IndexError, ValueError, TypeError, NotImplementedError, torch.linalg.LinAlgError,
              RuntimeError)

# Ops whose out-of-range index is a RuntimeError on the CPU (ATen's gather/scatter checks use
# TORCH_CHECK), while index_select/embedding/x[i]/index_* raise IndexError (TORCH_CHECK_INDEX).
# (nll_loss/cross_entropy's "Target 9 is out of bounds." is an IndexError on the CPU too.)
_INDEX_IS_RUNTIME = frozenset({
    "gather", "scatter", "scatter_add", "scatter_reduce", "take_along_dim", "one_hot",
    "multi_margin_loss", "multilabel_margin_loss_forward"})
# A reduction over a wholly empty tensor with no dim given: RuntimeError on the CPU
# ("Expected reduction dim to be specified for input.numel() == 0"), except argmax/argmin,
# which raise IndexError (as every reduction does for an empty *given* dim).
_EMPTY_IS_INDEX = frozenset({"argmax", "argmin"})


def _base(name: str) -> str:
    """'aten.scatter_add_.default' / 'scatter_add_' -> 'scatter_add'."""
    for prefix in ("aten::", "aten."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    name = name.split(".")[0]
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    return name


def cpu_error_type(name: str, exc: BaseException) -> type:
    """The exception type PyTorch's CPU kernel raises where op `name` raised `exc` on neuron.

    Integer division by zero is RuntimeError("ZeroDivisionError") on the CPU; out-of-range
    gather/scatter indices and empty max/min are RuntimeError; argmax/argmin of an empty
    tensor is IndexError.

    >>> cpu_error_type("aten.floor_divide.default", ZeroDivisionError())
    <class 'RuntimeError'>
    >>> cpu_error_type("aten.gather.default", IndexError())
    <class 'RuntimeError'>
    >>> cpu_error_type("aten.index_select.default", IndexError())
    <class 'IndexError'>
    """
    base = _base(name)
    if isinstance(exc, NotImplementedForDtype):
        return NotImplementedError
    if isinstance(exc, ZeroDivisionError):
        return RuntimeError
    if isinstance(exc, IndexError) and base in _INDEX_IS_RUNTIME and \
            "Dimension out of range" not in str(exc):
        return RuntimeError
    if "numel() == 0" in str(exc) and isinstance(exc, (IndexError, RuntimeError)):
        return IndexError if base in _EMPTY_IS_INDEX else RuntimeError
    for t in (torch.linalg.LinAlgError, NotImplementedError, IndexError, ValueError, TypeError):
        if isinstance(exc, t):
            return t
    if isinstance(exc, (UnsupportedOpError, UnsupportedTensorError, torch.OutOfMemoryError)):
        return type(exc)
    return KernelError


def cpu_worded(name: str, cpu: BaseException, args=(), kwargs=None, ours=None):
    """The CPU's exception `cpu` for a call of op `name` the neuron device refused too: its
    type and words first, then the op (and what the device said, `ours`, when it said more),
    the user's line and the arguments (None when its type cannot be built from a message).

    >>> e = cpu_worded("aten::mm", RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    >>> type(e).__name__, str(e).splitlines()[:2]
    ('RuntimeError', ['mat1 and mat2 shapes cannot be multiplied', '  (aten::mm on neuron)'])
    """
    first = str(cpu).splitlines()[0] if str(cpu) else ""
    said = str(ours).splitlines()[0] if ours is not None and str(ours) else ""
    said = f": {said}" if said and first not in said else ""
    detail = (f"{cpu}\n  ({name} on neuron{said})\n{where()}\n"
              f"  args: {describe_args(args, kwargs or {})}")
    try:
        return type(cpu)(detail)
    except Exception:   # noqa: BLE001 -- an exception type with a custom constructor
        return None


def kernel_error(name: str, exc: BaseException, args=(), kwargs=None) -> Exception:
    """The error a user sees when op `name` fails on neuron: the CPU's exception type, with the
    op, the original error, the user's line and the arguments.

    >>> e = kernel_error("aten.floor_divide.default", ZeroDivisionError("integer division by 0"))
    >>> type(e).__name__, "floor_divide" in str(e)
    ('RuntimeError', True)
    """
    kind = cpu_error_type(name, exc)
    if isinstance(exc, NotImplementedForDtype):  # the CPU's words first, as it says them
        exc = _user_dtype(exc, args)
        detail = (f"{exc}\n  ({name} on neuron)\n{where()}\n"
                  f"  args: {describe_args(args, kwargs or {})}")
    else:
        detail = (f"{name} failed on neuron: {type(exc).__name__}: {exc}\n{where()}\n"
                  f"  args: {describe_args(args, kwargs or {})}")
    if kind is KernelError or isinstance(exc, KernelError):
        return KernelError(detail)
    try:
        return kind(detail)
    except Exception:  # an exception type with a custom constructor
        return KernelError(detail)
