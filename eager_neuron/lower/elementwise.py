"""Elementwise lowerings: unary, binary, ternary ops with broadcasting and type promotion.

Each op is an expression over its schema argument names; `T(..)` is the compute type. Tensor
arguments become loaded operands, Scalar arguments become kernel scalars, so `add.Tensor` and
`add.Scalar` share one template and a new alpha value does not recompile. A one-element tensor
operand of a larger output is passed as a scalar too (one kernel for `x * t` and `x * 2.0`).

    1. template analysis (names used, compute type, casts, rendered expression): once per
       (overload, template, argument types), cached in _SPECS
    2. per call: operand kinds (flat / one / nd), numpy views, scalars -> launch
Helpers with integer and float forms (`_div_floor_i` / `_div_floor_f`, ...) are chosen by the
compute type at render time; integer division by zero raises ZeroDivisionError like the CPU.

>>> import torch, eager_neuron
>>> (torch.tensor([7, -7], device="neuron") // 2).tolist()
[3, -4]
"""

from __future__ import annotations

import functools
import re

import torch

from .. import adaptive_fast as _adaptive_fast
from .. import cost as _cost
from .. import errors
from ..adaptive import MODULE as _adaptive
from ..buffers import _span as _byte_extent
from ..cache.families import ELEMENTWISE
from ..context import _TLS as _ctx_tls
from ..elementwise_base import PARALLEL_MIN, PRELUDE, PRELUDE_ID, SPECIAL_PRELUDE  # noqa: F401
from ..elementwise_base import SPECIAL_RE as _SPECIAL_RE
from ..kernels import compile as kc
from ..kernels import vmath as _vmath
from ..launch import launch
from . import cells as _cells
from .common import _CHECKED_SCALAR_OPS as _CHECKED
from .common import I64_END, I64_MIN, NP_TYPE, coalesce, kernel_int
from .elementwise_ops import OPS

# the op table (op -> template, compute rule, argument casts) and its template helpers live in
# lower/elementwise_ops.py; the njit helpers the templates call in kernels/elementwise_prelude.py

_HELPERS = ("_div_trunc", "_div_floor", "_rem", "_fmod", "_pow", "_shl", "_shr", "_gcd")
_HELPER_RE = re.compile(r"\b(" + "|".join(_HELPERS) + r")\(")
# the integer helpers that raise (division by zero): such a kernel can fail after some stores
_FAULTS_RE = re.compile(r"\b_(div_trunc|div_floor|rem|fmod)_i\(")
# PARALLEL_MIN, the preludes (PRELUDE, SPECIAL_PRELUDE: added only when an expression calls a
# special function) and their digest PRELUDE_ID come from elementwise_base.py, which adaptive
# eager's flush and compile/ read too; the source is rendered by the key's type
# (cache/families.py ELEMENTWISE), from the key alone
_RENDER = ELEMENTWISE.render
IN_PLACE_LOOPS = [True]   # in-place ops' kernels read x0 from the output (False: A/B switch)
_FLOATS = frozenset({torch.float32, torch.float64})


# ---------------------------------------------------------------------------------------------
# template analysis, once per (op, template, argument types)
# ---------------------------------------------------------------------------------------------

class _Spec:
    """What a call's argument types fix: operands, the rendered expression, casts, the store."""

    __slots__ = ("tensors", "scalars", "expr", "loads", "scalar_casts", "store", "T", "flops",
                 "engine", "special", "faults")

    def __init__(self, tensors, scalars, expr, loads, scalar_casts, store, T, flops, engine,
                 special=False):
        self.tensors = tensors            # schema names loaded from arrays, in order x0, x1, ..
        self.scalars = scalars            # schema names passed as kernel scalars c0, c1, ..
        self.expr = expr
        self.loads = loads                # per tensor: numpy cast applied on load
        self.scalar_casts = scalar_casts  # per scalar
        self.store = store
        self.T = T
        self.flops = flops
        self.engine = engine
        self.special = special            # calls a special-function helper (SPECIAL_PRELUDE)
        self.faults = bool(_FAULTS_RE.search(expr))   # may raise inside the kernel


_NAMES: dict = {}   # (id(overload), template) -> the names the template uses, schema order
_SPECS: dict = {}   # (id(overload), op, template, out dtype, per-name type, as-scalar) -> _Spec


