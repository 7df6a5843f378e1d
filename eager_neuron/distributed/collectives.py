"""c10d ops on neuron tensors: run by gloo on the tensors' host-backed memory, charged to the
simulator by the collective cost model (cost.py), counted in COUNTERS.

A neuron tensor's `_data` is a CPU view of its device buffer, so a collective hands gloo those
views: gloo reads and writes device memory directly (zero-copy). Views that gloo cannot take
(non-contiguous) go through a contiguous staging copy that is written back after the work
completes. Adaptive eager is flushed first, so every recorded op has landed in device memory.

Both doors reach here through the dispatch funnel's host table (ops.HOST):
    c10d::*              what dist.all_reduce & co. and DDP's reducer issue (async Work handles)
    _c10d_functional::*  what DTensor, FSDP2 and funcol issue (completed before they return, so
                         wait_tensor is a flush and nothing more)

>>> import torch, eager_neuron
>>> from eager_neuron.distributed import collectives
>>> "c10d::allreduce_" in collectives.handled_ops()
True
"""

from __future__ import annotations

import os
import threading
from collections import Counter

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import cost

# kind of each op for the cost model
_KIND = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce", "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce",
    "broadcast_": "broadcast", "broadcast": "broadcast", "reduce_": "reduce",
    "allgather_": "all_gather", "_allgather_base_": "all_gather",
    "allgather_coalesced_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor_out": "all_gather",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "reduce_scatter_tensor_out": "reduce_scatter",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all", "all_to_all_single": "all_to_all",
    "gather_": "gather", "scatter_": "scatter",
    "send": "p2p", "recv_": "p2p", "recv_any_source_": "p2p", "isend": "p2p", "irecv": "p2p",
    "batch_p2p_ops": "p2p",
    "barrier": "barrier", "monitored_barrier_": "barrier",
}
_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd")


