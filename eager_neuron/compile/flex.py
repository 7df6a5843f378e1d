"""FlexAttention on neuron: the `flex_attention` / `flex_attention_backward` higher-order ops as
one fused Numba kernel each (flash-attention style), with the dense decomposition behind them.
(Over 500 lines on purpose: the subgraph renderer, the operand staging and the two doors read
one set of block-mask conventions; the kernels' sources are already apart, in kernels/flex.py.)

Why: torch's dense implementation (`sdpa_dense`) materializes the (B, H, L, S) scores and runs
the score_mod and mask_mod as dozens of elementwise kernels over them. Here the two subgraphs
(FX graphs of scalar ops on score, b, h, q_idx, kv_idx and captured buffers) are rendered into
Numba scalar code inside one kernel that walks the block mask: only the kv blocks listed for a
query block are visited (`kv_indices`), the mask_mod runs in partial blocks only (`full_kv_*`
blocks skip it), and softmax is online (running max, rescaled sum), so scores exist one
(query block, kv block) tile at a time. The kernel sources are kernels/flex.py's.

Both doors use it: eager (the HOP's NeuronTensor py_impl, compile/__init__.py) and a graph
compiled by the neuron backend (compile/program.py runs the HOP node through `forward` /
`backward`). Whatever the kernel cannot do falls back to the dense path with a counted reason
(`stats()["fallbacks"]`): a subgraph op with no rendering, a dtype other than float32/float64,
a captured buffer that needs a gradient, a kernel that fails to build.

Results match the HOP's: forward (out, logsumexp / ln 2, max score / ln 2), fully masked rows
give out 0 and logsumexp -inf; backward (dq, dk, dv, captured-buffer grads = None).
Accumulation is in the input's dtype (float32: torch's dense path does the same), exp in float32
is kernels/vmath.py's branch-free one.

>>> import torch, torch._dynamo, eager_neuron     # (dynamo's import lets neuron in)
>>> from torch.nn.attention.flex_attention import flex_attention
>>> q = torch.ones(1, 1, 4, 2, device="neuron")
>>> flex_attention(q, q, q).cpu()[0, 0, 0].tolist()
[1.0, 1.0]
"""

from __future__ import annotations

import importlib
import math
import operator
from collections import Counter

import numpy as np
import torch

from ..kernels import flex as kf
from ..kernels import matmul as km
from ..launch import launch

_HOPS = "torch._higher_order_ops.flex_attention"
_LN2 = math.log(2.0)


