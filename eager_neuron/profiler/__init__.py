"""Profiler: every op and kernel launch tied to the user's source line.

Three modules, in the order a profile moves through them: recording.py (step 1),
attribution.py (steps 2-3), views.py (step 4); every name is re-exported here.

    1. record: a dispatch hook (dispatch.OP_HOOKS) around each op and a launch hook
       (launch.HOOKS) per kernel append raw records to one process-wide list; each thread keeps
       its own stack of open ops, so autograd's device thread records safely beside the main one
    2. attribute: a top-level op gets the first frame outside torch and eager_neuron; a backward
       op gets "backward of <forward line>" through the autograd node's sequence number, which
       the forward op recorded with its line
    3. materialize at exit: `Event`s with inclusive and self times, and the device time that no
       kernel explains (DMA transfers) as `transfer` events cut from the simulated clock
    4. views: table(), export_chrome_trace(), to_dataframe(), to_parquet()
    5. kineto.py: torch.profiler (ProfilerActivity.PrivateUse1) gets the device kernels too

>>> import torch, eager_neuron
>>> with eager_neuron.profile() as prof:
...     y = torch.ones(4, device="neuron") * 2
>>> print(prof.table(group_by="op"))  # doctest: +SKIP
"""

from __future__ import annotations

from . import kineto as _kineto
from .attribution import FIELDS, Event, _materialize, _transfer  # noqa: F401
from .recording import (  # noqa: F401
    _ERRORS,
    _PENDING,
    _RECORDS,
    _SEQ_LOC,
    _SESSIONS,
    _kernel_name,
    _launch_hook,
    _op_hook,
    _start,
    _stop,
    record_flush,
)
from .views import Profile, Table, chrome_trace, profile, read_parquet  # noqa: F401

_kineto.install()   # torch.profiler with ProfilerActivity.PrivateUse1 shows neuron kernels

__all__ = ["Profile", "Table", "Event", "FIELDS", "profile", "read_parquet", "chrome_trace",
           "record_flush"]
