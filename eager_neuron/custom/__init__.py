"""Custom kernels: `eager_neuron.kernel` (core.py; source.py renders the user's function as Numba
source) and Python PrivateUse1 registrations
(privateuse1.py). See docs/KERNELS.md.

>>> from eager_neuron.custom import kernel, privateuse1_impl, set_debug
"""

from __future__ import annotations

from .core import Kernel, KernelTypingError, kernel, set_debug
from .privateuse1 import privateuse1_impl

__all__ = ["Kernel", "KernelTypingError", "kernel", "privateuse1_impl", "set_debug"]
