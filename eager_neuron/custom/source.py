"""A custom kernel's source: the user's function plus what it references (globals, closure
cells, @njit helpers), rendered as one self-contained Numba module, each line mapped back to the
user's file and line (errors name the kernel's own line).

>>> import math
>>> from eager_neuron.custom.source import _Source, _add_function
>>> def twice(x, out):
...     for i in range(x.size):
...         out[i] = 2 * x[i] + math.pi * 0
>>> src = _Source()
>>> _add_function(src, twice, "@njit", "twice")
>>> print(src.text())
from __future__ import annotations
import math
@njit
def twice(x, out):
    for i in range(x.size):
        out[i] = 2 * x[i] + math.pi * 0
<BLANKLINE>
"""

from __future__ import annotations

import ast
import inspect
import math
import sys
import textwrap
import types

import numpy as np


class _Source:
    """Rendered lines and, per line, the (file, line) of the user's source it came from."""

    def __init__(self) -> None:
        self.lines: list[str] = ["from __future__ import annotations"]
        self.origin: list[tuple | None] = [None]
        self.parallel_used = False
        self.unsupported: dict[str, str] = {}
        self._done: set = set()

    def add(self, line: str, origin=None) -> None:
        self.lines.append(line)
        self.origin.append(origin)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _code_names(code: types.CodeType) -> set:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


def _constant_source(value) -> str | None:
    if isinstance(value, bool) or isinstance(value, int) and not isinstance(value, bool):
        return repr(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return repr(value)
        return "math.nan" if value != value else ("math.inf" if value > 0 else "-math.inf")
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return _constant_source(value.item())
    return None


def _emit_global(src: _Source, name: str, value, deps: list) -> None:
    """One module-level line (or helper function) so the kernel's global `name` resolves."""
    if (name, id(value)) in src._done:
        return
    src._done.add((name, id(value)))
    if isinstance(value, types.ModuleType):
        modname = value.__name__
        if modname in ("numpy", "math", "cmath") or modname.startswith("numba"):
            src.add(f"import {modname} as {name}" if modname != name else f"import {modname}")
        else:
            src.unsupported[name] = f"module {modname} (only numpy, math, cmath and numba)"
        return
    const = _constant_source(value)
    if const is not None:
        src.add(f"{name} = {const}")
        return
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        src.add(f"{name} = np.{np.dtype(value).name}")
        return
    numba = sys.modules.get("numba")   # a kernel's prange came from an imported numba
    if numba is not None and value is numba.prange:
        src.parallel_used = True
        src.add(f"from numba import prange as {name}")
        return
    py_func = getattr(value, "py_func", None)   # a user's @njit helper, or another Kernel
    if py_func is None and isinstance(value, types.FunctionType):
        py_func = value
    if py_func is not None and isinstance(py_func, types.FunctionType):
        deps.append((name, py_func))
        return
    for modname, mod in (("math", math), ("numpy", np), ("cmath", __import__("cmath"))):
        attr = getattr(value, "__name__", None)
        if attr and getattr(mod, attr, None) is value:
            src.add(f"from {modname} import {attr} as {name}")
            return
    src.unsupported[name] = f"{type(value).__name__} object"


def _add_function(src: _Source, fn: types.FunctionType, decorator: str, as_name: str) -> None:
    """The function's own source lines, decorator lines dropped, each line mapped to its origin.
    Annotations stay (the rendered module postpones them: `from __future__ import annotations`)."""
    try:
        lines, start = inspect.getsourcelines(fn)
    except (OSError, TypeError) as exc:
        raise TypeError(
            f"eager_neuron.kernel needs the source of {fn.__qualname__} ({exc}); define it in a "
            "file (or a cell), not with exec/lambda") from None
    filename = inspect.getsourcefile(fn) or "<unknown>"
    body = textwrap.dedent("".join(lines))
    tree = ast.parse(body)
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef):
        raise TypeError(f"eager_neuron.kernel expects a plain function, got {type(node).__name__}")
    first = node.lineno - 1      # the `def` line: decorators above it are dropped
    # names the body reads: module globals first, then closure cells
    deps: list = []
    glb = fn.__globals__
    params = set(inspect.signature(fn).parameters)
    for name in sorted(_code_names(fn.__code__)):
        if name in params:
            continue
        if name in glb:
            _emit_global(src, name, glb[name], deps)
    if fn.__closure__:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                _emit_global(src, name, cell.cell_contents, deps)
            except ValueError:
                src.unsupported[name] = "an unbound closure variable"
    for dep_name, dep in deps:
        if ("fn", id(dep)) not in src._done:
            src._done.add(("fn", id(dep)))
            _add_function(src, dep, "@njit", dep_name)
    src.add(decorator)
    for i, line in enumerate(body.splitlines()[first:]):
        if i == 0 and as_name != fn.__name__:
            line = line.replace(f"def {fn.__name__}", f"def {as_name}", 1)
        src.add(line, (filename, start + first + i))
    if "prange" in fn.__code__.co_names:
        src.parallel_used = True
