"""The linalg family on neuron vs the CPU: factorizations, solves, spectral ops, their errors.

Every test runs the op on neuron and on the CPU and compares; inputs are batched and/or
non-contiguous, and no test may reach the CPU fallback (counted in eager_neuron.stats()).
"""

from __future__ import annotations

import pytest
import torch

import eager_neuron  # noqa: F401  (registers the neuron device)
from eager_neuron.stats import STATS

DEV = "neuron"


@pytest.fixture(autouse=True)
def no_fallback():
    before = sum(STATS.fallbacks.values())
    launches = STATS.launches
    yield
    assert sum(STATS.fallbacks.values()) == before, dict(STATS.fallbacks)
    assert STATS.launches > launches          # the work ran as kernels on the device


def close(actual, expected, atol=1e-4, rtol=1e-4):
    if isinstance(expected, torch.Tensor):
        actual, expected = [actual], [expected]
    for a, e in zip(actual, expected):
        assert a.device.type == DEV
        torch.testing.assert_close(a.cpu(), e, atol=atol, rtol=rtol)


def dev(*ts):
    return [t.to(DEV) for t in ts]


def _noncontig(t):
    """Same values, transposed storage: exercises strided reads."""
    return t.mT.contiguous().mT


def test_solve_batched_broadcast_and_vector():
    torch.manual_seed(0)
    A, B, b = torch.randn(3, 5, 5), torch.randn(2, 1, 5, 4), torch.randn(3, 5)
    An, Bn, bn = dev(A, B, b)
    close(torch.linalg.solve(An, Bn), torch.linalg.solve(A, B))
    close(torch.linalg.solve(An, bn), torch.linalg.solve(A, b))
    close(torch.linalg.solve(An, Bn.mT, left=False), torch.linalg.solve(A, B.mT, left=False))
    close(torch.linalg.solve(_noncontig(An), Bn), torch.linalg.solve(_noncontig(A), B))
    # LU and pivots are outputs the backward reads: they must be the CPU's, exactly laid out
    for a, an in ((A, An), (_noncontig(A), _noncontig(An))):
        exp = torch.ops.aten._linalg_solve_ex(a, B[0, 0])
        act = torch.ops.aten._linalg_solve_ex(an, Bn[0, 0])
        close(act, exp)


def test_lu_family():
    torch.manual_seed(1)
    for shape in ((4, 4), (2, 6, 4), (2, 4, 6)):
        A = torch.randn(shape)
        (An,) = dev(A)
        close(torch.linalg.lu_factor_ex(An), torch.linalg.lu_factor_ex(A))
        close(torch.linalg.lu(An), torch.linalg.lu(A))
        LU, piv = torch.linalg.lu_factor(A)
        close(torch.lu_unpack(*dev(LU, piv)), torch.lu_unpack(LU, piv))
    A, B = torch.randn(3, 5, 5), torch.randn(3, 5, 2)
    LU, piv = torch.linalg.lu_factor(A)
    for left, adjoint in ((True, False), (True, True), (False, False), (False, True)):
        rhs = B if left else B.mT
        close(torch.linalg.lu_solve(*dev(LU, piv, rhs), left=left, adjoint=adjoint),
              torch.linalg.lu_solve(LU, piv, rhs, left=left, adjoint=adjoint))


def test_inv_det_slogdet_and_singular():
    torch.manual_seed(2)
    A = torch.randn(4, 6, 6)
    A[1, :, 2] = 0                        # one singular matrix in the batch
    (An,) = dev(A)
    close(torch.linalg.det(An), torch.linalg.det(A))
    close(torch.linalg.slogdet(An), torch.linalg.slogdet(A))
    close(torch.linalg.det(_noncontig(An)), torch.linalg.det(_noncontig(A)))
    inv, info = torch.linalg.inv_ex(An)
    assert info.cpu().tolist() == torch.linalg.inv_ex(A)[1].tolist() == [0, 3, 0, 0]
    keep = [0, 2, 3]
    close(inv[keep], torch.linalg.inv(A[keep]))
    with pytest.raises(torch.linalg.LinAlgError, match=r"\(Batch element 1\).*singular"):
        torch.linalg.inv(An)
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        torch.linalg.solve(An[1], An[1])