class Counters:
    """Collectives run on neuron tensors since import or reset(): count, bytes, simulated us."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.count: Counter = Counter()
        self.bytes: Counter = Counter()
        self.time_us: Counter = Counter()
        self.staged = 0          # non-contiguous tensors that went through a staging copy

    def snapshot(self) -> dict:
        return {"collectives": dict(self.count), "collective_bytes": dict(self.bytes),
                "collective_us": dict(self.time_us), "collective_staged": self.staged}


COUNTERS = Counters()


def handled_ops() -> list[str]:
    """Every c10d / functional-collective op name this module serves."""
    return sorted(n for n in torch._C._dispatch_get_all_op_names()
                  if n.split("::")[0] in _NAMESPACES and n.split("::")[1] != "check_for_nan")


# -- cost -----------------------------------------------------------------------------------------
def _local_world_size(p: int) -> int:
    # torchrun says how many ranks share this host; spawn-style launches are all on one host
    value = os.environ.get("LOCAL_WORLD_SIZE")
    return int(value) if value else p


def charge(kind: str, nbytes: int, world_size: int, index: int, blocking: bool) -> float:
    """Enqueue one collective on core `index`'s current queue; the host waits if `blocking`.

    >>> from eager_neuron.distributed.collectives import charge
    >>> charge("all_reduce", 1 << 20, 2, 0, blocking=False) > 0
    True
    """
    from ..simulator import SIM

    link = cost.link_for(SIM.profile, world_size, _local_world_size(world_size))
    t = cost.collective_time_us(kind, nbytes, world_size, link)
    core = SIM.core(index)
    start = SIM.record(core.queue)
    SIM.wait(core.queue, start + t)
    if blocking:
        SIM.host_wait(start + t)
    with COUNTERS.lock:
        COUNTERS.count[kind] += 1
        COUNTERS.bytes[kind] += nbytes
        COUNTERS.time_us[kind] += t
    return t


def _bytes(x) -> int:
    leaves, _ = tree_flatten(x)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def _world_size(args) -> int:
    from torch._C._distributed_c10d import ProcessGroup
    from torch.distributed.distributed_c10d import _resolve_process_group

    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                return ProcessGroup.unbox(a).size()
            except RuntimeError:
                continue
    name = args[-1]
    try:
        return _resolve_process_group(name).size()
    except Exception:   # noqa: BLE001 - only for the cost model: one rank if unknown
        return 1


# -- unwrap / stage / rewrap ------------------------------------------------------------------------
def _unwrap(x, index, originals, staged):
    from ..tensor import NeuronTensor

    if type(x) is NeuronTensor:
        i = x.device.index
        if index[0] is None:
            index[0] = i
        elif index[0] != i:
            raise RuntimeError(
                f"a collective got tensors on neuron:{index[0]} and neuron:{i}: every tensor of "
                "one collective must be on the rank's device (torch.neuron.set_device(local_rank))")
        data = x._data
        if not data.is_contiguous():
            tmp = data.contiguous()
            staged.append((data, tmp))
            data = tmp
        originals[id(data)] = x
        return data
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, index, originals, staged) for v in x)
    return x


def _rewrap(out, originals, index):
    """Outputs that alias an input come back as that neuron tensor; fresh ones move to the device
    (functional collectives allocate their results on the host side)."""
    from ..dispatch import alloc, wrap

    leaves, spec = tree_flatten(out)
    back = []
    for v in leaves:
        if isinstance(v, torch.Tensor) and not isinstance(v, torch.ScriptObject):
            orig = originals.get(id(v))
            if orig is None:
                data, block = alloc(index, v.shape, v.stride(), v.dtype)
                data.copy_(v)
                orig = wrap(data, block, index)
            back.append(orig)
        else:
            back.append(v)
    return tree_unflatten(back, spec)


def _async_flag(func, args, kwargs) -> bool:
    for i, a in enumerate(func._schema.arguments):
        if a.name == "async_op":
            if a.name in kwargs:
                return bool(kwargs[a.name])
            if i < len(args):
                return bool(args[i])
            return True
    return False


# -- the handlers ----------------------------------------------------------------------------------
def c10d_op(func, args, kwargs, mode):
    """A c10d op (dist.all_reduce & co., DDP's reducer): gloo runs it on the device memory."""
    if mode is not None:
        return func(*args, **kwargs)
    from ..dispatch import flush

    flush("collective")
    index, originals, staged = [None], {}, []
    uargs = _unwrap(args, index, originals, staged)
    ukw = {k: _unwrap(v, index, originals, staged) for k, v in kwargs.items()}
    out = func(*uargs, **ukw)
    if staged:
        _wait_all(out)
        for dst, tmp in staged:
            dst.copy_(tmp)
        with COUNTERS.lock:
            COUNTERS.staged += len(staged)
    idx = index[0] if index[0] is not None else torch.neuron.current_device()
    name = func._schema.name.split("::")[1]
    nbytes = max([_bytes(a) for a in args] + [0])
    charge(_KIND.get(name, "all_reduce"), nbytes, _world_size(args), idx,
           blocking=not _async_flag(func, args, kwargs))
    return _rewrap(out, originals, idx)


def _wait_all(out) -> None:
    from torch._C._distributed_c10d import Work

    leaves, _ = tree_flatten(out)
    for v in leaves:
        if isinstance(v, torch.ScriptObject):
            try:
                Work.unbox(v).wait()
            except RuntimeError:
                pass


def functional_op(func, args, kwargs, mode):
    """A functional collective (DTensor, FSDP2, funcol): run, completed before returning."""
    if mode is not None:
        return func(*args, **kwargs)
    from ..dispatch import flush

    flush("collective")
    name = func._schema.name.split("::")[1]
    if name == "wait_tensor":
        return args[0]   # the work completed when the collective returned
    index, originals, staged = [None], {}, []
    uargs = _unwrap(args, index, originals, staged)
    ukw = {k: _unwrap(v, index, originals, staged) for k, v in kwargs.items()}
    out = func(*uargs, **ukw)
    leaves, _ = tree_flatten(out)
    for v in leaves:
        if isinstance(v, torch.Tensor):
            torch.ops._c10d_functional.wait_tensor(v)
    for dst, tmp in staged:
        dst.copy_(tmp)
    idx = index[0] if index[0] is not None else torch.neuron.current_device()
    nbytes = max([_bytes(a) for a in args] + [_bytes(out)])
    charge(_KIND.get(name, "all_reduce"), nbytes, _world_size(args), idx, blocking=True)
    return _rewrap(out, originals, idx)


def install(host_table: dict) -> None:
    """Route every c10d and functional-collective op on neuron tensors to the handlers above."""
    for name in handled_ops():
        ns = name.split("::")[0]
        host_table.setdefault(name, c10d_op if ns == "c10d" else functional_op)
