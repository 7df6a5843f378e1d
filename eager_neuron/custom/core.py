"""Custom kernels: a Python function in the Numba subset becomes a PyTorch operator on `neuron`.

`eager_neuron.kernel(name, outputs=...)` turns a function that loops over numpy arrays into
`torch.ops.<ns>.<name>` (a `torch.library.custom_op` underneath):

- the kernel's parameters are the op's inputs followed by its output arrays; `outputs` is a
  function of the inputs (its parameter names are the op's arguments) returning, per output, a
  tensor to copy the shape/dtype of or a `(shape, dtype)` pair; it also serves as the fake/meta
  implementation, so torch.compile sees an opaque op with the right metadata;
- parameters annotated `float`/`int`/`bool` are runtime scalars (a new value never recompiles);
  the others are tensors; `mutates=("x",)` names inputs the kernel writes in place;
- on neuron tensors it runs through `launch()` (memory cache -> disk cache -> compile; charged to
  the simulated core with the declared `flops`/`bytes_moved`/`engine`); compiled once per
  signature class (dtype, rank, layout of each array; type of each scalar), never per size;
- on CPU tensors the same Numba function runs on the CPU arrays (to compare), uncharged.

>>> import torch, eager_neuron
>>> from numba import prange
>>> @eager_neuron.kernel("doc::axpy", outputs=lambda x, y, a: x)
... def axpy(x, y, a: float, out):
...     for i in prange(x.shape[0]):
...         out[i] = a * x[i] + y[i]
>>> x = torch.ones(4, device="neuron")
>>> torch.ops.doc.axpy(x, x, 2.0).tolist()
[3.0, 3.0, 3.0, 3.0]
"""

from __future__ import annotations

import hashlib
import inspect
import math
import re
import sys
from typing import Callable, Sequence

import numpy as np
import torch

from .. import context as _context
from .. import errors
from .. import launch as _launch
from .source import _add_function, _Source

__all__ = ["kernel", "Kernel", "set_debug", "KernelTypingError"]

_DEBUG = [False]
_HALF = (torch.bfloat16, torch.float16)
_SCALAR_TYPES = {float: float, int: int, bool: bool, "float": float, "int": int, "bool": bool}
_NAMESPACE_MODULES = {"numpy": np, "math": math}


def set_debug(on: bool = True) -> None:
    """Debug mode for custom kernels compiled from now on: bounds-checked indexing, serial loops.

    An out-of-range index then raises IndexError naming the op and your line instead of reading
    or writing outside the array. Debug kernels are cached under their own key.

    >>> import eager_neuron.custom as c; c.set_debug(True); c.set_debug(False)
    """
    _DEBUG[0] = bool(on)


class KernelTypingError(errors.KernelError):
    """Numba could not compile a custom kernel for the given argument types."""


# ---------------------------------------------------------------------------------------------
# the decorator
# ---------------------------------------------------------------------------------------------

def _spec_of(x, where_: str) -> tuple:
    if isinstance(x, torch.Tensor):
        return tuple(x.shape), x.dtype
    if isinstance(x, (tuple, list)) and len(x) == 2 and isinstance(x[1], torch.dtype):
        # SymInts stay symbolic (torch.compile with dynamic shapes)
        return tuple(s if isinstance(s, torch.SymInt) else int(s) for s in x[0]), x[1]
    raise TypeError(f"{where_}: each declared output must be a tensor (its shape and dtype are "
                    f"copied) or a (shape, dtype) pair, got {type(x).__name__}")


