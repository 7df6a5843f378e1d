"""The op table on one screen: core op -> kernel family; decompositions; the fenced fallback.

Lookup order in dispatch: HOST (transfers, RNG, scalar reads) -> views (schema says alias) ->
ALLOC -> _foreach_ -> KERNELS -> decomposition -> CPU fallback (warned once, counted).
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings

import torch

from .lower import cast, elementwise, host

# -- kernel families ------------------------------------------------------------------------------
FAMILIES = {
    "elementwise": elementwise.LOWERINGS,   # unary/binary/ternary, activations and their backward
    "cast": cast.LOWERINGS,                 # _to_copy, copy_, clone (incl. bfloat16 bits)
}
# families built so far; a family module exports LOWERINGS {op name: lowering} and may export
# DYNAMIC {op name: fn(func, a, core) -> [(data, block), ...]} for data-dependent output sizes.
# A module that is listed but missing is skipped; one that fails to import warns (never silent:
# its ops then decompose or reach the counted fallback, which the OpInfo sweep reports).
_FAMILY_MODULES = ("reduce", "matmul", "index", "norm", "conv", "loss", "mask",
                   "linalg", "fft", "complex", "sort", "special", "pool", "attention",
                   "resample", "distance")
DYNAMIC: dict = {}
for _mod in _FAMILY_MODULES:
    if importlib.util.find_spec(f"eager_neuron.lower.{_mod}") is None:
        continue
    try:
        _m = importlib.import_module(f"eager_neuron.lower.{_mod}")
    except Exception as _exc:   # noqa: BLE001 - loud, not fatal: its ops then decompose or fall back
        warnings.warn(f"eager_neuron: kernel family lower/{_mod}.py failed to import "
                      f"({type(_exc).__name__}: {_exc}); its ops will not use device kernels")
        continue
    if hasattr(_m, "LOWERINGS"):
        FAMILIES[_mod] = _m.LOWERINGS
    DYNAMIC.update(getattr(_m, "DYNAMIC", {}))

KERNELS: dict = {}
for _family, _table in FAMILIES.items():
    for _name, _fn in _table.items():
        KERNELS[_name] = _fn
# in-place variants of elementwise ops share the kernel: the output is `self`
for _name in list(elementwise.OPS):
    if _name.startswith("aten::") and not _name.endswith("_"):
        KERNELS.setdefault(_name + "_", KERNELS[_name])

# what adaptive eager may record into a fused group (the rest flushes it)
FUSIBLE_OPS = frozenset(set(elementwise.LOWERINGS) | {n + "_" for n in elementwise.OPS}
                        | set(cast.LOWERINGS))

# packets whose .out overloads the same lowering handles (it writes into the given out)
OUT_OK = frozenset(name for name in elementwise.OPS)

# -- host ops: transfers, scalar reads, RNG from the CPU generator, host factories ---------------
HOST = host.HOST

# -- views that the schema does not mark as views (the input is a dead temporary) ----------------
VIEW_LIKE = frozenset({"aten::_unsafe_view", "aten::lift_fresh", "aten::_reshape_alias"})

# -- allocation only, no kernel -------------------------------------------------------------------
ALLOC = frozenset({
    "aten::empty.memory_format", "aten::empty_strided", "aten::empty_like",
    "aten::new_empty", "aten::new_empty_strided", "aten::empty_permuted",
})

# -- decompositions we refuse (they lower to prims or loop badly); these go to the fallback ------
NO_DECOMP = frozenset()

_DECOMP = None


def decomposition(func):
    """PyTorch's decomposition for func: the core ATen set first, then the global table."""
    global _DECOMP
    if _DECOMP is None:
        from torch._decomp import core_aten_decompositions, decomposition_table

        table = dict(decomposition_table)
        table.update(core_aten_decompositions())
        _DECOMP = table
    return _DECOMP.get(func)


def coverage() -> dict:
    """{family: sorted op names} for docs and tools."""
    return {family: sorted(table) for family, table in FAMILIES.items()}


aten = torch.ops.aten
