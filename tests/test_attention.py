"""F.scaled_dot_product_attention on neuron: one fused kernel forward, one backward, vs the CPU.

The fused path (lower/attention.py) covers masks (bool, additive, broadcast, with gradient),
causal, grouped-query attention and strided views; dropout and float64 take the math path.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import eager_neuron

RTOL, ATOL = 1e-5, 1e-5


def _run(q, k, v, mask=None, **kw):
    """Forward + backward on both devices; returns (neuron stats, max errors)."""
    ins = [t.requires_grad_() for t in (q, k, v)] + ([mask] if mask is not None else [])
    nins = [t.detach().to("neuron").requires_grad_(t.requires_grad) for t in ins]
    ref = F.scaled_dot_product_attention(*ins[:3], attn_mask=mask, **kw)
    grad = torch.randn(ref.shape, dtype=ref.dtype)
    ref.backward(grad)
    eager_neuron.reset_stats()
    got = F.scaled_dot_product_attention(*nins[:3], attn_mask=nins[3] if mask is not None
                                         else None, **kw)
    got.backward(grad.to("neuron"))
    stats = eager_neuron.stats()
    torch.testing.assert_close(got.detach().cpu(), ref.detach(), rtol=RTOL, atol=ATOL)
    for t, n in zip(ins, nins):
        if t.requires_grad:
            torch.testing.assert_close(n.grad.cpu(), t.grad, rtol=RTOL, atol=ATOL)
    assert not stats["fallbacks"], stats["fallbacks"]
    return stats


def _qkv(B=2, H=4, Hk=4, L=5, S=7, E=8, Ev=6):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, H, L, E, generator=g), torch.randn(B, Hk, S, E, generator=g),
            torch.randn(B, Hk, S, Ev, generator=g))


@pytest.mark.parametrize("case", ["plain", "causal", "gqa", "bool_mask", "masked_row",
                                  "additive_grad", "additive_2d", "strided"])
def test_fused_matches_cpu_in_two_launches(case):
    q, k, v = _qkv(L=6, S=6) if case in ("causal", "gqa") else _qkv()
    mask, kw = None, {}
    if case == "causal":
        kw["is_causal"] = True
    elif case == "gqa":
        q, k, v = _qkv(H=4, Hk=2, L=6, S=6)
        kw.update(is_causal=True, enable_gqa=True)
    elif case == "bool_mask":
        mask = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(1)) > 0.3
        mask[..., 0] = True
    elif case == "masked_row":
        mask = torch.ones(2, 1, 5, 7, dtype=torch.bool)
        mask[0, 0, 2] = False           # a row with nothing to attend to: zeros, as the CPU
    elif case == "additive_grad":
        mask = torch.randn(1, 4, 5, 7).requires_grad_()   # broadcast over the batch
    elif case == "additive_2d":
        mask = torch.randn(5, 7).requires_grad_()
    elif case == "strided":
        q = torch.randn(2, 5, 4, 8).transpose(1, 2)       # (B, L, H, E) -> (B, H, L, E) view
    stats = _run(q, k, v, mask, **kw)
    assert stats["launches"] == 2, stats["launches"]   # one forward, one backward kernel
    assert not stats["decompositions"], stats["decompositions"]


def _launched(fn) -> list:
    """The kernel keys fn's launches have (launch.HOOKS)."""
    from eager_neuron import launch

    keys = []
    launch.HOOKS.append(hook := lambda event: keys.append(event["key"]))
    try:
        fn()
    finally:
        launch.HOOKS.remove(hook)
    return keys


def _math_path(keys) -> bool:
    """torch's math path: bmm, _safe_softmax's kernel, bmm; no fused attention kernel."""
    return any(k[:2] == ("norm", "softmax") and "safe" in k for k in keys) and \
        any(k[:2] == ("matmul", "bmm") for k in keys) and \
        not any(k[0] == "attention" for k in keys)


def test_float64_takes_the_math_path():
    q, k, v = (t.double() for t in _qkv())
    keys = _launched(lambda: _run(q, k, v))
    assert _math_path(keys), keys


def test_dropout_takes_the_math_path_on_device():
    q, k, v = (t.to("neuron") for t in _qkv())
    eager_neuron.reset_stats()
    out = []
    keys = _launched(lambda: out.append(F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)))
    stats = eager_neuron.stats()
    assert out[0].shape == (2, 4, 5, 6) and out[0].device.type == "neuron"
    assert not stats["fallbacks"], stats["fallbacks"]
    assert _math_path(keys), keys


def test_bfloat16():
    q, k, v = (t.bfloat16() for t in _qkv())
    qn, kn, vn = (t.to("neuron") for t in (q, k, v))
    eager_neuron.reset_stats()
    got = F.scaled_dot_product_attention(qn, kn, vn)
    assert not eager_neuron.stats()["fallbacks"]
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    torch.testing.assert_close(got.cpu().float(), ref, rtol=1e-2, atol=1e-2)


def test_adaptive_mode_matches_plain():
    q, k, v = _qkv()
    with eager_neuron.adaptive():
        stats = _run(q, k, v, is_causal=False)
    assert not stats["fallbacks"]


# ---------------------------------------------------------------------------------------------
# the inference fast path of nn.MultiheadAttention / nn.TransformerEncoderLayer (eval, no grad)
# ---------------------------------------------------------------------------------------------

def _pad():
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[1, 3:] = True
    return pad


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("masks", ["none", "padding", "causal"])
def test_encoder_layer_fast_path(norm_first, masks):
    import copy

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32,
                                             batch_first=True, norm_first=norm_first,
                                             activation="gelu").eval()
    n_layer = copy.deepcopy(layer).to("neuron")
    x = torch.randn(3, 5, 16)
    kw = {"none": {}, "padding": {"src_key_padding_mask": _pad()},
          "causal": {"src_mask": torch.nn.Transformer.generate_square_subsequent_mask(5)}}[masks]
    with torch.no_grad():
        ref = layer(x, **kw)
        eager_neuron.reset_stats()
        got = n_layer(x.to("neuron"), **{k: v.to("neuron") for k, v in kw.items()})
    stats = eager_neuron.stats()
    assert not stats["fallbacks"], stats["fallbacks"]   # aten::_transformer_encoder_layer_fwd
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kw", [{}, {"key_padding_mask": True}, {"need_weights": False},
                                {"average_attn_weights": False}])
def test_multihead_attention_fast_path(kw):
    import copy

    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()
    n_mha = copy.deepcopy(mha).to("neuron")
    x = torch.randn(3, 5, 16)
    kw = {k: (_pad() if k == "key_padding_mask" else v) for k, v in kw.items()}
    with torch.no_grad():
        ref = mha(x, x, x, **kw)
        eager_neuron.reset_stats()
        xn = x.to("neuron")
        got = n_mha(xn, xn, xn, **{k: (v.to("neuron") if torch.is_tensor(v) else v)
                                   for k, v in kw.items()})
    stats = eager_neuron.stats()
    assert not stats["fallbacks"], stats["fallbacks"]   # aten::_native_multi_head_attention
    torch.testing.assert_close(got[0].cpu(), ref[0], rtol=1e-4, atol=1e-5)
    if ref[1] is not None:
        torch.testing.assert_close(got[1].cpu(), ref[1], rtol=1e-4, atol=1e-5)