def _template_names(template: str, arg_names: tuple) -> tuple:
    key = (template, arg_names)
    names = _NAMES.get(key)
    if names is None:
        # NOTE: a name after '.' is an attribute (math.exp), never an argument
        names = tuple(nm for nm in arg_names
                      if re.search(r"(?<![\w.])%s\b" % re.escape(nm), template))
        _NAMES[key] = names
    return names


def _render_expr(template: str, subst: dict) -> str:
    if not subst:
        return template
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, subst)) + r")\b")
    return pattern.sub(lambda m: subst[m.group(1)], template)


def _np(t: torch.Tensor):
    return t.numpy(force=True)


def _type_of(v):
    return v.dtype if isinstance(v, torch.Tensor) else type(v)


# Integer-only ops: the CPU refuses other dtypes by name ("bitwise_and_cpu" not implemented for
# 'Float'); decided here, before a compile (a float `&` used to fail inside Numba's typing).
# op -> (the CPU kernel's name, bool allowed)
_INT_ONLY = {"aten::bitwise_and": ("bitwise_and_cpu", True),
             "aten::bitwise_or": ("bitwise_or_cpu", True),
             "aten::bitwise_xor": ("bitwise_xor_cpu", True),
             "aten::bitwise_left_shift": ("lshift_cpu", False),
             "aten::bitwise_right_shift": ("rshift_cpu", False),
             "aten::gcd": ("gcd_cpu", False), "aten::lcm": ("lcm_cpu", False)}


# Ops the CPU refuses on bool tensors (a bool result here would be an answer the CPU never
# gives): op -> the CPU kernel's name (NotImplementedError), or the CPU's RuntimeError text
_NO_BOOL = {"aten::abs": "abs_cpu", "aten::floor": "floor_vml_cpu",
            "aten::ceil": "ceil_vml_cpu", "aten::trunc": "trunc_vml_cpu",
            "aten::round": "round_vml_cpu", "aten::frac": "frac_cpu",
            "aten::relu": RuntimeError("Boolean inputs not supported for relu")}


def _check_no_bool(op_name: str, a: dict) -> None:
    x = a.get("self")
    if isinstance(x, torch.Tensor) and x.dtype == torch.bool:
        refusal = _NO_BOOL[op_name]
        if isinstance(refusal, Exception):
            raise refusal
        raise errors.NotImplementedForDtype(refusal, torch.bool)


# Ops whose CPU kernel has no instance for the operands' common dtype (torch.result_type of
# the two operands, before any int-to-float promotion of the result): op -> (operand names,
# the kernel's name, whether integers are refused too (else only bool)). The CPU raises
# NotImplementedError naming the kernel and the common dtype.
_COMMON_REFUSE = {
    "aten::hypot": (("self", "other"), "hypot_cpu", True),
    "aten::nextafter": (("self", "other"), "nextafter_cpu", True),
    "aten::igamma": (("self", "other"), "igamma_cpu", True),
    "aten::igammac": (("self", "other"), "igammac_cpu", True),
    "aten::floor_divide": (("self", "other"), "div_floor_cpu", False),
    "aten::remainder": (("self", "other"), "remainder_cpu", False),
    "aten::fmod": (("self", "other"), "fmod_cpu", False),
    "aten::lerp": (("self", "end"), None, True),
    "aten::pow": (("self", "exponent"), "pow", False),
    "aten::div": (("self", "other"), None, False),
    "aten::logaddexp": (("self", "other"), "logaddexp_cpu", True),
    "aten::logaddexp2": (("self", "other"), "logaddexp2_cpu", True),
}


def _check_common_refusal(op_name: str, a: dict) -> None:
    names, kernel, ints_too = _COMMON_REFUSE[op_name]
    x, y = (a.get(nm) for nm in names)
    if not (isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor)):
        return
    if op_name == "aten::pow" and not isinstance(y, torch.Tensor):
        return   # pow(Tensor, Scalar) special-cases its exponent (mask ** True is the mask)
    if op_name == "aten::div":   # true division promotes to float; the rounding modes do not
        if a.get("rounding_mode") is None:
            return
        kernel = f"div_{a['rounding_mode']}_cpu"
    common = torch.result_type(x, y) if y is not None else x.dtype
    w = a.get("weight") if op_name == "aten::lerp" else None
    if isinstance(w, torch.Tensor) and isinstance(x, torch.Tensor):
        # a 0-d weight tensor takes part in the promotion: lerp(ints, ints, tensor(0.5)) is a
        # float lerp on the CPU (a weight of other dims must be self's dtype: meta refuses)
        common = torch.result_type(torch.empty((), dtype=common).expand(1), w)
    if common.is_floating_point or common.is_complex or (common != torch.bool and not ints_too):
        return
    if kernel is None:   # lerp: by the weight's kind
        kernel = "lerp_kernel_tensor" if isinstance(a.get("weight"), torch.Tensor) \
            else "lerp_kernel_scalar"
    raise errors.NotImplementedForDtype(kernel, common)


