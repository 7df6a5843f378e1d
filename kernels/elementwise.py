"""Elementwise family: one loop, any number of inputs, one output, broadcasting by strides.

The spec is plain data: an expression over loaded operands `x0..xn` and scalars `c0..ck`, each
operand's kind ('flat': same shape and contiguous, 'one': a single element, 'nd': broadcast
view), the rank of the loop, the load casts and the store cast.

>>> src, name = render("x0 + c0", ("flat",), 1, ("np.float32",), ("np.float32",), "np.float32")
>>> "for i in range(n)" in src
True
"""

from __future__ import annotations

import hashlib

HEADER = '@njit(error_model="numpy", nogil=True{extra})\n'


def kernel_name(prefix: str, *parts) -> str:
    digest = hashlib.sha1(repr(parts).encode()).hexdigest()[:12]
    return f"{prefix}_{digest}"


def render(expr: str, kinds: tuple, rank: int, loads: tuple, scalar_casts: tuple,
           store: str, parallel: bool = False, fastmath: bool = False) -> tuple[str, str]:
    """Source of `k(out, a0..an, s0..sk)`; `rank == 1` with no 'nd' input is the flat loop."""
    n_in, n_sc = len(kinds), len(scalar_casts)
    name = kernel_name("ew", expr, kinds, rank, loads, scalar_casts, store, parallel, fastmath)
    extra = (", parallel=True" if parallel else "") + (", fastmath=True" if fastmath else "")
    params = ["out"] + [f"a{i}" for i in range(n_in)] + [f"s{j}" for j in range(n_sc)]
    lines = [HEADER.format(extra=extra), f"def {name}({', '.join(params)}):"]
    # 1. scalars and single-element operands are loaded once, outside the loop
    for j, cast in enumerate(scalar_casts):
        lines.append(f"    c{j} = {cast}(s{j})")
    for i, kind in enumerate(kinds):
        if kind == "one":
            lines.append(f"    x{i} = {loads[i]}(a{i}[0])")
    rng = "prange" if parallel else "range"
    idx = ", ".join(f"i{d}" for d in range(rank))
    # 2. the loop nest over the output
    indent = "    "
    for d in range(rank):
        loop = rng if d == 0 else "range"
        lines.append(f"{indent}for i{d} in {loop}(out.shape[{d}]):")
        indent += "    "
    for i, kind in enumerate(kinds):
        if kind != "one":
            lines.append(f"{indent}x{i} = {loads[i]}(a{i}[{idx}])")
    lines.append(f"{indent}out[{idx}] = {store.format(expr)}")
    return "\n".join(lines) + "\n", name


# ---------------------------------------------------------------------------------------------
# fused recurrent cells: the ops PyTorch calls for nn.LSTM / nn.GRU on an accelerator
# (aten::_thnn_fused_{lstm,gru}_cell and their backward; the math of ATen's cuda/RNN.cu)
# ---------------------------------------------------------------------------------------------

_CELL_HEADER = '@njit(error_model="numpy", nogil=True)\n'


def render_lstm_cell(has_bias: bool, T: str) -> tuple[str, str]:
    """k(hy, cy, ws, ig, hg, cx, b1, b2): gates i,f,g,o; ws holds the activated gates [B, 4H]."""
    name = kernel_name("lstm_cell", has_bias, T)
    bias = lambda k: f" + b1[{k} * H + j] + b2[{k} * H + j]" if has_bias else ""  # noqa: E731
    src = f'''{_CELL_HEADER}def {name}(hy, cy, ws, ig, hg, cx, b1, b2):
    one = {T}(1)
    H = cx.shape[1]
    for b in range(cx.shape[0]):
        for j in range(H):
            gi = one / (one + math.exp(-(ig[b, j] + hg[b, j]{bias(0)})))
            gf = one / (one + math.exp(-(ig[b, H + j] + hg[b, H + j]{bias(1)})))
            gc = math.tanh(ig[b, 2 * H + j] + hg[b, 2 * H + j]{bias(2)})
            go = one / (one + math.exp(-(ig[b, 3 * H + j] + hg[b, 3 * H + j]{bias(3)})))
            ws[b, j] = gi
            ws[b, H + j] = gf
            ws[b, 2 * H + j] = gc
            ws[b, 3 * H + j] = go
            c = gf * cx[b, j] + gi * gc
            cy[b, j] = c
            hy[b, j] = go * math.tanh(c)
'''
    return src, name


