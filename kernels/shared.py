"""Helper libraries shared by rendered kernels: compiled once per process, linked into each kernel.

A library is the source of `@njit` helpers (kernels/vmath.py's float32 math,
kernels/sort_prelude.py's sorts, kernels/halfround.py's rounding to the half types).
`register(lib, source)` returns the one line a kernel's source starts with instead of the
helpers' text:

    from eager_neuron.kernels.shared import (_vexp, _vtanh, ...)  # vmath library 1a2b3c4d5e6f

The import binds this process's dispatchers (the library's source is exec'd once, on the first
import), so a helper is typed, lowered and optimised once per argument signature per process, and
every kernel that calls it links that code. Helpers that used to be inlined by Numba are
`forceinline=True`: LLVM's `alwaysinline`, so the O3 pass over the kernel's final module inlines
them after linking and the loops vectorize as before (tests/test_vmath.py::test_vectorized; plain
@njit left `_vtanh` a call and its loop scalar).

Why: the helpers used to be `@njit(inline="always")` text exec'd fresh into every kernel, so
Numba's IR-level inliner deep-copied and re-typed every helper at every call site of every
kernel, and the sort helpers compiled from scratch per kernel (tools/bench_coldcompile.py, the
numbers in docs/KERNELS.md). Results are unchanged: the helpers carry the flags of every kernel
that calls them (error_model="numpy", no fastmath; a Numba-inlined helper took its caller's
flags), and LLVM inlining keeps each instruction's semantics.

Not shared: the elementwise division/rounding helpers (kernels/elementwise_prelude.py) stay
Numba-inlined text. Shared, an integer ZeroDivisionError raised by a called helper inside a prange
loop came back wrapped ("returned a result with an exception set"), and in a fused float64 chain
one NaN's sign bit changed (floor_divide(-nan, nan): LLVM picked the other NaN operand);
tools/bench_coldcompile.py --diff found both. The vmath and sort helpers raise nothing and gave
the same bits on every case of that check.

The digest in the line changes with the library's source, so an edited helper is a new kernel
source, hence a new disk key and PRELUDE_ID (old entries: clean misses). A kernel loaded from the
disk tier holds the helpers' machine code it was linked with; the import only binds names.

>>> from eager_neuron.kernels import shared
>>> line = shared.register("doc_example", "@njit\\ndef _doc_twice(x):\\n    return 2 * x\\n")
>>> line.startswith("from eager_neuron.kernels.shared import (_doc_twice,)")
True
>>> ns = {}; exec(line, ns); ns["_doc_twice"](21)
42
"""

from __future__ import annotations

import hashlib
import re
import threading

_SOURCES: dict[str, str] = {}    # library -> helper source
_OWNER: dict[str, str] = {}      # helper name -> library
_BUILT: dict[str, dict] = {}     # library -> its exec namespace (built on first use)
_lock = threading.Lock()
# counters for tests: libraries exec'd in this process (each at most once)
STATS = {"libraries_built": 0}

# the modules that register libraries (imported when a kernel names a helper not yet registered)
_LIBRARY_MODULES = ("eager_neuron.kernels.vmath", "eager_neuron.kernels.sort_prelude",
                    "eager_neuron.kernels.halfround")
_DEF_RE = re.compile(r"^def (\w+)\(", re.M)


def register(lib: str, source: str) -> str:
    """Register `source` (plain @njit helpers) as library `lib`; the kernel-source prelude line.

    Helper names are unique across libraries (a kernel may import from several).
    """
    names = _DEF_RE.findall(source)
    for n in names:
        owner = _OWNER.get(n, lib)
        if owner != lib:
            raise ValueError(f"helper {n} of library {lib} is already defined by {owner}")
    if re.search(r"\binline=", source):
        # Numba's IR inlining would type the helper again in every caller, with its flags
        raise ValueError(f"library {lib}: shared helpers are @njit, not inline= (use forceinline)")
    if _SOURCES.get(lib, source) != source:
        raise ValueError(f"library {lib} registered twice with different sources")
    _SOURCES[lib] = source
    for n in names:
        _OWNER[n] = lib
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    return (f"from eager_neuron.kernels.shared import ({', '.join(names)},)"
            f"  # {lib} library {digest}\n")


def namespace(lib: str) -> dict:
    """The library's namespace, exec'd on first use (defines dispatchers, compiles nothing)."""
    ns = _BUILT.get(lib)
    if ns is None:
        with _lock:
            ns = _BUILT.get(lib)
            if ns is None:
                from . import compile as kc  # numba() first: the CPU features (compile.py)

                ns = kc._namespace()
                exec(compile(_SOURCES[lib], f"<eager_neuron helpers {lib}>", "exec"), ns)
                _BUILT[lib] = ns
                STATS["libraries_built"] += 1
    return ns


def compiled_signatures(name: str) -> int:
    """How many signatures helper `name` has been compiled for in this process (0: not built)."""
    lib = _OWNER[name]
    ns = _BUILT.get(lib)
    return len(ns[name].signatures) if ns is not None else 0


def __getattr__(name: str):
    # `from eager_neuron.kernels.shared import _vexp` in a kernel's source lands here
    lib = _OWNER.get(name)
    if lib is None:   # a kernel loaded from disk before its renderer's module was imported
        import importlib

        for mod in _LIBRARY_MODULES:
            importlib.import_module(mod)
        lib = _OWNER.get(name)
    if lib is None:
        raise AttributeError(f"no shared kernel helper named {name}")
    return namespace(lib)[name]
