"""Classification of an aten overload (once) and its outputs' metadata (once per argument
signature): the two caches dispatch() consults before any lowering runs."""

from __future__ import annotations

import torch

from .meta import _META, _META_LIMIT, _spec, _to_meta, meta_outputs  # noqa: F401 -- API

# ---------------------------------------------------------------------------------------------
# classification, once per overload
# ---------------------------------------------------------------------------------------------

class Plan:
    __slots__ = ("kind", "lower", "mutates", "ret_alias", "name", "decomp", "out_args",
                 "cpu_meta", "prepare")

    def __init__(self, kind, lower=None, mutates=(), ret_alias=(), name="", decomp=None,
                 out_args=()):
        self.kind = kind
        self.lower = lower
        self.mutates = mutates        # names of args the op writes
        self.ret_alias = ret_alias    # per return: name of the written arg it aliases, or None
        self.name = name
        self.decomp = decomp
        self.out_args = out_args      # names of out= args (resized to the result's shape first)
        # where PyTorch's meta function and its CPU kernel disagree on an output's shape/dtype
        # (bfloat16 batch-norm statistics, eval-mode saved stats), the lowering's
        # `cpu_meta(a, leaves) -> leaves` says what the CPU returns
        self.cpu_meta = getattr(lower, "cpu_meta", None)
        # a lowering that can return its launch instead of making it (lower.prepare(func, a,
        # outs) -> launch() arguments or None): dispatch then calls launch itself
        self.prepare = getattr(lower, "prepare", None)


_PLANS: dict = {}


def _plan(func) -> Plan:
    from . import ops

    schema = func._schema
    name = schema.name                                    # "aten::add_"
    full = f"{name}.{schema.overload_name}" if schema.overload_name else name
    mutates = tuple(a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write)
    ret_alias = []
    for r in schema.returns:
        target = None
        if r.alias_info is not None and r.alias_info.is_write:
            for a in schema.arguments:
                if a.alias_info and a.alias_info.before_set == r.alias_info.before_set:
                    target = a.name
        ret_alias.append(target)
    out_args = tuple(a.name for a in schema.arguments if a.is_out)
    kw = dict(name=full, mutates=mutates, ret_alias=tuple(ret_alias), out_args=out_args)
    if full in ops.HOST or name in ops.HOST:
        return Plan("host", lower=ops.HOST.get(full) or ops.HOST[name], **kw)
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        # reached us from inside a decomposition (e.g. aten::to): PyTorch's own composite
        return Plan("decomp", decomp=func.decompose, **kw)
    if torch.Tag.inplace_view in func.tags:
        return Plan("inplace_view", **kw)
    if func.is_view or full in ops.VIEW_LIKE:
        return Plan("view", **kw)
    if full in ops.ALLOC:
        return Plan("alloc", **kw)
    if name.startswith("aten::_foreach_"):
        return Plan("foreach", **kw)
    dynamic = ops.DYNAMIC.get(full) or ops.DYNAMIC.get(name)
    if dynamic is not None:
        return Plan("dynamic", lower=dynamic, **kw)
    lower = ops.KERNELS.get(full) or ops.KERNELS.get(name)
    if lower is not None and not (schema.overload_name.startswith("out") and
                                  name not in ops.OUT_OK):
        return Plan("kernel", lower=lower, **kw)
    if name.startswith("prims::") and hasattr(func, "impl_aten"):
        # PyTorch's refs decompose into prims; each prim has an aten implementation
        return Plan("decomp", decomp=func.impl_aten, **kw)
    if full not in ops.NO_DECOMP:
        decomp = ops.decomposition(func)
        if decomp is not None:
            return Plan("decomp", decomp=decomp, **kw)
    if lower is not None:
        return Plan("kernel", lower=lower, **kw)
    from .custom.privateuse1 import privateuse1_impl

    impl = _custom_op_impl(name) or privateuse1_impl(func)
    if impl is not None:
        return Plan("decomp", decomp=impl, **kw)
    return Plan("fallback", **kw)


def _custom_op_impl(name: str):
    """A torch.library.custom_op's device-agnostic Python implementation (e.g. torch.nn's
    chunked linear_cross_entropy): written in torch ops, so it runs as a decomposition."""
    from torch._library import custom_ops

    opdef = custom_ops.OPDEFS.get(name)
    if opdef is None:
        return None
    return opdef._backend_fns.get("neuron") or opdef._backend_fns.get(None)


_FUSIBLE = None


def fusible_lowerings() -> frozenset:
    """Lowerings whose launches adaptive eager may record (the elementwise and cast families)."""
    global _FUSIBLE
    if _FUSIBLE is None:
        from . import ops

        _FUSIBLE = frozenset(fn for name, fn in ops.KERNELS.items()
                             if name in ops.FUSIBLE_OPS)
    return _FUSIBLE
