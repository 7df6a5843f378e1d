"""Compiled functions get names no other process gives them (kernels/compile.py
`_unique_function_ids`): Numba's linkonce_odr symbols of two processes' kernels never meet in
the JIT of a third that loads both from the disk cache."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SCRIPT = r'''
import numpy as np
from eager_neuron.kernels.compile import compile_kernel
k = compile_kernel("""
@njit
def _helper(x):
    return x + 1.0

@njit(error_model="numpy", nogil=True)
def kern(out, x):
    for i in range(x.shape[0]):
        out[i] = _helper(x[i])
""", "kern")
k(np.empty(2), np.ones(2))
(cres,) = k.overloads.values()
print(cres.fndesc.mangled_name)
'''


def _name() -> str:
    out = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_two_processes_name_the_same_kernel_differently():
    a, b = _name(), _name()
    assert "kern" in a and "kern" in b
    assert a != b   # same source, same types: only the per-process counter tells them apart
