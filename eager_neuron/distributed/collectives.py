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
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_tensor_out": "reduce_scatter",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all", "all_to_all_single": "all_to_all",
    "gather_": "gather", "scatter_": "scatter",
    "send": "p2p", "recv_": "p2p", "recv_any_source_": "p2p", "isend": "p2p", "irecv": "p2p",
    "batch_p2p_ops": "p2p",
    "barrier": "barrier", "monitored_barrier_": "barrier",
}
_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd")

# -- the cross-rank agreement check -------------------------------------------------------------
# gloo cannot tell a float32 all-reduce from an int32 one of the same byte size (a silent wrong
# answer), and a size mismatch aborts one rank from gloo's worker thread. So before a collective
# every rank all-gathers a 4-integer fingerprint (op, dtype, tensor count, numel) of what it is
# about to send; on any disagreement every rank raises the same clear error and none sends.
# One small extra collective per collective; EAGER_NEURON_DIST_CHECK=0 turns it off, and
# TORCH_DISTRIBUTED_DEBUG=DETAIL replaces it with PyTorch's own (stricter) wrapper check.
# op name -> (index of the argument whose tensors must agree, "full" | "dtype")
_CHECK_ARG = {
    "allreduce_": (0, "full"), "allreduce_coalesced_": (0, "full"), "broadcast_": (0, "full"),
    "reduce_": (0, "full"), "allgather_": (1, "full"), "_allgather_base_": (1, "full"),
    "allgather_coalesced_": (1, "full"), "allgather_into_tensor_coalesced_": (1, "full"),
    "reduce_scatter_": (0, "full"), "_reduce_scatter_base_": (1, "full"),
    "reduce_scatter_tensor_coalesced_": (1, "full"), "alltoall_": (1, "dtype"),
    "alltoall_base_": (1, "dtype"),
    "all_reduce": (0, "full"), "all_reduce_": (0, "full"), "all_reduce_coalesced": (0, "full"),
    "all_reduce_coalesced_": (0, "full"), "broadcast": (0, "full"),
    "all_gather_into_tensor": (0, "full"), "all_gather_into_tensor_out": (0, "full"),
    "all_gather_into_tensor_coalesced": (0, "full"), "reduce_scatter_tensor": (0, "full"),
    "reduce_scatter_tensor_out": (0, "full"), "reduce_scatter_tensor_coalesced": (0, "full"),
    "all_to_all_single": (0, "dtype"),
}
_OP_IDS = {name: i + 1 for i, name in enumerate(sorted(_CHECK_ARG))}
_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]


def _check_enabled() -> bool:
    if os.environ.get("EAGER_NEURON_DIST_CHECK", "1").strip().lower() in ("0", "false", "off"):
        return False
    from torch.distributed import distributed_c10d as c10d

    return c10d.get_debug_level() != c10d.DebugLevel.DETAIL


def _fingerprint(name: str, args) -> list[int] | None:
    spec = _CHECK_ARG.get(name)
    if spec is None or spec[0] >= len(args):
        return None
    leaves = [t for t in tree_flatten(args[spec[0]])[0] if isinstance(t, torch.Tensor)]
    if not leaves:
        return None
    dt = leaves[0].dtype
    code = _DTYPES.index(dt) + 1 if dt in _DTYPES else 99
    if any(t.dtype != dt for t in leaves):
        code = 100
    if spec[1] == "dtype":
        return [_OP_IDS[name], code, -1, -1]
    return [_OP_IDS[name], code, len(leaves), sum(t.numel() for t in leaves)]


def _describe(fp: list[int]) -> str:
    names = {v: k for k, v in _OP_IDS.items()}
    op = names.get(fp[0], "?")
    dt = str(_DTYPES[fp[1] - 1]).replace("torch.", "") if 0 < fp[1] <= len(_DTYPES) else (
        "mixed dtypes" if fp[1] == 100 else "other dtype")
    if fp[2] < 0:
        return f"{op} of {dt}"
    return f"{op} of {fp[2]} {dt} tensor(s), {fp[3]} elements"


