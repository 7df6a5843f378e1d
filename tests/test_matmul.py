"""The matmul family on `neuron` against the CPU: mm, addmm, bmm, baddbmm, addbmm, mv, addmv,
dot; transposed, strided and broadcast operands; the bias/scale epilogue; nn.Linear forward and
backward; counters (no CPU fallback or decomposition of these ops, no recompile for a new batch).

Cases reuse kernels (keyed on op, dtype, layout and epilogue, never on sizes), so the file
compiles a few dozen small kernels in total.
"""

from __future__ import annotations

import copy

import pytest
import torch

import eager_neuron
from eager_neuron.lower import matmul as lmm

DEV = "neuron"
FLOATS = (torch.float32, torch.float64)
# BLAS libraries differ (MKL on the CPU side, OpenBLAS here): a few float32 ulps
TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.float64: {}, torch.int64: {}}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _rand(*shape, dtype=torch.float32):
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype)
    return torch.randint(-9, 9, shape, dtype=dtype)


def _ours_clean():
    """None of this family's ops fell back to the CPU or to a decomposition."""
    st = eager_neuron.stats()
    ours = set(lmm.LOWERINGS)
    assert not ours & set(st["fallbacks"]), st["fallbacks"]
    assert not ours & set(st["decompositions"]), st["decompositions"]


def run(fn, *xs, dtype=torch.float32):
    """fn on neuron copies of xs and on xs: same values, no fallback for our ops."""
    eager_neuron.reset_stats()
    got = fn(*[x.to(DEV) for x in xs])
    want = fn(*xs)
    torch.testing.assert_close(got.cpu(), want, **TOL[dtype])
    _ours_clean()
    return got


# -- mm: layouts ---------------------------------------------------------------------------------

# every layout in float32; float64 and int64 on two (each layout pair is its own kernel)
MM_CASES = [(torch.float32, lay) for lay in ("contig", "a_t", "b_t", "both_t", "sliced",
                                             "expanded")]
MM_CASES += [(dt, lay) for dt in (torch.float64, torch.int64) for lay in ("contig", "b_t")]


@pytest.mark.parametrize(("dtype", "layout"), MM_CASES)
def test_mm_layouts(dtype, layout):
    a, b = _rand(5, 7, dtype=dtype), _rand(7, 3, dtype=dtype)
    fns = {
        "contig": lambda a, b: a @ b,
        "a_t": lambda a, b: a.t().contiguous().t() @ b,          # F-contiguous: no copy
        "b_t": lambda a, b: a @ b.t().contiguous().t(),
        "both_t": lambda a, b: (b.t() @ a.t()).t(),
        "sliced": lambda a, b: a[:, ::2] @ b[:4],                 # genuinely strided: copied
        "expanded": lambda a, b: a @ b[:, :1].expand(7, 3),
    }
    run(fns[layout], a, b, dtype=dtype)


def test_transposed_weight_is_not_copied():
    """nn.Linear's weight.t() is F-contiguous: one launch, no cast-kernel copy."""
    a, w = _rand(8, 16).to(DEV), _rand(4, 16).to(DEV)
    a @ w.t()
    eager_neuron.reset_stats()
    a @ w.t()
    assert eager_neuron.stats()["launches"] == 1


@pytest.mark.parametrize("shape", [(0, 3, 4), (3, 0, 4), (3, 4, 0), (1, 5, 1)])
def test_mm_degenerate(shape):
    m, k, n = shape
    run(torch.mm, _rand(m, k), _rand(k, n))


def test_mm_int32_and_uint8():
    for dtype in (torch.int32, torch.uint8):
        a = torch.randint(0, 9, (6, 5)).to(dtype)
        b = torch.randint(0, 9, (5, 4)).to(dtype)
        run(torch.mm, a, b, dtype=torch.int64)


