"""Special functions as njit helpers for elementwise kernels: the gamma family (digamma,
trigamma, polygamma, Hurwitz zeta, regularized incomplete gamma) and the error-function family
(erfinv, ndtri, erfcx, log_ndtr); `prelude()` also brings in kernels/bessel.py and
kernels/orthopoly.py.

Where ATen's CPU kernel computes in the tensor's own type (Cephes-derived code in float32 for
float32) the helper does the same, in the same operation order, so results match the CPU to an
ulp or two. Where it does not matter for the CPU's answer (erfcx for x >= 0, igamma) the helper
computes in float64 from its own formulas. One copy per float type: `T(` is the type and `_SUF`
its name (`_digamma_float32`); every constant goes through `T(`, since a bare Python literal would
promote float32 arithmetic to float64.

>>> src = prelude()
>>> "_igamma_float32" in src and "_bessel_y1_float64" in src and "_cheb_w_float32" in src
True
"""

from __future__ import annotations

from . import bessel, orthopoly

_DIGAMMA_A = (8.33333333333333333333E-2, -2.10927960927960927961E-2, 7.57575757575757575758E-3,
              -4.16666666666666666667E-3, 3.96825396825396825397E-3, -8.33333333333333333333E-3,
              8.33333333333333333333E-2)
_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9,
           7.47242496e10, -2.950130727918164224e12, 1.1646782814350067249e14,
           -4.5979787224074726105e15, 1.8152105401943546773e17, -7.1661652561756670113e18)
_NDTRI = {
    "P0": (-5.99633501014107895267E1, 9.80010754185999661536E1, -5.66762857469070293439E1,
           1.39312609387279679503E1, -1.23916583867381258016E0),
    "Q0": (1.0, 1.95448858338141759834E0, 4.67627912898881538453E0, 8.63602421390890590575E1,
           -2.25462687854119370527E2, 2.00260212380060660359E2, -8.20372256168333339912E1,
           1.59056225126211695515E1, -1.18331621121330003142E0),
    "P1": (4.05544892305962419923E0, 3.15251094599893866154E1, 5.71628192246421288162E1,
           4.40805073893200834700E1, 1.46849561928858024014E1, 2.18663306850790267539E0,
           -1.40256079171354495875E-1, -3.50424626827848203418E-2, -8.57456785154685413611E-4),
    "Q1": (1.0, 1.57799883256466749731E1, 4.53907635128879210584E1, 4.13172038254672030440E1,
           1.50425385692907503408E1, 2.50464946208309415979E0, -1.42182922854787788574E-1,
           -3.80806407691578277194E-2, -9.33259480895457427372E-4),
    "P2": (3.23774891776946035970E0, 6.91522889068984211695E0, 3.93881025292474443415E0,
           1.33303460815807542389E0, 2.01485389549179081538E-1, 1.23716634817820021358E-2,
           3.01581553508235416007E-4, 2.65806974686737550832E-6, 6.23974539184983293730E-9),
    "Q2": (1.0, 6.02427039364742014255E0, 3.67983563856160859403E0, 1.37702099489081330271E0,
           2.16236993594496635890E-1, 1.34204006088543189037E-2, 3.28014464682127739104E-4,
           2.89247864745380683936E-6, 6.79019408009981274425E-9),
}

