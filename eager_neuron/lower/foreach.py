"""The `_foreach_*` ops used by optimizers: one per-tensor op per list element, same funnel.

`_foreach_add_.List(self, other, alpha)` runs `add_.Tensor(self[i], other[i], alpha)` for each i.
Adaptive eager fuses the resulting runs; plain eager pays one launch per element.
"""

from __future__ import annotations

import torch

_OVERLOAD = {"List": "Tensor", "Scalar": "Scalar", "ScalarList": "Scalar", "Tensor": "Tensor",
             "default": "default", "ScalarAndTensor": "Scalar", "Scalar_out": "Scalar"}
_BASE: dict = {}


def _per_tensor_op(func):
    """(per-element OpOverload, which schema args are lists) for a _foreach_ overload."""
    hit = _BASE.get(func)
    if hit is not None:
        return hit
    schema = func._schema
    base = schema.name.split("::")[1][len("_foreach_"):]          # "add_" / "add"
    packet = getattr(torch.ops.aten, base)
    ov = schema.overload_name or "default"
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
    per = None
    for c in candidates:
        if c in packet.overloads():
            per = getattr(packet, c)
            break
    if per is None:
        raise NotImplementedError(f"no per-tensor op for {schema.name}.{ov}")
    lists = tuple(i for i, a in enumerate(schema.arguments)
                  if str(a.type).startswith(("Tensor[]", "Tensor(a!)[]", "Tensor(a)[]",
                                             "List[Tensor]", "float[]", "Scalar[]", "complex[]",
                                             "List[float]", "List[Scalar]")))
    _BASE[func] = (per, lists, schema.returns and len(schema.returns) > 0)
    return _BASE[func]


def run_foreach(func, plan, args, kwargs, mode):
    try:
        per, lists, returns = _per_tensor_op(func)
    except NotImplementedError as exc:
        from ..dispatch import run_fallback

        return run_fallback(func, plan, args, kwargs, mode, why=str(exc))
    n = len(args[0])
    results = []
    for i in range(n):
        call = tuple(a[i] if j in lists else a for j, a in enumerate(args))
        call_kw = {}
        for k, v in kwargs.items():
            call_kw[k] = v
        if mode is not None:
            with mode:
                results.append(per(*call, **call_kw))
        else:
            results.append(per(*call, **call_kw))
    if plan.mutates and not any(plan.ret_alias):
        return None
    return results
