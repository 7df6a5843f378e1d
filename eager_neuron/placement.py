"""Placement: CUDA's "Expected all tensors to be on the same device" for neuron ops.

dispatch calls `check_placement` once per kernel op; a neuron op given a CPU tensor that is not
0-d is refused, as CUDA refuses it (0-d CPU tensors are scalars there too).
"""

from __future__ import annotations

import torch

# -- placement: CUDA's "Expected all tensors to be on the same device" -----------------------
# Ops that take CPU tensors next to device ones on CUDA too: copies between devices and index
# tensors (x[cpu_index] works on CUDA).
_PLACEMENT_EXEMPT = frozenset((
    "aten::copy_", "aten::_to_copy", "aten::_copy_from", "aten::_copy_from_and_resize",
    "aten::to", "aten::set_", "aten::index", "aten::index_put", "aten::index_put_",
    "aten::_index_put_impl_", "aten::_unsafe_index", "aten::_unsafe_index_put",
    "aten::lift_fresh", "aten::lift_fresh_copy", "aten::_local_scalar_dense",
))


# Ops whose named arguments CUDA reads on the host whichever device they are on (CTC's lengths
# tensors: `.to(kCPU)` in its Tensor overloads), so a CPU tensor there is no mix of devices.
_CPU_ARGS = {
    "aten::_ctc_loss": frozenset(("input_lengths", "target_lengths")),
    "aten::_ctc_loss_backward": frozenset(("input_lengths", "target_lengths")),
}


def check_placement(func, args, kwargs, index) -> None:
    """Refuse an op mixing neuron:`index` tensors with a CPU tensor that is not 0-d, as CUDA does.

    `index` is the op's neuron core (None: no neuron tensor, nothing to check). 0-d CPU tensors
    stay allowed (they are scalars, as on CUDA), and so do copies and index tensors.

    >>> import torch, eager_neuron
    >>> from eager_neuron.placement import check_placement
    >>> x = torch.ones(2, 2, device="neuron")
    >>> check_placement(torch.ops.aten.add.Tensor, (x, torch.tensor(1.0)), {}, 0)  # 0-d: fine
    >>> try:
    ...     check_placement(torch.ops.aten.add.Tensor, (x, torch.ones(2, 2)), {}, 0)
    ... except RuntimeError as e:
    ...     print(str(e).splitlines()[0][:68])
    Expected all tensors to be on the same device, but found at least tw
    """
    if index is None:
        return
    found = _cpu_operand(args, kwargs, func)
    if found is None or func._schema.name in _PLACEMENT_EXEMPT:
        return
    allowed = _CPU_ARGS.get(func._schema.name)
    if allowed is not None:
        found = _cpu_operand(args, kwargs, func, allowed)
        if found is None:
            return
    from . import errors

    name = func._schema.name
    full = f"{name}.{func._schema.overload_name}" if func._schema.overload_name else name
    raise RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"neuron:{index} and cpu! (when checking argument for argument {found} in {full})\n"
        f"{errors.where()}\n"
        f"  fix: move it to the device first (t.to('neuron:{index}')); only 0-d CPU tensors "
        "(scalars) may be mixed with neuron tensors")


def _cpu_operand(args, kwargs, func, allowed=frozenset()):
    """The schema name of the first non-0-d CPU tensor argument (lists included) whose name is
    not in `allowed`, or None."""
    schema_args = func._schema.arguments
    for i, a in enumerate(args):
        if _is_cpu_nonscalar(a):
            name = schema_args[i].name if i < len(schema_args) else f"#{i}"
            if name not in allowed:
                return name
    for k, v in kwargs.items():
        if _is_cpu_nonscalar(v) and k not in allowed:
            return k
    return None


def _is_cpu_nonscalar(a) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dim() != 0 and a.device.type == "cpu"
    if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
        return any(isinstance(v, torch.Tensor) and v.dim() != 0 and v.device.type == "cpu"
                   for v in a)
    return False


# -- where a result lives: ops with a tensor operand and a `device=` argument ----------------
# ATen makes their result on the device the argument names (zeros_like(x, device="cpu"),
# x.new_ones(2, device="neuron:1")), not on the operand's. These read only the operand's
# metadata (shape, strides, dtype):
_LIKE = frozenset((
    "aten::empty_like", "aten::zeros_like", "aten::ones_like", "aten::full_like",
    "aten::rand_like", "aten::randn_like", "aten::randint_like", "aten::new_empty",
    "aten::new_empty_strided", "aten::new_zeros", "aten::new_ones", "aten::new_full",
))
# these read their 0-d operands' values (start, end)
_READS = frozenset(("aten::linspace", "aten::logspace"))


def _device_ops() -> dict:
    """{overload: position of its `device` argument} for the ops above."""
    found = {}
    for name in _LIKE | _READS:
        packet = getattr(torch.ops.aten, name.split("::")[1])
        for overload in packet.overloads():
            func = getattr(packet, overload)
            for i, arg in enumerate(func._schema.arguments):
                if arg.name == "device":
                    found[func] = i
    return found


DEVICE_AT = _device_ops()


def elsewhere(func, at: int, args, kwargs):
    """The result of `func` where its `device=` argument (position `at`) puts it, when that is
    not the core of its neuron operands; NotImplemented when it is, or when it has none (the
    op runs as usual).

    A CPU or meta result is made by the op itself on CPU stand-ins of the operands (empty
    tensors of the same metadata, or host copies where values are read); another core's result
    is made on the operands' core and moved there (the op reads no operand values there)."""
    dev = kwargs["device"] if "device" in kwargs else args[at] if at < len(args) else None
    if dev is None:
        return NotImplemented
    from .buffers import device_index, to_host
    from .tensor import NeuronTensor

    index = next((v._index for v in (*args, *kwargs.values()) if type(v) is NeuronTensor),
                 None)
    if index is None:
        return NotImplemented
    dev = torch.device(dev)
    if dev.type == "neuron" and dev.index is None:
        return NotImplemented   # "neuron": the operand's core (its device guard is current)
    want = device_index(dev)
    if want == index:
        return NotImplemented
    if want is not None:   # another core: made here, moved there
        here = torch.device("neuron", index)
        if "device" in kwargs:
            out = func(*args, **{**kwargs, "device": here})
        else:
            out = func(*args[:at], here, *args[at + 1:], **kwargs)
        return out.to(dev)
    reads = func._schema.name in _READS

    def host(v):
        if type(v) is not NeuronTensor:
            return v
        if reads:
            return to_host(v, reason=f"{func._schema.name} on {dev}")
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype)

    return func(*[host(a) for a in args], **{k: host(v) for k, v in kwargs.items()})