def _check_int_only(op_name: str, dtype) -> None:
    kernel, bool_ok = _INT_ONLY[op_name]
    if dtype.is_floating_point or dtype.is_complex or (dtype == torch.bool and not bool_ok):
        raise errors.NotImplementedForDtype(kernel, dtype)


# ATen's sub_check (BinaryOps.h): subtraction refuses bool operands; a Python bool is wrapped
# into a bool tensor first, so `mask - True` is the two-bool case
_SUB_OPS = frozenset({"aten::sub", "aten::rsub"})


def _is_bool(v) -> bool:
    return type(v) is bool or (isinstance(v, torch.Tensor) and v.dtype == torch.bool)


def _check_sub(a: dict) -> None:
    self_b, other_b = _is_bool(a.get("self")), _is_bool(a.get("other"))
    if self_b and other_b:
        raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not "
                           "supported. Use the `^` or `logical_xor()` operator instead.")
    if self_b or other_b:
        raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported. "
                           "If you are trying to invert a mask, use the `~` or `logical_not()` "
                           "operator instead.")


# Binary ops whose Python-number operand ATen wraps into a tensor that takes part in type
# promotion (a Python int in [2**63, 2**64) arrives as a uint64 Scalar). Their arguments that
# do not promote (alpha, a where's condition) are left out by name.
_WRAPPED_PROMOTE = frozenset({
    "aten::add", "aten::sub", "aten::rsub", "aten::mul", "aten::div", "aten::true_divide",
    "aten::floor_divide", "aten::remainder", "aten::fmod", "aten::pow", "aten::bitwise_and",
    "aten::bitwise_or", "aten::bitwise_xor", "aten::bitwise_left_shift",
    "aten::bitwise_right_shift", "aten::where"})
_PROMOTED_ARGS = ("self", "other", "exponent")


def _check_uint64_promotion(a: dict) -> None:
    """The CPU's refusal of a uint64 Scalar (a Python int >= 2**63) against bool tensors only:
    c10's promoteTypes(Bool, UInt64) raises, while an integer tensor takes the value modulo
    2**64 (lower/common.py kernel_int)."""
    tensors = [a[nm] for nm in _PROMOTED_ARGS if isinstance(a.get(nm), torch.Tensor)]
    if tensors and all(t.dtype == torch.bool for t in tensors):
        raise RuntimeError("Promotion for uint16, uint32, uint64 types is not supported, "
                           "attempted to promote Bool and UInt64")


