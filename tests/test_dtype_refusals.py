"""Ops whose CPU kernel takes only some dtypes refuse the others on neuron, in the CPU's words
plus the op, the dtype and the fix (refusals._dtype_rule): gelu and its backward and adaptive
max pooling on integers and bool, the max pools on bool (histc of integers answers, as on CUDA:
transformers' MoE layers use it; test_model_families.py). Neuron's kernels answered
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


# dispatch's dtype gate: the first call of an (op, operand dtypes) with an operand that is not
# float32/float64 is asked of the CPU; a dtype its kernel is not built for is refused in its
# words. (OpInfo's supported-dtype tables, swept: 272 such calls answered on neuron before.)
GATED = {
    "bessel_j0_bf16": (lambda t: torch.special.bessel_j0(t), torch.bfloat16),
    "log_ndtr_f16": (lambda t: torch.special.log_ndtr(t), torch.float16),
    "glu_int": (lambda t: F.glu(t.reshape(2, 2)), torch.int64),
    "silu_int": (lambda t: F.silu(t), torch.int32),
    "softplus_int": (lambda t: F.softplus(t), torch.int64),
    "hardswish_int": (lambda t: F.hardswish(t), torch.int8),
    "mse_complex": (lambda t: F.mse_loss(t, t), torch.complex64),
    "xlogy_complex": (lambda t: torch.xlogy(t, t), torch.complex64),
    "lu_int": (lambda t: torch.linalg.lu(t.reshape(2, 2)), torch.int64),
    "cholesky_f16": (lambda t: torch.linalg.cholesky(t.reshape(2, 2)), torch.float16),
    "mv_bool": (lambda t: torch.mv(t.reshape(2, 2), t[:2]), torch.bool),
    "clamp_tensor_bool": (lambda t: t.clamp(t, t), torch.bool),
    "unfold_int": (lambda t: F.unfold(t.reshape(1, 1, 2, 2), 1), torch.int64),
    "avg_pool3d_f16": (lambda t: F.avg_pool3d(t.reshape(1, 1, 1, 2, 2), 1), torch.float16),
    "add_int_ok": (lambda t: t + t, torch.int64),
    "matmul_int_ok": (lambda t: t.reshape(2, 2) @ t.reshape(2, 2), torch.int64),
    "sum_bool_ok": (lambda t: t.sum(), torch.bool),
}


@pytest.mark.parametrize("name", list(GATED))
def test_dtype_gate_follows_the_cpu(name):
    f, dtype = GATED[name]
    t = torch.tensor([1, 2, 3, 0]).to(dtype)
    ref, got = _outcome(f, t), _outcome(f, t.to("neuron"))
    assert got == ref, (ref, got)
    assert (ref == "ok") == name.endswith("_ok")


def test_dtype_gate_asks_the_cpu_once_per_op_and_dtypes(monkeypatch):
    from eager_neuron import dispatch

    asked = []
    real = dispatch.cpu_raises
    monkeypatch.setattr(dispatch, "cpu_raises", lambda *a: asked.append(a[0]) or real(*a))
    monkeypatch.setattr(dispatch, "_DTYPES_RAN", set())
    x = torch.randn(5).to("neuron")
    i = torch.tensor([0, 3, 1]).to("neuron")
    for _ in range(3):
        x * 2                          # float32 only: never asked
        x.index_select(0, i)           # an int64 operand: asked once
        (i * 2).sum()
    assert asked.count(torch.ops.aten.index_select.default) == 1
    assert torch.ops.aten.mul.Tensor not in asked or asked.count(torch.ops.aten.mul.Tensor) == 1
