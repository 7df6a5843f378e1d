"""The one bfloat16 / float16 rounding rule of kernels (kernels/halfround.py) against the CPU's
conversion, over a sweep of float32 bit patterns (normals, subnormals, ties, overflow, inf, NaN).
Conversion to a half type is exact arithmetic (round to nearest even), the same on every ISA."""

import math

import numpy as np
import pytest
import torch

from eager_neuron.kernels.compile import numba as _numba
from eager_neuron.kernels.halfround import ROUND_BF16, ROUND_F16

# NOTE: Numba through eager_neuron (its code generator's CPU features set first): a Numba
# compile before that would give this test process another toolchain than its child processes
# (the disk-cache tests that share an xdist worker with it would miss across processes)
_NS = {"njit": _numba().njit, "np": np, "math": math}
exec(ROUND_BF16 + ROUND_F16 + '''
@njit
def _apply(kind, a, o):
    for i in range(a.size):
        o[i] = _round_bf16(a[i]) if kind == 0 else _round_f16(a[i])
''', _NS)


def _patterns() -> np.ndarray:
    step = np.arange(0, 2 ** 32, 4099, dtype=np.uint64).astype(np.uint32)
    # every tie and its neighbours around 1.0 and in the subnormals of both types
    near = [0x3F800000 + d for d in range(-70000, 70000, 7)]
    near += [0x00000000 + d for d in range(0, 70000, 3)] + [0x33800000 + d for d in range(-9, 9)]
    edge = [0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x477FF000, 0x477FEFFF, 0x477FE000, 0x7F800000,
            0xFF800000, 0x7FC00001, 0xFFFFFFFF, 0x80000000, 0x80000001]
    return np.concatenate([step, np.array(near + edge, np.uint32)]).view(np.float32)


@pytest.mark.parametrize("kind, dtype", [(0, torch.bfloat16), (1, torch.float16)])
def test_rounding_matches_the_cpu_conversion(kind, dtype):
    x = _patterns()
    got = np.empty_like(x)
    _NS["_apply"](kind, x, got)
    want = torch.from_numpy(x).to(dtype).float().numpy()
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    # bit for bit (the sign of zero included) wherever the result is a number
    bad = (got.view(np.uint32) != want.view(np.uint32)) & ~nan
    assert not bad.any(), (x[bad][:5], got[bad][:5], want[bad][:5])
