"""The op table on one screen: aten op -> kernel family -> lowering; the fenced CPU fallback.

Lookup order in dispatch (eager_neuron/plan.py): HOST (transfers, RNG, scalar reads) -> views
(the schema says alias) -> ALLOC -> _foreach_ -> DYNAMIC -> KERNELS -> decomposition -> CPU
fallback (warned once, counted). Each family module under eager_neuron/lower/ exports LOWERINGS
{op: lowering} and may export DYNAMIC {op: fn} for data-dependent output sizes. An op registered
by two families fails `import eager_neuron` (DuplicateOpError) unless OVERRIDES below names it.
In-place (`add_`, `scatter_.src`) and out= (`add.out`) variants are read off torch's schemas for
the families whose row allows them; a family lists an in-place op only when its lowering differs
(`tril_`, `fill_`).
docs/OPS.md is generated from this table by tools/gen_ops_doc.py.

>>> from eager_neuron import ops
>>> ops.family_of("aten::mm"), ops.family_of("aten::add_"), ops.family_of("aten::mul.out")
('matmul', 'elementwise', 'elementwise')
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings

import torch

from .decomps import decomposition  # noqa: F401 -- ops.decomposition, for plan/dispatch
from .lower import cast, elementwise, host

# -- 1. the families, in the order docs/OPS.md lists them --------------------------------------
#  family            variants read off the schema   what it lowers
TABLE = {
    "elementwise":     ("inplace", "out"),  # unary/binary/ternary math, activations, backward
    "cells":           (),   # several outputs per element: LSTM/GRU cells, frexp
    "cast":            (),   # _to_copy, copy_, clone (incl. bfloat16/float16 bits)
    "reduce":          (),   # sum/mean/prod, max/min/arg*, any/all, var/std, logsumexp, scans
    "matmul":          ("inplace",),  # mm, bmm, addmm, baddbmm, addbmm, mv, addmv, dot
    "index":           ("inplace",),  # embedding, index_select, gather, scatter*, index_add/put
    "shape":           (),   # cat, pad, flip, roll, repeat, tril/triu, *_scatter
    "norm":            (),   # softmax/log_softmax, layer/batch/group norm (+ backward)
    "conv":            (),   # convolution and its backward, 1/2/3-d, transposed
    "loss":            (),   # nll, mse, bce, smooth_l1/huber, ... (+ backward)
    "linalg":          (),   # LU, Cholesky, triangular solves, inv, det
    "linalg_spectral": (),   # QR, eigh, SVD, pinv, lstsq, matrix_exp
    "fft":             (),   # _fft_r2c, _fft_c2c, _fft_c2r
    "complex":         (),   # complex, polar, conj_physical (complex operands: see complex.OPS)
    "sort":            (),   # sort/argsort/topk, kthvalue, median, mode, unique, searchsorted
    "pool":            (),   # max/avg/adaptive/fractional pooling (+ backward)
    "attention":       (),   # scaled_dot_product_attention forward and backward
    "resample":        (),   # upsample_*, grid_sampler (+ backward)
    "distance":        (),   # _pdist / _cdist forward and backward
    "embedding_bag":   (),   # _embedding_bag (+ dense / per-sample-weight backward)
    "extras":          ("inplace",),  # addr; DYNAMIC: repeat_interleave.Tensor, unique_dim
    "ctc":             (),   # DYNAMIC: _ctc_loss and its backward
    "fp8":             (),   # _scaled_mm (float8 operands, per-tensor / row-wise scales)
}
# lowerings that no family lists as its own (the mask family only serves DYNAMIC ops)
DYNAMIC_ONLY = ("mask",)
# a family module whose LOWERINGS merges another family's (for its importers): those ops are
# counted once, under the family that defines them
RE_EXPORTS = {"elementwise": ("cells",), "index": ("shape",)}
# an op two families export on purpose: the named family's lowering runs
OVERRIDES = {
    # elementwise keeps these templates so adaptive eager can fuse casts into a group
    "aten::_to_copy": "cast", "aten::copy_": "cast", "aten::copy": "cast", "aten::clone": "cast",
}


class DuplicateOpError(RuntimeError):
    """An op registered by two families (or twice by `register`): the last would win silently."""


# -- 2. building the table: every op once ------------------------------------------------------
FAMILIES: dict = {}     # family -> {op: lowering}, each op under exactly one family
KERNELS: dict = {}      # op (packet or overload name) -> lowering, incl. schema variants
FAMILY_OF: dict = {}    # op -> family
DYNAMIC: dict = {}      # op -> fn(func, a, core) -> [(data, block), ...]


def register(name: str, fn, family: str) -> None:
    """Add one op to the table; a second registration of `name` raises DuplicateOpError."""
    previous = FAMILY_OF.get(name)
    if previous is not None:
        winner = OVERRIDES.get(name)
        if winner not in (previous, family):
            raise DuplicateOpError(f"{name} is registered by both the {previous!r} and the "
                                   f"{family!r} families: keep one, or name the winner in "
                                   "eager_neuron/ops.py OVERRIDES")
        if winner == previous:
            return
        del FAMILIES[previous][name]
    KERNELS[name] = fn
    FAMILY_OF[name] = family
    FAMILIES.setdefault(family, {})[name] = fn


def _module(name: str):
    """A family module, or None: not there yet (a family being built) is skipped; one that fails
    to import warns (never silent: its ops then decompose or reach the counted fallback)."""
    if importlib.util.find_spec(f"eager_neuron.lower.{name}") is None:
        return None
    try:
        return importlib.import_module(f"eager_neuron.lower.{name}")
    except Exception as exc:   # noqa: BLE001 - loud, not fatal: the OpInfo sweep reports its ops
        warnings.warn(f"eager_neuron: kernel family lower/{name}.py failed to import "
                      f"({type(exc).__name__}: {exc}); its ops will not use device kernels",
                      stacklevel=2)
        return None


def _variants(name: str, kinds: tuple) -> tuple[list, bool]:
    """(in-place names, has out=) for a functional op, read off torch's schemas: `add` gives
    `add_` (every overload writes self), `scatter.src` gives `scatter_.src` (that overload
    exists and writes self); out= is read for whole packets only."""
    base, _, overload = name.partition(".")
    if "::" not in name or base.endswith("_"):
        return [], False
    ns, op = base.split("::")
    namespace = getattr(torch.ops, ns)
    inplace = []
    if "inplace" in kinds and hasattr(namespace, op + "_"):
        packet = getattr(namespace, op + "_")
        overloads = [overload] if overload else packet.overloads()
        if overload in packet.overloads() or not overload:
            if all(getattr(packet, ov)._schema.arguments[0].alias_info is not None
                   and getattr(packet, ov)._schema.arguments[0].alias_info.is_write
                   for ov in overloads):
                inplace.append(f"{base}_" + (f".{overload}" if overload else ""))
    has_out = "out" in kinds and not overload and hasattr(namespace, op) and any(
        any(a.is_out for a in getattr(getattr(namespace, op), ov)._schema.arguments)
        for ov in getattr(namespace, op).overloads())
    return inplace, has_out


def _build() -> frozenset:
    modules = {"elementwise": elementwise, "cast": cast}
    for family in (*TABLE, *DYNAMIC_ONLY):
        if family not in modules:
            modules[family] = _module(family)
    out_ok, variants = set(), []
    for family, kinds in TABLE.items():
        mod = modules[family]
        if mod is None:
            continue
        merged = {n for m in RE_EXPORTS.get(family, ()) if modules.get(m) is not None
                  for n in modules[m].LOWERINGS}
        for name, fn in mod.LOWERINGS.items():
            if name in merged:
                continue
            register(name, fn, family)
            inplace, has_out = _variants(name, kinds)
            variants += [(v, fn, family) for v in inplace]
            if has_out:
                out_ok.add(name)
    # an in-place variant that a family lowers itself keeps that family's lowering
    for name, fn, family in variants:
        if name not in FAMILY_OF:
            register(name, fn, family)
    for family in (*TABLE, *DYNAMIC_ONLY):
        for name, fn in getattr(modules.get(family), "DYNAMIC", {}).items():
            if name in DYNAMIC:
                raise DuplicateOpError(f"{name} has two DYNAMIC lowerings")
            DYNAMIC[name] = fn
    return frozenset(out_ok)


# out= overloads the functional lowering handles (it writes into the given out)
OUT_OK = _build()

# what adaptive eager may record into a fused group (the rest flushes it)
FUSIBLE_OPS = frozenset(n for n, f in FAMILY_OF.items() if f in ("elementwise", "cells", "cast"))

# -- 3. host ops: transfers, scalar reads, RNG from the CPU generator, host factories ----------
HOST = host.HOST

# -- 4. views that the schema does not mark as views (the input is a dead temporary) -----------
VIEW_LIKE = frozenset({"aten::_unsafe_view", "aten::lift_fresh", "aten::_reshape_alias"})

# -- 5. allocation only, no kernel --------------------------------------------------------------
ALLOC = frozenset({
    "aten::empty.memory_format", "aten::empty_strided", "aten::empty_like",
    "aten::new_empty", "aten::new_empty_strided", "aten::empty_permuted",
})

# *** the CPU fallback: what runs on the host, counted (stats()["fallbacks"]) ******************
# Every op not above and without a decomposition. The list is measured, not written: the
# OpInfo sweep (`make coverage`, tools/op_coverage.py) prints its members; every run counts them
# in stats()["fallbacks"], warned once per op. Decompositions we refuse (they lower to prims or
# loop badly) go here too:
NO_DECOMP = frozenset()
# *** end of the fallback section ***************************************************************


def family_of(name: str) -> str | None:
    """The family whose kernel runs `name` (an op or overload name), or None."""
    if name in FAMILY_OF:
        return FAMILY_OF[name]
    packet = name.split(".")[0]
    if packet in FAMILY_OF and (not name[len(packet):].startswith(".out") or packet in OUT_OK):
        return FAMILY_OF[packet]
    return None


def coverage() -> dict:
    """{family: sorted op names} for docs and tools."""
    return {family: sorted(table) for family, table in FAMILIES.items()}


aten = torch.ops.aten