class FlexStats:
    """Counters: fused launches per direction, dense fallbacks by reason."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.fused_forward = 0
        self.fused_backward = 0
        self.dense_forward = 0
        self.dense_backward = 0
        self.fallbacks: Counter = Counter()

    def snapshot(self) -> dict:
        return {"fused_forward": self.fused_forward, "fused_backward": self.fused_backward,
                "dense_forward": self.dense_forward, "dense_backward": self.dense_backward,
                "fallbacks": dict(self.fallbacks)}


FSTATS = FlexStats()
ENABLED = [True]      # tools/bench_flex.py turns the fused kernels off to time the dense path


def stats() -> dict:
    """FlexAttention counters (also under eager_neuron.compile.stats()["flex"])."""
    return FSTATS.snapshot()


class Unsupported(Exception):
    """The fused kernel cannot run this call: the message is the counted reason."""


# ---------------------------------------------------------------------------------------------
# subgraph rendering: an FX graph of scalar ops -> lines of Numba scalar code
# ---------------------------------------------------------------------------------------------

aten = torch.ops.aten
# value kinds: "f" the compute float type T, "i" int64, "b" bool
_ARITH = {"add": "+", "sub": "-", "mul": "*"}
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_FLOAT_FN = {"exp": "np.exp", "log": "np.log", "tanh": "np.tanh", "sqrt": "np.sqrt",
             "sin": "np.sin", "cos": "np.cos", "log1p": "np.log1p", "expm1": "np.expm1"}
# call targets (aten overloads, operator.*, torch.*, tensor methods) -> one op name
_NAMES: dict = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
    operator.floordiv: "floordiv", operator.mod: "mod", operator.neg: "neg",
    operator.pow: "pow", operator.abs: "abs", operator.eq: "eq", operator.ne: "ne",
    operator.lt: "lt", operator.le: "le", operator.gt: "gt", operator.ge: "ge",
    operator.and_: "and", operator.or_: "or", operator.xor: "xor", operator.invert: "not",
    operator.getitem: "index", torch.where: "where", torch.abs: "abs", torch.neg: "neg",
    torch.minimum: "minimum", torch.maximum: "maximum", torch.clamp: "clamp",
    torch.logical_and: "and", torch.logical_or: "or", torch.logical_not: "not",
    torch.sigmoid: "sigmoid",
}
for _n in _FLOAT_FN:
    _NAMES[getattr(torch, _n)] = _n
_ATEN = {
    "add": "add", "sub": "sub", "rsub": "rsub", "mul": "mul", "div": "div", "neg": "neg",
    "abs": "abs", "pow": "pow", "remainder": "mod", "floor_divide": "floordiv",
    "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
    "logical_and": "and", "logical_or": "or", "logical_xor": "xor", "logical_not": "not",
    "bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "xor", "bitwise_not": "not",
    "where": "where", "index": "index", "minimum": "minimum", "maximum": "maximum",
    "clamp": "clamp", "sigmoid": "sigmoid", "_to_copy": "cast", "alias": "same",
    "detach": "same", "clone": "same", "lift_fresh_copy": "same", "scalar_tensor": "const",
    "new_ones": "ones", "new_zeros": "zeros", "ones": "ones", "zeros": "zeros",
    "full": "full", "convert_element_type": "cast", "tanh_backward": "tanh_backward",
    "sigmoid_backward": "sigmoid_backward",
    **{n: n for n in _FLOAT_FN},
}
_METHODS = {"abs": "abs", "neg": "neg", "exp": "exp", "log": "log", "tanh": "tanh",
            "sigmoid": "sigmoid", "clamp": "clamp", "to": "cast", "new_ones": "ones",
            "new_zeros": "zeros", "logical_and": "and", "logical_or": "or",
            "logical_not": "not", "sqrt": "sqrt", "__getitem__": "index"}


def _kind_of_dtype(dtype) -> str:
    if dtype == torch.bool:
        return "b"
    if dtype.is_floating_point:
        return "f"
    if dtype.is_complex:
        raise Unsupported("complex value in a score_mod or mask_mod")
    return "i"


def _op_name(node) -> str:
    t = node.target
    if node.op == "call_method":
        name = _METHODS.get(t)
    elif isinstance(t, torch._ops.OpOverload):
        name = _ATEN.get(t._schema.name.split("::")[-1])
        if t in (aten.div.Tensor_mode, aten.div.Scalar_mode):
            mode = node.kwargs.get("rounding_mode")
            name = {"floor": "floordiv", "trunc": "truncdiv"}.get(mode, "div")
        if t in (aten.add.Tensor, aten.sub.Tensor) and node.kwargs.get("alpha", 1) != 1:
            name = None
    else:
        name = _NAMES.get(t)
    if name is None:
        raise Unsupported(f"score_mod/mask_mod op {getattr(t, '__name__', t)}")
    return name


class _Render:
    """One subgraph's lines. `inputs`: the leading placeholders' (name, kind); the rest are
    captured buffers, rendered as kernel arguments `bufs[k]` (an array or a scalar)."""

    def __init__(self, gm, inputs, bufs, prefix: str) -> None:
        self.lines: list = []
        self.prefix = prefix
        self.n = 0
        env: dict = {}
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(phs) != len(inputs) + len(bufs):
            raise Unsupported("subgraph arity differs from its buffers")
        for node, (name, kind) in zip(phs, inputs):
            env[node] = (name, kind)
        for node, (arg, value) in zip(phs[len(inputs):], bufs):
            if isinstance(value, torch.Tensor):
                kind = _kind_of_dtype(value.dtype)
                env[node] = ("buf", arg, value.dim(), (), kind)
            elif isinstance(value, float):
                env[node] = (f"T({arg})", "f")
            elif isinstance(value, (bool, int)):
                env[node] = (arg, "b" if isinstance(value, bool) else "i")
            else:
                raise Unsupported(f"captured value of type {type(value).__name__}")
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                self.outputs = node.args[0]
                self.env = env
                return
            if node.op not in ("call_function", "call_method"):
                raise Unsupported(f"subgraph node {node.op}")
            env[node] = self._node(node, env)
        raise Unsupported("subgraph without output")

    def result(self, value) -> tuple:
        """(expr, kind) of an output value (a node or a constant)."""
        return self._val(value, self.env)

    def _tmp(self, expr: str, kind: str) -> tuple:
        name = f"{self.prefix}{self.n}"
        self.n += 1
        self.lines.append(f"{name} = {expr}")
        return (name, kind)

    def _val(self, a, env):
        if isinstance(a, torch.fx.Node):
            v = env[a]
            if v[0] == "buf" and v[2] != len(v[3]):
                raise Unsupported("a captured buffer used as a whole")
            if v[0] == "buf":
                idx = ", ".join(v[3]) if v[3] else "0"
                return self._tmp(f"{v[1]}[{idx}]", v[4])
            return v
        if isinstance(a, bool):
            return ("True" if a else "False", "b")
        if isinstance(a, int):
            return (f"np.int64({a})", "i")
        if isinstance(a, float):
            if math.isnan(a):
                return ("T(np.nan)", "f")
            if math.isinf(a):
                return ("T(np.inf)" if a > 0 else "T(-np.inf)", "f")
            return (f"T({a!r})", "f")
        raise Unsupported(f"subgraph constant of type {type(a).__name__}")

    @staticmethod
    def _as(v, kind: str) -> str:
        expr, k = v
        if k == kind:
            return expr
        if kind == "f":
            return f"T({expr})"
        if kind == "i":
            return f"np.int64({expr})"
        return f"({expr} != 0)"

    def _node(self, node, env):
        name = _op_name(node)
        args = list(node.args)
        kw = node.kwargs
        if name == "index":
            return self._index(args, env)
        if name == "same":
            return self._val(args[0], env)
        if name in ("const", "ones", "zeros", "full"):
            dtype = kw.get("dtype")
            if name == "const":
                value = args[0]
            elif name == "full":
                value = args[-1]
            else:
                value = 1 if name == "ones" else 0
            if dtype is None and node.op == "call_method" or name in ("ones", "zeros") and \
                    dtype is None and isinstance(args[0], torch.fx.Node):
                val = node.meta.get("val", node.meta.get("example_value"))
                if val is None:
                    raise Unsupported(f"{name} without a dtype")
                dtype = val.dtype
            kind = _kind_of_dtype(dtype) if dtype is not None else (
                "f" if isinstance(value, float) else "b" if isinstance(value, bool) else "i")
            return self._tmp(self._as(self._val(value, env), kind), kind)
        if name == "cast":
            dtype = kw.get("dtype") or (args[1] if len(args) > 1 else None)
            if not isinstance(dtype, torch.dtype):
                raise Unsupported("a cast to a non-dtype")
            kind = _kind_of_dtype(dtype)
            return self._tmp(self._as(self._val(args[0], env), kind), kind)
        vals = [self._val(a, env) for a in args]
        if name in _ARITH or name == "rsub":
            a, b = vals[:2]
            if name == "rsub":
                a, b = b, a
            kind = "f" if "f" in (a[1], b[1]) else "i"
            return self._tmp(f"{self._as(a, kind)} {_ARITH.get(name, '-')} "
                             f"{self._as(b, kind)}", kind)
        if name == "div":
            return self._tmp(f"{self._as(vals[0], 'f')} / {self._as(vals[1], 'f')}", "f")
        if name in ("floordiv", "mod", "truncdiv"):
            kind = "f" if "f" in (vals[0][1], vals[1][1]) else "i"
            a, b = self._as(vals[0], kind), self._as(vals[1], kind)
            if name == "truncdiv":
                if kind == "f":
                    return self._tmp(f"T(np.trunc({a} / {b}))", kind)
                return self._tmp(f"np.int64(np.trunc({a} / {b}))", kind)
            if kind == "f" and name == "floordiv":
                return self._tmp(f"T(np.floor({a} / {b}))", kind)
            return self._tmp(f"{a} {'//' if name == 'floordiv' else '%'} {b}", kind)
        if name == "pow":
            kind = "f" if "f" in (vals[0][1], vals[1][1]) else "i"
            return self._tmp(f"{self._as(vals[0], kind)} ** {self._as(vals[1], kind)}", kind)
        if name == "neg":
            kind = "i" if vals[0][1] == "b" else vals[0][1]
            return self._tmp(f"-{self._as(vals[0], kind)}", kind)
        if name == "abs":
            kind = "i" if vals[0][1] == "b" else vals[0][1]
            return self._tmp(f"abs({self._as(vals[0], kind)})", kind)
        if name in _FLOAT_FN:
            return self._tmp(f"T({_FLOAT_FN[name]}({self._as(vals[0], 'f')}))", "f")
        if name in ("tanh_backward", "sigmoid_backward"):    # (grad, y = f(x))
            g, y = self._as(vals[0], "f"), self._as(vals[1], "f")
            if name == "tanh_backward":
                return self._tmp(f"{g} * (T(1) - {y} * {y})", "f")
            return self._tmp(f"{g} * {y} * (T(1) - {y})", "f")
        if name == "sigmoid":
            return self._tmp(f"T(1) / (T(1) + T(np.exp(-{self._as(vals[0], 'f')})))", "f")
        if name in _CMP:
            kind = "f" if "f" in (vals[0][1], vals[1][1]) else "i"
            return self._tmp(f"{self._as(vals[0], kind)} {_CMP[name]} "
                             f"{self._as(vals[1], kind)}", "b")
        if name in ("and", "or", "xor"):
            sym = {"and": "&", "or": "|", "xor": "^"}[name]
            bitwise = node.target in (aten.bitwise_and.Tensor, aten.bitwise_or.Tensor,
                                      aten.bitwise_xor.Tensor, operator.and_, operator.or_,
                                      operator.xor)
            kind = "i" if bitwise and "i" in (vals[0][1], vals[1][1]) else "b"
            if kind == "i" and "f" in (vals[0][1], vals[1][1]):
                raise Unsupported("a bitwise op on floats")
            return self._tmp(f"{self._as(vals[0], kind)} {sym} {self._as(vals[1], kind)}",
                             kind)
        if name == "not":
            if vals[0][1] == "i" and node.target in (aten.bitwise_not.default, operator.invert):
                return self._tmp(f"~{vals[0][0]}", "i")
            return self._tmp(f"not {self._as(vals[0], 'b')}", "b")
        if name == "where":
            c, a, b = vals[:3]
            kind = "f" if "f" in (a[1], b[1]) else ("i" if "i" in (a[1], b[1]) else "b")
            return self._tmp(f"{self._as(a, kind)} if {self._as(c, 'b')} else "
                             f"{self._as(b, kind)}", kind)
        if name in ("minimum", "maximum"):
            kind = "f" if "f" in (vals[0][1], vals[1][1]) else "i"
            fn = "min" if name == "minimum" else "max"
            return self._tmp(f"{fn}({self._as(vals[0], kind)}, {self._as(vals[1], kind)})",
                             kind)
        if name == "clamp":
            lo = kw.get("min", args[1] if len(args) > 1 else None)
            hi = kw.get("max", args[2] if len(args) > 2 else None)
            v = vals[0]
            for bound, fn in ((lo, "max"), (hi, "min")):
                if bound is None:
                    continue
                bv = self._val(bound, env)
                kind = "f" if "f" in (v[1], bv[1]) else "i"
                v = self._tmp(f"{fn}({self._as(v, kind)}, {self._as(bv, kind)})", kind)
            return v
        raise Unsupported(f"score_mod/mask_mod op {name}")

    def _index(self, args, env):
        base = args[0]
        if not isinstance(base, torch.fx.Node) or env[base][0] != "buf":
            raise Unsupported("indexing a value that is not a captured buffer")
        _, arg, ndim, done, kind = env[base]
        idx = args[1]
        idx = list(idx) if isinstance(idx, (list, tuple)) else [idx]
        exprs = list(done)
        for i in idx:
            if i is None or isinstance(i, slice):
                raise Unsupported("a slice or None index of a captured buffer")
            v = self._val(i, env)
            if v[1] == "f":
                raise Unsupported("a float index")
            exprs.append(self._as(v, "i"))
        if len(exprs) > ndim:
            raise Unsupported("too many indices for a captured buffer")
        if len(exprs) < ndim:
            return ("buf", arg, ndim, tuple(exprs), kind)
        return self._tmp(f"{arg}[{', '.join(exprs)}]" if ndim else f"{arg}[0]", kind)


def _is_noop_mask(fn) -> bool:
    try:
        from torch.nn.attention.flex_attention import noop_mask
    except ImportError:
        return False
    return fn is noop_mask


def _render_mods(score_gm, mask_fn, score_bufs, mask_bufs, joint_gm=None):
    """(score lines -> `sc`, mask lines -> `ok`, joint lines -> `gs`, kernel buffer args)."""
    args = []
    sbuf, mbuf = [], []
    for k, b in enumerate(score_bufs):
        sbuf.append((f"sb{k}", b))
        args.append(b)
    for k, b in enumerate(mask_bufs):
        mbuf.append((f"mb{k}", b))
        args.append(b)
    idx = [("b", "i"), ("h", "i"), ("i", "i"), ("j", "i")]
    if not isinstance(score_gm, torch.fx.GraphModule):
        raise Unsupported("score_mod is not a graph")
    sr = _Render(score_gm, [("x", "f")] + idx, sbuf, "_s")
    score = sr.lines + [f"sc = T({sr.result(sr.outputs)[0]})"]
    if _is_noop_mask(mask_fn):
        mask = ["ok = True"]
    else:
        if not isinstance(mask_fn, torch.fx.GraphModule):
            raise Unsupported("mask_mod is not a graph")
        mr = _Render(mask_fn, idx, mbuf, "_m")
        mask = mr.lines + [f"ok = {_Render._as(mr.result(mr.outputs), 'b')}"]
    joint = []
    if joint_gm is not None:
        if not isinstance(joint_gm, torch.fx.GraphModule):
            raise Unsupported("joint graph is not a graph")
        jr = _Render(joint_gm, [("x", "f")] + idx + [("ds", "f")], sbuf, "_j")
        outs = jr.outputs
        if not isinstance(outs, (list, tuple)) or any(o is not None for o in outs[1:]):
            raise Unsupported("score_mod buffer needs a gradient")
        joint = jr.lines + [f"gs = T({jr.result(outs[0])[0]})"]
    return score, mask, joint, args


def _renderer(src_fn, *args, f32: bool):
    """render() for launch(): kernels/flex.py's source behind the vmath prelude (float32)."""
    def render():
        from ..kernels.vmath import VMATH_PRELUDE

        src, name = src_fn(*args)
        return (VMATH_PRELUDE + "\n" if f32 else "") + src, name
    return render