def render_lstm_cell_backward(has_ghy: bool, has_gcy: bool, has_bias: bool,
                              T: str) -> tuple[str, str]:
    """k(gg, gcx, gb, ghy, gcy, cx, cy, ws): grads of the gates, cx and (summed) the bias."""
    name = kernel_name("lstm_cell_bw", has_ghy, has_gcy, has_bias, T)
    ghy = "ghy[b, j]" if has_ghy else "zero"
    gcy = "gcy[b, j]" if has_gcy else "zero"
    bias = f'''
    for j in range(4 * H):
        s = zero
        for b in range(cx.shape[0]):
            s += gg[b, j]
        gb[j] = s
''' if has_bias else ""
    src = f'''{_CELL_HEADER}def {name}(gg, gcx, gb, ghy, gcy, cx, cy, ws):
    one = {T}(1)
    zero = {T}(0)
    H = cx.shape[1]
    for b in range(cx.shape[0]):
        for j in range(H):
            gi = ws[b, j]
            gf = ws[b, H + j]
            gc = ws[b, 2 * H + j]
            go = ws[b, 3 * H + j]
            dh = {ghy}
            t = math.tanh(cy[b, j])
            dgo = dh * t
            dc = dh * go * (one - t * t) + {gcy}
            dgi = dc * gc
            dgf = dc * cx[b, j]
            dgc = dc * gi
            gcx[b, j] = dc * gf
            gg[b, j] = dgi * (one - gi) * gi
            gg[b, H + j] = dgf * (one - gf) * gf
            gg[b, 2 * H + j] = dgc * (one - gc * gc)
            gg[b, 3 * H + j] = dgo * (one - go) * go
{bias}'''
    return src, name


def render_gru_cell(has_bias: bool, T: str) -> tuple[str, str]:
    """k(hy, ws, ig, hg, hx, b1, b2): gates r,z,n; ws [B, 5H] = r, z, n, hx, hn + b2n."""
    name = kernel_name("gru_cell", has_bias, T)
    b1 = lambda k: f" + b1[{k} * H + j]" if has_bias else ""  # noqa: E731
    b2 = lambda k: f" + b2[{k} * H + j]" if has_bias else ""  # noqa: E731
    src = f'''{_CELL_HEADER}def {name}(hy, ws, ig, hg, hx, b1, b2):
    one = {T}(1)
    H = hx.shape[1]
    for b in range(hx.shape[0]):
        for j in range(H):
            r = one / (one + math.exp(-(ig[b, j] + hg[b, j]{b1(0)}{b2(0)})))
            z = one / (one + math.exp(-(ig[b, H + j] + hg[b, H + j]{b1(1)}{b2(1)})))
            hn = hg[b, 2 * H + j]{b2(2)}
            n = math.tanh(ig[b, 2 * H + j]{b1(2)} + r * hn)
            h = hx[b, j]
            ws[b, j] = r
            ws[b, H + j] = z
            ws[b, 2 * H + j] = n
            ws[b, 3 * H + j] = h
            ws[b, 4 * H + j] = hn
            hy[b, j] = n + z * (h - n)
'''
    return src, name


def render_gru_cell_backward(has_bias: bool, T: str) -> tuple[str, str]:
    """k(gig, ghg, ghx, gib, ghb, ghy, ws): grads of both gate inputs, hx and the biases."""
    name = kernel_name("gru_cell_bw", has_bias, T)
    bias = '''
    for j in range(3 * H):
        s1 = zero
        s2 = zero
        for b in range(ghy.shape[0]):
            s1 += gig[b, j]
            s2 += ghg[b, j]
        gib[j] = s1
        ghb[j] = s2
''' if has_bias else ""
    src = f'''{_CELL_HEADER}def {name}(gig, ghg, ghx, gib, ghb, ghy, ws):
    one = {T}(1)
    zero = {T}(0)
    H = ghy.shape[1]
    for b in range(ghy.shape[0]):
        for j in range(H):
            r = ws[b, j]
            z = ws[b, H + j]
            n = ws[b, 2 * H + j]
            h = ws[b, 3 * H + j]
            hn = ws[b, 4 * H + j]
            go = ghy[b, j]
            dz = go * (h - n) * (one - z) * z
            dh = go * z
            dn = go * (one - z) * (one - n * n)
            dhn = dn * r
            dr = dn * hn * (one - r) * r
            gig[b, j] = dr
            gig[b, H + j] = dz
            gig[b, 2 * H + j] = dn
            ghg[b, j] = dr
            ghg[b, H + j] = dz
            ghg[b, 2 * H + j] = dhn
            ghx[b, j] = dh
{bias}'''
    return src, name


