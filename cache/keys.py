"""Cache keys and their versions.

A kernel key is a flat tuple of exactly what changes the generated code:
    (FORMAT_VERSION, family, op, static fields..., argument types)
and the disk tier adds `toolchain()` and a digest of the rendered source, so that a
numba/llvmlite/numpy/torch/Python/CPU change or an edited renderer is a clean miss.

A `KeyType` names the fields of one family's key and renders the kernel from the key alone
(cache/families.py: elementwise, reduce, matmul; lower/linalg_base.py BatchKernel for linalg):
a lowering whose render() is `TYPE.render(key)` cannot read anything the key lacks. The key
itself stays a plain tuple built at tuple speed (a NamedTuple costs ~3x a tuple literal per op).

>>> from eager_neuron.cache.keys import disk_key
>>> len(disk_key((1, "elementwise", "aten::add"), "@njit\\ndef k(o):\\n    pass\\n"))
64
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys

FORMAT_VERSION = 2   # bump when any renderer's output or the disk entry layout changes


class KeyType:
    """One family's kernel key: `(family, *fields)` as a plain tuple, and its renderer.

    `fields` name the tuple's positions after the family; `fixed` pins fields that tell two key
    layouts of one family apart (matmul's "blas" and "loop"); `renderer(*fields)` returns
    `(source, function name)` and reads nothing but its arguments.

    >>> K = KeyType("doc", ("op", "n"), lambda op, n: (f"def k_{op}(o):\\n    o[:] = {n}\\n",
    ...                                                 f"k_{op}"))
    >>> key = ("doc", "fill", 2)
    >>> K.render(key)[1], K.describe(key)
    ('k_fill', "doc(op='fill', n=2)")
    >>> K.render(("doc", "fill"))
    Traceback (most recent call last):
    ValueError: ('doc', 'fill') is not a doc key: expected (family, op, n)
    """

    __slots__ = ("family", "fields", "fixed", "renderer")

    def __init__(self, family: str, fields: tuple, renderer, fixed: dict | None = None) -> None:
        self.family = family
        self.fields = tuple(fields)
        self.fixed = dict(fixed or {})
        self.renderer = renderer

    def matches(self, key: tuple) -> bool:
        """Whether `key` (a lowering's key, without launch's argument types) is of this type."""
        return (len(key) == len(self.fields) + 1 and key[0] == self.family
                and all(key[1 + self.fields.index(f)] == v for f, v in self.fixed.items()))

    def render(self, key: tuple) -> tuple[str, str]:
        """(source, name) of the kernel `key` names, from the key alone."""
        if not self.matches(key):
            raise ValueError(f"{key!r} is not a {self.family} key: expected (family, "
                             f"{', '.join(self.fields)})")
        return self.renderer(*key[1:])

    def describe(self, key: tuple) -> str:
        """The key with its field names (for logs and error messages)."""
        pairs = ", ".join(f"{f}={v!r}" for f, v in zip(self.fields, key[1:]))
        return f"{self.family}({pairs})"

    def __repr__(self) -> str:
        return f"<KeyType {self.family}({', '.join(self.fields)})>"


def _version() -> str:
    """eager_neuron's version, from its installed metadata (importing the package from here
    would close an import cycle: eager_neuron -> cache.disk -> cache.keys -> eager_neuron)."""
    from importlib import metadata

    try:
        return metadata.version("eager_neuron")
    except metadata.PackageNotFoundError:   # pragma: no cover - run from a source tree
        return "unknown"


@functools.lru_cache(maxsize=1)
def toolchain() -> tuple:
    """Everything outside the key that changes the machine code a kernel compiles to."""
    import llvmlite
    import numpy
    import torch

    from eager_neuron.kernels.compile import numba as _numba

    numba = _numba()   # first: it sets the code generator's CPU features (kernels/compile.py)
    from numba.core import config as nb_config


    try:
        from numba.core.registry import cpu_target

        # (triple, cpu name, cpu features) as Numba's own cache index has them; honours
        # NUMBA_CPU_NAME / NUMBA_CPU_FEATURES (e.g. "generic" for a cache shared across hosts)
        cpu = tuple(cpu_target.target_context.codegen().magic_tuple())
    except Exception:  # pragma: no cover - a numba without magic_tuple
        cpu = (platform.machine(), "", "")
    return (
        ("eager_neuron", _version()),
        ("format", FORMAT_VERSION),
        ("python", sys.implementation.name, sys.version_info[:2]),
        ("numba", numba.__version__),
        ("llvmlite", llvmlite.__version__),
        ("numpy", numpy.__version__),
        ("torch", torch.__version__),
        ("codegen", int(nb_config.OPT), bool(nb_config.BOUNDSCHECK),
         bool(nb_config.DEBUGINFO_DEFAULT)),
        ("cpu",) + cpu,
    )


@functools.lru_cache(maxsize=1)
def toolchain_id() -> str:
    """A short stable name for `toolchain()` (shown by the cache tool, stored in entries)."""
    return hashlib.sha256(repr(toolchain()).encode()).hexdigest()[:16]


def disk_key(key: tuple, source: str) -> str:
    """The disk tier's key: sha256 over the toolchain, the kernel key and the rendered source.

    The source digest makes an edited renderer a miss even when nobody bumped FORMAT_VERSION.
    """
    src = hashlib.sha256(source.encode()).hexdigest()
    return hashlib.sha256(repr((toolchain(), key, src)).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def _package_dirs() -> list:
    """The directories of eager_neuron's code: the package, and kernels/ and cache/ (installed
    as eager_neuron.kernels / eager_neuron.cache from the repository's top)."""
    import importlib

    dirs = []
    for name in ("eager_neuron", "eager_neuron.kernels", "eager_neuron.cache"):
        path = os.path.dirname(os.path.abspath(importlib.import_module(name).__file__))
        if path not in dirs:
            dirs.append(path)
    return dirs


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """sha256 of every .py of eager_neuron (the package, kernels/, cache/): whatever renders a
    kernel's source, builds its key or shapes a traced graph. Any edit changes it (~30 ms, once
    per process).

    >>> len(source_hash())
    64
    """
    h = hashlib.sha256()
    files: dict = {}             # path -> name relative to its top's parent (a nested top: once)
    for top in _package_dirs():
        for root, subdirs, names in os.walk(top):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "__")))
            for n in names:
                path = os.path.join(root, n)
                if n.endswith(".py") and path not in files:
                    files[path] = os.path.relpath(path, os.path.dirname(top))
    for path, rel in sorted(files.items(), key=lambda kv: kv[1]):
        with open(path, "rb") as f:
            h.update(rel.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


_ORIGINS: dict = {}     # a renderer's file outside the package -> sha256 of its bytes


def renderer_origin(render) -> str | None:
    """What, besides the package's sources, the code of `render` is: "" for a renderer of
    eager_neuron (in `source_hash()`), a digest of the file that defines any other (a test's or
    a user's `launch()` call), None when its code cannot be pinned down (no file: `-c`, exec;
    not a function): such a kernel is never found by the index.

    >>> renderer_origin(lambda: ("", "k")) is None or len(renderer_origin(lambda: ("", "k")))
    True
    """
    while isinstance(render, functools.partial):     # (eager lowerings: partial(renderer, ...))
        render = render.func
    code = getattr(render, "__code__", None)
    if code is None:
        return None
    path = os.path.abspath(code.co_filename)
    if any(path.startswith(top + os.sep) for top in _package_dirs()):
        return ""
    digest = _ORIGINS.get(path)
    if digest is None:
        try:
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            return None
        _ORIGINS[path] = digest
    return digest


def index_key(key: tuple, origin: str = "") -> str:
    """The render index's key: a kernel found by what names it, without rendering its source.

    Only sound next to `source_hash()` and the renderer's `origin` (renderer_origin): a renderer
    reads nothing but its key (docs/CACHE.md), so the key, the toolchain and the code that
    renders decide the source. `disk_key` stays the entry's key (an edit elsewhere in the
    package misses the index, never the entries)."""
    return hashlib.sha256(repr(("index", toolchain(), key, source_hash(), origin)).encode()
                          ).hexdigest()
