"""0-d CPU tensor arithmetic of a compiled graph, run as numpy scalar math on the host.

A compiled optimizer step (AdamW, Adam, ... with `capturable=False`) computes its bias
corrections per parameter on the CPU `step` tensors: `1 - beta1 ** step`, its reciprocal, a
square root, a negation... ~10 aten calls per parameter (~280 in a GPT-2 tiny step), each a
torch dispatch on a 0-d tensor (~10 us). Their values only feed fused kernels as scalar
arguments. Here each such node is one numpy operation on a numpy scalar of the tensor's dtype
(~0.3 us): float32 stays float32 (a Python scalar operand is cast to it, as torch's type
promotion does for a 0-d tensor), so +, -, *, /, sqrt, reciprocal and negation are the same
IEEE operations torch's CPU kernels do, and `pow` calls the C library's pow for the dtype.
A value that something other than a kernel's scalar argument reads (an eager node, the graph's
output, a `copy_` back into the optimizer state) is stored as a 0-d CPU tensor as before.

>>> import numpy as np
>>> _OPS["sub"](np.float32(1.0), np.float32(0.25))
np.float32(0.75)
"""

from __future__ import annotations

import numpy as np
import torch
from torch.fx import Node

from .stats import CSTATS

aten = torch.ops.aten

_NP = {torch.float32: np.float32, torch.float64: np.float64}

_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "rsub": lambda a, b: b - a,
    "neg": lambda a: -a,
    "sqrt": np.sqrt,
    "reciprocal": lambda a: a.dtype.type(1) / a,
    "pow": np.power,
}

# aten overload -> (operation, positional operands it takes, keyword arguments it accepts with
# the values that keep it plain: an alpha other than 1 stays an eager node)
_TABLE = {
    aten.add.Tensor: ("add", 2), aten.sub.Tensor: ("sub", 2), aten.mul.Tensor: ("mul", 2),
    aten.div.Tensor: ("div", 2), aten.rsub.Scalar: ("rsub", 2), aten.rsub.Tensor: ("rsub", 2),
    aten.add.Scalar: ("add", 2), aten.sub.Scalar: ("sub", 2), aten.mul.Scalar: ("mul", 2),
    aten.div.Scalar: ("div", 2), aten.neg.default: ("neg", 1), aten.sqrt.default: ("sqrt", 1),
    aten.reciprocal.default: ("reciprocal", 1), aten.pow.Scalar: ("pow", 2),
    aten.pow.Tensor_Scalar: ("pow", 2), aten.pow.Tensor_Tensor: ("pow", 2),
}


def _host_scalar_val(v) -> bool:
    return isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dim() == 0 and \
        v.dtype in _NP


def plan(node: Node):
    """The host form of `node` (op name, operand list, numpy type) or None."""
    if node.op != "call_function" or node.target not in _TABLE:
        return None
    name, arity = _TABLE[node.target]
    val = node.meta.get("val")
    if not _host_scalar_val(val):
        return None
    if len(node.args) != arity or any(v != 1 for k, v in node.kwargs.items() if k == "alpha") \
            or any(k != "alpha" for k in node.kwargs):
        return None
    dt = val.dtype
    for a in node.args:
        if isinstance(a, Node):
            av = a.meta.get("val")
            # a tensor operand: a CPU 0-d tensor of the same dtype (another dtype would promote)
            if not (_host_scalar_val(av) and av.dtype == dt):
                return None
        elif isinstance(a, bool) or not isinstance(a, (int, float)):
            return None
    return _OPS[name], tuple(node.args), _NP[dt]


class HostScalar:
    """One 0-d CPU node as numpy math; `tensor` when some reader needs a torch tensor."""

    __slots__ = ("node", "fn", "args", "np_type", "dtype", "tensor", "operands")

    def __init__(self, node: Node, form, tensor: bool) -> None:
        self.node = node
        self.fn, self.args, self.np_type = form
        self.dtype = node.meta["val"].dtype
        self.tensor = tensor
        # per operand: (node, None) read from env, or (None, the constant as the numpy type)
        self._operands()

    def _operands(self) -> None:
        self.operands = tuple((a, None) if isinstance(a, Node) else (None, self.np_type(a))
                              for a in self.args)

    def __setstate__(self, state) -> None:
        # (stored with its Program, compile/artifact.py; operands derive from args)
        _, slots = state if isinstance(state, tuple) else (None, state)
        for k, v in slots.items():
            setattr(self, k, v)
        if "operands" not in slots:
            self._operands()

    def run(self, env: dict) -> None:
        t = self.np_type
        vals = []
        for a, c in self.operands:
            if a is None:
                vals.append(c)
                continue
            v = env[a]
            if type(v) is not t and not isinstance(v, np.generic):
                v = t(v.item())
            vals.append(v)
        out = t(self.fn(*vals))
        env[self.node] = torch.tensor(out.item(), dtype=self.dtype) if self.tensor else out


# a run of host steps as one generated function (compile/planned.py): the same numpy operations
# in straight-line code, operands in locals (HostScalar.run's operand loop, conversion checks
# and env traffic cost ~2-5 us a node in a step; 252 nodes per GPT-2 tiny AdamW step)
_INLINE = {"add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
           "rsub": "{1} - {0}", "neg": "-{0}", "sqrt": "_sqrt({0})",
           "reciprocal": "{T}(1) / {0}", "pow": "_pow({0}, {1})"}
_NAMES = {id(fn): name for name, fn in _OPS.items()}
BLOCKS = [0]        # blocks built (a test counts them)
_MEMO = ("pow", "sqrt")


