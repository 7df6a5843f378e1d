"""Autocast and GradScaler on `neuron`, with CUDA's autocast op lists.

PyTorch 2.13 registers no kernel at all under the AutocastPrivateUse1 key, so with autocast on,
every op on a neuron tensor raised "Could not run ... with arguments from the 'Autocastneuron'
backend". Here: a fallthrough for every op, then a Python kernel per op of CUDA's lists
(aten/src/ATen/autocast_mode.cpp) that casts the floating neuron inputs and redispatches below
the autocast key: matmul-like ops run in the autocast dtype, precision-sensitive ones (exp, log,
softmax, norms, losses, ...) in float32, multi-input ones (cat, addcmul, ...) in the widest type.

>>> import torch, eager_neuron
>>> a = torch.ones(2, 2, device="neuron")
>>> with torch.autocast("neuron", dtype=torch.bfloat16):
...     (a @ a).dtype, torch.exp(a.bfloat16()).dtype
(torch.bfloat16, torch.float32)
"""

from __future__ import annotations

import types

import torch

aten = torch.ops.aten
_KEY = torch._C.DispatchKey.AutocastPrivateUse1
_EXCLUDE = torch._C.DispatchKeySet(_KEY)

# CUDA's lists (autocast_mode.cpp), by aten name: every overload of the name is covered.
LOWER = (
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr",
    "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm",
    "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
    "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "scaled_dot_product_attention",
)
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm",
    "group_norm", "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d",
    "upsample_bicubic2d", "_upsample_bicubic2d_aa",
    # CUDA's fp32_set_opt_dtype list: float32 unless the caller passed a dtype
    "prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm", "sum",
)
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put",
           "scatter_add", "tensordot", "cat", "stack")
_SET_OPT_DTYPE = frozenset(("prod", "softmax", "log_softmax", "cumprod", "cumsum",
                            "linalg_vector_norm", "sum"))


def _eligible(t) -> bool:
    return (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
            and t.device.type == "neuron")


def _cast(x, dtype):
    if _eligible(x) and x.dtype != dtype:
        return x.to(dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(v, dtype) for v in x)
    return x


def _widest(args, kwargs):
    widest = None
    for x in list(args) + list(kwargs.values()):
        for t in (x if isinstance(x, (list, tuple)) else (x,)):
            if _eligible(t):
                widest = t.dtype if widest is None else torch.promote_types(widest, t.dtype)
    return widest


def _kernel(op, policy: str):
    def run(*args, **kwargs):
        if policy == "lower":
            dtype = torch.get_autocast_dtype("neuron")
        elif policy == "fp32":
            dtype = torch.float32
            if op._schema.name.split("::")[1] in _SET_OPT_DTYPE and kwargs.get("dtype") is not None:
                dtype = None    # an explicit dtype= wins, as on CUDA
        else:
            dtype = _widest(args, kwargs)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            if dtype is not None:
                args, kwargs = _cast(args, dtype), {k: _cast(v, dtype) for k, v in kwargs.items()}
            return op(*args, **kwargs)
    return run


_LIB = None


def install() -> None:
    """The fallthrough and the per-op kernels under AutocastPrivateUse1; torch.neuron's amp API."""
    global _LIB
    if _LIB is not None:
        return
    _LIB = torch.library.Library("aten", "IMPL")
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    _LIB._fallthrough = fallthrough      # kept alive with _LIB
    for policy, names in (("lower", LOWER), ("fp32", FP32), ("promote", PROMOTE)):
        for name in names:
            packet = getattr(aten, name, None)
            if packet is None:
                continue
            for ov in packet.overloads():
                op = getattr(packet, ov)
                if policy == "lower" and ov.startswith("out"):
                    continue     # CUDA does not autocast out= variants
                _LIB.impl(op, _kernel(op, policy), "AutocastPrivateUse1")
    _install_decomps()


# -- GradScaler's two ops as device work (they had no neuron kernel: a CPU fallback each step) --
def _non_finite_check_and_unscale(grads, found_inf, inv_scale):
    """found_inf = 1 if any gradient holds inf/NaN; every gradient *= inv_scale (as on CUDA,
    also when one is not finite). Runs as neuron ops: no host read, no sync."""
    for g in grads:
        bad = torch.logical_not(torch.isfinite(g)).any().to(found_inf.dtype)
        found_inf.copy_(torch.maximum(found_inf, bad.reshape(found_inf.shape)))
        g.mul_(inv_scale.to(g.dtype) if g.dtype != inv_scale.dtype else inv_scale)


def _update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                  growth_interval):
    """CUDA's amp_update_scale_ with torch.where instead of a branch on the host."""
    inf = found_inf > 0
    successful = growth_tracker + 1
    grown = scale * growth_factor
    grow = (successful == growth_interval) & ~inf & torch.isfinite(grown)
    new_scale = torch.where(inf, scale * backoff_factor, torch.where(grow, grown, scale))
    reset = inf | (successful == growth_interval)
    growth_tracker.copy_(torch.where(reset, torch.zeros_like(successful), successful))
    scale.copy_(new_scale)
    return scale


def decomp_plan(op, fn):
    """A dispatch Plan that runs `fn` (written in torch ops) for `op`: device work, op by op.
    Built from the schema here (plan._plan would load the whole decomposition table at import)."""
    from .plan import Plan

    schema = op._schema
    args = schema.arguments
    mutates = tuple(a.name for a in args if a.alias_info and a.alias_info.is_write)
    ret_alias = tuple(
        next((a.name for a in args if r.alias_info is not None and a.alias_info
              and a.alias_info.before_set == r.alias_info.before_set), None)
        for r in schema.returns)
    name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
    return Plan("decomp", name=name, mutates=mutates, ret_alias=ret_alias,
                out_args=tuple(a.name for a in args if a.is_out), decomp=fn)


def _install_decomps() -> None:
    from .plan import _PLANS

    for op, fn in ((aten._amp_foreach_non_finite_check_and_unscale_.default,
                    _non_finite_check_and_unscale),
                   (aten._amp_update_scale_.default, _update_scale)):
        _PLANS[op] = decomp_plan(op, fn)


# -- torch.neuron's amp functions (what torch.amp asks a device module for) ----------------------
def get_amp_supported_dtype() -> list:
    """Dtypes torch.autocast("neuron", dtype=...) accepts.

    >>> import torch, eager_neuron; torch.neuron.get_amp_supported_dtype()
    [torch.float16, torch.bfloat16]
    """
    return [torch.float16, torch.bfloat16]


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("neuron")


def set_autocast_enabled(enabled: bool) -> None:
    torch.set_autocast_enabled("neuron", enabled)


def get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype("neuron")


def set_autocast_dtype(dtype: torch.dtype) -> None:
    torch.set_autocast_dtype("neuron", dtype)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


class autocast(torch.amp.autocast_mode.autocast):  # noqa: N801 -- as torch.cuda.amp.autocast
    """torch.neuron.amp.autocast(dtype=...): torch.autocast("neuron", ...)."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.bfloat16,
                 cache_enabled: bool = True) -> None:
        super().__init__("neuron", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """torch.neuron.amp.GradScaler(): torch.amp.GradScaler("neuron")."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        super().__init__("neuron", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)


def amp_module() -> types.ModuleType:
    mod = types.ModuleType("torch.neuron.amp")
    mod.autocast = autocast
    mod.GradScaler = GradScaler
    return mod


MODULE_FUNCTIONS = ("get_amp_supported_dtype", "is_autocast_enabled", "set_autocast_enabled",
                    "get_autocast_dtype", "set_autocast_dtype", "is_bf16_supported")