# ---------------------------------------------------------------------------------------------
# special functions: straight ports of ATen's CPU code (aten/src/ATen/native/Math.h, derived
# from Cephes), in the same precision and operation order so results match the CPU's. One copy
# per float type (`_digamma_float32`, `_digamma_float64`): every constant is cast to the type,
# since a bare Python literal would promote float32 arithmetic to float64.
# ---------------------------------------------------------------------------------------------

_I0E_A = (
    -4.41534164647933937950E-18, 3.33079451882223809783E-17, -2.43127984654795469359E-16,
    1.71539128555513303061E-15, -1.16853328779934516808E-14, 7.67618549860493561688E-14,
    -4.85644678311192946090E-13, 2.95505266312963983461E-12, -1.72682629144155570723E-11,
    9.67580903537323691224E-11, -5.18979560163526290666E-10, 2.65982372468238665035E-9,
    -1.30002500998624804212E-8, 6.04699502254191894932E-8, -2.67079385394061173391E-7,
    1.11738753912010371815E-6, -4.41673835845875056359E-6, 1.64484480707288970893E-5,
    -5.75419501008210370398E-5, 1.88502885095841655729E-4, -5.76375574538582365885E-4,
    1.63947561694133579842E-3, -4.32430999505057594430E-3, 1.05464603945949983183E-2,
    -2.37374148058994688156E-2, 4.93052842396707084878E-2, -9.49010970480476444210E-2,
    1.71620901522208775349E-1, -3.04682672343198398683E-1, 6.76795274409476084995E-1)
_I0E_B = (
    -7.23318048787475395456E-18, -4.83050448594418207126E-18, 4.46562142029675999901E-17,
    3.46122286769746109310E-17, -2.82762398051658348494E-16, -3.42548561967721913462E-16,
    1.77256013305652638360E-15, 3.81168066935262242075E-15, -9.55484669882830764870E-15,
    -4.15056934728722208663E-14, 1.54008621752140982691E-14, 3.85277838274214270114E-13,
    7.18012445138366623367E-13, -1.79417853150680611778E-12, -1.32158118404477131188E-11,
    -3.14991652796324136454E-11, 1.18891471078464383424E-11, 4.94060238822496958910E-10,
    3.39623202570838634515E-9, 2.26666899049817806459E-8, 2.04891858946906374183E-7,
    2.89137052083475648297E-6, 6.88975834691682398426E-5, 3.36911647825569408990E-3,
    8.04490411014108831608E-1)
_I1E_A64 = (
    2.77791411276104639959E-18, -2.11142121435816608115E-17, 1.55363195773620046921E-16,
    -1.10559694773538630805E-15, 7.60068429473540693410E-15, -5.04218550472791168711E-14,
    3.22379336594557470981E-13, -1.98397439776494371520E-12, 1.17361862988909016308E-11,
    -6.66348972350202774223E-11, 3.62559028155211703701E-10, -1.88724975172282928790E-9,
    9.38153738649577178388E-9, -4.44505912879632808065E-8, 2.00329475355213526229E-7,
    -8.56872026469545474066E-7, 3.47025130813767847674E-6, -1.32731636560394358279E-5,
    4.78156510755005422638E-5, -1.61760815825896745588E-4, 5.12285956168575772895E-4,
    -1.51357245063125314899E-3, 4.15642294431288815669E-3, -1.05640848946261981558E-2,
    2.47264490306265168283E-2, -5.29459812080949914269E-2, 1.02643658689847095384E-1,
    -1.76416518357834055153E-1, 2.52587186443633654823E-1)
