"""nn.Module.to("neuron") while an earlier forward's graph is still alive.

A neuron tensor is a traceable wrapper subclass, so `Module._apply` moves each parameter with
`torch.utils.swap_tensors` (the Parameter object keeps its identity: tied weights stay tied,
optimizers built before the move keep working). torch's swap refuses a parameter that anything
but its AccumulateGrad node references, e.g. a convolution's weight saved by a CPU forward whose
output the user still holds (`ref = model(x); model.to("neuron")`, the usual way to compare
devices). On CUDA that works (`.data =`); here it failed half way, some parameters moved and
some not.

So a swap whose target is a neuron tensor goes ahead when only that reference check objects:
the old graph keeps the CPU tensor it saved (its values are unchanged), and its AccumulateGrad
node is poisoned, so a backward through that old graph raises instead of sending its gradient
to a tensor no module holds any more. Every other refusal (weak references, different slots) is
torch's, unchanged.

>>> import torch, eager_neuron
>>> conv = torch.nn.Conv2d(1, 1, 1)
>>> ref = conv(torch.ones(1, 1, 2, 2))      # its graph saves conv.weight
>>> w = conv.weight
>>> conv.to("neuron").weight is w, w.device.type
(True, 'neuron')
"""

from __future__ import annotations

import copyreg
import threading

import torch

_TORCH_SWAP = torch.utils.swap_tensors


def _refuse_old_graph(grad_outputs):
    raise RuntimeError(
        "backward through a graph recorded before its module moved to neuron: the parameter "
        "this gradient belongs to is now a neuron tensor (Module.to swapped it). Run backward "
        "before moving the module, or run the forward again after the move.")


def swap_tensors(t1, t2) -> None:
    """torch.utils.swap_tensors, which also swaps a parameter an old graph still references
    when the swap moves it to neuron (see the module's docstring)."""
    from .tensor import NeuronTensor

    try:
        return _TORCH_SWAP(t1, t2)
    except RuntimeError as exc:
        if "use_count" not in str(exc) or not isinstance(t2, NeuronTensor) \
                or t2._use_count() > 1:
            raise
    if t1.is_leaf and t1.requires_grad:
        torch.autograd.graph.get_gradient_edge(t1).node.register_prehook(_refuse_old_graph)
    _exchange(t1, t2)


def _exchange(t1, t2) -> None:
    """Exchange the two objects' class, attributes, slots and C++ tensors (torch's checks of
    weak references and slots already passed in its own swap)."""
    for name in ("__class__", "__dict__"):
        a, b = getattr(t1, name), getattr(t2, name)
        setattr(t1, name, b)
        setattr(t2, name, a)
    for slot in copyreg._slotnames(t1.__class__):
        has1, has2 = hasattr(t1, slot), hasattr(t2, slot)
        v1, v2 = getattr(t1, slot, None), getattr(t2, slot, None)
        for t, has, v in ((t1, has2, v2), (t2, has1, v1)):
            if has:
                setattr(t, slot, v)
            elif hasattr(t, slot):
                delattr(t, slot)
    torch._C._swap_tensor_impl(t1, t2)


# -- Module._apply: tied parameters stay tied when a module leaves neuron ---------------------
# To neuron, _apply swaps each parameter in place (a traceable wrapper subclass). From neuron
# to the CPU it cannot (no shallow-copy-compatible type, no swap for a plain result), so it
# makes a new Parameter per slot: a weight two modules share (GPT-2's wte and lm_head) became
# two, and training on the CPU afterwards updated them apart. CUDA keeps them one (`.data =`).
# The outermost _apply notes which slots shared a neuron tensor and points them at one result.
_TORCH_APPLY = torch.nn.Module._apply
_depth = threading.local()


def _shared_neuron_slots(module) -> list:
    """[(the shared tensor, [(slot dict, key), ...])] for neuron tensors held by >= 2 slots."""
    from .tensor import NeuronTensor

    seen: dict = {}
    for m in module.modules():
        for d in (m._parameters, m._buffers):
            for key, t in d.items():
                if isinstance(t, NeuronTensor):
                    seen.setdefault(id(t), (t, []))[1].append((d, key))
    return [group for group in seen.values() if len(group[1]) > 1]


def _script_params(module) -> list:
    """[(script module, name, parameter object)] of a TorchScript module tree, held across
    _apply (its parameters live in C++ slots; see _resync_script_slots)."""
    if not isinstance(module, torch.jit.ScriptModule):
        return []
    return [(m, name, p, type(p), p.device) for m in module.modules()
            if isinstance(m, torch.jit.ScriptModule)
            for name, p in list(m._parameters.items()) if p is not None]


def _resync_script_slots(held: list) -> None:
    """A TorchScript module's parameters live in C++ slots. _apply swaps each Python parameter
    object with its neuron copy (swap_tensors), which the slot does not see: `traced.to(
    "neuron")` left every weight on the CPU, silently (its forward then mixed devices). The
    slot is pointed at the swapped object, as `.data =` would have left it on CUDA. (A
    parameter that was not swapped, a move off neuron makes a new Parameter the slot holds
    already, is left alone.)"""
    for m, name, p, kind, device in held:
        if (type(p) is not kind or p.device != device) and m._c.getattr(name) is not p:
            m._c.setattr(name, p)


def _apply(self, fn, recurse=True):
    if getattr(_depth, "n", 0) or not recurse:
        return _TORCH_APPLY(self, fn, recurse)
    shared = _shared_neuron_slots(self)
    held = _script_params(self)
    _depth.n = 1
    try:
        out = _TORCH_APPLY(self, fn, recurse)
    finally:
        _depth.n = 0
    _resync_script_slots(held)
    for _, slots in shared:
        d0, k0 = slots[0]
        first = d0.get(k0)
        for d, key in slots[1:]:
            if d.get(key) is not first:
                d[key] = first
    return out


_apply.__wrapped__ = _TORCH_APPLY
_apply.__doc__ = _TORCH_APPLY.__doc__


_TORCH_JIT_LOAD = torch.jit.load


def jit_load(f, map_location=None, _extra_files=None, _restore_shapes=False):
    """torch.jit.load with map_location="neuron": TorchScript's C++ loader made each tensor on
    the device from an empty one and could not set a wrapper subclass's storage (every weight
    came back with 0 elements: the first forward failed in addmm). It loads on the CPU and the
    module moves (`.to`, its C++ slots pointed at the neuron parameters: _resync_script_slots)."""
    dev = torch.device(map_location) if isinstance(map_location, str) else map_location
    if isinstance(dev, torch.device) and dev.type == "neuron":
        module = _TORCH_JIT_LOAD(f, map_location="cpu", _extra_files=_extra_files,
                                 _restore_shapes=_restore_shapes)
        return module.to(dev)
    return _TORCH_JIT_LOAD(f, map_location, _extra_files, _restore_shapes)


jit_load.__wrapped__ = _TORCH_JIT_LOAD


def install() -> None:
    torch.utils.swap_tensors = swap_tensors
    torch.nn.Module._apply = _apply
    torch.jit.load = jit_load
