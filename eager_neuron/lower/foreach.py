"""The `_foreach_*` ops used by optimizers: one per-tensor op per list element, same funnel.

`_foreach_add_.List(self, other, alpha)` runs `add_.Tensor(self[i], other[i], alpha)` for each i.
Adaptive eager fuses the resulting runs; plain eager pays one launch per element.
"""

from __future__ import annotations

import torch
from torch.autograd.graph import increment_version

from .. import errors
from .. import tensor as _tensor

_OVERLOAD = {"List": "Tensor", "Scalar": "Scalar", "ScalarList": "Scalar", "Tensor": "Tensor",
             "default": "default", "ScalarAndTensor": "Scalar", "Scalar_out": "Scalar"}
_BASE: dict = {}


def _inplace_binary(op):
    """`maximum_`/`minimum_` have no aten in-place overload: compute, then write self."""
    def run(self, other):
        return self.copy_(op(self, other))
    return run


def _per_tensor_op(func):
    """(per-element op, argument spec, returns) for a _foreach_ overload.

    The spec says, per foreach argument, whether it is a per-element list, whether it is the
    `Tensor scalars` of a `.Tensor` overload (one scalar per element, on the CPU), and the
    keyword it must go under: per-element ops take some arguments keyword-only
    (`addcmul_(self, t1, t2, *, value)`) or name them differently (`norm`'s dtype)."""
    hit = _BASE.get(func)
    if hit is not None:
        return hit
    schema = func._schema
    base = schema.name.split("::")[1][len("_foreach_"):]          # "add_" / "add"
    ov = schema.overload_name or "default"
    if base in ("maximum_", "minimum_") and ov == "List":
        per = _inplace_binary(getattr(torch.ops.aten, base[:-1]).default)
        per_args = None
    else:
        per = _lookup(base, ov)
        per_args = per._schema.arguments
    spec = []
    keyword = False
    for j, a in enumerate(schema.arguments):
        if a.kwarg_only:
            break                   # the caller passes these by name already
        is_list = isinstance(a.type, torch._C.ListType)
        scalars = a.name == "scalars" and str(a.type) == "Tensor"
        name = None
        if per_args is not None:
            names = [p.name for p in per_args]
            if a.name in names:
                target = per_args[names.index(a.name)]
                if target.kwarg_only or names.index(a.name) != j:
                    name = a.name
            elif j < len(per_args) and per_args[j].kwarg_only:
                name = per_args[j].name
        keyword = keyword or name is not None
        if keyword and name is None:
            name = per_args[j].name if per_args is not None and j < len(per_args) else a.name
        spec.append((is_list, scalars, name))
    _BASE[func] = (per, tuple(spec), bool(schema.returns))
    return _BASE[func]


def _lookup(base, ov):
    # `maximum_`/`minimum_` have no aten in-place packet: their Scalar forms become clamp_min_ /
    # clamp_max_ below (ASGD's capturable foreach step: `_foreach_maximum_(new_mus, 1.0)`)
    packet = getattr(torch.ops.aten, base, None)
    candidates = [_OVERLOAD.get(ov, ov), "Tensor", "default", "Scalar", "Tensor_Scalar",
                  "Tensor_Tensor", "Scalar_Tensor"]
    if base.startswith("norm"):
        packet, candidates = torch.ops.aten.linalg_vector_norm, ["default"]
    if base in ("pow", "pow_") and ov == "ScalarAndTensor":
        candidates = ["Scalar"]
    if base in ("pow", "pow_") and ov in ("Scalar", "ScalarList"):
        candidates = ["Tensor_Scalar"]
    if base in ("pow", "pow_") and ov == "List":
        candidates = ["Tensor_Tensor"]
    if base == "pow_":      # the in-place packet names its overloads by the exponent alone
        candidates = {"Scalar": ["Scalar"], "ScalarList": ["Scalar"], "List": ["Tensor"]}.get(
            ov, candidates)
    if base in ("lerp", "lerp_") and ov in ("Scalar", "ScalarList"):
        candidates = ["Scalar"]
    if base in ("lerp", "lerp_") and ov == "List":
        candidates = ["Tensor"]
    if base in ("clamp_min", "clamp_min_", "clamp_max", "clamp_max_", "maximum", "maximum_",
                "minimum", "minimum_") and ov in ("Scalar", "ScalarList"):
        packet = getattr(torch.ops.aten, {"maximum": "clamp_min", "minimum": "clamp_max"}.get(
            base.rstrip("_"), base.rstrip("_")) + ("_" if base.endswith("_") else ""))
        candidates = ["default"]
    if base in ("addcmul", "addcmul_", "addcdiv", "addcdiv_"):
        candidates = ["default"]
    if base in ("div", "div_", "mul", "mul_", "add", "add_", "sub", "sub_") and ov == "List":
        candidates = ["Tensor"]
    for c in candidates:
        if packet is not None and c in packet.overloads():
            return getattr(packet, c)
    raise NotImplementedError(f"no per-tensor op for _foreach_{base}.{ov}")


