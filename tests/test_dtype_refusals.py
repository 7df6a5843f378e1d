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


def _h(d):
    return torch.randn(2, 3, dtype=torch.float16, device=d)


def _w(d, dtype=torch.float32):
    return torch.randn(3, 4, dtype=dtype, device=d)


def _b(d, dtype=torch.float32):
    return torch.randn(4, dtype=dtype, device=d)


# matrix products with operands of different dtypes: the CPU refuses (its words), neuron's
# half route and promoting float kernels answered (fuzz_adaptive seed 17290: addmm of a
# float16 input, a float32 weight and bias)
MIXED_PRODUCTS = {
    "mm_half_float": lambda d: _h(d) @ _w(d),
    "mm_long_float": lambda d: torch.ones(2, 3, dtype=torch.long, device=d) @ _w(d),
    "addmm_half_input": lambda d: torch.addmm(_b(d), _h(d), _w(d)),
    "addmm_half_bias": lambda d: torch.addmm(_b(d, torch.float16), _h(d).float(), _w(d)),
    "addmm_inplace": lambda d: torch.randn(3, 4, device=d).addmm_(_w(d, torch.float64)[:, :3],
                                                                  _w(d)),
    "linear_half_input": lambda d: torch.nn.functional.linear(_h(d), _w(d).t(), _b(d)),
    "mv_double_vec": lambda d: torch.mv(_w(d), _b(d, torch.float64)),
    "dot": lambda d: torch.dot(_b(d), _b(d, torch.float64)),
    "bmm_bf16_float": lambda d: torch.bmm(torch.randn(1, 2, 3, device=d).bfloat16(),
                                          torch.randn(1, 3, 2, device=d)),
    "addr_mixed_ok": lambda d: torch.addr(torch.randn(4, 4, device=d), _b(d),
                                          _b(d, torch.float64)),
    "addmm_half_ok": lambda d: torch.addmm(_b(d, torch.float16), _h(d), _w(d, torch.float16)),
}


@pytest.mark.parametrize("name", list(MIXED_PRODUCTS))
def test_products_of_mixed_dtypes_follow_the_cpu(name):
    f = MIXED_PRODUCTS[name]
    outcome = []
    for d in ("cpu", "neuron"):
        try:
            r = f(d)
            outcome.append(("ok", r.dtype, tuple(r.shape)))
        except RuntimeError as e:
            outcome.append(("RuntimeError", str(e).splitlines()[0]))
    assert outcome[1] == outcome[0], outcome
    assert (outcome[0][0] == "ok") == name.endswith("_ok")