def _agree(name: str, args, pg) -> None:
    """Raise the same RuntimeError on every rank if the ranks' collectives disagree."""
    fp = _fingerprint(name, args)
    if fp is None or pg is None or pg.size() <= 1 or not _check_enabled():
        return
    import torch.distributed as dist

    mine = torch.tensor(fp, dtype=torch.int64)
    every = torch.empty(pg.size() * 4, dtype=torch.int64)
    dist.all_gather_into_tensor(every, mine, group=pg)
    rows = every.view(pg.size(), 4).tolist()
    if all(r == rows[0] for r in rows):
        return
    from .. import errors

    lines = "\n".join(f"    rank {r}: {_describe(row)}" for r, row in enumerate(rows))
    raise RuntimeError(
        f"collective mismatch across ranks (this is rank {pg.rank()}): the ranks called\n"
        f"{lines}\n{errors.where()}\n  fix: every rank must issue the same collective, in the "
        "same order, with the same dtype and number of elements; nothing was sent "
        "(EAGER_NEURON_DIST_CHECK=0 skips this check)")


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
    _to_profiler(kind, nbytes, t, index)
    return t


def _to_profiler(kind: str, nbytes: int, t: float, index: int) -> None:
    """One `collective:<kind>` entry on the profiler's timeline (the launch hooks' event form)."""
    from .. import launch

    if not launch.HOOKS:
        return
    event = {"key": ("collective", kind), "outcome": "collective", "compile_s": 0.0,
             "host_us": 0.0, "device_us": t, "bytes": nbytes, "flops": 0.0, "engine": "dma"}
    from ..context import OpContext, using

    with using(OpContext(index)):   # the hook reads the core from the op context
        for hook in list(launch.HOOKS):
            hook(event)


def _bytes(x) -> int:
    leaves, _ = tree_flatten(x)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def _group(args):
    """The op's process group: a boxed ProcessGroup argument, or a functional op's group name."""
    from torch._C._distributed_c10d import ProcessGroup
    from torch.distributed.distributed_c10d import _resolve_process_group

    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                return ProcessGroup.unbox(a)
            except RuntimeError:
                continue
    for a in reversed(args):
        if isinstance(a, str):
            try:
                return _resolve_process_group(a)
            except Exception:   # noqa: BLE001 - not a group name
                continue
    return None


def _world_size(pg) -> int:
    return pg.size() if pg is not None else 1


# -- unwrap / stage / rewrap -----------------------------------------------------------------------
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
_PATCHED = [False]


def _patch_libraries() -> None:
    """FSDP2/DDP adjustments (fsdp.py, ddp.py) for groups not made by the neuron backend (e.g.
    init_process_group("gloo") used with neuron tensors): installed at the first collective."""
    if _PATCHED[0]:
        return
    _PATCHED[0] = True
    from . import ddp, fsdp

    fsdp.install()
    ddp.install()


def c10d_op(func, args, kwargs, mode):
    """A c10d op (dist.all_reduce & co., DDP's reducer): gloo runs it on the device memory."""
    if mode is not None:
        return func(*args, **kwargs)
    from ..dispatch import flush

    flush("collective")
    _patch_libraries()
    name = func._schema.name.split("::")[1]
    pg = _group(args)
    _agree(name, args, pg)
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
    nbytes = max([_bytes(a) for a in args] + [0])
    charge(_KIND.get(name, "all_reduce"), nbytes, _world_size(pg), idx,
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
    _patch_libraries()
    pg = _group(args)
    _agree(name, args, pg)
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
    charge(_KIND.get(name, "all_reduce"), nbytes, _world_size(pg), idx, blocking=True)
    return _rewrap(out, originals, idx)


def install(host_table: dict) -> None:
    """Route every c10d and functional-collective op on neuron tensors to the handlers above."""
    for name in handled_ops():
        ns = name.split("::")[0]
        host_table.setdefault(name, c10d_op if ns == "c10d" else functional_op)