# ---------------------------------------------------------------------------------------------
# running: checks, outputs, launch; the dense path behind every refusal
# ---------------------------------------------------------------------------------------------

def _np(t: torch.Tensor) -> np.ndarray:
    from ..tensor import NeuronTensor

    if type(t) is not NeuronTensor:
        raise Unsupported("an operand that is not a neuron tensor")
    return t._data.numpy()


def _empty_like_order(ref: torch.Tensor, shape, dtype):
    """A new neuron tensor of `shape` laid out in the stride order of `ref` (as the HOP's
    _permute_strides), last dim contiguous."""
    from ..buffers import alloc
    from ..tensor import wrap

    st = ref.stride()
    order = sorted(range(len(shape)), key=lambda d: (st[d], d))
    last = len(shape) - 1
    order.remove(last)
    order = [last] + order
    strides = [0] * len(shape)
    acc = 1
    for d in order:
        strides[d] = acc
        acc *= max(int(shape[d]), 1)
    data, block = alloc(ref.device.index or 0, tuple(shape), tuple(strides), dtype)
    return wrap(data, block, ref.device.index or 0)


def _common(query, key, value, block_mask):
    from ..adaptive import MODULE as adaptive

    if query.dtype not in (torch.float32, torch.float64) or not (
            query.dtype == key.dtype == value.dtype):
        raise Unsupported(f"dtype {query.dtype} (fused: float32, float64)")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise Unsupported("rank other than 4")
    B, H, L, E = query.shape
    Bk, Hk, S, _ = value.shape
    if Hk == 0 or H % Hk or not (Bk == B or Bk == 1) or key.shape[:3] != (Bk, Hk, S):
        raise Unsupported("head or batch counts that do not broadcast")
    if len(block_mask) != 17:
        raise Unsupported("a block mask layout of another torch")
    QB, KVB = int(block_mask[14]), int(block_mask[15])
    kvn, kvi, fkvn, fkvi = block_mask[2:6]
    if kvn is None or kvi is None:
        raise Unsupported("a block mask without kv blocks")
    if kvn.dim() != 3 or kvn.shape[2] * QB < L:
        raise Unsupported("a block mask that does not cover the queries")
    adaptive.flush("flex attention")
    arrs = [_np(kvn), _np(kvi)]
    if fkvn is None:
        arrs += [np.zeros((1, 1, 0), np.int32), np.zeros((1, 1, 0, 0), np.int32)]
    else:
        arrs += [_np(fkvn), _np(fkvi)]
    # bounded blocks: a block larger than the sequence (the empty mask's 2^30) is the sequence
    return arrs, min(QB, max(L, 1)), min(KVB, max(S, 1)), QB, KVB


