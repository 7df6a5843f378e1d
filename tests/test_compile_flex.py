"""FlexAttention on neuron: `flex_attention` with score_mod and block_mask (causal, sliding
window, document masking, relative bias, ALiBi, tanh soft-capping, GQA), eager and compiled by
the neuron backend, forward and backward, against a float64 reference written out with plain
ops (scores, mask, softmax, PV). The fused kernels (compile/flex.py) are asserted on their
counters: one forward and one backward launch per call, no dense fallback; what they refuse
runs dense, counted, and is still right."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import eager_neuron  # noqa: F401
from eager_neuron.compile import flex

N = "neuron"
B, H, S, D = 2, 4, 40, 16          # S is not a multiple of the 16-wide blocks
BLOCK = 16
DOC = torch.tensor([[0] * 11 + [1] * 17 + [2] * 12, [0] * 25 + [1] * 15])
DOC_DEV = DOC.to(N)


def causal(b, h, qi, ki):
    return qi >= ki


def sliding(b, h, qi, ki):
    return (qi >= ki) & (qi - ki <= 9)


def document(b, h, qi, ki):
    return (DOC_DEV[b, qi] == DOC_DEV[b, ki]) & (qi >= ki)


def unrenderable_mask(b, h, qi, ki):
    return (qi >= ki) & (torch.fmod(qi + ki, 3) != 1)   # fmod: no rendering


def rel_bias(score, b, h, qi, ki):
    return score + (qi - ki) * 0.125


def alibi(score, b, h, qi, ki):
    return score - (h + 1) * 0.25 * torch.abs(qi - ki)


def softcap(score, b, h, qi, ki):
    return 2.0 * torch.tanh(score / 2.0)


def unrenderable(score, b, h, qi, ki):
    return score + torch.atan(score)      # atan: no rendering, the dense path runs


_MASKS = {"causal": causal, "sliding": sliding, "document": document, "none": None,
          "unrenderable": unrenderable_mask}
_MODS = {"rel_bias": rel_bias, "alibi": alibi, "softcap": softcap, "none": None,
         "unrenderable": unrenderable}


def _reference(q, k, v, mask_name, mod_name):
    """float64 attention with plain ops; q (B, H, S, D), k and v (B, Hk, S, D)."""
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    qi = torch.arange(S).view(1, 1, S, 1)
    ki = torch.arange(S).view(1, 1, 1, S)
    hh = torch.arange(q.shape[1]).view(1, -1, 1, 1)
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if mod_name == "rel_bias":
        s = s + (qi - ki) * 0.125
    elif mod_name == "alibi":
        s = s - (hh + 1) * 0.25 * (qi - ki).abs()
    elif mod_name == "softcap":
        s = 2.0 * torch.tanh(s / 2.0)
    elif mod_name == "unrenderable":
        s = s + torch.atan(s)
    allowed = {"causal": qi >= ki, "sliding": (qi >= ki) & (qi - ki <= 9),
               "document": (DOC.view(B, 1, S, 1) == DOC.view(B, 1, 1, S)) & (qi >= ki),
               "none": torch.ones(1, 1, S, S, dtype=torch.bool),
               "unrenderable": (qi >= ki) & (torch.fmod(qi + ki, 3) != 1)}[mask_name]
    return torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ v


def _bound(ref: torch.Tensor, dtype) -> torch.Tensor:
    # a sum of S products of D-term dot products, each rounded in `dtype`: ~ (S + D) roundings
    # of values of the reference's size (softmax weights <= 1, inputs ~ N(0, 1))
    return 4 * torch.finfo(dtype).eps * (S + D) * (1 + ref.abs())


def _run(mode, mask_name, mod_name, dtype=torch.float32, hk=H, bk=B):
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(2)
    q0 = torch.randn(B, H, S, D, generator=g, dtype=torch.float64)
    k0, v0 = (torch.randn(bk, hk, S, D, generator=g, dtype=torch.float64) for _ in range(2))
    qn, kn, vn = (t.to(dtype).to(N).requires_grad_() for t in (q0, k0, v0))
    qr, kr, vr = (t.to(dtype).double().requires_grad_() for t in (q0, k0, v0))
    mask = _MASKS[mask_name]
    bm = None if mask is None else create_block_mask(mask, B, None, S, S, device=N,
                                                     BLOCK_SIZE=BLOCK)
    fa = flex_attention if mode == "eager" else torch.compile(flex_attention, backend="neuron")
    flex.FSTATS.reset()
    out = fa(qn, kn, vn, score_mod=_MODS[mod_name], block_mask=bm, enable_gqa=hk != H)
    ref = _reference(qr, kr, vr, mask_name, mod_name)
    gout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    out.backward(gout.to(dtype).to(N))
    ref.backward(gout.to(dtype).double())
    for name, a, b in (("out", out, ref), ("dq", qn.grad, qr.grad), ("dk", kn.grad, kr.grad),
                       ("dv", vn.grad, vr.grad)):
        a, b = a.detach().cpu().double(), b.detach()
        assert a.shape == b.shape, name
        err = (a - b).abs()
        assert (err <= _bound(b, dtype)).all(), f"{name}: max error {err.max().item()}"
    return flex.stats()


_FUSED = {"fused_forward": 1, "fused_backward": 1, "dense_forward": 0, "dense_backward": 0,
          "fallbacks": {}}


# (eager softcap: the joint graph is traced on the CPU, compile/flex.py trace_joint_on_cpu;
# a neuron trace aborted inside autograd's engine)
@pytest.mark.parametrize("mode,mask_name,mod_name", [
    (mode, mask, mod) for mode in ("eager", "compiled")
    for mask, mod in (("causal", "rel_bias"), ("sliding", "none"), ("document", "alibi"),
                      ("none", "rel_bias"), ("causal", "softcap"))] + [
    ("compiled", "none", "softcap")])
def test_fused_forward_and_backward(mode, mask_name, mod_name):
    assert _run(mode, mask_name, mod_name) == _FUSED


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_gqa_and_float64(mode):
    # 4 query heads over 2 key/value heads; float64 end to end
    assert _run(mode, "sliding", "alibi", torch.float64, hk=2) == _FUSED


def test_kv_batch_broadcast():
    # one key/value batch for two query batches: dk, dv sum over the query batch
    assert _run("compiled", "causal", "rel_bias", hk=1, bk=1) == _FUSED


@pytest.mark.parametrize("mode,mask_name,mod_name,op", [
    ("eager", "unrenderable", "rel_bias", "fmod"), ("compiled", "unrenderable", "none", "fmod"),
    ("eager", "causal", "unrenderable", "atan"), ("compiled", "causal", "unrenderable", "atan")])
def test_unrenderable_subgraph_runs_dense(mode, mask_name, mod_name, op):
    st = _run(mode, mask_name, mod_name)
    assert st["fused_forward"] == st["fused_backward"] == 0
    assert st["dense_forward"] == st["dense_backward"] == 1
    reasons = sorted(st["fallbacks"])     # (an aten overload carries its name: fmod.Scalar)
    assert len(reasons) == 2 and all(st["fallbacks"][r] == 1 for r in reasons), reasons
    assert reasons[0].startswith(f"backward: score_mod/mask_mod op {op}"), reasons
    assert reasons[1].startswith(f"forward: score_mod/mask_mod op {op}"), reasons


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_captured_buffer_gradient_runs_dense(mode):
    # a learned bias table read by the score_mod: its gradient needs a scatter, the dense path
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(3)
    q0, k0, v0 = (torch.randn(1, 2, S, D, generator=g, dtype=torch.float64) for _ in range(3))
    bias0 = torch.randn(2 * S - 1, generator=g, dtype=torch.float64)
    bias = bias0.float().to(N).requires_grad_()

    def table(score, b, h, qi, ki):
        return score + bias[qi - ki + S - 1]

    qn, kn, vn = (t.float().to(N).requires_grad_() for t in (q0, k0, v0))
    bm = create_block_mask(causal, 1, None, S, S, device=N, BLOCK_SIZE=BLOCK)
    flex.FSTATS.reset()
    fa = flex_attention if mode == "eager" else torch.compile(flex_attention, backend="neuron")
    out = fa(qn, kn, vn, score_mod=table, block_mask=bm)
    out.sum().backward()
    st = flex.stats()
    assert st["fused_forward"] == 1 and st["dense_backward"] == 1, st
    assert st["fallbacks"] == {"backward: score_mod buffer needs a gradient": 1}
    br = bias0.float().double().requires_grad_()
    qr, kr, vr = (t.float().double().requires_grad_() for t in (q0, k0, v0))
    qi, ki = torch.arange(S).view(S, 1), torch.arange(S).view(1, S)
    s = qr @ kr.transpose(-1, -2) / D ** 0.5 + br[qi - ki + S - 1]
    ref = torch.softmax(s.masked_fill(qi < ki, float("-inf")), -1) @ vr
    ref.sum().backward()
    for a, b in ((out, ref), (qn.grad, qr.grad), (bias.grad, br.grad)):
        a, b = a.detach().cpu().double(), b.detach()
        assert ((a - b).abs() <= _bound(b, torch.float32)).all()


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_strided_inputs_and_expanded_grad(mode):
    # q, k, v as (B, S, H, D) projections seen through transpose(1, 2), and a sum's gradient
    # (grad_out broadcast with stride 0): the kernel reads any strides
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(4)
    x0 = [torch.randn(B, S, H, D, generator=g, dtype=torch.float64) for _ in range(3)]
    xn = [t.float().to(N).requires_grad_() for t in x0]
    xr = [t.float().double().requires_grad_() for t in x0]
    bm = create_block_mask(sliding, B, None, S, S, device=N, BLOCK_SIZE=BLOCK)
    fa = flex_attention if mode == "eager" else torch.compile(flex_attention, backend="neuron")
    flex.FSTATS.reset()
    out = fa(*(t.transpose(1, 2) for t in xn), score_mod=rel_bias, block_mask=bm)
    ref = _reference(*(t.transpose(1, 2) for t in xr), "sliding", "rel_bias")
    (out * out).sum().backward()
    (ref * ref).sum().backward()
    assert flex.stats() == _FUSED
    for a, b in [(out, ref)] + [(t.grad, r.grad) for t, r in zip(xn, xr)]:
        a, b = a.detach().cpu().double(), b.detach()
        assert ((a - b).abs() <= _bound(b, torch.float32)).all(), (a - b).abs().max().item()


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_logsumexp_and_its_gradient(mode):
    # return_lse=True: the logsumexp (the HOP's is in log2 units, the API's natural) and a loss
    # that reads it, so the backward gets a logsumexp gradient
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(5)
    x0 = [torch.randn(B, H, S, D, generator=g, dtype=torch.float64) for _ in range(3)]
    xn = [t.float().to(N).requires_grad_() for t in x0]
    xr = [t.float().double().requires_grad_() for t in x0]
    bm = create_block_mask(document, B, None, S, S, device=N, BLOCK_SIZE=BLOCK)
    fa = flex_attention if mode == "eager" else torch.compile(flex_attention, backend="neuron")
    flex.FSTATS.reset()
    out, lse = fa(*xn, score_mod=rel_bias, block_mask=bm, return_lse=True)
    qi, ki = torch.arange(S).view(1, 1, S, 1), torch.arange(S).view(1, 1, 1, S)
    s = xr[0] @ xr[1].transpose(-1, -2) / D ** 0.5 + (qi - ki) * 0.125
    allowed = (DOC.view(B, 1, S, 1) == DOC.view(B, 1, 1, S)) & (qi >= ki)
    s = s.masked_fill(~allowed, float("-inf"))
    ref, ref_lse = torch.softmax(s, -1) @ xr[2], torch.logsumexp(s, -1)
    w = torch.randn(lse.shape, generator=g, dtype=torch.float64)
    ((out * out).sum() + (lse * w.float().to(N)).sum()).backward()
    ((ref * ref).sum() + (ref_lse * w.float().double()).sum()).backward()
    assert flex.stats() == _FUSED
    for a, b in [(out, ref), (lse, ref_lse)] + [(t.grad, r.grad) for t, r in zip(xn, xr)]:
        a, b = a.detach().cpu().double(), b.detach()
        assert ((a - b).abs() <= _bound(b, torch.float32)).all(), (a - b).abs().max().item()


def test_without_mkl_gemm(monkeypatch):
    # a torch that exports no MKL gemm: the tiles' products are Numba's np.dot
    monkeypatch.setattr(flex.km, "mkl_symbols", lambda: {})
    assert _run("compiled", "document", "rel_bias", hk=2) == _FUSED


def test_fewer_queries_than_keys():
    # 24 queries over 40 keys (the last 24 positions of a causal prefix): L != S, and the last
    # query block is partial in both directions
    torch._dynamo.reset()
    L = 24
    g = torch.Generator().manual_seed(6)
    q0 = torch.randn(1, H, L, D, generator=g, dtype=torch.float64)
    k0, v0 = (torch.randn(1, H, S, D, generator=g, dtype=torch.float64) for _ in range(2))
    xn = [t.float().to(N).requires_grad_() for t in (q0, k0, v0)]
    xr = [t.float().double().requires_grad_() for t in (q0, k0, v0)]

    def offset_causal(b, h, qi, ki):
        return qi + (S - L) >= ki

    bm = create_block_mask(offset_causal, 1, None, L, S, device=N, BLOCK_SIZE=BLOCK)
    flex.FSTATS.reset()
    out = torch.compile(flex_attention, backend="neuron")(*xn, score_mod=rel_bias,
                                                          block_mask=bm)
    qi, ki = torch.arange(L).view(L, 1), torch.arange(S).view(1, S)
    s = xr[0] @ xr[1].transpose(-1, -2) / D ** 0.5 + (qi - ki) * 0.125
    ref = torch.softmax(s.masked_fill(qi + (S - L) < ki, float("-inf")), -1) @ xr[2]
    w = torch.randn(out.shape, generator=g, dtype=torch.float64)
    (out * w.float().to(N)).sum().backward()
    (ref * w.float().double()).sum().backward()
    assert flex.stats() == _FUSED
    for a, b in [(out, ref)] + [(t.grad, r.grad) for t, r in zip(xn, xr)]:
        a, b = a.detach().cpu().double(), b.detach()
        assert ((a - b).abs() <= _bound(b, torch.float32)).all(), (a - b).abs().max().item()
