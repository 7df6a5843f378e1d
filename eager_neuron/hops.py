"""Higher-order operators on neuron: torch.cond, while_loop, scan, map, associative_scan,
invoke_subgraph and the rest of torch's HOPs with a dense implementation.

A HOP dispatches on tensor subclasses and modes by table (`python_key_table`), not through
`__torch_dispatch__`: with no rule for NeuronTensor or NeuronMode, `torch.cond(x.sum() > 0, f,
g, (x,))` on a neuron tensor raised NotImplementedError ("no rule registered for HOP cond and
subclass NeuronTensor") in eager, under the mode, and inside a compiled graph (whose HOP nodes
run as eager calls). Each rule here runs the HOP's own dense implementation (torch's
CompositeExplicitAutograd kernel: evaluate the predicate, call the branch, loop, scan), so the
branch functions' ops run on neuron as any op does, with the CPU's semantics; autograd through
a HOP is torch's own (its Autograd key runs before these rules). FlexAttention keeps its fused
kernels (compile/flex.py registers those).

>>> import torch, eager_neuron
>>> x = torch.tensor([1.0, -2.0]).to("neuron")
>>> torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,)).cpu().tolist()
[0.0, -3.0]
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey

_SKIP = frozenset({"flex_attention", "flex_attention_backward"})   # compile/flex.py's
INSTALLED: list = []    # the HOPs given neuron rules (a test reads it)


def _tensor_rule(dense):
    def rule(*args, **kwargs):
        return dense(*args, **kwargs)
    return rule


def _save_rng(op, *args, **kwargs):
    """run_and_save_rng_state on neuron (activation checkpointing in a compiled graph saves the
    generator before a random op, to replay it in the recompute): neuron draws from the CPU's
    generator (device.py), so its state is the CPU's, as the CPU kernel of this HOP takes it."""
    return torch.get_rng_state(), op(*args, **kwargs)


def _with_rng(rng_state, op, *args, **kwargs):
    """run_with_rng_state on neuron: the op drawn from the saved state, the generator put back."""
    current = torch.get_rng_state()
    torch.set_rng_state(rng_state.cpu())
    try:
        return op(*args, **kwargs)
    finally:
        torch.set_rng_state(current)


# HOPs with no dense kernel (device kernels only) that neuron answers as the CPU's kernel does
_DEVICE_RULES = {"run_and_save_rng_state": _save_rng, "run_with_rng_state": _with_rng}


def run_under_mode(hop, args, kwargs):
    """A HOP under NeuronMode (NeuronMode.__torch_dispatch__, which answers HOPs:
    `supports_higher_order_operators`; torch pops the mode while it runs): NeuronMode's
    convention, CPU in and CPU out. The operands are made neuron tensors, the HOP runs by the
    NeuronTensor rule above (the branches' ops on neuron), its results are brought back, and an
    operand it wrote in place (invoke_subgraph, a mutating custom op's HOP) is written back. A
    mode answering through a `python_key_table` rule instead made dynamo trace the rule when
    torch.cond compiles its eager call (a graph break inside torch's dense kernel)."""
    from torch.utils._pytree import tree_map_only

    from .tensor import NeuronTensor

    moved = []     # (the caller's CPU tensor, its neuron copy, the copy's version)

    def to_neuron(t):
        if t.device.type != "cpu":
            return t
        n = t.to("neuron")
        moved.append((t, n, n._version))
        return n

    args, kwargs = tree_map_only(torch.Tensor, to_neuron, (tuple(args), dict(kwargs)))
    out = hop(*args, **kwargs)
    for t, n, version in moved:
        if n._version != version:        # an operand the HOP wrote in place: so is the caller's
            with torch.no_grad():
                t.copy_(n.cpu())
    return tree_map_only(NeuronTensor, lambda t: t.cpu(), out)


def install() -> None:
    """Give every HOP torch has registered so far (those with a dense kernel, and the RNG
    state HOPs) a rule for NeuronTensor; a HOP that already has one keeps it. Run at import and
    again when dynamo loads (compile/__init__.py: its import registers more HOPs)."""
    from .tensor import NeuronTensor

    for name, hop in list(torch._ops._higher_order_ops.items()):
        dense = hop.py_kernels.get(DispatchKey.CompositeExplicitAutograd)
        rule = _DEVICE_RULES.get(name) or (_tensor_rule(dense) if dense is not None else None)
        if name in _SKIP or rule is None:
            continue
        if NeuronTensor not in hop.python_key_table:
            hop.py_impl(NeuronTensor)(rule)
            INSTALLED.append(name)


__all__ = ["install", "INSTALLED", "run_under_mode"]