def test_triangular_solves():
    torch.manual_seed(3)
    A = torch.randn(2, 5, 5) + 5 * torch.eye(5)
    B = torch.randn(2, 5, 3)
    An, Bn = dev(A, B)
    for upper in (True, False):
        for unit in (True, False):
            close(torch.linalg.solve_triangular(An, Bn, upper=upper, unitriangular=unit),
                  torch.linalg.solve_triangular(A, B, upper=upper, unitriangular=unit))
            close(torch.linalg.solve_triangular(An, Bn.mT, upper=upper, left=False,
                                                unitriangular=unit),
                  torch.linalg.solve_triangular(A, B.mT, upper=upper, left=False,
                                                unitriangular=unit))
            for tr in (True, False):
                close(torch.triangular_solve(Bn, An, upper, tr, unit),
                      torch.triangular_solve(B, A, upper, tr, unit))


def test_cholesky_family_and_not_pd():
    torch.manual_seed(4)
    X = torch.randn(3, 5, 5)
    P = X @ X.mT + 5 * torch.eye(5)
    (Pn,) = dev(P)
    for upper in (False, True):
        close(torch.linalg.cholesky(Pn, upper=upper), torch.linalg.cholesky(P, upper=upper))
        F = torch.linalg.cholesky(P, upper=upper)
        close(torch.cholesky_inverse(*dev(F), upper=upper), torch.cholesky_inverse(F, upper))
        B = torch.randn(3, 5, 2)
        close(torch.cholesky_solve(*dev(B, F), upper=upper), torch.cholesky_solve(B, F, upper))
    bad = P.clone()
    bad[2] = -bad[2]
    L, info = torch.linalg.cholesky_ex(bad.to(DEV))
    assert info.cpu().tolist() == torch.linalg.cholesky_ex(bad)[1].tolist() == [0, 0, 1]
    close(L[:2], torch.linalg.cholesky(P[:2]))
    with pytest.raises(torch.linalg.LinAlgError, match="not positive-definite"):
        torch.linalg.cholesky(bad.to(DEV))


def test_qr_family():
    torch.manual_seed(5)
    for shape in ((6, 4), (2, 4, 6), (3, 5, 5)):
        A = torch.randn(shape)
        (An,) = dev(A)
        for mode in ("reduced", "complete", "r"):
            close(torch.linalg.qr(An, mode=mode), torch.linalg.qr(A, mode=mode))
        close(torch.geqrf(An), torch.geqrf(A))
        a, tau = torch.geqrf(A)
        C = torch.randn(shape[:-2] + (shape[-2], 3))
        for transpose in (False, True):
            close(torch.ormqr(*dev(a, tau, C), True, transpose), torch.ormqr(a, tau, C, True,
                                                                             transpose))
    A = torch.randn(2, 6, 4)
    a, tau = torch.geqrf(A)
    close(torch.linalg.householder_product(*dev(a, tau)), torch.linalg.householder_product(a,
                                                                                             tau))