def _build_spec(op_name: str, template: str, rule: str, arg_casts: dict, a: dict, names: tuple,
                as_scalar: tuple, out_dtype) -> _Spec:
    """`as_scalar[i]`: tensor operand i is a kernel scalar (a compiled graph's CPU scalar
    tensor, compile/codegen.py); eager calls pass none (see _spec_for)."""
    if op_name in _INT_ONLY:
        _check_int_only(op_name, out_dtype)
    if op_name == "aten::round" and "decimals" in a and not (
            a["self"].dtype.is_floating_point or a["self"].dtype.is_complex):
        # round.decimals has no integer/bool kernel (round.default copies an integer tensor)
        raise errors.NotImplementedForDtype("round_cpu" if a["decimals"] else "round_vml_cpu",
                                            a["self"].dtype)
    if op_name == "aten::addcmul" and out_dtype == torch.bool:
        raise errors.NotImplementedForDtype("addcmul_cpu_out", torch.bool)
    if op_name in _NO_BOOL:
        _check_no_bool(op_name, a)
    if op_name in _SUB_OPS:
        _check_sub(a)
    if op_name in _COMMON_REFUSE:
        _check_common_refusal(op_name, a)
    if op_name == "aten::heaviside" and a["self"].dtype != a["values"].dtype:
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")
    bad = [v.dtype for v in (*(a[nm] for nm in names), torch.empty(0, dtype=out_dtype))
           if isinstance(v, torch.Tensor) and v.dtype not in NP_TYPE]
    if bad:
        raise NotImplementedError(f"no elementwise kernel for {bad[0]}")
    # 1. compute type, from the original operands (a (1,)-shaped tensor still promotes fully)
    if rule == "out":
        ctype = out_dtype
    elif rule == "out_float":
        self_t = a["self"].dtype
        ctype = self_t if self_t.is_floating_point else torch.float32
    elif rule == "common":
        vals = [a[nm] for nm in names]
        ctype = torch.result_type(*vals) if len(vals) == 2 else vals[0].dtype
    elif rule == "bool":
        ctype = torch.bool
    else:
        ctype = None
    T = NP_TYPE[ctype] if ctype is not None else ""
    # 2. operands: tensors are loaded from arrays, scalars (and as_scalar tensors) are not
    tensors = tuple(nm for i, nm in enumerate(names)
                    if isinstance(a[nm], torch.Tensor) and not as_scalar[i])
    scalars = tuple(nm for nm in names if nm not in tensors)
    loads = tuple("np.bool_" if arg_casts.get(nm) == "bool" else T for nm in tensors)
    scalar_casts = []
    for nm in names:
        if nm in tensors:
            continue
        v = a[nm]
        if arg_casts.get(nm) == "bool":
            scalar_casts.append("np.bool_")
        elif T:
            scalar_casts.append(T)
        elif isinstance(v, torch.Tensor):
            scalar_casts.append(NP_TYPE[v.dtype])
        else:
            scalar_casts.append(_py_cast(v))
    # 3. the expression: names -> x_i / c_j, T(..) -> the compute type, helpers by kind
    subst = {nm: f"x{i}" for i, nm in enumerate(tensors)}
    subst.update({nm: f"c{j}" for j, nm in enumerate(scalars)})
    expr = _render_expr(template, subst)
    kind = "_f" if ctype in _FLOATS else "_i"
    expr = _HELPER_RE.sub(lambda m: f"{m.group(1)}{kind}(", expr)
    special = bool(_SPECIAL_RE.search(expr))
    if special:
        if ctype not in _FLOATS:
            raise NotImplementedError(f"{op_name}: special functions compute in float32/64")
        expr = _SPECIAL_RE.sub(lambda m: f"{m.group(1)}_{T.split('.')[1]}(", expr)
    expr = re.sub(r"(?<![\w.])T\(", f"{T or 'np.float64'}(", expr)
    engine = "scalar" if "math." in expr else "vector"
    if T == "np.float32":
        # no SVML in PyPI llvmlite: libm calls never vectorize; these polynomials do (1-2 ulp)
        expr = _vmath.vectorize_math(expr)
    store = "({}) != 0" if out_dtype == torch.bool else f"{NP_TYPE[out_dtype]}({{}})"
    return _Spec(tensors, scalars, expr, loads, tuple(scalar_casts), store, T,
                 max(1, expr.count("(")), engine, special)


def _spec_for(func, a: dict, out_dtype, op_name: str):
    """The call's _Spec (cached per argument types) and the numpy views of its tensor operands.
    A one-element tensor operand is a tensor operand the kernel reads (kind "one"), never a
    value read on the host: a fast-path replay reads it in its kernel, adaptive eager may have
    it pending, and fast and slow calls share one kernel (it was a kernel scalar once, so
    `x * t` shared the kernel of `x * 2.0`, and never repeated from a runner)."""
    entry = OPS[op_name]
    template, rule = entry[0], entry[1]
    if callable(template):
        template = template(a)
    # id(func), not func: OpOverload.__hash__ is Python code
    names = _NAMES.get((id(func), template))
    if names is None:
        names = _NAMES[(id(func), template)] = _template_names(template, tuple(a))
    types, nps = [], {}
    for nm in names:
        v = a[nm]
        if isinstance(v, torch.Tensor):
            arr = nps[nm] = v.numpy(force=True)
            types.append(arr.dtype)
        else:
            types.append(type(v))
    key = (id(func), op_name, template, out_dtype, tuple(types))
    spec = _SPECS.get(key)
    if spec is None:
        spec = _SPECS[key] = _build_spec(op_name, template, rule, entry[2] if len(entry) > 2
                                         else {}, a, names, (False,) * len(names), out_dtype)
    return spec, nps


