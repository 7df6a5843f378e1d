"""Issue 14's hot ops of a training step: a repeat call takes the fast path (counters, never
wall time) and equals the CPU (exact, or a float64 reference with dtype-derived bounds).

Each op here once cost 5-40x its kernel's host time on every repeat (the funnel, a meta or
reference decomposition each call); see fastpath_capture.py for how a runner is learned.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import eager_neuron  # noqa: F401 -- registers the device
from eager_neuron import fastpath
from eager_neuron.stats import STATS

DEV = "neuron"


def _hits() -> int:
    return fastpath.STATS_FAST["hits"]


def _ulp_bound(ref64: torch.Tensor, dtype=torch.float32, k: float = 64.0) -> float:
    return k * torch.finfo(dtype).eps * max(1.0, float(ref64.abs().max()))


def _qkv(seed: int, requires_grad: bool = False):
    """q, k, v as GPT-2 makes them: interleaved views of one (B, T, 3C) projection."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(2, 8, 192, generator=g)
    dev = qkv.to(DEV).requires_grad_(requires_grad)
    cpu = qkv.double().requires_grad_(requires_grad)

    def heads(x):
        return [t.view(2, 8, 4, 16).transpose(1, 2) for t in x.split(64, 2)]
    return dev, cpu, heads


def test_attention_on_interleaved_qkv_views_replays_and_equals_float64():
    mask_cpu = torch.ones(2, 1, 8, 8, dtype=torch.bool).tril()
    mask = mask_cpu.to(DEV)
    fwd = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
    bwd = torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward.default
    for seed in range(4):
        dev, cpu, heads = _qkv(seed, requires_grad=True)
        before, ops0 = _hits(), STATS.ops
        out = F.scaled_dot_product_attention(*heads(dev), attn_mask=mask, scale=0.25)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(10 + seed))
        out.backward(g.to(DEV))
        hits = _hits() - before
        ref = F.scaled_dot_product_attention(*heads(cpu), attn_mask=mask_cpu, scale=0.25)
        ref.backward(g.double())
        assert (out.detach().cpu().double() - ref.detach()).abs().max() <= _ulp_bound(ref)
        assert (dev.grad.cpu().double() - cpu.grad).abs().max() <= _ulp_bound(cpu.grad)
        if seed >= 2:   # learned on the first calls: forward and backward replay
            assert fwd in fastpath.TABLES and bwd in fastpath.TABLES
            assert hits >= 2 and STATS.ops > ops0


def test_one_tensor_as_every_operand_is_never_confused():
    """q is k is v (and mm(m, m)): every array lies in two sources' spans, so nothing is
    learned from the ambiguous call, and new values are still right."""
    for seed in range(3):
        x = torch.randn(1, 2, 4, 8, generator=torch.Generator().manual_seed(seed))
        m = x[0, 0]
        xd, md = x.to(DEV), m.to(DEV)
        out = F.scaled_dot_product_attention(xd, xd, xd)
        ref = F.scaled_dot_product_attention(x.double(), x.double(), x.double())
        assert (out.cpu().double() - ref).abs().max() <= _ulp_bound(ref)
        mm = (md @ md.T).cpu().double()
        ref = m.double() @ m.double().T
        assert (mm - ref).abs().max() <= _ulp_bound(ref)