def test_eigh_svd_pinv_lstsq():
    torch.manual_seed(6)
    S = torch.randn(3, 5, 5)
    S = S + S.mT
    for uplo in ("L", "U"):
        w, v = torch.linalg.eigh(S.to(DEV), UPLO=uplo)
        w0, v0 = torch.linalg.eigh(S, UPLO=uplo)
        close((w, v.abs()), (w0, v0.abs()))
    A = torch.randn(2, 6, 4)
    (An,) = dev(A)
    close(torch.linalg.svdvals(An), torch.linalg.svdvals(A))
    U, s, Vh = torch.linalg.svd(An, full_matrices=True)
    assert U.shape == (2, 6, 6) and Vh.shape == (2, 4, 4)
    close(U[..., :4] @ torch.diag_embed(s) @ Vh, A)
    close(torch.linalg.pinv(An), torch.linalg.pinv(A))
    close(torch.linalg.pinv(S.to(DEV), hermitian=True), torch.linalg.pinv(S, hermitian=True))
    B = torch.randn(2, 6, 3)
    for driver in ("gels", "gelsy", "gelsd", "gelss"):
        close(torch.linalg.lstsq(An, B.to(DEV), driver=driver),
              torch.linalg.lstsq(A, B, driver=driver))
    with pytest.raises(torch.linalg.LinAlgError, match="non-finite"):
        torch.linalg.svdvals(torch.full((3, 3), float("nan"), device=DEV))


def test_matrix_exp_matches_cpu_rounding():
    torch.manual_seed(7)
    for scale in (1e-3, 0.5, 3.0, 9.0):
        A = torch.randn(3, 5, 5) * scale
        close(torch.linalg.matrix_exp(A.to(DEV)), torch.linalg.matrix_exp(A), atol=1e-5,
              rtol=1.3e-6)
    A = torch.randn(2, 4, 4, dtype=torch.float64)
    close(torch.linalg.matrix_exp(A.to(DEV)), torch.linalg.matrix_exp(A), atol=1e-12, rtol=0)


def test_cross_bfloat16_rounds_like_cpu():
    torch.manual_seed(8)
    a, b = (torch.randn(6, 3, 5) * 7).bfloat16(), (torch.randn(6, 3, 5) * 7).bfloat16()
    assert torch.equal(torch.linalg.cross(*dev(a, b), dim=1).cpu(),
                       torch.linalg.cross(a, b, dim=1))


def test_backward_through_solve_and_det():
    torch.manual_seed(9)
    A = torch.randn(2, 4, 4, requires_grad=True)
    B = torch.randn(2, 4, 3, requires_grad=True)
    An = A.detach().to(DEV).requires_grad_()
    Bn = B.detach().to(DEV).requires_grad_()
    loss = torch.linalg.solve(A, B).sum() + torch.linalg.det(A).sum()
    loss_n = torch.linalg.solve(An, Bn).sum() + torch.linalg.det(An).sum()
    close(torch.autograd.grad(loss_n, (An, Bn)), torch.autograd.grad(loss, (A, B)))


def test_batch_size_does_not_recompile():
    torch.manual_seed(10)
    torch.linalg.solve(*dev(torch.randn(2, 4, 4), torch.randn(2, 4, 1)))
    compiles = STATS.compiles
    torch.linalg.solve(*dev(torch.randn(7, 6, 6), torch.randn(7, 6, 2)))
    assert STATS.compiles == compiles


def test_ldl_factor_and_solve_match_lapack_pivoting():
    torch.manual_seed(11)
    for n in (1, 3, 6):
        A = torch.randn(4, n, n)
        A = A + A.mT
        A[1, 0, 0] = 0.0                   # forces a 2x2 Bunch-Kaufman block
        LD, piv, info = torch.linalg.ldl_factor_ex(A)
        close(torch.linalg.ldl_factor_ex(A.to(DEV)), (LD, piv, info))
        B = torch.randn(4, n, 2)
        close(torch.linalg.ldl_solve(*dev(LD, piv, B)), torch.linalg.ldl_solve(LD, piv, B),
              atol=1e-3, rtol=1e-3)


# ---------------------------------------------------------------------------------------------
# complex64 / complex128: judged against complex128 CPU references with bounds derived from
# the dtype (never one CPU's rounding): |ours - exact| <= C * n * eps * scale
# ---------------------------------------------------------------------------------------------

CDT = [torch.complex64, torch.complex128]


def _cbound(t: torch.Tensor, n: int, dtype, c: float = 64.0) -> float:
    eps = torch.finfo(dtype.to_real()).eps
    return c * n * eps * max(1.0, float(t.abs().max()))