class Kernel:
    """A custom kernel: callable like the op (`k(x, ...)` is `torch.ops.<ns>.<name>(x, ...)`).

    Attributes: `op` (the OpOverload), `name` ("ns::name"), `py_func` (the original Python
    function), `source()` (the rendered Numba source).
    """

    def __init__(self, fn, name: str, outputs, mutates, flops, bytes_moved, engine,
                 parallel, debug, fastmath=False) -> None:
        if "::" not in name:
            raise ValueError(f"eager_neuron.kernel: name {name!r} must be 'namespace::op'")
        self.py_func = fn
        self.name = name
        self._outputs = outputs
        self.mutates = tuple([mutates] if isinstance(mutates, str) else mutates or ())
        self._flops = flops
        self._bytes = bytes_moved
        self.engine = engine
        self._parallel = parallel
        self._debug = debug
        self._fastmath = fastmath
        self._failed: dict = {}
        kparams = list(inspect.signature(fn).parameters.values())
        if outputs is None:
            self.n_out = 0
            op_params = kparams
        else:
            out_params = list(inspect.signature(outputs).parameters)
            op_params = kparams[:len(out_params)]
            if [p.name for p in op_params] != out_params:
                raise TypeError(
                    f"eager_neuron.kernel {name}: the parameters of `outputs` {out_params} must be "
                    f"the kernel's first parameters {[p.name for p in kparams]} (the op's "
                    "inputs); the kernel's remaining parameters are its output arrays")
            self.n_out = len(kparams) - len(op_params)
            if self.n_out < 1:
                raise TypeError(f"eager_neuron.kernel {name}: `outputs` is given but the kernel "
                                "has no parameters left for output arrays")
        for m in self.mutates:
            if m not in [p.name for p in op_params]:
                raise ValueError(f"eager_neuron.kernel {name}: mutates={self.mutates!r} names "
                                 f"{m!r}, which is not an input of the kernel")
        # which op arguments are runtime scalars (annotated) and which are tensors
        self.scalars = {}
        sig_params = []
        for p in op_params:
            ann = p.annotation
            if isinstance(ann, str):
                ann = _SCALAR_TYPES.get(ann, ann)
            kind = _SCALAR_TYPES.get(ann) if not isinstance(ann, str) else None
            if kind is not None:
                self.scalars[p.name] = kind
                anno = kind
            else:
                anno = torch.Tensor
            # a default comes from the kernel or from `outputs` (`lambda x, eps=1e-6: x`)
            default = p.default
            if default is inspect.Parameter.empty and outputs is not None:
                default = inspect.signature(outputs).parameters[p.name].default
            sig_params.append(inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                default=default, annotation=anno))
        self.arg_names = [p.name for p in op_params]
        ret = (None if self.n_out == 0 else torch.Tensor if self.n_out == 1
               else tuple[tuple(torch.Tensor for _ in range(self.n_out))])
        self._signature = inspect.Signature(sig_params, return_annotation=ret)
        self._src_cache: dict = {}
        self._custom_op = self._register()
        ns, op = name.split("::")
        self.op = getattr(getattr(torch.ops, ns), op).default
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__
        self.__wrapped__ = fn

    # -- rendering -------------------------------------------------------------------------------

    def _mode(self) -> tuple[bool, bool]:
        from ..kernels import compile as kc

        debug = _DEBUG[0] if self._debug is None else bool(self._debug)
        src = self._rendered(False, debug)
        parallel = src.parallel_used if self._parallel is None else bool(self._parallel)
        return parallel and not debug and kc.parallel_allowed(), debug

    def _rendered(self, parallel: bool, debug: bool) -> _Source:
        key = (parallel, debug)
        src = self._src_cache.get(key)
        if src is None:
            src = _Source()
            opts = []
            if parallel:
                opts.append("parallel=True")
            if debug:
                opts.append("boundscheck=True")
            if self._fastmath:
                fm = self._fastmath
                opts.append("fastmath=True" if fm is True else
                            "fastmath={" + ", ".join(repr(f) for f in sorted(fm)) + "}")
            deco = f"@njit({', '.join(opts)})" if opts else "@njit"
            _add_function(src, self.py_func, deco, self.py_func.__name__)
            src.digest = hashlib.sha256(src.text().encode()).hexdigest()[:16]
            self._src_cache[key] = src
        return src

    def source(self, parallel: bool | None = None, debug: bool = False) -> str:
        """The Numba source this kernel compiles from (what the disk cache is keyed on)."""
        if parallel is None:
            parallel = self._mode()[0]
        return self._rendered(parallel, debug).text()

    # -- the op ----------------------------------------------------------------------------------

    def _register(self):
        proto = _prototype(self.py_func.__name__, self._signature)
        cop = torch.library.custom_op(self.name, proto, mutates_args=self.mutates,
                                      device_types=None)
        # one Python implementation per door; neuron (and NeuronMode's CPU tensors) launch
        cop.register_kernel("neuron")(self._run_device)
        cop.register_kernel("cpu")(self._run_cpu)
        cop.register_fake(self._fake)
        return cop

    def register_autograd(self, backward: Callable, *, setup_context: Callable | None = None):
        """The op's backward (torch.library.register_autograd): torch ops or other kernels.
        Returns the kernel. See docs/KERNELS.md section 2 and kernel_lib/rmsnorm.py.
        """
        self._custom_op.register_autograd(backward, setup_context=setup_context)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{n}: {self.scalars[n].__name__}" if n in self.scalars else n
                         for n in self.arg_names)
        mut = f", mutates {list(self.mutates)}" if self.mutates else ""
        return f"<eager_neuron.kernel {self.name}({args}) -> {self.n_out} output(s){mut}>"

    def __call__(self, *args, **kwargs):
        return self.op(*args, **kwargs)


    def _bind(self, args, kwargs) -> list:
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return [bound.arguments[n] for n in self.arg_names]

    def _out_specs(self, values: list) -> list[tuple]:
        if self._outputs is None:
            return []
        res = self._outputs(*values)
        where_ = f"eager_neuron.kernel {self.name}: outputs"
        if self.n_out == 1 and not (isinstance(res, (list, tuple)) and len(res) == 1
                                    and not isinstance(res[0], (int, torch.dtype))):
            specs = [_spec_of(res, where_)]
        else:
            if not isinstance(res, (list, tuple)) or len(res) != self.n_out:
                raise TypeError(f"{where_} must return {self.n_out} outputs (the kernel has "
                                f"{self.n_out} output parameters), got {res!r}")
            specs = [_spec_of(r, where_) for r in res]
        return specs

    def _fake(self, *args, **kwargs):
        values = self._bind(args, kwargs)
        device = next((v.device for v in values if isinstance(v, torch.Tensor)), None)
        outs = [torch.empty(s, dtype=d, device=device) for s, d in self._out_specs(values)]
        return None if not outs else outs[0] if len(outs) == 1 else tuple(outs)

    def _cost(self, values, outs) -> tuple[float, float]:
        def ev(v, default):
            if v is None:
                return default
            return float(v(*values) if callable(v) else v)

        nbytes = sum(v.numel() * v.element_size() for v in list(values) + list(outs)
                     if isinstance(v, torch.Tensor))
        return ev(self._flops, 0.0), ev(self._bytes, float(nbytes))

    def _arrays(self, values: list) -> tuple:
        out = []
        for n, v in zip(self.arg_names, values):
            if n in self.scalars:
                if isinstance(v, torch.Tensor):
                    raise TypeError(f"{self.name}: argument {n!r} is a runtime scalar "
                                    f"({self.scalars[n].__name__}); got a tensor")
                out.append(self.scalars[n](v))
            else:
                out.append(v.detach().numpy())
        return tuple(out)

    def _key(self, parallel: bool, debug: bool) -> tuple:
        src = self._rendered(parallel, debug)
        return ("custom", self.name, src.digest, parallel, debug)

    def _render(self, parallel: bool, debug: bool):
        return lambda: (self._rendered(parallel, debug).text(), self.py_func.__name__)

    def _run_device(self, *args, **kwargs):
        """neuron tensors (and CPU tensors under NeuronMode): allocate, launch, charge."""
        from ..adaptive import flush
        from ..buffers import alloc
        from ..tensor import NeuronTensor, wrap

        flush(f"custom kernel {self.name}")
        values = self._bind(args, kwargs)
        index = None
        for n, v in zip(self.arg_names, values):
            if type(v) is NeuronTensor:
                if index is None:
                    index = v.device.index
                elif v.device.index != index:
                    raise RuntimeError(
                        f"{self.name}: expected all tensors on the same device, found "
                        f"neuron:{index} and {v.device} (argument {n!r})\n{errors.where()}")
        if index is not None:
            for n, v in zip(self.arg_names, values):
                if isinstance(v, torch.Tensor) and type(v) is not NeuronTensor:
                    raise RuntimeError(
                        f"{self.name}: expected all tensors on neuron:{index}, but argument "
                        f"{n!r} is on {v.device}\n{errors.where()}\n  fix: move it with "
                        f".to('neuron:{index}')")
        specs = self._out_specs(values)
        # bfloat16/float16: computed in float32 (numpy has no bfloat16), rounded back once
        wide = [v.float() if isinstance(v, torch.Tensor) and v.dtype in _HALF else v
                for v in values]
        host = [v._data if type(v) is NeuronTensor else v for v in wide]
        outs, blocks = [], []
        for shape, dtype in specs:
            stride = torch.empty(shape, device="meta").stride()
            data, block = alloc(index, shape, stride,
                                torch.float32 if dtype in _HALF else dtype)
            outs.append(data)
            blocks.append(block)
        arrays = self._arrays(host) + tuple(o.numpy() for o in outs)
        flops, nbytes = self._cost(values, [torch.empty(s, dtype=d, device="meta")
                                            for s, d in specs])
        parallel, debug = self._mode()
        # the launch runs under its own op context: charged to the operands' core, never
        # recorded by adaptive eager (the group was flushed above)
        with _context.using(_context.OpContext(index or 0)):
            self._guarded(lambda: _launch.launch(
                self._key(parallel, debug), self._render(parallel, debug), arrays,
                flops=flops, bytes_moved=nbytes, engine=self.engine,
                extra={"custom": self.name}), arrays, args, kwargs)
        # in-place half inputs: the float32 copy was written, write it back rounded
        for n, v, w in zip(self.arg_names, values, wide):
            if n in self.mutates and w is not v:
                v.copy_(w)
        results = []
        for (_shape, dtype), data, block in zip(specs, outs, blocks):
            t = wrap(data, block, index)
            results.append(t.to(dtype) if dtype in _HALF else t)
        return None if not results else results[0] if len(results) == 1 else tuple(results)

    def _run_cpu(self, *args, **kwargs):
        """Plain CPU tensors: the same compiled function on the CPU arrays, not charged."""
        values = self._bind(args, kwargs)
        specs = self._out_specs(values)
        wide = [v.float() if isinstance(v, torch.Tensor) and v.dtype in _HALF else v
                for v in values]
        outs = [torch.empty(s, dtype=torch.float32 if d in _HALF else d) for s, d in specs]
        arrays = self._arrays(wide) + tuple(o.numpy() for o in outs)
        parallel, debug = self._mode()
        fn = self._compiled(parallel, debug, arrays, args, kwargs)
        self._guarded(lambda: fn(*arrays), arrays, args, kwargs)
        for n, v, w in zip(self.arg_names, values, wide):
            if n in self.mutates and w is not v:
                v.copy_(w)
        results = [o.to(d) if d in _HALF else o for o, (s, d) in zip(outs, specs)]
        return None if not results else results[0] if len(results) == 1 else tuple(results)

    def _compiled(self, parallel, debug, arrays, args, kwargs):
        """The dispatcher for these argument types from the same caches launch() uses."""
        from ..cache import FORMAT_VERSION

        key = self._key(parallel, debug)
        full = (FORMAT_VERSION,) + key + _launch.arg_types(arrays)
        fn = _launch.MEMORY.get(full)
        if fn is None:
            def build():
                return _launch._build(full, self._render(parallel, debug), arrays)[0]

            fn = self._guarded(build, arrays, args, kwargs)
            _launch.MEMORY.put(full, fn)
        return fn

    # -- errors ----------------------------------------------------------------------------------

    def _guarded(self, run, arrays, args, kwargs):
        """Run a compile/launch; turn Numba's errors into one that names the op, the kernel's
        line, the argument types, the caller's line and the fix."""
        from ..kernels.compile import KernelCompileError

        types_key = _launch.arg_types(arrays)
        failed = self._failed.get(types_key)
        if failed is not None:   # Numba already refused these types: no second compile
            raise self._typing_error(failed, arrays) from None
        try:
            return run()
        except KernelCompileError as exc:
            self._failed[types_key] = exc
            raise self._typing_error(exc, arrays) from None
        except IndexError as exc:
            raise IndexError(
                f"{self.name}: index out of range inside the kernel ({exc})\n{errors.where()}\n"
                f"  args: {errors.describe_args(args, kwargs)}\n  fix: check the kernel's loop "
                "bounds against the arrays' shapes") from None
        except (ZeroDivisionError, ValueError, TypeError, AssertionError) as exc:
            raise type(exc)(
                f"{self.name} raised inside the kernel: {type(exc).__name__}: {exc}\n"
                f"{errors.where()}\n  args: {errors.describe_args(args, kwargs)}") from None

    def _typing_error(self, exc: Exception, arrays) -> Exception:
        from ..kernels.compile import numba

        nb = numba()
        cause = exc.__cause__ or exc
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(cause))
        parallel, debug = self._mode()
        src = self._rendered(parallel, debug)
        kline = ""
        for m in re.finditer(r'File "<eager_neuron kernel [^>]*>", line (\d+)', text):
            n = int(m.group(1)) - 1
            if 0 <= n < len(src.origin) and src.origin[n] is not None:
                fname, lineno = src.origin[n]
                kline = (f"  kernel line: {fname}:{lineno}: "
                         f"{src.lines[n].strip()}\n")
                break
        reason = []
        for line in text.splitlines():
            s = line.strip()
            if not s or s.startswith(("Failed in", "During:", "File ", "- Resolution",
                                      "Rewrite", "This error")):
                if s.startswith("File ") or s.startswith("During:"):
                    break
                continue
            if s.startswith(("There are", "- Of which")):
                break
            reason.append(s)
            if len(reason) >= 3:
                break
        types_ = ", ".join(f"{n}: {nb.typeof(a)}" for n, a in
                           zip(self.arg_names + [f"out{i}" for i in range(self.n_out)], arrays))
        hint = ""
        if src.unsupported:
            hint = "; globals the kernel cannot use: " + ", ".join(
                f"{k} ({v})" for k, v in sorted(src.unsupported.items()))
        return KernelTypingError(
            f"custom kernel {self.name} does not compile for ({types_})\n{kline}"
            f"  numba: {' '.join(reason) or type(cause).__name__}\n{errors.where()}\n"
            "  fix: a kernel uses the Numba nopython subset: numpy arrays and their methods, "
            "int/float/bool scalars, range/prange loops, math and numpy functions, other plain "
            "functions; no torch calls, strings, dicts or Python objects"
            + hint)


