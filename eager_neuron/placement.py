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