def _cclose(actual, exact, n, dtype, c=64.0, derived=False):
    """`derived`: actual is computed on the host from device results (a product, a check)."""
    actual = actual.cpu()
    if not derived:
        assert actual.dtype == (dtype if exact.is_complex() else dtype.to_real()), actual.dtype
    err = float((actual.to(exact.dtype) - exact).abs().max()) if exact.numel() else 0.0
    assert err <= _cbound(exact, n, dtype, c), (err, _cbound(exact, n, dtype, c))


def _well_conditioned(shape, dtype, seed):
    torch.manual_seed(seed)
    n = shape[-1]
    return (torch.randn(shape, dtype=dtype) + n * torch.eye(n, dtype=dtype)).to(dtype)


def _c128(t):
    return t.to(torch.complex128)


@pytest.mark.parametrize("dtype", CDT)
def test_complex_lu_solve_inv_det(dtype):
    A = _well_conditioned((2, 4, 4), dtype, 10)
    B = torch.randn(2, 4, 3, dtype=dtype)
    An, Bn = dev(A, B)
    A2, B2 = _c128(A), _c128(B)
    _cclose(torch.linalg.solve(An, Bn), torch.linalg.solve(A2, B2), 4, dtype)
    _cclose(torch.linalg.solve(An, Bn.mT, left=False), torch.linalg.solve(A2, B2.mT, left=False),
            4, dtype)
    _cclose(torch.linalg.inv(_noncontig(An)), torch.linalg.inv(A2), 4, dtype)
    _cclose(torch.linalg.det(An), torch.linalg.det(A2), 4, dtype)
    sign, logabs = torch.linalg.slogdet(An)
    s2, l2 = torch.linalg.slogdet(A2)
    _cclose(sign, s2, 4, dtype)
    _cclose(logabs, l2, 4, dtype)
    # LU: zgetf2's pivots (|re| + |im|) are the CPU's; the factors within the bound
    LU, piv = torch.linalg.lu_factor(An)
    LU2, piv2 = torch.linalg.lu_factor(A2)
    assert torch.equal(piv.cpu(), piv2)
    _cclose(LU, LU2, 4, dtype)
    for left in (True, False):
        rhs, rhs2 = (Bn, B2) if left else (Bn.mT, B2.mT)
        got = torch.linalg.lu_solve(LU, piv, rhs, left=left, adjoint=True)
        _cclose(got, torch.linalg.lu_solve(LU2, piv2, rhs2, left=left, adjoint=True), 4, dtype)
    P, L, U = torch.linalg.lu(An)
    _cclose(_c128((P @ L @ U).cpu()), A2, 4, dtype, derived=True)


@pytest.mark.parametrize("dtype", CDT)
def test_complex_cholesky_and_triangular(dtype):
    M = torch.randn(2, 4, 4, dtype=dtype)
    H = (M @ M.mH + 4 * torch.eye(4, dtype=dtype)).to(dtype)
    B = torch.randn(2, 4, 2, dtype=dtype)
    Hn, Bn = dev(H, B)
    H2, B2 = _c128(H), _c128(B)
    for upper in (False, True):
        F = torch.linalg.cholesky(Hn, upper=upper)
        _cclose(F, torch.linalg.cholesky(H2, upper=upper), 4, dtype)
        _cclose(torch.cholesky_solve(Bn, F, upper=upper),
                torch.cholesky_solve(B2, torch.linalg.cholesky(H2, upper=upper), upper=upper),
                4, dtype)
        _cclose(torch.cholesky_inverse(F, upper=upper), torch.linalg.inv(H2), 4, dtype)
    T = torch.randn(4, 4, dtype=dtype).triu() + 4 * torch.eye(4, dtype=dtype)
    _cclose(torch.linalg.solve_triangular(T.to(DEV), Bn, upper=True),
            torch.linalg.solve_triangular(_c128(T), B2, upper=True), 4, dtype)
    with pytest.raises(torch.linalg.LinAlgError, match="positive-definite"):
        torch.linalg.cholesky(-Hn[0])