def _run_out(func, args, kwargs, mode):
    """`_foreach_sqrt.out(self, *, out)` & co.: ATen's generated out= kernels run the functional
    overload, then resize (with the CPU's warning) and copy each result into its out tensor."""
    kw = dict(kwargs)
    out = kw.pop("out")
    ov = func._schema.overload_name
    functional = getattr(getattr(torch.ops.aten, func._schema.name.split("::")[1]),
                         ov[:-len("_out")] if ov.endswith("_out") else "default")
    def call(op, *a, **k):
        if mode is not None:    # NeuronMode: CPU tensors in and out
            with mode:
                return op(*a, **k)
        return _tensor._dispatch(op, a, k)

    results = call(functional, *args, **kw)
    if len(out) != len(results):
        raise RuntimeError(f"{func.name()}: expected {len(results)} out tensors, got {len(out)}")
    for o, r in zip(out, results):
        if o.shape != r.shape:
            if o.numel():   # ATen's resize_output warning (inplace.warn_resized's words)
                errors.warn(
                    f"An output with one or more elements was resized since it had shape "
                    f"{list(o.shape)}, which does not match the required output shape "
                    f"{list(r.shape)}. This behavior is deprecated; resize outputs explicitly "
                    "with t.resize_(0) first.")
            if mode is not None:    # (a CPU out tensor resizes itself, outside the mode)
                o.resize_(r.shape)
            else:
                call(torch.ops.aten.resize_.default, o, list(r.shape))
        call(torch.ops.aten.copy_.default, o, r)
        increment_version(o)    # once per out tensor, as the CPU's out= kernel


def run_foreach(func, plan, args, kwargs, mode):
    if isinstance(kwargs.get("out"), (list, tuple)):
        return _run_out(func, args, kwargs, mode)
    try:
        per, spec, returns = _per_tensor_op(func)
    except NotImplementedError as exc:
        from ..fallback import run_fallback

        return run_fallback(func, plan, args, kwargs, mode, why=str(exc))
    # the first list sets the length: `_foreach_pow.ScalarAndTensor(Scalar self, Tensor[]
    # exponent)` (capturable Adam's `beta1 ** step`) leads with a number
    n = next(len(a) for (is_list, _s, _n), a in zip(spec, args) if is_list)
    for (is_list, _scalars, _name), a in zip(spec, args):
        if is_list and len(a) != n:
            # before any element is written (the CPU checks the lists first): dispatch asks
            # the CPU for its words ("Tensor list must have same number of elements as scalar
            # list."); the loop below wrote the first elements, then failed at the missing one
            raise RuntimeError(f"{func.name()}: lists of {n} and {len(a)} elements")
    results = []
    direct = isinstance(per, torch._ops.OpOverload)
    for i in range(n):
        call, call_kw = [], dict(kwargs)
        for (is_list, scalars, name), a in zip(spec, args):
            v = a[i] if is_list else a
            if scalars:
                v = a[i].item()     # `.Tensor` overloads: one scalar per element, a CPU tensor
            if name is None:
                call.append(v)
            else:
                call_kw[name] = v
        if mode is not None:
            with mode:
                results.append(per(*call, **call_kw))
        elif direct:
            # straight into the funnel: the per-element op is below autograd already (the
            # foreach op passed it), so the C++ round trip would only add its cost
            results.append(_tensor._dispatch(per, tuple(call), call_kw))
        else:
            results.append(per(*call, **call_kw))   # a composite (maximum_: op, then copy_)
    if plan.mutates:
        # the version counters of the tensors written, once per tensor as on the CPU (calls made
        # inside __torch_dispatch__, NeuronMode's too, skip ADInplaceOrView: autograd's
        # saved-tensor check relies on these to refuse a backward through a tensor the optimizer
        # changed)
        for (is_list, _scalars, _name), arg, schema_arg in zip(spec, args, func._schema.arguments):
            if is_list and schema_arg.name in plan.mutates:
                for t in arg:
                    increment_version(t)
    if plan.mutates and not any(plan.ret_alias):
        return None
    return results