def lower_elementwise(func, a: dict, outs: list, op_name: str, defer: bool = False):
    """Run (or record) one elementwise op. defer=True returns the launch instead, as
    launch()'s positional arguments (dispatch launches it: one call less on the hot path);
    None when there is nothing left to launch (empty, or recorded by adaptive eager)."""
    # NOTE: the per-call work reads numpy attributes (shape, size, flags): much cheaper than
    # torch's Python bindings. numpy(force=True): under NeuronMode an operand may be a CPU
    # tensor that requires grad; force only detaches here (a CPU buffer, never conj/neg).
    out = outs[0]
    out_np = out.numpy(force=True)
    n = out_np.size
    if n == 0:
        return
    # 1. the spec, per argument types
    ctx = getattr(_ctx_tls, "ctx", None)
    armed = ctx is not None and ctx.recording
    spec, nps = _spec_for(func, a, out.dtype, op_name)
    return _request(func, a, outs, op_name, defer, out_np, n, spec, nps, ctx, armed)


def _request(func, a: dict, outs: list, op_name: str, defer: bool, out_np, n: int, spec: _Spec,
             nps: dict, ctx, armed: bool):
    """lower_elementwise from its spec on: operand kinds, views and scalars, then the launch
    (or its request, defer=True; or the op recorded by adaptive eager)."""
    out = outs[0]
    tensors = spec.tensors
    if ctx is not None and ctx.capture is not None and spec.faults:
        # the fast path is learning this op: a kernel that can raise cannot be replayed from
        # the captured launch
        ctx.capture = None
    # 2. operand kinds: flat (same shape, contiguous), one (single element), nd (broadcast)
    shape = out_np.shape
    out_contig = out_np.flags.c_contiguous
    kinds = []
    flat = out_contig
    in_bytes = 0
    for nm in tensors:
        arr = nps[nm]
        in_bytes += arr.nbytes
        if arr.size == 1 and n != 1:
            kinds.append("one")
        elif out_contig and arr.shape == shape and arr.flags.c_contiguous:
            kinds.append("flat")
        else:
            kinds.append("nd")
            flat = False
    if flat:
        rank = 1
        arrays = [out_np.reshape(-1)] + [nps[nm].reshape(-1) for nm in tensors]
    else:
        kinds = ["one" if k == "one" else "nd" for k in kinds]
        shape = out.shape
        expanded = [a[nm].expand(shape) if kinds[i] == "nd" else None
                    for i, nm in enumerate(tensors)]
        strides = [out.stride()] + [e.stride() for e in expanded if e is not None]
        cshape, cstrides = coalesce(tuple(shape), strides)
        rank = len(cshape)
        arrays = [_np(out.as_strided(cshape, cstrides[0], out.storage_offset()))]
        j = 1
        for i, nm in enumerate(tensors):
            if kinds[i] == "nd":
                e = expanded[i]
                arrays.append(_np(e.as_strided(cshape, cstrides[j], e.storage_offset())))
                j += 1
            else:
                arrays.append(nps[nm].reshape(-1))
    kinds = tuple(kinds)
    # 3. scalars: runtime arguments (a new alpha never recompiles), cast inside the kernel
    scalar_vals = []
    for j, nm in enumerate(spec.scalars):
        v = a[nm]
        if isinstance(v, bool) or v is None:
            v = bool(v)
        elif type(v) is int and (op_name in _CHECKED or not I64_MIN <= v < I64_END):
            # beyond int64: converted as ATen does (lower/common.py kernel_int)
            if v >= I64_END and op_name in _WRAPPED_PROMOTE and nm in _PROMOTED_ARGS:
                _check_uint64_promotion(a)
            v = kernel_int(v, spec.scalar_casts[j], op_name)
        scalar_vals.append(v)
    expr, loads, scalar_casts, store = spec.expr, spec.loads, spec.scalar_casts, spec.store
    parallel = n >= PARALLEL_MIN and kc.parallel_allowed()
    if armed:
        if spec.faults:
            # an op that can raise mid-kernel (integer division by zero) is never recorded:
            # what is pending launches first, then this op alone, so its error comes from its
            # own line with nothing half-written (see docs/ARCHITECTURE.md, adaptive eager)
            _adaptive.flush("op that can fault")
        elif rank == 1 and not spec.special:
            # adaptive eager: append to the pending fused group instead of launching
            operands = [(arrays[1 + i], a[nm]) for i, nm in enumerate(tensors)]
            if _adaptive.record(op_name, expr, kinds, loads, scalar_casts, store,
                                (arrays[0], out), operands, tuple(scalar_vals), n,
                                blocks=ctx.blocks, core=ctx.core):
                _adaptive_fast.learn(out, spec, kinds, n, op_name, ctx)   # a repeat skips it
                return
        else:
            _adaptive.flush("special function" if spec.special else
                            "strided or broadcast operand")

    # the key names every field the source depends on (cache/families.py ELEMENTWISE); the
    # source is rendered from it alone, only on a memory miss
    # an in-place op (the output is operand 0's memory, same dtype: `x.add_(y)`) gets a loop
    # that reads x0 from the output (kernels/elementwise.py _in_place_loop: it vectorizes)
    in_place = (IN_PLACE_LOOPS[0] and rank == 1 and bool(tensors) and kinds[0] == "flat" and
                out.dtype == a[tensors[0]].dtype and out.data_ptr() == a[tensors[0]].data_ptr())
    key = ("elementwise", op_name, expr, kinds, rank, loads, scalar_casts, store, parallel,
           PRELUDE_ID, in_place)
    # the cost model's elementwise work (cost.py) for the output; the operands as stored (a
    # broadcast operand is read once)
    flops, out_bytes = _cost.elementwise_work(n, (), out_np.itemsize, spec.flops)
    req = (key, functools.partial(_RENDER, key), (*arrays, *scalar_vals), flops,
           out_bytes + in_bytes, spec.engine)
    if defer:
        return req
    launch(*req)