@pytest.mark.parametrize("dtype", CDT)
def test_complex_qr_eigh_svd_pinv(dtype):
    torch.manual_seed(11)
    A = torch.randn(2, 5, 3, dtype=dtype)
    An, A2 = A.to(DEV), _c128(A)
    for mode in ("reduced", "complete"):
        Q, R = torch.linalg.qr(An, mode=mode)
        Q2, R2 = torch.linalg.qr(A2, mode=mode)   # zlarfg's convention: diag(R) real
        _cclose(Q, Q2, 5, dtype)
        _cclose(R, R2, 5, dtype)
    S = torch.randn(4, 4, dtype=dtype)
    Hm = (S + S.mH).to(dtype)
    w, V = torch.linalg.eigh(Hm.to(DEV))
    w2 = torch.linalg.eigvalsh(_c128(Hm))
    _cclose(w, w2, 4, dtype)
    V, w = _c128(V.cpu()), w.cpu().double()
    # eigenvectors up to a phase: A V = V diag(w), V^H V = I
    _cclose(_c128(Hm) @ V, V * w.to(torch.complex128), 4, dtype, c=256, derived=True)
    _cclose(V.mH @ V, torch.eye(4, dtype=torch.complex128), 4, dtype, c=256, derived=True)
    U, s, Vh = torch.linalg.svd(An, full_matrices=False)
    _cclose(s, torch.linalg.svdvals(A2), 5, dtype)
    recon = _c128(U.cpu()) @ torch.diag_embed(s.cpu().double()).to(torch.complex128) \
        @ _c128(Vh.cpu())
    _cclose(recon, A2, 5, dtype, c=256, derived=True)
    _cclose(torch.linalg.pinv(An), torch.linalg.pinv(A2), 5, dtype, c=256)
    _cclose(torch.linalg.matrix_exp(0.3 * S.to(DEV)), torch.linalg.matrix_exp(0.3 * _c128(S)),
            4, dtype, c=256)


def _grads(f, inputs, dev_):
    xs = [x.detach().to(dev_).requires_grad_() for x in inputs]
    out = f(*xs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    torch.manual_seed(5)
    gs = [torch.randn(o.shape, dtype=torch.complex128 if o.is_complex() else torch.float64)
          .to(o.dtype).to(dev_) for o in outs]
    return [g.cpu() for g in torch.autograd.grad(outs, xs, gs)]


@pytest.mark.parametrize("dtype", CDT)
@pytest.mark.parametrize("name", ["solve", "inv", "det", "slogdet", "cholesky", "qr", "eigvalsh",
                                  "svdvals", "lu_factor"])
def test_complex_linalg_backward(name, dtype):
    fns = {
        "solve": lambda a, b=None: torch.linalg.solve(a, b),
        "inv": lambda a, b=None: torch.linalg.inv(a),
        "det": lambda a, b=None: torch.linalg.det(a),
        "slogdet": lambda a, b=None: torch.linalg.slogdet(a)[1],
        "cholesky": lambda a, b=None: torch.linalg.cholesky(
            a @ a.mH + 4 * torch.eye(4, dtype=a.dtype, device=a.device)),
        "qr": lambda a, b=None: torch.linalg.qr(a),
        "eigvalsh": lambda a, b=None: torch.linalg.eigvalsh(a + a.mH),
        "svdvals": lambda a, b=None: torch.linalg.svdvals(a),
        "lu_factor": lambda a, b=None: torch.linalg.lu_factor(a)[0],
    }
    A = _well_conditioned((4, 4), dtype, 21)
    B = torch.randn(4, 2, dtype=dtype)
    got = _grads(fns[name], (A, B) if name == "solve" else (A,), DEV)
    exact = _grads(fns[name], (_c128(A), _c128(B)) if name == "solve" else (_c128(A),), "cpu")
    for g, e in zip(got, exact):
        _cclose(g, e, 4, dtype, c=512)
