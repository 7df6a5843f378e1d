"""A kernel the memory tier drops is freed (launch._release).

Numba keeps every compiled function in its target context until the dispatcher is collected,
and that entry reached the kernel's exec namespace, which held the dispatcher: a cleared kernel
cache freed nothing, and each reload (from the disk tier or a compile) added its kernels again.
tools/fuzz_fastpath.py, which clears the cache in its programs, grew by ~1,400 dispatchers (and
~500k Python objects gc walks) in 30 programs. Counted here: live dispatchers and Numba's
registered functions across clear-and-reload cycles, for compiled and disk-loaded kernels.
"""

from __future__ import annotations

import gc

import numpy as np
import torch

import eager_neuron  # noqa: F401
from eager_neuron.launch import MEMORY, launch


def _live():
    from numba.core.registry import CPUDispatcher, cpu_target

    gc.collect()
    dispatchers = sum(type(o) is CPUDispatcher for o in gc.get_objects())
    return dispatchers, len(cpu_target.target_context._defns)


def _ops(x):
    return (x * 2 + 1).exp().sum() + x.softmax(0).amax() + x @ x


def test_a_cleared_kernel_cache_frees_its_kernels():
    x = torch.randn(64, device="neuron")
    want = _ops(x.cpu())
    for _ in range(2):   # warm: every kernel compiled or on disk
        _ops(x)
        MEMORY.clear()
    before = _live()
    for _ in range(5):
        got = _ops(x)    # reloaded from the disk tier (or compiled)
        MEMORY.clear()
    torch.testing.assert_close(got.cpu(), want)
    assert _live() == before


def test_a_freshly_compiled_kernel_is_freed_with_the_cache():
    def render(k):
        helper = f"@njit(inline='always')\ndef h{k}(v):\n    return v + {k}\n"
        return helper + f"@njit\ndef fill{k}(o):\n    o[:] = h{k}(1.0)\n", f"fill{k}"

    out = np.zeros(4)
    launch(("test_release", "warm"), lambda: render(0), (out,))
    MEMORY.clear()
    before = _live()
    for k in range(1, 4):
        launch(("test_release", "fresh", k), lambda k=k: render(k), (out,))
        assert out.tolist() == [1.0 + k] * 4
        MEMORY.clear()
    assert _live() == before