def _buf_arrays(bufs) -> list:
    out = []
    for b in bufs:
        if isinstance(b, torch.Tensor):
            if b.dtype not in (torch.float32, torch.float64, torch.int64, torch.int32,
                               torch.int16, torch.int8, torch.uint8, torch.bool):
                raise Unsupported(f"captured buffer of dtype {b.dtype}")
            arr = _np(b)
            out.append(arr.reshape(1) if arr.ndim == 0 else arr)
        elif isinstance(b, (bool, int, float)):
            out.append(b)
        elif isinstance(b, (torch.SymInt, torch.SymFloat)):
            out.append(b.node.pytype(b))
        else:
            raise Unsupported(f"captured value of type {type(b).__name__}")
    return out


def _block_args(QB, KVB, QBr, KVBr):
    # a block size clamped to the sequence only when one block covers it all
    return (QBr if QBr < QB else QB), (KVBr if KVBr < KVB else KVB)


def _pairs(marr, B, H, L, S, QB, KVB) -> int:
    """(query, key) pairs the kernel visits (the listed blocks' area, capped at L x S): what
    the simulated core is charged for, so a sparse mask costs less than a dense one."""
    kvn, fkvn = marr[0], marr[2]
    blocks = int(kvn.sum()) + (int(fkvn.sum()) if fkvn.size else 0)
    spread = (B * H) // max(kvn.shape[0] * kvn.shape[1], 1)   # a broadcast mask's copies
    return min(blocks * spread * QB * KVB, B * H * L * S)