def block(hosts: list):
    """fn(env) running `hosts` (HostScalar steps, in order) as one function: the values each
    computes are HostScalar.run's (the same operations on the same numpy types), stored in env
    the same way (a 0-d tensor where `tensor`)."""
    ns = {"_sqrt": np.sqrt, "_pow": np.power, "_gen": np.generic, "_tensor": torch.tensor}
    lines = ["def _host_block(env):", "    memo = {}"]
    local: dict = {}       # node -> local name of its numpy value
    for k, h in enumerate(hosts):
        t = f"T{k}"
        ns[t] = h.np_type
        vals = []
        for j, (a, c) in enumerate(h.operands):
            if a is None:
                ns[f"C{k}_{j}"] = c
                vals.append(f"C{k}_{j}")
                continue
            name = local.get(a)
            if name is None:
                name = local[a] = f"x{len(local)}"
                ns[f"N_{name}"] = a
                lines.append(f"    {name} = env[N_{name}]")
                lines.append(f"    if type({name}) is not {t} and not isinstance({name}, _gen):")
                lines.append(f"        {name} = {t}({name}.item())")
            vals.append(name)
        op = _NAMES.get(id(h.fn))
        if op is None:
            ns[f"F{k}"] = h.fn
            expr = f"F{k}({', '.join(vals)})"
        else:
            expr = _INLINE[op].format(*vals, T=t)
        name = local[h.node] = f"x{len(local)}"
        ns[f"K{k}"] = h.node
        if op in _MEMO:
            # a ufunc on scalars (~1 us): the same operands give the same value (an optimizer's
            # per-parameter chains all read one step count), computed once per call
            key = f"({t}, {op!r}, {', '.join(vals)})"
            lines.append(f"    {name} = memo.get({key})")
            lines.append(f"    if {name} is None:")
            lines.append(f"        {name} = memo[{key}] = {t}({expr})")
        else:
            lines.append(f"    {name} = {t}({expr})")
        if h.tensor:
            ns[f"D{k}"] = h.dtype
            lines.append(f"    env[K{k}] = _tensor({name}.item(), dtype=D{k})")
        else:
            lines.append(f"    env[K{k}] = {name}")
    exec(compile("\n".join(lines), "<eager_neuron host block>", "exec"), ns)
    BLOCKS[0] += 1
    return ns["_host_block"]


_COPY = aten.copy_.default
HOST_COPY = [True]      # False: every copy_ of a host value runs through torch (measurements)


def copy_takes_host(node: Node, src: Node) -> bool:
    """`node` is copy_(dst, src) into a 0-d CPU tensor of src's dtype (an optimizer's `step + 1`
    written back into its state): it takes src's numpy value (copy_host), no tensor is made."""
    if node.op != "call_function" or node.target is not _COPY or node.kwargs or \
            len(node.args) != 2 or node.args[1] is not src or node.args[0] is src:
        return False
    d, v = node.args[0], src.meta.get("val")
    dv = d.meta.get("val") if isinstance(d, Node) else None
    return _host_scalar_val(dv) and _host_scalar_val(v) and dv.dtype == v.dtype


def copy_host(node: Node, env: dict, direct: bool) -> bool:
    """copy_(dst, src) whose src is a host value (a numpy scalar): written into dst with
    `fill_` (exact: a float32/float64 value into a tensor of its dtype; the version counter
    bumps as copy_'s does). False: the node runs through torch, src made a 0-d tensor first
    (a dispatch mode must see the copy, or dst is not the plain CPU tensor it was traced as)."""
    src = node.args[1]
    v = env.get(src) if isinstance(src, Node) else None
    if not isinstance(v, np.generic):
        return False
    dst = env[node.args[0]]
    direct = direct and HOST_COPY[0]
    dtype = src.meta["val"].dtype
    if direct and type(dst) is torch.Tensor and dst.dtype == dtype and dst.dim() == 0 and \
            dst.device.type == "cpu" and not dst.requires_grad:
        dst.fill_(v.item())
        env[node] = dst
        CSTATS.eager_ops["aten::copy_"] += 1
        CSTATS.host_copies += 1
        return True
    env[src] = torch.tensor(v.item(), dtype=dtype)
    return False


def copies(nodes: list, other):
    """fn(env) for consecutive copy_ nodes that take a host value (copy_takes_host): each value
    written into its 0-d CPU tensor through numpy (the same store as fill_'s), one version bump
    for them all (as each copy_ bumps its destination's), counted as copy_host counts; a node
    whose operands are not so at run time takes `other` (the interpreter's step)."""
    items = [(n, n.args[0], n.args[1], n.args[1].meta["val"].dtype) for n in nodes]

    def run(env):
        done = []
        for node, d, src, dtype in items:
            v = env.get(src)
            dst = env[d]
            if HOST_COPY[0] and isinstance(v, np.generic) and type(dst) is torch.Tensor and \
                    dst.dtype == dtype and dst.dim() == 0 and dst.device.type == "cpu" and \
                    not dst.requires_grad and not dst.is_neg():
                dst.numpy()[()] = v
                env[node] = dst
                done.append(dst)
            else:
                other("node", node, env)
        if done:
            _bump(done)
            CSTATS.eager_ops["aten::copy_"] += len(done)
            CSTATS.host_copies += len(done)
    return run


_bump = torch._C._increment_version


def tensorize(env: dict, nodes) -> None:
    """Before nodes run through torch (an eager rerun of a kernel's nodes): numpy scalars they
    read become the 0-d CPU tensors torch expects."""
    for n in nodes:
        for a in n.all_input_nodes:
            v = env.get(a)
            if isinstance(v, np.generic):
                env[a] = torch.tensor(v.item(), dtype=a.meta["val"].dtype)


__all__ = ["plan", "HostScalar", "tensorize", "block", "copy_takes_host", "copy_host", "copies"]
