"""eager_neuron: a simulated Trainium-class accelerator that PyTorch sees as device `neuron`.

>>> import torch, eager_neuron
>>> x = torch.randn(4, 10, device="neuron")
>>> x.device
device(type='neuron', index=0)
"""

from __future__ import annotations

__version__ = "0.1.0"

from . import device as _device  # noqa: E402
from .config import config  # noqa: E402
from .stats import STATS  # noqa: E402

_device.register()
from . import conventions as _conventions  # noqa: E402

_conventions.install()   # storages, amp, devapi, pinned memory, ...: built on torch.neuron

from . import dispatch as _dispatch  # noqa: E402

_dispatch.install_privateuse1_impls()

from . import backward as _backward  # noqa: E402

_backward.install()
from . import hops as _hops  # noqa: E402
from . import numerics  # noqa: E402
from .adaptive import adaptive, set_adaptive  # noqa: E402
from .errors import KernelError, UnsupportedOpError, UnsupportedTensorError  # noqa: E402
from .mode import NeuronMode  # noqa: E402
from .numerics import check_numerics  # noqa: E402
from .profiler import profile  # noqa: E402
from .tensor import NeuronTensor  # noqa: E402

numerics.install_from_env()   # EAGER_NEURON_CHECK=1|nan: the numerics debugger for the process
_hops.install()   # torch.cond, while_loop, scan, map, ... on neuron (hops.py)

if config.disk_cache:
    # the disk tier; diskcache and numba are imported with the first kernel, not here
    from .cache import disk as _disk  # noqa: E402

    _disk.install()


def stats() -> dict:
    """Counters since import or the last reset_stats(): ops, launches, compiles, hits, ...

    >>> import eager_neuron
    >>> [k for k in ("ops", "launches", "compiles", "collectives") if k in eager_neuron.stats()]
    ['ops', 'launches', 'compiles', 'collectives']
    """
    from .simulator import SIM

    out = STATS.snapshot()
    # simulated device: device_time_us, launch_overhead_us, hbm_bytes, engine_busy_us, ...
    out.update(SIM.stats())
    return out


def reset_stats() -> None:
    """Zero every counter (kernels stay cached)."""
    from .simulator import SIM

    STATS.reset()
    SIM.reset_counters()


__all__ = [
    "NeuronMode", "NeuronTensor", "adaptive", "set_adaptive", "stats", "reset_stats", "config",
    "UnsupportedOpError",
    "UnsupportedTensorError", "KernelError", "profile", "__version__", "check_numerics",
]
from . import compile as _compile  # noqa: E402,F401 -- torch.compile backend "neuron" (docs/COMPILE.md)
from . import distributed as _distributed  # noqa: E402,F401 -- c10d "neuron" (DISTRIBUTED.md)
from .custom import kernel  # noqa: E402,F401 -- custom kernels (docs/KERNELS.md)
from .lower import rnn_seq as _rnn_seq  # noqa: E402,F401 -- nn.LSTM/GRU as sequence kernels