def _parallel(units: int, work: int) -> bool:
    """Threads over tiles: off. NOTE: the tiles' products are gemm calls, and gemm inside
    Numba's threads measured 9x slower than one thread (1024 keys, 8 heads, causal: 416 ms
    against 48 ms, 2 loaded cores; OpenBLAS warns of a hang under OpenMP). The kernels keep
    the parallel variant for a host where that changes."""
    return False


def _forward_fused(query, key, value, score_mod, block_mask, scale, kernel_options,
                   score_mod_other_buffers=(), mask_mod_other_buffers=()):
    marr, QBr, KVBr, QB, KVB = _common(query, key, value, block_mask)
    score, mask, _, bufs = _render_mods(score_mod, block_mask[-1], score_mod_other_buffers,
                                        mask_mod_other_buffers)
    bargs = _buf_arrays(bufs)
    B, H, L, _ = query.shape
    S, Ev = value.shape[2], value.shape[3]
    f32 = query.dtype == torch.float32
    out = _empty_like_order(query, (B, H, L, Ev), query.dtype)
    lse = _empty_like_order(query[..., 0], (B, H, L), query.dtype)
    mx = _empty_like_order(query[..., 0], (B, H, L), query.dtype)
    QBk, KVBk = _block_args(QB, KVB, QBr, KVBr)
    parallel = _parallel(B * H * ((L + QBk - 1) // QBk), B * H * L * S)
    mkl = bool(km.mkl_symbols())
    key_ = ("flex", "fwd", tuple(score), tuple(mask), len(score_mod_other_buffers),
            len(mask_mod_other_buffers), f32, parallel, mkl)
    args = (_np(out), _np(lse), _np(mx), _np(query), _np(key), _np(value), *marr,
            float(scale), QBk, KVBk, *bargs)
    dense = _pairs(marr, B, H, L, S, QBk, KVBk) * (query.shape[3] + Ev) * 2
    launch(key_, _renderer(kf.render_forward, score, mask, len(score_mod_other_buffers),
                           len(mask_mod_other_buffers), f32, parallel, mkl, f32=f32), args,
           flops=float(dense), bytes_moved=float(sum(a.nbytes for a in args[:6])),
           engine="tensor", extra={"flex": "forward"})
    FSTATS.fused_forward += 1
    return out, lse, mx


def _backward_fused(query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph,
                    joint_graph, block_mask, scale, kernel_options,
                    score_mod_other_buffers=(), mask_mod_other_buffers=()):
    if any(isinstance(b, torch.Tensor) and b.requires_grad for b in score_mod_other_buffers):
        raise Unsupported("score_mod buffer needs a gradient")
    if joint_graph is None:
        raise Unsupported("no joint graph")
    marr, QBr, KVBr, QB, KVB = _common(query, key, value, block_mask)
    score, mask, joint, bufs = _render_mods(fw_graph, block_mask[-1], score_mod_other_buffers,
                                            mask_mod_other_buffers, joint_graph)
    bargs = _buf_arrays(bufs)
    B, H, L, E = query.shape
    Bk, Hk, S, Ev = value.shape
    f32 = query.dtype == torch.float32
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    if grad_logsumexp is None:
        grad_logsumexp = torch.zeros_like(logsumexp)
    dq = _empty_like_order(query, (B, H, L, E), query.dtype)
    dk = _empty_like_order(key, (Bk, Hk, S, E), key.dtype)
    dv = _empty_like_order(value, (Bk, Hk, S, Ev), value.dtype)
    parallel = _parallel(Bk * Hk, B * H * L * S)
    QBk, KVBk = _block_args(QB, KVB, QBr, KVBr)
    mkl = bool(km.mkl_symbols())
    key_ = ("flex", "bwd", tuple(score), tuple(mask), tuple(joint),
            len(score_mod_other_buffers), len(mask_mod_other_buffers), f32, parallel, mkl)
    args = (_np(dq), _np(dk), _np(dv), _np(query), _np(key), _np(value), _np(out),
            _np(grad_out), _np(logsumexp), _np(grad_logsumexp), *marr, float(scale),
            QBk, KVBk, *bargs)
    dense = _pairs(marr, B, H, L, S, QBk, KVBk) * (E + Ev) * 5
    launch(key_, _renderer(kf.render_backward, score, mask, joint,
                           len(score_mod_other_buffers), len(mask_mod_other_buffers), f32,
                           parallel, mkl, f32=f32), args,
           flops=float(dense), bytes_moved=float(sum(a.nbytes for a in args[:10])),
           engine="tensor", extra={"flex": "backward"})
    FSTATS.fused_backward += 1
    grads = tuple(None for _ in score_mod_other_buffers)
    return dq, dk, dv, grads


def trace_joint_on_cpu(create):
    """Wrap torch's `create_fw_bw_graph` (it traces the score_mod's joint graph with fake
    tensors made from the example values): neuron example values and buffers are traced as CPU
    ones. Why: torch makes the joint's incoming gradient as a real tensor on the example's
    device outside its fake mode; a real NeuronTensor is a subclass the fake mode refuses, so
    tracing any score_mod with a non-trivial derivative (tanh) raised inside autograd's engine
    and aborted the process. The graph holds device-free aten ops; only shapes and dtypes of
    the values matter (they are fake while traced)."""
    if getattr(create, "_en_neuron", False):
        return create

    def create_fw_bw_graph(score_mod, index_values, other_buffers):
        from ..tensor import NeuronTensor

        def cpu(t):
            if type(t) is not NeuronTensor:
                return t
            return torch.zeros(t.shape, dtype=t.dtype).requires_grad_(t.requires_grad)

        if any(type(t) is NeuronTensor for t in (*index_values, *other_buffers)):
            index_values = tuple(cpu(t) for t in index_values)
            other_buffers = tuple(cpu(t) for t in other_buffers)
        return create(score_mod, index_values, other_buffers)

    create_fw_bw_graph._en_neuron = True
    return create_fw_bw_graph


def _fallback(direction: str, exc: Exception) -> None:
    reason = str(exc) if isinstance(exc, Unsupported) else \
        f"kernel failed: {type(exc).__name__}"
    FSTATS.fallbacks[f"{direction}: {reason}"] += 1
    from ..config import config

    if "graphs" in config.log or "kernels" in config.log:
        import sys

        print(f"[eager_neuron] flex attention {direction} runs dense: {reason}",
              file=sys.stderr)


def forward(*args, **kwargs):
    """The flex_attention HOP on neuron tensors: the fused kernel, else the dense path."""
    if ENABLED[0]:
        try:
            return _forward_fused(*args, **kwargs)
        except Exception as exc:    # noqa: BLE001 - every refusal runs dense, counted
            _fallback("forward", exc)
    FSTATS.dense_forward += 1
    return importlib.import_module(_HOPS).sdpa_dense(*args, **kwargs)


def backward(*args, **kwargs):
    """The flex_attention_backward HOP on neuron tensors: fused, else dense."""
    if ENABLED[0]:
        try:
            return _backward_fused(*args, **kwargs)
        except Exception as exc:    # noqa: BLE001 - every refusal runs dense, counted
            _fallback("backward", exc)
    FSTATS.dense_backward += 1
    return importlib.import_module(_HOPS).sdpa_dense_backward(*args, **kwargs)
