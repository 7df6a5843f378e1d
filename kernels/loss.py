"""Loss kernels with per-sample loops: margin-loss backward passes, CTC loss (alpha-beta).

Every kernel follows PyTorch's CPU loop (same order, same float type), so results match the
CPU bit for bit or within rounding. Inputs are (N, C) views (a 1-d input is N = 1); the
incoming gradient is an (N,) view, stride 0 for a reduced loss.

>>> src, name = render_multi_margin_backward("np.float32", True, False)
>>> name in src
True
"""

from __future__ import annotations

from .elementwise import kernel_name

HEADER = '@njit(error_model="numpy", nogil=True)\n'

# multi_margin_loss_backward_cpu_kernel: h = g (p = 1) or 2 g z (p = 2), times weight[target]
_MULTI_MARGIN_BACKWARD = """\
def {name}(gi, go, x, target, w, margin, g, err):
    nf = x.shape[0]
    dim = x.shape[1]
    for t in range(nf):
        ti = target[t]
        if ti < 0 or ti >= dim:
            err[0] = ti
            err[1] = 1
            return
        xt = x[t, ti]
        acc = {T}(0)
        for d in range(dim):
            if d == ti:
                continue
            z = {T}(margin) - xt + x[t, d]
            if z > 0:
                h = {h}
                acc -= h
                gi[t, d] = h
            else:
                gi[t, d] = 0
        gi[t, ti] = acc
        for d in range(dim):
            gi[t, d] *= go[t]
"""

# multilabel_margin_loss_backward_cpu_kernel: targets end at the first negative entry
_MULTILABEL_MARGIN_BACKWARD = """\
def {name}(gi, go, x, target, is_target, g):
    nf = x.shape[0]
    dim = x.shape[1]
    for t in range(nf):
        for d in range(dim):
            gi[t, d] = 0
        for dt in range(dim):
            ti = target[t, dt]
            if ti < 0:
                break
            xt = x[t, ti]
            for d in range(dim):
                if is_target[t, d] == 0:
                    z = {T}(1) - xt + x[t, d]
                    if z > 0:
                        gi[t, ti] -= {T}(g)
                        gi[t, d] += {T}(g)
        for d in range(dim):
            gi[t, d] *= go[t]
"""


# multilabel_margin_loss_forward_out_frame: per-row sums in float64 (CPU acc_type), /dim, and
# for a reduction the sum over rows (/N for mean)
_MULTILABEL_MARGIN = """\
def {name}(out, is_target, x, target, reduction):
    nf = x.shape[0]
    dim = x.shape[1]
    total = 0.0
    for t in range(nf):
        for d in range(dim):
            is_target[t, d] = 0
        for dt in range(dim):
            ti = target[t, dt]
            if ti < 0:
                break
            is_target[t, ti] = 1
        s = 0.0
        for dt in range(dim):
            ti = target[t, dt]
            if ti < 0:
                break
            xt = x[t, ti]
            for d in range(dim):
                if is_target[t, d] == 0:
                    z = {T}(1) - xt + x[t, d]
                    if z > 0:
                        s += z
        if reduction == 0:
            out[t] = s / dim
        else:
            total += s
    if reduction != 0:
        total /= dim
        if reduction == 1:
            total /= nf
        out[0] = total
"""


def render_multilabel_margin(T: str) -> tuple[str, str]:
    """`k(out, is_target, x, target, reduction)`: out (N,) for reduction none, else (1,)."""
    name = kernel_name("multilabel_margin", T)
    return HEADER + _MULTILABEL_MARGIN.format(name=name, T=T), name


def render_multi_margin_backward(T: str, p_is_one: bool, has_weight: bool) -> tuple[str, str]:
    """`k(gi, go, x, target, w, margin, g, err)`: g = 1/dim (1/(N*dim) for mean); w the class
    weights (read only with `has_weight`); err[1] = 1 flags a target out of range."""
    name = kernel_name("multi_margin_bw", T, p_is_one, has_weight)
    h = f"{T}(g)" if p_is_one else f"{T}(2) * {T}(g) * z"
    if has_weight:
        h = f"({h}) * w[ti]"
    return HEADER + _MULTI_MARGIN_BACKWARD.format(name=name, T=T, h=h), name


def render_multilabel_margin_backward(T: str) -> tuple[str, str]:
    """`k(gi, go, x, target, is_target, g)`."""
    name = kernel_name("multilabel_margin_bw", T)
    return HEADER + _MULTILABEL_MARGIN_BACKWARD.format(name=name, T=T), name