# -- the half route in one kernel ---------------------------------------------------------------
# A bfloat16/float16 elementwise op is computed in float32 and rounded back (lower/half.py): the
# route's three kernels (operands cast up into float32 scratch, the float32 op, the result cast
# down) become one when every operand and the output can be read and written as half bits in
# the float32 op's own kernel: the same float32 expression, operands loaded exactly as the cast
# up writes them, the result stored rounded as the cast down writes it (kernels/halfround.py
# HALF_IO), so the same bits. ONE_KERNEL[0] = False: the three kernels (A/B switch, tests).
ONE_KERNEL = [True]
_HALF_IO = {torch.bfloat16: ("_ld_bf16", "_st_bf16({})"),
            torch.float16: ("_ld_f16", "_st_f16({})")}
_STANDIN = torch.zeros((), dtype=torch.float32)   # float32 operands for the spec (never read)
_HALF_SPECS: dict = {}   # (float32 spec, half dtype, which operands are half, half out)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype in _HALF_IO else t


def _aliases_badly(out: torch.Tensor, v: torch.Tensor) -> bool:
    """Does operand v share memory with out other than as the same elements (an in-place op's
    self)? One pass reads v[i] and writes out[i] in order: only identical layouts are safe."""
    if v.numel() == 0 or out.numel() == 0:
        return False
    if v.data_ptr() == out.data_ptr() and v.shape == out.shape and v.stride() == out.stride():
        return False
    lo, hi = _byte_extent(out)
    vlo, vhi = _byte_extent(v)
    return vlo < hi and lo < vhi


def prepare_half(func, a: dict, outs: list, op_name: str):
    """The launch request of a half-type elementwise call as one kernel (see ONE_KERNEL), None
    when there is nothing to launch, or False when the call takes the route's three kernels:
    an operand or output of another float type, a compute type other than float32, memory
    shared between an operand and the output, or adaptive eager recording."""
    if len(outs) != 1 or not ONE_KERNEL[0]:
        return False
    out = outs[0]
    half = out.dtype if out.dtype in _HALF_IO else None
    if half is None and out.dtype != torch.bool:
        return False
    ctx = getattr(_ctx_tls, "ctx", None)
    if ctx is not None and ctx.recording:
        return False
    fa = {}
    halves = []
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            if _aliases_badly(out, v):
                return False
            if v.dtype in _HALF_IO:
                if half is None:
                    half = v.dtype
                elif v.dtype != half:
                    return False
                halves.append(k)
                v = _STANDIN.expand(v.shape)
            elif v.dtype.is_floating_point or v.dtype.is_complex:
                return False
        elif isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            return False
        fa[k] = v
    if not halves:
        return False
    out_np = _bits(out).numpy(force=True)
    n = out_np.size
    if n == 0:
        return None
    spec, _ = _spec_for(func, fa, out.dtype if out.dtype == torch.bool else torch.float32,
                        op_name)
    key = (spec, half, tuple(halves), out.dtype == half)   # (the spec itself: never an id reused)
    hspec = _HALF_SPECS.get(key)
    if hspec is None:
        hspec = _HALF_SPECS[key] = _half_spec(spec, half, halves, out.dtype == half)
    if hspec is False:
        return False
    ba = {k: _bits(v) if k in halves else v for k, v in a.items()}
    nps = {nm: ba[nm].numpy(force=True) for nm in hspec.tensors}
    return _request(func, ba, [_bits(out)], op_name, True, out_np, n, hspec, nps, ctx, False)