_I1E_A32 = _I1E_A64[12:]
_I1E_B64 = (
    7.51729631084210481353E-18, 4.41434832307170791151E-18, -4.65030536848935832153E-17,
    -3.20952592199342395980E-17, 2.96262899764595013876E-16, 3.30820231092092828324E-16,
    -1.88035477551078244854E-15, -3.81440307243700780478E-15, 1.04202769841288027642E-14,
    4.27244001671195135429E-14, -2.10154184277266431302E-14, -4.08355111109219731823E-13,
    -7.19855177624590851209E-13, 2.03562854414708950722E-12, 1.41258074366137813316E-11,
    3.25260358301548823856E-11, -1.89749581235054123450E-11, -5.58974346219658380687E-10,
    -3.83538038596423702205E-9, -2.63146884688951950684E-8, -2.51223623787020892529E-7,
    -3.88256480887769039346E-6, -1.10588938762623716291E-4, -9.76109749136146840777E-3,
    7.78576235018280120474E-1)
_I1E_B32 = _I1E_B64[18:]
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


def _polevl(var: str, coeffs, T: str, out: str, indent: str) -> list:
    """Cephes polevl as straight-line code: out = ((0 * x + c0) * x + c1) ..."""
    lines = [f"{indent}{out} = {T}(0)"]
    lines += [f"{indent}{out} = {out} * {var} + {T}({c!r})" for c in coeffs]
    return lines


def _chbevl(var: str, coeffs, T: str, out: str, indent: str) -> list:
    """Cephes chbevl (Chebyshev series) as straight-line code."""
    lines = [f"{indent}b0 = {T}({coeffs[0]!r})", f"{indent}b1 = {T}(0)", f"{indent}b2 = {T}(0)"]
    for c in coeffs[1:]:
        lines += [f"{indent}b2 = b1", f"{indent}b1 = b0",
                  f"{indent}b0 = {var} * b1 - b2 + {T}({c!r})"]
    lines.append(f"{indent}{out} = {T}(0.5) * (b0 - b2)")
    return lines