# -- addmm: the fused epilogue -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("bias_shape", [(3,), (5, 1), (5, 3), ()])
def test_addmm_bias_broadcast(dtype, bias_shape):
    beta, alpha = (2, 3) if not dtype.is_floating_point else (0.5, 1.5)
    run(lambda c, a, b: torch.addmm(c, a, b, beta=beta, alpha=alpha),
        _rand(*bias_shape, dtype=dtype), _rand(5, 7, dtype=dtype), _rand(7, 3, dtype=dtype),
        dtype=dtype)


def test_addmm_one_launch():
    c, a, b = _rand(3).to(DEV), _rand(5, 7).to(DEV), _rand(7, 3).to(DEV)
    torch.addmm(c, a, b, beta=0.5, alpha=2.0)
    eager_neuron.reset_stats()
    torch.addmm(c, a, b, beta=0.25, alpha=4.0)      # new scalars: same kernel
    st = eager_neuron.stats()
    assert st["launches"] == 1 and st["compiles"] == 0


def test_addmm_beta_zero_ignores_nan_bias():
    c = torch.full((5, 3), float("nan"))
    run(lambda c, a, b: torch.addmm(c, a, b, beta=0, alpha=2.0), c, _rand(5, 7), _rand(7, 3))


@pytest.mark.parametrize("dtype", [torch.float64])
def test_addmm_inplace(dtype):
    def fn(c, a, b):
        c = c.clone()
        c.addmm_(a, b, beta=0.5, alpha=2.0)
        return c
    run(fn, _rand(5, 3, dtype=dtype), _rand(5, 7, dtype=dtype), _rand(7, 3, dtype=dtype),
        dtype=dtype)


# -- batched ---------------------------------------------------------------------------------------

BMM_CASES = [(torch.float32, lay) for lay in ("contig", "transposed", "broadcast", "strided")]
BMM_CASES += [(torch.float64, "transposed"), (torch.int64, "strided")]


@pytest.mark.parametrize(("dtype", "layout"), BMM_CASES)
def test_bmm_layouts(dtype, layout):
    a, b = _rand(4, 5, 7, dtype=dtype), _rand(4, 7, 3, dtype=dtype)
    fns = {
        "contig": torch.bmm,
        "transposed": lambda a, b: torch.bmm(a.transpose(1, 2).contiguous().transpose(1, 2),
                                             b.transpose(1, 2).contiguous().transpose(1, 2)),
        "broadcast": lambda a, b: torch.bmm(a, b[:1].expand(4, 7, 3)),
        "strided": lambda a, b: torch.bmm(a[:, :, ::2], b[:, :4]),
    }
    run(fns[layout], a, b, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_baddbmm_addbmm(dtype):
    c3, c2 = _rand(5, 1, dtype=dtype), _rand(5, 3, dtype=dtype)
    a, b = _rand(4, 5, 7, dtype=dtype), _rand(4, 7, 3, dtype=dtype)
    run(lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0), c3, a, b, dtype=dtype)
    run(lambda c, a, b: torch.addbmm(c, a, b, beta=0.5, alpha=2.0), c2, a, b, dtype=dtype)
    run(lambda c, a, b: torch.addbmm(c, a, b), c2, a[:0], b[:0], dtype=dtype)


def test_matmul_broadcasting_and_attention():
    q, k = _rand(2, 3, 6, 8), _rand(2, 3, 6, 8)
    run(lambda q, k: torch.softmax(q @ k.transpose(-1, -2), -1) @ q, q, k)
    run(lambda x, w: x @ w, _rand(2, 3, 8), _rand(8, 4))


# -- vectors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS + (torch.int64,))
def test_mv_addmv_dot(dtype):
    m, v = _rand(5, 7, dtype=dtype), _rand(14, dtype=dtype)
    alpha, beta = (2, 3) if not dtype.is_floating_point else (0.5, 1.5)
    run(lambda m, v: torch.mv(m, v[:7]), m, v, dtype=dtype)
    run(lambda m, v: torch.mv(m.t().contiguous().t(), v[::2]), m, v, dtype=dtype)
    run(lambda c, m, v: torch.addmv(c, m, v[:7], beta=beta, alpha=alpha),
        _rand(5, dtype=dtype), m, v, dtype=dtype)
    run(lambda a, b: torch.dot(a[::2], b[:7]), v, v, dtype=dtype)