def _prototype(name: str, signature: inspect.Signature):
    def proto(*args, **kwargs):
        devices = {str(a.device) for a in args if isinstance(a, torch.Tensor)}
        raise NotImplementedError(
            f"custom kernel {name} runs on neuron and cpu tensors, not on {sorted(devices)}\n"
            f"{errors.where()}\n  fix: move the inputs with .to('neuron')")

    proto.__name__ = name
    proto.__signature__ = signature
    proto.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    proto.__annotations__["return"] = signature.return_annotation
    return proto


def kernel(name: str, *, outputs: Callable | None = None, mutates: Sequence[str] | str = (),
           flops: float | Callable | None = None, bytes_moved: float | Callable | None = None,
           engine: str = "vector", parallel: bool | None = None, debug: bool | None = None,
           fastmath: bool | set = False):
    """Decorator: a Numba-subset Python function becomes the operator `torch.ops.<ns>.<name>`.

    - `outputs(*inputs)`: per output, a tensor (shape and dtype copied) or `(shape, dtype)`;
      its parameters are the op's inputs, the kernel's remaining parameters the output arrays.
    - `mutates`: inputs the kernel writes in place. Parameters annotated float/int/bool are
      runtime scalars. `flops`/`bytes_moved` (numbers or functions of the inputs) and `engine`
      ("vector", "scalar", "tensor", "gpsimd") feed the simulator's cost model.
    - `parallel`: None compiles with parallel=True when the kernel uses prange.
    - `debug`: bounds-checked indexing (default: `set_debug()`).
    - `fastmath`: Numba's flag (True or a set such as {"reassoc", "contract"}: vectorized
      float sums; True also assumes no inf/nan).

    >>> import torch, eager_neuron
    >>> @eager_neuron.kernel("doc::double", outputs=lambda x: x)
    ... def double(x, out):
    ...     for i in range(x.size):
    ...         out.flat[i] = 2 * x.flat[i]
    >>> double(torch.arange(3.0, device="neuron")).tolist()
    [0.0, 2.0, 4.0]
    """
    def deco(fn):
        return Kernel(fn, name, outputs, mutates, flops, bytes_moved, engine, parallel, debug,
                      fastmath)

    return deco


def trace_into_call() -> None:
    """torch.compile skips frames under eager_neuron/; the op call in Kernel.__call__ is what
    it must see. Applied once torch._dynamo is imported (eager_neuron.compile's import hook, or
    here when dynamo came first): importing dynamo ourselves would cost ~1.7 s per process."""
    dynamo = sys.modules.get("torch._dynamo")
    call = Kernel.__call__
    if dynamo is None or getattr(call, "_en_traced", False):
        return
    if hasattr(dynamo, "dont_skip_tracing"):
        call = dynamo.dont_skip_tracing(call)
        call._en_traced = True
        Kernel.__call__ = call


trace_into_call()