_TEMPLATE = '''
@njit(inline="always", error_model="numpy")
def _polevl_SUF(z, coeffs):
    # Horner from the highest coefficient: ((0 z + c0) z + c1) z ...
    p = T(0.0)
    for c in coeffs:
        p = p * z + T(c)
    return p

@njit(inline="always", error_model="numpy")
def _chbevl_SUF(y, coeffs):
    # Clenshaw sum of a Chebyshev series, halved as Cephes' chbevl
    b0 = T(coeffs[0])
    b1 = T(0.0)
    b2 = T(0.0)
    for i in range(1, len(coeffs)):
        b2 = b1
        b1 = b0
        b0 = y * b1 - b2 + T(coeffs[i])
    return T(0.5) * (b0 - b2)

@njit(inline="always", error_model="numpy")
def _digamma_pos_SUF(x):
    # x >= 0: recur up to 10, then the asymptotic series (no recursion in numba: the reflection
    # for x < 0 lives in _digamma_SUF)
    result = T(0)
    while x < T(10):
        result -= T(1) / x
        x += T(1)
    if x == T(10):
        return result + T(2.25175258906672110764)
    y = T(0)
    if x < T(1.0e17):
        z = T(1) / (x * x)
        y = z * _polevl_SUF(z, _DIGAMMA_A)
    return result + math.log(x) - (T(0.5) / x) - y

@njit(inline="always", error_model="numpy")
def _digamma_SUF(x):
    if x == 0:
        return T(math.copysign(math.inf, -x))
    if x < 0:
        if x == np.trunc(x):
            return T(math.nan)
        xd = np.float64(x)
        r = xd - np.trunc(xd)
        return _digamma_pos_SUF(T(1) - x) - T(math.pi / math.tan(math.pi * r))
    return _digamma_pos_SUF(x)

@njit(inline="always", error_model="numpy")
def _trigamma_SUF(x):
    sign = T(1)
    result = T(0)
    if x < T(0.5):
        sign = T(-1)
        s = math.sin(T(math.pi) * x)
        result -= (T(math.pi) * T(math.pi)) / (s * s)
        x = T(1) - x
    for _ in range(6):
        result += T(1) / (x * x)
        x += T(1)
    ixx = T(1) / (x * x)
    result += (T(1) + T(1) / (T(2) * x) + ixx * (T(1) / T(6) - ixx * (T(1) / T(30)
               - ixx * (T(1) / T(42))))) / x
    return sign * result

@njit(inline="always", error_model="numpy")
def _polygamma_SUF(x, n):
    # n >= 2: (-1)^(n+1) n! zeta(n + 1, x), zeta in double (the CPU's accumulate type)
    one = T(1)
    sign = one if n % 2 else -one
    return sign * math.exp(math.lgamma(T(n) + one)) * T(_zeta(np.float64(n + 1), np.float64(x)))

@njit(inline="always", error_model="numpy")
def _zeta_SUF(x, q):
    return T(_zeta(np.float64(x), np.float64(q)))

@njit(inline="always", error_model="numpy")
def _erfinv_SUF(y):
    # a rational first guess, then two Newton steps on erf(x) - y
    y_abs = abs(y)
    if y_abs > T(1.0):
        return T(math.nan)
    if y_abs == T(1.0):
        return T(math.copysign(math.inf, y))
    if y_abs <= T(0.7):
        z = y * y
        num = (((T(-0.140543331) * z + T(0.914624893)) * z + T(-1.645349621)) * z
               + T(0.886226899))
        dem = ((((T(0.012229801) * z + T(-0.329097515)) * z + T(1.442710462)) * z
                + T(-2.118377725)) * z + T(1.0))
        x = y * num / dem
    else:
        z = math.sqrt(-math.log((T(1.0) - y_abs) / T(2.0)))
        num = ((T(1.641345311) * z + T(3.429567803)) * z + T(-1.624906493)) * z \\
            + T(-1.970840454)
        dem = (T(1.637067800) * z + T(3.543889200)) * z + T(1.0)
        x = math.copysign(num, y) / dem
    k = T(2.0) * T(0.564189583547756286948079451560772586)
    x = x - (math.erf(x) - y) / (k * math.exp(-x * x))
    x = x - (math.erf(x) - y) / (k * math.exp(-x * x))
    return x

@njit(inline="always", error_model="numpy")
def _ndtri_SUF(y0):
    one = T(1)
    zero = T(0)
    if y0 == zero:
        return T(-math.inf)
    if y0 == one:
        return T(math.inf)
    if y0 < zero or y0 > one:
        return T(math.nan)
    code = True
    y = y0
    if y > one - T(0.13533528323661269189):
        y = one - y
        code = False
    if y > T(0.13533528323661269189):
        y = y - T(0.5)
        y2 = y * y
        x = y + y * (y2 * _polevl_SUF(y2, _NDTRI_P0) / _polevl_SUF(y2, _NDTRI_Q0))
        return x * T(2.50662827463100050242E0)
    x = math.sqrt(T(-2.0) * math.log(y))
    x0 = x - math.log(x) / x
    z = one / x
    if x < T(8.0):
        x1 = z * _polevl_SUF(z, _NDTRI_P1) / _polevl_SUF(z, _NDTRI_Q1)
    else:
        x1 = z * _polevl_SUF(z, _NDTRI_P2) / _polevl_SUF(z, _NDTRI_Q2)
    x = x0 - x1
    if code:
        x = -x
    return x

@njit(inline="always", error_model="numpy")
def _erfcx_y100_SUF(x):
    # 0 <= x <= 50. The CPU looks erfcx up in 100 Chebyshev pieces of y = 400 / (4 + x) at
    # t = 2 y - (2k + 1), both rounded to the type: its answer is erfcx at the x those rounded
    # values stand for, which _erfcx_pos evaluates (below 1e-15 of 1 it returns 1, as the CPU)
    y = T(400.0) / (T(4.0) + x)
    k = np.int64(y)
    if k >= 100:
        return T(1.0)
    t = T(2.0) * y - T(2 * k + 1)
    return T(_erfcx_pos(400.0 / ((np.float64(t) + np.float64(2 * k + 1)) * 0.5) - 4.0))

@njit(inline="always", error_model="numpy")
def _erfcx_SUF(x):
    # erfc(x) e^(x^2) with the CPU's roundings: its backward, 2 x erfcx(x) - 2/sqrt(pi), and
    # log_ndtr's, exp(-(log_ndtr(x) + x^2/2)), magnify an ulp of difference past the tolerance
    if x != x:
        return x
    if x >= T(0.0):
        if x > T(50.0):
            # the CPU's 5-term continued fraction (x^2 in the type, the rest in double; the CPU
            # still differs by up to 3 ulp here, harmless: the backward scales ulps by ~1)
            if x > T(5e7):
                return T(0.56418958354775628694807945156) / x
            xx = np.float64(x * x)
            return T(np.float64(T(0.56418958354775628694807945156)) * (xx * (xx + 4.5) + 2.0)
                     / (np.float64(x) * (xx * (xx + 5.0) + 3.75)))
        return _erfcx_y100_SUF(x)
    if x < T(-26.7):
        return T(math.inf)
    # 2 e^(x^2) - erfcx(-x): x^2 rounded to the type, then C's exp in double
    e = 2.0 * math.exp(np.float64(x * x))
    if x < T(-6.1):
        return T(e)
    return T(e - np.float64(_erfcx_y100_SUF(-x)))

@njit(inline="always", error_model="numpy")
def _log_ndtr_SUF(x):
    # log Phi(x); below -1 through erfcx, so the left tail does not underflow to log(0). Its
    # backward, exp(-(result + x^2/2)), cancels: an ulp here is 10 there, so erfcx must be the
    # CPU's to the bit
    t = x * T(0.70710678118654752440)
    if x < T(-1.0):
        return math.log(_erfcx_SUF(-t) / T(2.0)) - t * t
    return math.log1p(-math.erfc(t) / T(2.0))

@njit(inline="always", error_model="numpy")
def _igamma_SUF(a, x):
    return T(_igam(np.float64(a), np.float64(x), False))

@njit(inline="always", error_model="numpy")
def _igammac_SUF(a, x):
    return T(_igam(np.float64(a), np.float64(x), True))
'''