def _special_for(T: str) -> str:
    t = T.split(".")[1]            # "float32"
    f32 = t == "float32"
    h = '@njit(inline="always", error_model="numpy")\n'
    src = []
    # digamma: x >= 0 part, then the reflection for x < 0 (kept apart: no recursion in numba)
    body = [f"def _digamma_pos_{t}(x):", f"    result = {T}(0)",
            f"    while x < {T}(10):", f"        result -= {T}(1) / x", f"        x += {T}(1)",
            f"    if x == {T}(10):", f"        return result + {T}(2.25175258906672110764)",
            f"    y = {T}(0)", f"    if x < {T}(1.0e17):", f"        z = {T}(1) / (x * x)"]
    body += _polevl("z", _DIGAMMA_A, T, "p", "        ")
    body += ["        y = z * p", f"    return result + math.log(x) - ({T}(0.5) / x) - y"]
    src.append(h + "\n".join(body))
    refl = (f"{T}(math.pi / math.tan(math.pi * r))" if f32 else
            "math.pi / math.tan(math.pi * r)")
    src.append(h + f'''def _digamma_{t}(x):
    if x == 0:
        return {T}(math.copysign(math.inf, -x))
    if x < 0:
        if x == np.trunc(x):
            return {T}(math.nan)
        xd = np.float64(x)
        r = xd - np.trunc(xd)
        return _digamma_pos_{t}({T}(1) - x) - {refl}
    return _digamma_pos_{t}(x)''')
    src.append(h + f'''def _trigamma_{t}(x):
    sign = {T}(1)
    result = {T}(0)
    if x < {T}(0.5):
        sign = {T}(-1)
        s = math.sin({T}(math.pi) * x)
        result -= ({T}(math.pi) * {T}(math.pi)) / (s * s)
        x = {T}(1) - x
    for _ in range(6):
        result += {T}(1) / (x * x)
        x += {T}(1)
    ixx = {T}(1) / (x * x)
    result += ({T}(1) + {T}(1) / ({T}(2) * x) + ixx * ({T}(1) / {T}(6) - ixx * ({T}(1) / {T}(30)
               - ixx * ({T}(1) / {T}(42))))) / x
    return sign * result''')
    # polygamma(n >= 2): sign * exp(lgamma(n + 1)) * zeta(n + 1, x), zeta in double (acc type)
    src.append(h + f'''def _polygamma_{t}(x, n):
    one = {T}(1)
    sign = one if n % 2 else -one
    return sign * math.exp(math.lgamma({T}(n) + one)) * {T}(_zeta(np.float64(n + 1), np.float64(x)))''')
    src.append(h + f'''def _zeta_{t}(x, q):
    return {T}(_zeta(np.float64(x), np.float64(q)))''')
    # modified Bessel functions of the first kind (i0, i0e, i1, i1e)
    i1a, i1b = (_I1E_A32, _I1E_B32) if f32 else (_I1E_A64, _I1E_B64)
    for name, small, large in (
            ("i0", "math.exp(x) * ca", "math.exp(x) * cb / math.sqrt(x)"),
            ("i0e", "ca", "cb / math.sqrt(x)"),
            ("i1", "math.exp(x) * x * ca", "(math.exp(x) * cb) / math.sqrt(x)"),
            ("i1e", "ca * x", "cb / math.sqrt(x)")):
        a, b = (_I0E_A, _I0E_B) if name.startswith("i0") else (i1a, i1b)
        odd = name.startswith("i1")
        lines = [f"def _{name}_{t}(x0):", "    x = abs(x0)", f"    if x <= {T}(8.0):",
                 f"        y = (x / {T}(2.0)) - {T}(2.0)"]
        lines += _chbevl("y", a, T, "ca", "        ")
        lines.append(f"        out = {small}")
        lines.append(f"        return -out if (x0 < {T}(0) and {odd}) else out")
        lines.append(f"    y = {T}(32.0) / x - {T}(2.0)")
        lines += _chbevl("y", b, T, "cb", "    ")
        lines.append(f"    out = {large}")
        lines.append(f"    return -out if (x0 < {T}(0) and {odd}) else out")
        src.append(h + "\n".join(lines))
    src.append(h + f'''def _erfinv_{t}(y):
    y_abs = abs(y)
    if y_abs > {T}(1.0):
        return {T}(math.nan)
    if y_abs == {T}(1.0):
        return {T}(math.copysign(math.inf, y))
    if y_abs <= {T}(0.7):
        z = y * y
        num = ((({T}(-0.140543331) * z + {T}(0.914624893)) * z + {T}(-1.645349621)) * z
               + {T}(0.886226899))
        dem = (((({T}(0.012229801) * z + {T}(-0.329097515)) * z + {T}(1.442710462)) * z
                + {T}(-2.118377725)) * z + {T}(1.0))
        x = y * num / dem
    else:
        z = math.sqrt(-math.log(({T}(1.0) - y_abs) / {T}(2.0)))
        num = (({T}(1.641345311) * z + {T}(3.429567803)) * z + {T}(-1.624906493)) * z \\
            + {T}(-1.970840454)
        dem = ({T}(1.637067800) * z + {T}(3.543889200)) * z + {T}(1.0)
        x = math.copysign(num, y) / dem
    k = {T}(2.0) * {T}(0.564189583547756286948079451560772586)
    x = x - (math.erf(x) - y) / (k * math.exp(-x * x))
    x = x - (math.erf(x) - y) / (k * math.exp(-x * x))
    return x''')
    lines = [f"def _ndtri_{t}(y0):", "    one = " + f"{T}(1)", "    zero = " + f"{T}(0)",
             "    if y0 == zero:", f"        return {T}(-math.inf)",
             "    if y0 == one:", f"        return {T}(math.inf)",
             "    if y0 < zero or y0 > one:", f"        return {T}(math.nan)",
             "    code = True", "    y = y0",
             f"    if y > one - {T}(0.13533528323661269189):", "        y = one - y",
             "        code = False",
             f"    if y > {T}(0.13533528323661269189):", f"        y = y - {T}(0.5)",
             "        y2 = y * y"]
    lines += _polevl("y2", _NDTRI["P0"], T, "p", "        ")
    lines += _polevl("y2", _NDTRI["Q0"], T, "q", "        ")
    lines += ["        x = y + y * (y2 * p / q)",
              f"        return x * {T}(2.50662827463100050242E0)",
              f"    x = math.sqrt({T}(-2.0) * math.log(y))", "    x0 = x - math.log(x) / x",
              "    z = one / x", f"    if x < {T}(8.0):"]
    lines += _polevl("z", _NDTRI["P1"], T, "p", "        ")
    lines += _polevl("z", _NDTRI["Q1"], T, "q", "        ")
    lines += ["        x1 = z * p / q", "    else:"]
    lines += _polevl("z", _NDTRI["P2"], T, "p", "        ")
    lines += _polevl("z", _NDTRI["Q2"], T, "q", "        ")
    lines += ["        x1 = z * p / q", "    x = x0 - x1", "    if code:", "        x = -x",
              "    return x"]
    src.append(h + "\n".join(lines))
    return "\n\n".join(src) + "\n"


