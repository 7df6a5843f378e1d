"""Ops whose CPU kernel takes only some dtypes refuse the others on neuron, in the CPU's words
plus the op, the dtype and the fix (refusals._dtype_rule): gelu and its backward, histc and
adaptive max pooling on integers and bool, the max pools on bool. Neuron's kernels answered
them (F.gelu(torch.tensor([1, 2]).to("neuron")) gave int64 values). Every dtype x op against
the CPU's outcome: refused where it refuses, answered where it answers."""

from __future__ import annotations

import warnings

import pytest
import torch

import eager_neuron  # noqa: F401

F = torch.nn.functional
CASES = {
    "gelu": lambda t: F.gelu(t),
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "gelu_": lambda t: torch.ops.aten.gelu_(t.clone()),
    "gelu_backward": lambda t: torch.ops.aten.gelu_backward(t, t),
    "histc": lambda t: t.histc(),
    "max_pool2d": lambda t: F.max_pool2d(t.reshape(1, 1, 2, 2), 2),
    "max_pool2d_indices": lambda t: F.max_pool2d(t.reshape(1, 1, 2, 2), 2, return_indices=True),
    "max_pool3d": lambda t: F.max_pool3d(t.reshape(1, 1, 1, 2, 2), (1, 2, 2)),
    "adaptive_max_pool1d": lambda t: F.adaptive_max_pool1d(t.reshape(1, 1, 4), 2),
    "adaptive_max_pool2d": lambda t: F.adaptive_max_pool2d(t.reshape(1, 1, 2, 2), 1),
}
DTYPES = [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool, torch.float32,
          torch.float64, torch.bfloat16]


def _outcome(f, t):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            f(t)
        except Exception as e:        # noqa: BLE001 - the type is what is compared
            return type(e).__name__
    return "ok"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_refused_where_the_cpu_refuses(name, dtype):
    f = CASES[name]
    t = torch.tensor([1, 2, 3, 0]).to(dtype)
    assert _outcome(f, t.to("neuron")) == _outcome(f, t)


def test_the_refusal_names_the_op_the_dtype_and_the_fix():
    with pytest.raises(NotImplementedError) as e:
        F.gelu(torch.tensor([1, 2]).to("neuron"))
    msg = str(e.value)
    assert "GeluKernelImpl" in msg and "aten::gelu" in msg and "torch.int64" in msg
    assert "x.float()" in msg