# float64 helpers shared by both types (the CPU's accumulate type, or our own formulas)
_COMMON = '''
@njit(inline="always", error_model="numpy")
def _zeta(x, q):
    # Hurwitz zeta (Cephes): direct sum to q + 9, then Euler-Maclaurin with _ZETA_A
    machep = 1.11022302462515654042E-16
    if x == 1.0:
        return math.inf
    if x < 1.0:
        return math.nan
    if q <= 0.0:
        if q == np.floor(q):
            return math.inf
        if x != np.floor(x):
            return math.nan
    s = q ** -x
    a = q
    i = 0
    b = 0.0
    while i < 9 or a <= 9.0:
        i += 1
        a += 1.0
        b = a ** -x
        s += b
        if -machep * s < b and b < machep * s:
            return s
    w = a
    s += b * w / (x - 1.0)
    s -= 0.5 * b
    a = 1.0
    k = 0.0
    for j in range(12):
        a *= x + k
        b /= w
        t = a * b / _ZETA_A[j]
        s = s + t
        t = abs(t / s)
        if t < machep:
            return s
        k += 1.0
        a *= x + k
        b /= w
        k += 1.0
    return s

@njit(inline="always", error_model="numpy")
def _erfcx_pos(x):
    # erfc(x) e^(x^2), x >= 0. x^2 = hi + lo exactly (Dekker's split), so e^(x^2) keeps double
    # accuracy; past 26 erfc underflows and the asymptotic series takes over (8 terms: < 1e-18)
    if x < 26.0:
        hi = x * x
        c = 134217729.0 * x
        xh = c - (c - x)
        xl = x - xh
        lo = ((xh * xh - hi) + 2.0 * xh * xl) + xl * xl
        return math.exp(hi) * math.erfc(x) * (1.0 + lo)
    s = 0.5 / (x * x)
    t = 1.0
    acc = 1.0
    for k in range(1, 9):
        t *= -(2 * k - 1) * s
        acc += t
    return 0.56418958354775628695 / x * acc

@njit(inline="always", error_model="numpy")
def _igam(a, x, upper):
    # regularized incomplete gamma P(a, x), or Q = 1 - P when upper; edge values as the CPU's
    if a != a or x != x or x < 0.0 or a < 0.0:
        return math.nan
    if a == 0.0:
        if x > 0.0:
            return 0.0 if upper else 1.0
        return math.nan
    if x == 0.0:
        return 1.0 if upper else 0.0
    if math.isinf(a):
        if math.isinf(x):
            return math.nan
        return 1.0 if upper else 0.0
    if math.isinf(x):
        return 0.0 if upper else 1.0
    if a > 1.0e9 and abs(x - a) < 0.3 * a:
        # 1. huge a near x: the series need ~sqrt(a) terms; Temme's uniform expansion,
        #    Q = erfc(eta sqrt(a/2)) / 2 + e^(-a eta^2 / 2) / sqrt(2 pi a) c0(eta) + O(1/a^2)
        mu = (x - a) / a
        eta = math.sqrt(2.0 * (mu - math.log1p(mu)))
        if mu < 0.0:
            eta = -eta
        if abs(eta) < 1.0e-3:
            c0 = -1.0 / 3.0 + eta * (1.0 / 12.0 + eta * (-2.0 / 135.0 + eta / 864.0))
        else:
            c0 = 1.0 / mu - 1.0 / eta
        r = math.exp(-0.5 * a * eta * eta) / math.sqrt(2.0 * math.pi * a) * c0
        if upper:
            return 0.5 * math.erfc(eta * math.sqrt(0.5 * a)) + r
        return 0.5 * math.erfc(-eta * math.sqrt(0.5 * a)) - r
    if x < a + 1.0:
        # 2. P by its series x^a e^-x / Gamma(a + 1) sum_k x^k / ((a + 1) ... (a + k)): each
        #    term smaller than the last since x < a + 1; Q = 1 - P is >= 0.3 there (no cancellation)
        term = 1.0
        s = 1.0
        ap = a
        for _ in range(2000000):
            ap += 1.0
            term *= x / ap
            s += term
            if term <= s * 1.0e-17:
                break
        p = s * math.exp(a * math.log(x) - x - math.lgamma(a + 1.0))
        return 1.0 - p if upper else p
    # 3. x >= a + 1: Q by its continued fraction (modified Lentz), P = 1 - Q
    tiny = 1.0e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 2000000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        if abs(d) < tiny:
            d = tiny
        c = b + an / c
        if abs(c) < tiny:
            c = tiny
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1.0e-16:
            break
    q = h * math.exp(a * math.log(x) - x - math.lgamma(a))
    return q if upper else 1.0 - q
'''

HELPERS = ("_digamma", "_trigamma", "_polygamma", "_zeta", "_erfinv", "_ndtri", "_erfcx",
           "_log_ndtr", "_igamma", "_igammac") + bessel.HELPERS + orthopoly.HELPERS


def prelude() -> str:
    """njit source of every special-function helper (float64 shared parts, then per type)."""
    tables = {"_DIGAMMA_A": _DIGAMMA_A, "_ZETA_A": _ZETA_A,
              **{f"_NDTRI_{k}": v for k, v in _NDTRI.items()}}
    head = "\n".join(f"{k} = {v!r}" for k, v in tables.items())
    own = "".join(orthopoly.for_type(_TEMPLATE, T) for T in ("np.float32", "np.float64"))
    return (head + "\n" + _COMMON + own + bessel.prelude(orthopoly.for_type)
            + orthopoly.prelude())