# -- autograd and models -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
def test_linear_forward_backward(dtype):
    cpu = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.Tanh(),
                              torch.nn.Linear(8, 3, bias=False)).to(dtype)
    dev = copy.deepcopy(cpu).to(DEV)
    x = _rand(2, 5, 12, dtype=dtype)
    xc, xd = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    eager_neuron.reset_stats()
    yd = dev(xd)
    yc = cpu(xc)
    torch.testing.assert_close(yd.cpu(), yc, **TOL[dtype])
    go = _rand(*yc.shape, dtype=dtype)
    yc.backward(go)
    yd.backward(go.to(DEV))
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, **TOL[dtype])
    for pc, pd in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(pd.grad.cpu(), pc.grad, **TOL[dtype])
    _ours_clean()


def test_bmm_backward():
    a, b = _rand(3, 4, 5), _rand(3, 5, 6)
    ac, bc = a.clone().requires_grad_(), b.clone().requires_grad_()
    ad, bd = a.to(DEV).requires_grad_(), b.to(DEV).requires_grad_()
    torch.bmm(ac, bc).pow(2).sum().backward()
    torch.bmm(ad, bd).pow(2).sum().backward()
    torch.testing.assert_close(ad.grad.cpu(), ac.grad, **TOL[torch.float32])
    torch.testing.assert_close(bd.grad.cpu(), bc.grad, **TOL[torch.float32])


def test_new_batch_size_does_not_recompile():
    lin = torch.nn.Linear(16, 8).to(DEV)

    def step(batch):
        x = torch.randn(batch, 16, device=DEV, requires_grad=True)
        lin(x).sum().backward()
        torch.bmm(x.view(1, batch, 16), x.view(1, batch, 16).transpose(1, 2))

    step(4)
    step(4)          # the second backward accumulates into .grad: that kernel is warm too
    eager_neuron.reset_stats()
    step(37)
    st = eager_neuron.stats()
    assert st["compiles"] == 0, st
    _ours_clean()


def test_neuron_mode_on_cpu_tensors_that_require_grad():
    """Under NeuronMode the operands are CPU tensors with requires_grad: read them in place."""
    x, w, b = _rand(4, 6).requires_grad_(), _rand(3, 6).requires_grad_(), _rand(3)
    want = torch.nn.functional.linear(x, w, b)
    want.sum().backward()
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    eager_neuron.reset_stats()
    with eager_neuron.NeuronMode():
        got = torch.nn.functional.linear(x, w, b)
        got.sum().backward()
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    torch.testing.assert_close(x.grad, gx, **TOL[torch.float32])
    torch.testing.assert_close(w.grad, gw, **TOL[torch.float32])
    assert eager_neuron.stats()["launches"] > 0
    _ours_clean()


def test_small_products_run_blas_on_one_thread():
    """OpenBLAS thread sync costs more than a second thread saves on small products."""
    from eager_neuron import blas

    bt = lmm.blas_threads
    assert bt is blas.blas_threads
    run(torch.mm, _rand(8, 8), _rand(8, 8))
    if bt.setter is None:
        pytest.skip("no OpenBLAS thread control in this SciPy build")
    assert bt.current == 1
    bt(float(blas.BLAS_THREADED_MIN))
    assert bt.current == bt.default


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_bilinear_trilinear_on_device(dtype):
    x1, x2 = _rand(5, 3, dtype=dtype), _rand(5, 2, dtype=dtype)
    w, b = _rand(4, 3, 2, dtype=dtype), _rand(4, dtype=dtype)
    run(torch.nn.functional.bilinear, x1, x2, w, b, dtype=dtype)
    run(lambda *t: torch.ops.aten._trilinear(*t, [1, 3], [0], [1, 2], []), x1, w, x2,
        dtype=dtype)   # no sum dims: the broadcast product itself


