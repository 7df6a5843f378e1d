"""FlexAttention on neuron: `flex_attention` with score_mod and block_mask (causal, sliding
window, document masking), eager and compiled by the neuron backend, forward and backward,
against a float64 reference written out with plain ops (scores, mask, softmax, PV)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import eager_neuron  # noqa: F401

N = "neuron"
B, H, S, D = 1, 2, 16, 8
DOC = torch.tensor([0] * 5 + [1] * 7 + [2] * 4)


def causal(b, h, qi, ki):
    return qi >= ki


def sliding(b, h, qi, ki):
    return (qi >= ki) & (qi - ki <= 4)


def document(b, h, qi, ki):
    return DOC_DEV[qi] == DOC_DEV[ki]


def rel_bias(score, b, h, qi, ki):
    return score + (qi - ki) * 0.125


DOC_DEV = DOC.to(N)
_MASKS = {"causal": causal, "sliding": sliding, "document": document}


def _reference(q, k, v, mask_name, score_mod):
    qi = torch.arange(S).view(S, 1)
    ki = torch.arange(S).view(1, S)
    s = (q @ k.transpose(-1, -2)) / D ** 0.5
    if score_mod is not None:
        s = s + (qi - ki) * 0.125
    allowed = {"causal": qi >= ki, "sliding": (qi >= ki) & (qi - ki <= 4),
               "document": DOC.view(S, 1) == DOC.view(1, S)}[mask_name]
    return torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ v


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("mask_name,score_mod", [("causal", rel_bias), ("sliding", None),
                                                 ("document", None)])
def test_flex_attention_forward_and_backward(mode, mask_name, score_mod):
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(2)
    q0, k0, v0 = (torch.randn(B, H, S, D, generator=g) for _ in range(3))
    qn, kn, vn = (t.to(N).requires_grad_() for t in (q0, k0, v0))
    qr, kr, vr = (t.double().requires_grad_() for t in (q0, k0, v0))
    bm = create_block_mask(_MASKS[mask_name], B, H, S, S, device=N)
    fa = flex_attention if mode == "eager" else torch.compile(flex_attention, backend="neuron")
    out = fa(qn, kn, vn, score_mod=score_mod, block_mask=bm)
    ref = _reference(qr, kr, vr, mask_name, score_mod)
    gout = torch.randn(out.shape, generator=g)
    out.backward(gout.to(N))
    ref.backward(gout.double())
    tol = 64 * torch.finfo(torch.float32).eps
    for a, b in ((out, ref), (qn.grad, qr.grad), (kn.grad, kr.grad), (vn.grad, vr.grad)):
        a = a.detach().cpu().double()
        assert ((a - b.detach()).abs() <= tol * (1 + b.detach().abs()) * S).all(), \
            f"max error {(a - b.detach()).abs().max().item()}"
