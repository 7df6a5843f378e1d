"""Cache keys and their versions.

A kernel key is a flat tuple of exactly what changes the generated code:
    (FORMAT_VERSION, family, op, tensor types, static scalars, variant)
and the disk tier adds `toolchain()` so that a numba/llvmlite/numpy/torch/CPU change is a miss.
"""

from __future__ import annotations

import functools
import platform

FORMAT_VERSION = 1   # bump when any renderer's output changes


@functools.lru_cache(maxsize=1)
def toolchain() -> tuple:
    import llvmlite
    import numba
    import numpy
    import torch

    from eager_neuron import __version__

    try:
        import llvmlite.binding as llvm

        cpu = (llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten())
    except Exception:  # pragma: no cover - llvmlite without host queries
        cpu = (platform.machine(), "")
    return (
        __version__,
        numba.__version__,
        llvmlite.__version__,
        numpy.__version__,
        torch.__version__,
        platform.machine(),
        cpu,
    )