def test_bilinear_backward():
    xs = [_rand(5, 3), _rand(5, 2), _rand(4, 3, 2)]
    grads = []
    for dev in ("cpu", DEV):
        ts = [x.detach().to(dev).requires_grad_() for x in xs]
        torch.nn.functional.bilinear(*ts).pow(2).sum().backward()
        grads.append([t.grad.cpu() for t in ts])
    for g, w in zip(*grads[::-1]):
        torch.testing.assert_close(g, w, **TOL[torch.float32])
    _ours_clean()


def test_vector_matrix_matmul_squeezes_in_place():
    # ATen's matmul(vector, matrix) calls squeeze_ on the device result
    run(torch.matmul, _rand(3), _rand(3, 4))
    run(torch.matmul, _rand(2, 3, 4), _rand(4))


def test_mkl_gemm_reads_in_place_and_refuses_what_blas_cannot_address():
    """kernels/blas.py xgemm (what float mm kernels call when torch exports MKL): C- and
    F-contiguous operands, size-1 and empty extents, beta 0 over NaN, beta 1 accumulation, all
    against float64; a strided operand or a column-major out is refused (False, c untouched),
    never a wrong product. The lowering copies such operands first (test_mm_layouts 'sliced')."""
    import numpy as np
    from numba import njit

    from eager_neuron.kernels import matmul as kmm

    if not kmm.mkl_symbols():
        pytest.skip("this torch exports no MKL gemm (the kernels use np.dot)")
    from eager_neuron.kernels.blas import xgemm

    k = njit(lambda a, b, c, beta: xgemm(a, b, c, beta))
    g = np.random.default_rng(0)
    for dt in (np.float32, np.float64):
        a, b = g.standard_normal((5, 7)).astype(dt), g.standard_normal((7, 3)).astype(dt)
        cases = [(a, b), (np.asfortranarray(a), b), (a, np.asfortranarray(b)), (a[:1], b),
                 (a, b[:, :1]), (a[:1], b[:, :1]), (a[:, :0], b[:0]), (a[:, :4], b[:4])]
        for x, y in cases:
            want = x.astype(np.float64) @ y.astype(np.float64)
            c = np.full(want.shape, np.nan, dt)
            assert k(x, y, c, 0.0)
            np.testing.assert_allclose(c, want, rtol=1e-5 if dt == np.float32 else 1e-12,
                                       atol=1e-5 if dt == np.float32 else 1e-12)
            c = np.ones(want.shape, dt)
            assert k(x, y, c, 1.0)
            np.testing.assert_allclose(c, want + 1, rtol=1e-5, atol=1e-5)
        c = np.zeros((5, 2), dt)
        assert not k(a[:, ::2], b[::2, :2], c, 0.0) and not c.any()
        c = np.zeros((3, 5), dt).T
        assert not k(a, b, c, 0.0) and not c.any()


def test_float_mm_kernel_calls_mkl_when_torch_has_it():
    from eager_neuron.kernels import matmul as kmm

    src, _name = kmm.render_blas("bmm", ("n", "t"), "bias")
    if kmm.mkl_symbols():
        assert "_xgemm(a[i], b[i].T, out[i], 0.0)" in src and "np.dot" not in src
    else:
        assert "np.dot(a[i], b[i].T, out[i])" in src


def test_addmm_bias_that_does_not_broadcast_raises_like_cpu():
    # PyTorch's meta function accepts it (output shaped like the bias); the CPU refuses it, and
    # BLAS would have written nothing into the returned buffer
    args = (torch.arange(5.0), torch.ones(1, 5), torch.ones(5, 1))
    with pytest.raises(RuntimeError, match="expanded size of the tensor"):
        torch.addmm(*args)
    with pytest.raises(RuntimeError, match="expanded size of the tensor"):
        torch.addmm(*(t.to("neuron") for t in args))
