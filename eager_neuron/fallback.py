"""The fenced CPU fallback: an op with no kernel and no decomposition runs on the host (counted
and warned once per op), or raises under EAGER_NEURON_FALLBACK=error."""

from __future__ import annotations

import sys

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import errors
from .adaptive import flush
from .buffers import alloc
from .config import config
from .operands import _original, unwrap_args
from .simulator import SIM
from .stats import STATS
from .tensor import NeuronTensor, wrap

_WARNED: set = set()


def run_fallback(func, plan, args, kwargs, mode, why: str = ""):
    name = plan.name
    if config.fallback == "error":
        raise errors.UnsupportedOpError(
            f"{name} has no neuron kernel and no decomposition"
            + (f" ({why})" if why else "") + f"\n{errors.where()}\n"
            f"  args: {errors.describe_args(args, kwargs)}; "
            "set EAGER_NEURON_FALLBACK=cpu to run it on the CPU")
    STATS.fallbacks[name] += 1
    flush("cpu fallback")
    if name not in _WARNED:
        _WARNED.add(name)
        errors.warn(
            f"{name} has no neuron kernel; running it on the CPU (counted in "
            f"eager_neuron.stats()['fallbacks']; EAGER_NEURON_FALLBACK=error makes this raise)"
            + (f" [{why}]" if why else ""))
    uargs, ukw, index = unwrap_args(args, kwargs)
    if "device" in ukw and ukw["device"] is not None and torch.device(ukw["device"]).type == \
            "neuron":
        ukw["device"] = "cpu"
    out = func(*uargs, **ukw)
    if mode is not None and index is None:
        return out
    if index is None:
        index = 0
    core = SIM.cores[index]
    # inputs go to the host and outputs come back: both charged as DMA transfers
    for x in uargs:
        if isinstance(x, torch.Tensor):
            core.transfer(x.numel() * x.element_size())

    def back(x):
        if isinstance(x, torch.Tensor) and not isinstance(x, NeuronTensor):
            if x.is_nested or x.layout != torch.strided:
                raise errors.UnsupportedTensorError(_layout_message(plan.name, x))
            for target in plan.ret_alias:
                if target is not None:
                    orig = _original(func, args, kwargs, target)
                    if isinstance(orig, NeuronTensor) and orig._data is x:
                        return orig
            data, block = alloc(index, x.shape, x.stride(), x.dtype)
            data.copy_(x)
            core.transfer(x.numel() * x.element_size())
            return wrap(data, block, index)
        return x

    leaves, spec = tree_flatten(out)
    return tree_unflatten([back(v) for v in leaves], spec)


def _layout_message(name: str, x: torch.Tensor) -> str:
    """What a result the neuron device cannot hold (a sparse or nested layout) says."""
    if x.is_nested:
        what, fix = ("nested tensors of layout torch.strided",
                     "build it with torch.nested.nested_tensor(..., layout=torch.jagged) "
                     "(jagged nested tensors run on neuron), or keep it on the CPU")
    else:
        what, fix = f"{x.layout} tensors", "keep this tensor on the CPU, or use a dense layout"
    return (f"{name}: its result would be one of the {what}, which the neuron device does not "
            f"hold\n{errors.where()}\n  fix: {fix}")


def log_op(plan, args, kwargs) -> None:
    print(f"[eager_neuron] op {plan.name} ({plan.kind}) {errors.describe_args(args, kwargs)}",
          file=sys.stderr)
