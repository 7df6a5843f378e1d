"""Special functions as elementwise templates: which aten op calls which helper.

The helpers are njit functions in kernels/special.py (with kernels/bessel.py and
kernels/orthopoly.py); lower/elementwise.py merges `OPS` into its table, so these ops get the
elementwise kernel, its in-place and out= forms, int/bool promotion and the bfloat16 path. A
helper computes in float32 or float64 (`_digamma` becomes `_digamma_float32`); its source is added
to a kernel only when the kernel's expression calls one (SPECIAL_PRELUDE).

>>> import torch, eager_neuron
>>> round(torch.special.bessel_j0(torch.tensor([1.0], device="neuron")).item(), 6)
0.765198
"""

from __future__ import annotations

import re

from ..kernels import special as ksp

# op -> (template, compute rule): see lower/elementwise.py OPS
OPS: dict = {
    "aten::digamma": ("_digamma(self)", "out"),
    "aten::polygamma": (lambda a: _polygamma(a["n"]), "out"),
    "aten::special_zeta": ("_zeta(self, other)", "out"),
    "aten::igamma": ("_igamma(self, other)", "out"),
    "aten::igammac": ("_igammac(self, other)", "out"),
    "aten::erfinv": ("_erfinv(self)", "out"),
    "aten::special_ndtri": ("_ndtri(self)", "out"),
    "aten::special_erfcx": ("_erfcx(self)", "out"),
    "aten::special_log_ndtr": ("_log_ndtr(self)", "out"),
    # Bessel and Airy (kernels/bessel.py)
    "aten::i0": ("_i0(self)", "out"),
    "aten::special_i0e": ("_i0e(self)", "out"),
    "aten::special_i1": ("_i1(self)", "out"),
    "aten::special_i1e": ("_i1e(self)", "out"),
    "aten::special_modified_bessel_i0": ("_i0(self)", "out"),   # the same series as i0
    "aten::special_modified_bessel_i1": ("_mod_i1(self)", "out"),
    "aten::special_modified_bessel_k0": ("_bessel_k(self, False, False)", "out"),
    "aten::special_modified_bessel_k1": ("_bessel_k(self, True, False)", "out"),
    "aten::special_scaled_modified_bessel_k0": ("_bessel_k(x, False, True)", "out"),
    "aten::special_scaled_modified_bessel_k1": ("_bessel_k(x, True, True)", "out"),
    "aten::special_bessel_j0": ("_bessel_j0(self)", "out"),
    "aten::special_bessel_j1": ("_bessel_j1(self)", "out"),
    "aten::special_bessel_y0": ("_bessel_y0(self)", "out"),
    "aten::special_bessel_y1": ("_bessel_y1(self)", "out"),
    "aten::special_airy_ai": ("_airy_ai(x)", "out"),
    "aten::special_spherical_bessel_j0": ("_sph_bessel_j0(x)", "out"),
    # orthogonal polynomials P_n(x), n truncated to an integer (kernels/orthopoly.py)
    "aten::special_chebyshev_polynomial_t": ("_cheb_t(x, n)", "out"),
    "aten::special_chebyshev_polynomial_u": ("_cheb_u(x, n)", "out"),
    "aten::special_chebyshev_polynomial_v": ("_cheb_v(x, n)", "out"),
    "aten::special_chebyshev_polynomial_w": ("_cheb_w(x, n)", "out"),
    "aten::special_shifted_chebyshev_polynomial_t": ("_scheb_t(x, n)", "out"),
    "aten::special_shifted_chebyshev_polynomial_u": ("_scheb_u(x, n)", "out"),
    "aten::special_shifted_chebyshev_polynomial_v": ("_scheb_v(x, n)", "out"),
    "aten::special_shifted_chebyshev_polynomial_w": ("_scheb_w(x, n)", "out"),
    "aten::special_hermite_polynomial_h": ("_hermite_h(x, n)", "out"),
    "aten::special_hermite_polynomial_he": ("_hermite_he(x, n)", "out"),
    "aten::special_laguerre_polynomial_l": ("_laguerre_l(x, n)", "out"),
    "aten::special_legendre_polynomial_p": ("_legendre_p(x, n)", "out"),
}


def _polygamma(n: int) -> str:
    # torch's CPU kernel: digamma for n = 0, trigamma for n = 1, the zeta series above
    if n == 0:
        return "_digamma(self)"
    if n == 1:
        return "_trigamma(self)"
    return f"_polygamma(self, {int(n)})"


PRELUDE = ksp.prelude()
HELPER_RE = re.compile(r"\b(" + "|".join(ksp.HELPERS) + r")\(")