def _half_spec(spec: _Spec, half, halves: list, half_out: bool):
    """The float32 spec reading the half operands as bits and storing half bits, or False."""
    if spec.T != "np.float32" or spec.faults:
        return False
    load, store = _HALF_IO[half]
    loads = []
    for nm, ld in zip(spec.tensors, spec.loads):
        if nm in halves:
            if ld != "np.float32":
                return False
            ld = load
        loads.append(ld)
    if not half_out:
        store = spec.store
    elif spec.store != "np.float32({})":
        return False
    return _Spec(spec.tensors, spec.scalars, spec.expr, tuple(loads), spec.scalar_casts, store,
                 spec.T, spec.flops, spec.engine, spec.special)


def fast_facts(func, a: dict, outs: list, op_name: str):
    """For eager_neuron.fastpath, after a plain-eager call was prepared: (tensor operand names
    in kernel order, kernel scalar names, scalar values change the kernel) or None when a
    repeat must come back here (an op that can fault inside the kernel)."""
    out = outs[0]
    spec, _ = _spec_for(func, a, out.dtype, op_name)
    if spec.faults:
        return None
    # keyed by value: a template built per call, or scalars range-checked on the host per call
    # (kernel_int: an int bound beyond an integer tensor's dtype raises, as on the CPU)
    return spec.tensors, spec.scalars, (callable(OPS[op_name][0]) and op_name not in _TYPE_KEYED
                                        or op_name in _CHECKED
                                        or op_name in _FILL)


# these ops' number is range-checked before the kernel (refusals.py: uint8 fill_(256) raises):
# their runners are keyed by value, so a new value comes back through the check (by value for
# every dtype: the fast path keys an op's runners one way)
_FILL = frozenset({"aten::fill", "aten::fill_", "aten::masked_fill", "aten::masked_fill_",
                   "aten::full_like"})


# Templates built per call (callable) may read a number's value (pow's special exponents,
# round's decimals, polygamma's order): their runners are keyed by value. These read only
# argument types, None-ness and strings (which a signature holds anyway): keyed by type, so
# an optimizer's per-step scalars (div_ by the bias correction) reuse one runner.
_TYPE_KEYED = frozenset({
    "aten::div", "aten::floor_divide", "aten::clamp", "aten::clamp_min", "aten::clamp_max",
    "aten::nan_to_num", "aten::logit", "aten::gelu", "aten::gelu_backward",
    "aten::bitwise_left_shift", "aten::bitwise_right_shift",
})


def _py_cast(v) -> str:
    if isinstance(v, bool) or v is None:
        return "np.bool_"
    if isinstance(v, int):
        return "np.int64"
    return "np.float64"


def _make(op_name: str):
    # NOTE: a functools.partial, not a closure: no Python frame between dispatch and
    # lower_elementwise (the hot path)
    lower = functools.partial(lower_elementwise, op_name=op_name)
    lower.__name__ = f"lower_{op_name.split('::')[1]}"
    lower.prepare = functools.partial(lower_elementwise, op_name=op_name, defer=True)
    lower.prepare_half = functools.partial(prepare_half, op_name=op_name)
    lower.fast_facts = functools.partial(fast_facts, op_name=op_name)
    return lower


LOWERINGS = {name: _make(name) for name in OPS}

LOWERINGS.update(_cells.LOWERINGS)   # LSTM/GRU cells, frexp (several outputs)
