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
