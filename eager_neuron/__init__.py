"""eager_neuron: a simulated Trainium-class accelerator that PyTorch sees as device `neuron`.

>>> import torch, eager_neuron
>>> x = torch.randn(4, 10, device="neuron")
>>> x.device
device(type='neuron', index=0)
"""

from __future__ import annotations

__version__ = "0.1.0"

from .config import config  # noqa: E402
from .stats import STATS  # noqa: E402
from . import device as _device  # noqa: E402

_device.register()

from . import dispatch as _dispatch  # noqa: E402,F401
from .errors import KernelError, UnsupportedOpError, UnsupportedTensorError  # noqa: E402
from .mode import NeuronMode  # noqa: E402
from .tensor import NeuronTensor  # noqa: E402


def stats() -> dict:
    """Counters since import or the last reset_stats(): ops, launches, compiles, hits, ...

    >>> import eager_neuron; sorted(eager_neuron.stats())[:3]
    ['compile_seconds', 'compiles', 'decompositions']
    """
    from .simulator import SIM

    out = STATS.snapshot()
    out["device_time_us"] = SIM.device_time_us()
    out["launch_overhead_us"] = sum(c.launch_overhead_us for c in SIM.cores)
    out["hbm_bytes"] = sum(c.hbm_bytes for c in SIM.cores)
    busy: dict = {}
    for c in SIM.cores:
        for engine, us in c.busy_us.items():
            busy[engine] = busy.get(engine, 0.0) + us
    out["engine_busy_us"] = busy
    return out


def reset_stats() -> None:
    """Zero every counter (kernels stay cached)."""
    STATS.reset()


__all__ = [
    "NeuronMode", "NeuronTensor", "stats", "reset_stats", "config", "UnsupportedOpError",
    "UnsupportedTensorError", "KernelError", "__version__",
]
