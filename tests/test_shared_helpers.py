"""Kernel helper libraries compiled once per process (kernels/shared.py) and the kernels' njit
without the C-callable wrapper (kernels/compile.py): counters and identities, never times.

The results stay bit for bit what the Numba-inlined helpers gave (tools/bench_coldcompile.py
--diff OLD_TREE runs the check against an old checkout); here: the helpers are one dispatcher per
process, a second kernel compiles none of them again, and a second process loads the kernels that
link them from disk with zero compiles and the same bits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from eager_neuron.kernels import compile as kc
from eager_neuron.kernels import shared, sort
from eager_neuron.kernels.vmath import VMATH_PRELUDE


def _vexp_kernel(name: str, body: str):
    src = VMATH_PRELUDE + (f'@njit(error_model="numpy", nogil=True)\n'
                           f"def {name}(out, x):\n"
                           f"    for i in range(x.shape[0]):\n"
                           f"        out[i] = {body}\n")
    x = np.linspace(-3, 3, 101, dtype=np.float32)
    return kc.compile_kernel(src, name, kc.typeof_args((x, x))), x


def test_vmath_helpers_compiled_once_per_process():
    k1, x = _vexp_kernel("k_shared_a", "_vexp(x[i])")
    n = shared.compiled_signatures("_vexp")
    k2, _ = _vexp_kernel("k_shared_b", "_vexp(x[i]) * np.float32(2)")
    # the second kernel links the first one's compiled helper: no new signature, one dispatcher
    assert n == 1 and shared.compiled_signatures("_vexp") == 1
    assert k1.py_func.__globals__["_vexp"] is k2.py_func.__globals__["_vexp"]
    assert shared.STATS["libraries_built"] >= 1
    a, b = np.empty_like(x), np.empty_like(x)
    k1(a, x)
    k2(b, x)
    assert np.array_equal(b, a * np.float32(2))
    # the vmath contract (tests/test_vmath.py checks every float32): 1 ulp of exp
    assert np.allclose(a, np.exp(x.astype(np.float64)), rtol=2.4e-7, atol=0)


def test_sort_helpers_shared_across_kernels():
    x = np.random.default_rng(0).standard_normal((3, 40)).astype(np.float32)
    vals, inds = np.empty_like(x), np.empty(x.shape, np.int64)
    src, name = sort.render_rows("sort", 1)
    k1 = kc.compile_kernel(src, name, kc.typeof_args((vals, inds, x, 0, 0)))
    n = shared.compiled_signatures("_introsort")
    src3, name3 = sort.render_rows("sort", 2)
    x3 = x.reshape(1, 3, 40)
    k3 = kc.compile_kernel(src3, name3, kc.typeof_args((vals.reshape(1, 3, 40),
                                                        inds.reshape(1, 3, 40), x3, 0, 0)))
    assert n >= 1 and shared.compiled_signatures("_introsort") == n   # reused, not recompiled
    k1(vals, inds, x, 0, 0)
    assert np.array_equal(vals, np.sort(x, 1))
    assert np.array_equal(np.take_along_axis(x, inds, 1), vals)
    v3, i3 = np.empty_like(x3), np.empty(x3.shape, np.int64)
    k3(v3, i3, x3, 1, 1)   # descending, stable
    assert np.array_equal(v3[0], -np.sort(-x, 1))


def test_kernels_compile_without_cfunc_wrapper():
    k, _ = _vexp_kernel("k_shared_c", "_vexp(x[i]) + np.float32(1)")
    assert k.targetoptions.get("no_cfunc_wrapper") is True
    ns = kc._namespace()
    exec('@njit(no_cfunc_wrapper=False)\ndef k_keeps(x):\n    return x\n', ns)
    assert ns["k_keeps"].targetoptions["no_cfunc_wrapper"] is False   # the source's word wins


def test_register_refuses_numba_inlining_and_name_clashes():
    with pytest.raises(ValueError, match="inline"):
        shared.register("t_inline", '@njit(inline="always")\ndef _t_a(x):\n    return x\n')
    shared.register("t_one", "@njit\ndef _t_b(x):\n    return x\n")
    with pytest.raises(ValueError, match="already defined"):
        shared.register("t_two", "@njit\ndef _t_b(x):\n    return x\n")
    line = shared.register("t_forced", "@njit(forceinline=True)\ndef _t_c(x):\n    return x\n")
    assert line.startswith("from eager_neuron.kernels.shared import (_t_c,)")


_CHILD = r"""
import json, sys, torch, eager_neuron
import torch.nn.functional as F
x = torch.linspace(-6, 6, 301)
y = torch.tensor([3.0, float("nan"), -0.0, 1.0, -float("inf"), 0.0, 2.0])
img = torch.arange(20.0).view(1, 1, 4, 5)
outs = [F.gelu(x.to("neuron")), torch.tanh(x.to("neuron")),
        torch.sort(y.to("neuron"))[0], torch.sort(y.to("neuron"))[1],
        F.interpolate(img.to("neuron"), size=(7, 9), mode="bicubic")]
bits = [o.cpu().contiguous().view(-1).view(torch.int32 if o.dtype == torch.float32
        else torch.int64).tolist() for o in outs]
st = eager_neuron.stats()
print(json.dumps({"compiles": st["compiles"], "disk_hits": st["disk_hits"], "bits": bits}))
"""


def test_second_process_loads_shared_helper_kernels_with_zero_compiles(tmp_path):
    env = dict(os.environ, EAGER_NEURON_CACHE_DIR=str(tmp_path))
    env.pop("EAGER_NEURON_ADAPTIVE", None)
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["compiles"] >= 4 and second["compiles"] == 0   # (the two sorts: one kernel)
    assert second["disk_hits"] >= 4
    assert second["bits"] == first["bits"]
