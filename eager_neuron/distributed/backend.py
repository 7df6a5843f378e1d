"""The c10d backend "neuron": gloo on the tensors' host-backed memory, registered for the device.

`dist.init_process_group()` (no backend: the accelerator's default), `init_process_group("neuron")`
and `init_process_group("cpu:gloo,neuron:neuron")` all build a process group whose neuron
collectives run through one gloo instance over TCP (it spans hosts as gloo does). The same gloo
serves CPU tensors of that group, so `dist.all_gather_object`, a CPU barrier or a CPU metric
all-reduce work in a neuron-only group too (NCCL groups cannot do that; here it is free).

>>> import torch.distributed as dist, eager_neuron
>>> dist.Backend.default_device_backend_map["neuron"]
'neuron'
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

NAME = "neuron"


def _create(opts, backend_options=None):
    """Extended-API creator: a ProcessGroup with gloo bound to both `cpu` and `neuron`.

    Returning a whole ProcessGroup (instead of a bare Backend) is the path PyTorch takes for a
    creator that builds its own group (distributed_c10d._new_process_group_helper): it is the
    only way one backend string can also serve the group's CPU tensors.
    """
    from . import ddp, fsdp

    fsdp.install()   # FSDP2's reshard frees neuron memory through the host-backed storage
    ddp.install()    # refuse find_unused_parameters on neuron up front (see ddp.py)
    store, rank, size = opts.store, opts.group_rank, opts.group_size
    timeout = opts.timeout if opts.timeout is not None else datetime.timedelta(minutes=30)
    gloo = dist.ProcessGroupGloo(store, rank, size, timeout=timeout)
    gloo.options.global_ranks_in_group = list(opts.global_ranks_in_group)
    gloo.options.group_name = opts.group_id
    gloo._set_sequence_number_for_group()
    backend = gloo
    if c10d.get_debug_level() == dist.DebugLevel.DETAIL:
        # TORCH_DISTRIBUTED_DEBUG=DETAIL: the wrapper checks every collective's shapes, dtypes
        # and op across ranks before running it (what PyTorch does for its own backends)
        backend = c10d._create_process_group_wrapper(
            wrapped_pg=gloo, store_prefix=opts.group_id, store=store, rank=rank,
            world_size=size, timeout=timeout)
    pg = dist.ProcessGroup(store, rank, size)
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    pg._register_backend(torch.device(NAME), dist.ProcessGroup.BackendType.CUSTOM, backend)
    return pg


_registered = False


def register() -> None:
    """Register the "neuron" backend and make it the neuron device's default (idempotent)."""
    global _registered
    if _registered or not dist.is_available():
        return
    _registered = True
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=[NAME])
    # NOTE: "neuron" alone names the whole group (its CPU tensors too): the creator binds both
    dist.Backend.backend_capability[NAME] = ["cpu", NAME]