def special_prelude() -> str:
    """njit helpers for digamma, trigamma, polygamma, zeta, i0/i0e/i1/i1e, erfinv, ndtri."""
    zeta = f'''_ZETA_A = {_ZETA_A!r}

@njit(inline="always", error_model="numpy")
def _zeta(x, q):
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
'''
    return zeta + "\n" + _special_for("np.float32") + "\n" + _special_for("np.float64")


# Orthogonal polynomials (x, n): ATen's *_polynomial_*_forward, n truncated to int64. `T(` is
# replaced by the float type; `_SUF` by its name.
_POLYNOMIALS = '''
@njit(inline="always", error_model="numpy")
def _cheb_t_SUF(x, nf):
    n = np.int64(nf)
    if n < 0:
        return T(0.0)
    if abs(x) == T(1.0):
        if x > T(0.0) or n % 2 == 0:
            return T(1.0)
        return T(-1.0)
    if n > 6 and abs(x) < T(1.0):
        return math.cos(T(n) * math.acos(x))
    if n == 0:
        return T(1.0)
    if n == 1:
        return x
    p = T(1.0)
    q = x
    r = x
    k = 2
    while k <= n and not q != q:
        r = (x + x) * q - p
        p = q
        q = r
        k += 1
    return r

@njit(inline="always", error_model="numpy")
def _cheb_u_SUF(x, nf):
    n = np.int64(nf)
    if n < 0:
        return T(0.0)
    if abs(x) == T(1.0):
        if x > T(0.0) or n % 2 == 0:
            return T(n + 1)
        return T(-(n + 1))
    if n > 8 and abs(x) < T(1.0):
        if math.sin(math.acos(x)) != T(0.0):
            return math.sin(T(n + 1) * math.acos(x)) / math.sin(math.acos(x))
        return T(n + 1) * math.cos(T(n + 1) * math.acos(x)) / x
    if n == 0:
        return T(1.0)
    if n == 1:
        return x + x
    p = T(1.0)
    q = x + x
    r = T(0.0)
    k = 2
    while k <= n and not q != q:
        r = (x + x) * q - p
        p = q
        q = r
        k += 1
    return r

@njit(inline="always", error_model="numpy")
def _cheb_v_SUF(x, nf):
    n = np.int64(nf)
    if n < 0:
        return T(0.0)
    if abs(x) == T(1.0):
        if x > T(0.0):
            return T(1.0)
        if n % 2 == 0:
            return T(n + n + 1)
        return T(-(n + n + 1))
    if n > 8 and abs(x) < T(1.0):
        if math.sin(math.acos(x) / T(2.0)) != T(1.0):
            return math.cos((T(n) + T(0.5)) * math.acos(x)) / math.cos(math.acos(x) / T(2.0))
        if n % 2 == 0:
            return T(n + n + 1)
        return T(-(n + n + 1))
    if n == 0:
        return T(1.0)
    if n == 1:
        return x + x - T(1.0)
    p = T(1.0)
    q = x + x - T(1.0)
    r = T(0.0)
    k = 2
    while k <= n and not q != q:
        r = (x + x) * q - p
        p = q
        q = r
        k += 1
    return r

@njit(inline="always", error_model="numpy")
def _cheb_w_SUF(x, nf):
    n = np.int64(nf)
    if n < 0:
        return T(0.0)
    if abs(x) == T(1.0):
        if x > T(0.0):
            return T(n + n + 1)
        if n % 2 == 0:
            return T(1.0)
        return T(-1.0)
    if n > 8 and abs(x) < T(1.0):
        if math.cos(math.acos(x) / T(2.0)) != T(1.0):
            return math.sin((T(n) + T(0.5)) * math.acos(x)) / math.sin(math.acos(x) / T(2.0))
        if x > T(0.0):
            return T(n + n + 1)
        if n % 2 == 0:
            return T(1.0)
        return T(-1.0)
    if n == 0:
        return T(1.0)
    if n == 1:
        return x + x + T(1.0)
    p = T(1.0)
    q = x + x + T(1.0)
    r = T(0.0)
    k = 2
    while k <= n and not q != q:
        r = (x + x) * q - p
        p = q
        q = r
        k += 1
    return r

@njit(inline="always", error_model="numpy")
def _hermite_h_SUF(x, nf):
    if math.isinf(nf) or nf != nf:
        n = np.int64(-1)
    else:
        n = np.int64(nf)
    if n < 0:
        return T(0.0)
    if n == 0:
        return T(1.0)
    if n == 1:
        return x + x
    if n > HLIMIT:
        return T(math.nan)
    p = T(1.0)
    q = x + x
    r = T(0.0)
    k = 2
    while k < n + n:
        r = (x + x) * q - T(k) * p
        p = q
        q = r
        k += 2
    return r

@njit(inline="always", error_model="numpy")
def _hermite_he_SUF(x, nf):
    n = np.int64(nf)
    if n < 0:
        return T(0.0)
    if n == 0:
        return T(1.0)
    if n == 1:
        return x
    if n > HLIMIT:
        return T(math.nan)
    p = T(1.0)
    q = x
    r = T(0.0)
    k = 1
    while k < n:
        r = x * q - T(k) * p
        p = q
        q = r
        k += 1
    return r

@njit(inline="always", error_model="numpy")
def _laguerre_l_SUF(x, nf):
    n = np.int64(nf)
    if n < 0:
        return T(0.0)
    if abs(x) == T(0.0):
        return T(1.0)
    if n == 0:
        return T(1.0)
    if n == 1:
        return T(1.0) - x
    p = T(1.0)
    q = T(1.0) - x
    r = T(0.0)
    k = 1
    while k < n and not q != q:
        r = ((T(k + k) + (T(1.0) - x)) * q - T(k) * p) / T(k + 1)
        p = q
        q = r
        k += 1
    return r

@njit(inline="always", error_model="numpy")
def _legendre_p_SUF(x, nf):
    n = np.int64(nf)
    if n < 0:
        return T(0.0)
    if abs(x) == T(1.0):
        if x > T(0.0) or n % 2 == 0:
            return T(1.0)
        return T(-1.0)
    if n == 0:
        return T(1.0)
    if n == 1:
        return x
    p = T(1.0)
    q = x
    r = T(0.0)
    k = 1
    while k < n and not q != q:
        r = (T(k + k + 1) * x * q - T(k) * p) / T(k + 1)
        p = q
        q = r
        k += 1
    return r

@njit(inline="always", error_model="numpy")
def _scheb_t_SUF(x, nf):
    n = np.int64(nf)
    if n < 0:
        return T(0.0)
    if x == T(1.0):
        return T(1.0)
    if x == T(0.0):
        if n % 2 == 0:
            return T(1.0)
        return T(-1.0)
    y = x + x - T(1.0)
    if n > 6 and abs(y) < T(1.0):
        return math.cos(T(n) * math.acos(y))
    if n == 0:
        return T(1.0)
    if n == 1:
        return y
    p = T(1.0)
    q = y
    r = T(0.0)
    k = 2
    while k <= n and not q != q:
        r = (y + y) * q - p
        p = q
        q = r
        k += 1
    return r

@njit(inline="always", error_model="numpy")
def _scheb_u_SUF(x, nf):
    n = np.int64(nf)
    if n < 0:
        return T(0.0)
    if x == T(1.0):
        return T(n + 1)
    if x == T(0.0):
        if n % 2 == 0:
            return T(n + 1)
        return T(-(n + 1))
    y = x + x - T(1.0)
    if n > 6 and abs(y) < T(1.0):
        if math.sin(math.acos(y)) != T(0.0):
            return math.sin(T(n + 1) * math.acos(y)) / math.sin(math.acos(y))
        return T(n + 1) * math.cos(T(n + 1) * math.acos(y)) / y
    if n == 0:
        return T(1.0)
    if n == 1:
        return y + y
    p = T(1.0)
    q = y + y
    r = T(0.0)
    k = 2
    while k <= n and not q != q:
        r = (y + y) * q - p
        p = q
        q = r
        k += 1
    return r

@njit(inline="always", error_model="numpy")
def _scheb_v_SUF(x, nf):
    n = np.int64(nf)
    if n < 0:
        return T(0.0)
    if x == T(1.0):
        return T(1.0)
    if x == T(0.0):
        if n % 2 == 0:
            return T(n + n + 1)
        return T(-(n + n + 1))
    y = x + x - T(1.0)
    if n > 6 and abs(y) < T(1.0):
        if math.sin(math.acos(y) / T(2.0)) != T(1.0):
            return math.cos((T(n) + T(0.5)) * math.acos(y)) / math.cos(math.acos(y) / T(2.0))
        if n % 2 == 0:
            return T(n + n + 1)
        return T(-(n + n + 1))
    if n == 0:
        return T(1.0)
    if n == 1:
        return y + y - T(1.0)
    p = T(1.0)
    q = y + y - T(1.0)
    r = T(0.0)
    k = 2
    while k <= n and not q != q:
        r = (y + y) * q - p
        p = q
        q = r
        k += 1
    return r

@njit(inline="always", error_model="numpy")
def _scheb_w_SUF(x, nf):
    n = np.int64(nf)
    if n < 0:
        return T(0.0)
    if x == T(1.0):
        return T(n + n + 1)
    if x == T(0.0):
        if n % 2 == 0:
            return T(1.0)
        return T(-1.0)
    y = x + x - T(1.0)
    if n > 4 and abs(y) < T(1.0):
        if math.cos(math.acos(y) / T(2.0)) != T(1.0):
            return math.sin((T(n) + T(0.5)) * math.acos(y)) / math.sin(math.acos(y) / T(2.0))
        if n % 2 == 0:
            return T(1.0)
        return T(-1.0)
    if n == 0:
        return T(1.0)
    if n == 1:
        return y + y + T(1.0)
    p = T(1.0)
    q = y + y + T(1.0)
    r = T(0.0)
    k = 2
    while k <= n and not q != q:
        r = (y + y) * q - p
        p = q
        q = r
        k += 1
    return r

@njit(inline="always", error_model="numpy")
def _sph_bessel_j0_SUF(x):
    if math.isinf(x):
        return T(0.0)
    if abs(x) < T(0.5):
        xx = x * x
        return T(1.0) + xx * (T(-1.0) / T(6.0) + xx * (T(1.0) / T(120.0) + xx * (T(-1.0)
            / T(5040.0) + xx * (T(1.0) / T(362880.0) + xx * (T(-1.0) / T(39916800.0) + xx
            * (T(1.0) / T(6227020800.0)))))))
    return math.sin(x) / x
'''


def polynomial_prelude() -> str:
    import re

    out = []
    for T, limit in (("np.float32", 128), ("np.float64", 512)):
        src = re.sub(r"(?<![\w.])T\(", f"{T}(", _POLYNOMIALS)
        out.append(src.replace("_SUF", "_" + T.split(".")[1]).replace("HLIMIT", str(limit)))
    return "\n".join(out)


def render_frexp(T: str) -> tuple[str, str]:
    """k(mantissa, exponent, x) over flat arrays: x = mantissa * 2**exponent, |mantissa| in
    [0.5, 1) (0, inf and nan keep exponent 0, as glibc's frexp)."""
    name = kernel_name("frexp", T)
    src = f'''{_CELL_HEADER}def {name}(m, e, x):
    for i in range(x.shape[0]):
        mi, ei = math.frexp(x[i])
        m[i] = {T}(mi)
        e[i] = ei
'''
    return src, name
