"""Typed kernel keys of the busiest families: what each field of the key tuple is, and the render
that reads only the key (see KeyType in cache/keys.py).

A lowering builds its key as a tuple literal (per call, at tuple speed) and hands launch() a
render() that calls `TYPE.render(key)`: the kernel's source then depends on the key alone, so a
field the renderer needs cannot be missing from the key (the bug EAGER_NEURON_CACHE_VERIFY=1
looks for). Imported by lowerings only (launch and the cache tiers do not need it).

>>> key = ("reduce", "sum", 1, 1, "np.float32", "np.float32", ("np.float32",), 0, "row", False,
...        False, "")
>>> REDUCE.describe(key)[:47]
"reduce(op='sum', ko=1, kr=1, acc_t='np.float32'"
>>> REDUCE.render(key)[0].count("@njit")
1
"""

from __future__ import annotations

import re

from eager_neuron.cache.keys import KeyType
from eager_neuron.elementwise_base import PRELUDE as _EW_PRELUDE
from eager_neuron.elementwise_base import SPECIAL_PRELUDE as _SPECIAL_PRELUDE
from eager_neuron.kernels import elementwise as _kew
from eager_neuron.kernels import matmul as _kmm
from eager_neuron.kernels import reduce as _kr
from eager_neuron.kernels import special as _ksp
from eager_neuron.kernels import vmath as _vmath

# -- elementwise (lower/elementwise.py renders every kernel through this type; adaptive eager's
#    one-op groups use the same key) -------------------------------------------------------------
# a special-function call in a rendered expression: lower/elementwise.py suffixes each helper with
# its compute type (`_digamma(` -> `_digamma_float64(`)
_SPECIAL_RE = re.compile(r"\b(" + "|".join(_ksp.HELPERS) + r")_float(?:32|64)\(")


def _special(expr: str) -> bool:
    """Whether the expression calls a special-function helper (its source is then added)."""
    return _SPECIAL_RE.search(expr) is not None


def _render_elementwise(op, expr, kinds, rank, loads, scalar_casts, store, parallel,
                        prelude_id, in_place):
    """The kernel of one elementwise op: [vmath polynomials] + the integer/float helpers +
    [special functions, when the expression calls one] + the loop (kernels/elementwise.py)."""
    src, name = _kew.render(expr, kinds, rank, loads, scalar_casts, store, parallel,
                            in_place=in_place)
    vm = _vmath.VMATH_PRELUDE if _vmath.needs_vmath(expr) else ""
    return vm + _EW_PRELUDE + (_SPECIAL_PRELUDE if _special(expr) else "") + src, name


ELEMENTWISE = KeyType("elementwise", (
    "op",            # the aten op (two ops with one expression keep separate kernels)
    "expr",          # the rendered expression over loads a0.., scalars c0.. (compute type T)
    "kinds",         # per tensor operand: "flat" | "one" (a single element) | "nd" (strided)
    "rank",          # loop rank: 1 for the flat loop, else the output's rank
    "loads",         # per operand: the cast applied on load (compute type)
    "scalar_casts",  # per kernel scalar: its cast
    "store",         # the cast applied on store (output dtype)
    "parallel",      # prange over the flat loop
    "prelude_id",    # hash of the njit helper preludes (an edited helper is a new key)
    "in_place",      # the output is operand 0 (`x.add_(y)`): the flat loop's in-place variant
), _render_elementwise)


# -- reductions (lower/reduce.py `reduce`) -----------------------------------------------------
REDUCE = KeyType("reduce", (
    "op",         # sum, mean, prod, amax, argmax, var, logsumexp, norm2, normp, ...
    "ko",         # kept (output) dims of the coalesced view
    "kr",         # reduced dims of the coalesced view
    "acc_t",      # accumulator numpy type
    "load_t",     # load cast (numpy type)
    "stores",     # per output: store cast
    "n_scalars",  # runtime scalars (correction, p of normp, ...)
    "mode",       # row | col | block | chunk: the loop order (kernels/reduce.py)
    "parallel",   # prange over rows or chunks
    "fastmath",   # float64 accumulations that may be reassociated
    "init",       # an initial value's expression, "" for none
), _kr.render_reduce)


# -- matrix products (lower/matmul.py `gemm`) ---------------------------------------------------
# the key carries the kernel op name; the renderers take the batch kind it comes from
_BATCH = {"mm": "none", "bmm": "bmm", "addbmm": "sum"}


def _render_blas(kernel_op, version, path, modes, epilogue):
    return _kmm.render_blas(_BATCH[kernel_op], modes, epilogue)


def _render_loop(kernel_op, version, path, epilogue, store, parallel):
    return _kmm.render_loop(_BATCH[kernel_op], epilogue, "np.int64", store, parallel)


MATMUL_BLAS = KeyType("matmul", (
    "kernel_op",  # mm | bmm | addbmm (batch: none, batched, summed over the batch)
    "version",    # lower/matmul.VERSION
    "path",       # "blas": floats through BLAS gemm
    "modes",      # per operand: n | t (read transposed) | b (one matrix shared by the batch)
    "epilogue",   # none | scale | bias
), _render_blas, fixed={"path": "blas"})

def _render_half(kernel_op, version, path, half, layouts, epilogue):
    return _kmm.render_blas_half(_BATCH[kernel_op], half, layouts, epilogue)


MATMUL_HALF = KeyType("matmul", (
    "kernel_op",  # mm | bmm
    "version",    # lower/matmul.VERSION
    "path",       # "half": bfloat16/float16 bits, float32 temporaries and BLAS, rounded once
    "half",       # bf16 | f16
    "layouts",    # per operand, its float32 temporary: C | F (2-D) | t (3-D, transposed)
    "epilogue",   # none | scale | bias
), _render_half, fixed={"path": "half"})

MATMUL_LOOP = KeyType("matmul", (
    "kernel_op",  # mm | bmm | addbmm
    "version",    # lower/matmul.VERSION
    "path",       # "loop": integers, accumulated in int64 (wrap-around as PyTorch)
    "epilogue",   # none | scale | bias
    "store",      # the output's numpy type
    "parallel",   # prange over the batch and rows
), _render_loop, fixed={"path": "loop"})

TYPES = (ELEMENTWISE, REDUCE, MATMUL_BLAS, MATMUL_HALF, MATMUL_LOOP)


def type_of(key: tuple) -> KeyType | None:
    """The typed key `key` is an instance of, or None (a family without a type yet)."""
    for t in TYPES:
        if t.matches(key):
            return t
    return None
