"""The model families the seeds name on `neuron`: state space, MoE, vision-language, speech, UNet.

Mamba (selective state space, recurrent scan), Mixtral (top-2 mixture-of-experts routing),
CLIP (image + text towers, contrastive loss), Whisper (speech encoder-decoder over log-mel
features) and a small diffusion-style UNet written here with torch.nn (conv, group norm, SiLU,
down/up sampling, a sinusoidal timestep embedding, a self-attention block). Each is built from a
tiny config with random weights on the CPU (nothing is downloaded), deep-copied to `neuron`, and
per mode (plain eager, adaptive eager) must give: the forward of the CPU, the loss and parameters
of the CPU after one AdamW step, for decoders the CPU's greedy `generate()` tokens, and not one
CPU fallback (the fallback is set to raise, so a missing kernel fails with its op name).

Tolerances: float32 on both devices, judged against a float64 copy of the model on the CPU:
neuron must be within rtol 1e-4 / atol 1e-5 of float64 plus twice the CPU float32's own error,
element by element (never bit for bit: the CPU's vectorised kernels and ours sum in different
orders).
"""

from __future__ import annotations

import contextlib
import copy
import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import eager_neuron
from eager_neuron.config import config as neuron_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tiny configs only: never reach the hub
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

RTOL, ATOL = 1e-4, 1e-5
VOCAB, BATCH, SEQ = 61, 2, 6


# ---------------------------------------------------------------------------------------------
# a diffusion-style UNet from torch.nn
# ---------------------------------------------------------------------------------------------

def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of diffusion timesteps, (B,) -> (B, dim).

    >>> timestep_embedding(torch.tensor([0, 10]), 8).shape
    torch.Size([2, 8])
    """
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ResBlock(nn.Module):
    def __init__(self, cin, cout, tdim, groups=4):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(groups, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.temb = nn.Linear(tdim, cout)
        self.norm2, self.conv2 = nn.GroupNorm(groups, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.drop = nn.Dropout(0.1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb(F.silu(temb))[:, :, None, None]
        h = self.conv2(self.drop(F.silu(self.norm2(h))))
        return self.skip(x) + h


class AttnBlock(nn.Module):
    def __init__(self, ch, heads=2, groups=4):
        super().__init__()
        self.norm, self.heads = nn.GroupNorm(groups, ch), heads
        self.qkv, self.proj = nn.Conv2d(ch, 3 * ch, 1), nn.Conv2d(ch, ch, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, self.heads, c // self.heads, h * w).unbind(1)
        out = F.scaled_dot_product_attention(q.transpose(-1, -2), k.transpose(-1, -2),
                                             v.transpose(-1, -2))
        return x + self.proj(out.transpose(-1, -2).reshape(b, c, h, w))


class TinyUNet(nn.Module):
    """Predicts the noise of a noised image: 2 resolutions, attention at the bottom.

    >>> TinyUNet()(torch.randn(1, 3, 8, 8), torch.tensor([5])).shape
    torch.Size([1, 3, 8, 8])
    """

    def __init__(self, ch=16, tdim=32):
        super().__init__()
        self.tdim = tdim
        self.tmlp = nn.Sequential(nn.Linear(tdim, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.inp = nn.Conv2d(3, ch, 3, padding=1)
        self.down1 = ResBlock(ch, ch, tdim)
        self.downsample = nn.Conv2d(ch, ch, 3, stride=2, padding=1)
        self.mid1, self.mid_attn = ResBlock(ch, 2 * ch, tdim), AttnBlock(2 * ch)
        self.pool_skip = nn.AvgPool2d(2)  # a pooled shortcut alongside the strided conv
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.up1 = ResBlock(3 * ch, ch, tdim)
        self.out = nn.Sequential(nn.GroupNorm(4, ch), nn.SiLU(), nn.Conv2d(ch, 3, 3, padding=1))

    def forward(self, x, t):
        temb = self.tmlp(timestep_embedding(t, self.tdim).to(x.dtype))
        h0 = self.down1(self.inp(x), temb)
        h = self.downsample(h0) + self.pool_skip(h0)
        h = self.mid_attn(self.mid1(h, temb))
        h = self.up1(torch.cat([self.up(h), h0], dim=1), temb)
        return self.out(h)


class UNetDenoiser(nn.Module):
    """The DDPM training objective around TinyUNet: `.loss` and `.logits` like an HF model."""

    def __init__(self):
        super().__init__()
        self.unet = TinyUNet()
        betas = torch.linspace(1e-4, 0.02, 50)
        self.register_buffer("alphas_bar", torch.cumprod(1 - betas, 0))

    def forward(self, images, timesteps, noise):
        a = self.alphas_bar[timesteps][:, None, None, None]
        pred = self.unet(a.sqrt() * images + (1 - a).sqrt() * noise, timesteps)
        return transformers.modeling_outputs.ModelOutput(loss=F.mse_loss(pred, noise), logits=pred)


# ---------------------------------------------------------------------------------------------
# tiny models (CPU, fixed seed) and inputs
# ---------------------------------------------------------------------------------------------

def _mamba():
    return transformers.MambaForCausalLM(transformers.MambaConfig(
        vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
        conv_kernel=4, time_step_rank=4, use_mambapy=False,
        bos_token_id=0, eos_token_id=1, pad_token_id=1))


def _mixtral():
    # NOTE: 4 experts, top-2 routing, and 4 query heads over 2 key/value heads
    return transformers.MixtralForCausalLM(transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=32, router_aux_loss_coef=0.02,
        output_router_logits=True, bos_token_id=0, eos_token_id=1, pad_token_id=1))


def _clip():
    return transformers.CLIPModel(transformers.CLIPConfig(
        text_config={"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 4,
                     "max_position_embeddings": 16, "bos_token_id": 0, "eos_token_id": 1,
                     "pad_token_id": 1},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "image_size": 16, "patch_size": 8},
        projection_dim=16))


def _whisper():
    return transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=8, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_source_positions=8, max_target_positions=16,
        decoder_start_token_id=0, bos_token_id=0, eos_token_id=1, pad_token_id=1,
        suppress_tokens=None, begin_suppress_tokens=None, dropout=0.1))


def _unet():
    return UNetDenoiser()


def _ids(g, n=SEQ):
    return torch.randint(2, VOCAB, (BATCH, n), generator=g)


def _lm_inputs(g):
    ids = _ids(g)
    return {"input_ids": ids, "labels": ids}


def _clip_inputs(g):
    # NOTE: 5 text tokens = 4 patches + the class token: both towers run the same shapes, so
    # adaptive eager compiles one set of fused kernels for the two
    ids = _ids(g, 5)
    ids[:, -1] = 1  # eos: CLIP pools the text at the eos position
    return {"input_ids": ids, "pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g),
            "return_loss": True}


def _whisper_inputs(g):
    # 2 * max_source_positions frames: the encoder's stride-2 conv halves them; 8 labels, as
    # many as encoder positions: encoder and decoder layers share their kernels' shapes
    return {"input_features": torch.randn(BATCH, 8, 16, generator=g), "labels": _ids(g, 8)}


def _unet_inputs(g):
    return {"images": torch.randn(BATCH, 3, 8, 8, generator=g),
            "timesteps": torch.randint(0, 50, (BATCH,), generator=g),
            "noise": torch.randn(BATCH, 3, 8, 8, generator=g)}


def _logits(out):
    return out.logits_per_image if hasattr(out, "logits_per_image") else out.logits


MODELS = {
    "mamba": (_mamba, _lm_inputs),
    "mixtral": (_mixtral, _lm_inputs),
    "clip": (_clip, _clip_inputs),
    "whisper": (_whisper, _whisper_inputs),
    "unet": (_unet, _unet_inputs),
}
DECODERS = ("mamba", "mixtral", "whisper")


def build(name: str, seed: int = 0):
    """The CPU model (same weights for a seed) and its batch of inputs.

    >>> model, batch = build("unet"); sorted(batch)
    ['images', 'noise', 'timesteps']
    """
    make_model, make_inputs = MODELS[name]
    torch.manual_seed(seed)
    model = make_model()
    return model, make_inputs(torch.Generator().manual_seed(seed + 1))


def to_device(inputs: dict, device: str) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def forward(model, inputs, device):
    """The model's logits (CLIP: image-text similarities), in eval mode, without grad."""
    with torch.no_grad():
        return _logits(model.eval()(**to_device(inputs, device)))


def train_step(model, inputs, device, seed=0, eps=1e-4):
    """One AdamW step on `device` (model moved there); returns (loss, model).

    NOTE: eps=1e-4 as in test_hf_models: a near-zero gradient is rounding noise on either device
    and AdamW's 1/(sqrt(v)+eps) would turn it into lr-sized steps of random sign.
    """
    model = model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, eps=eps)
    torch.manual_seed(seed)  # dropout masks come from the shared CPU generator
    loss = model(**to_device(inputs, device)).loss
    loss.backward()
    opt.step()
    return loss.detach(), model


def generate(model, inputs, device):
    """Greedy decoding of 5 new tokens from a prompt (Whisper: from its audio features)."""
    kwargs = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 1}
    model = model.eval()
    if "input_features" in inputs:
        return model.generate(inputs["input_features"].to(device), **kwargs)
    prompt = inputs["input_ids"][:, :3].to(device)
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs)


# ---------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------

@pytest.fixture(autouse=True, scope="module")
def _one_cpu_thread():
    """The CPU reference on one thread (tiny ops on OpenMP's spinning threads crawl when the
    machine is shared)."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@contextlib.contextmanager
def _fallback_raises():
    prev = neuron_config.fallback
    neuron_config.fallback = "error"
    try:
        yield
    finally:
        neuron_config.fallback = prev


def _close(got, ref, ref64, what):
    """got (neuron) is the CPU's float32 result up to rounding: within rtol/atol of the float64
    reference plus twice the CPU's own distance from it. NOTE: the slack matters after an AdamW
    step, which divides a gradient by sqrt(v) + eps: a weight whose gradient cancels to ~1e-4
    has its float32 rounding noise (either device's) magnified ~100x."""
    assert got.device.type == "neuron", what
    got, ref64 = got.detach().cpu().double(), ref64.detach().double()
    slack = 2 * (ref.detach().double() - ref64).abs() + ATOL + RTOL * ref64.abs()
    bad = (got - ref64).abs() > slack
    assert not bad.any(), (
        f"{what}: {int(bad.sum())}/{bad.numel()} elements off, worst |neuron - float64| "
        f"{(got - ref64).abs().max():.3g} where the CPU's float32 is "
        f"{(ref.double() - ref64).abs().max():.3g} off")


def check_family(name, model, inputs, ctx, generate_too=True):
    """Assert forward, one AdamW step and (decoders) greedy generate() on neuron under `ctx`
    (plain: nullcontext, or eager_neuron.adaptive) equal the CPU's (see _close)."""
    model64 = copy.deepcopy(model).double()
    if name == "mixtral":  # the CPU's _grouped_mm has no float64: the per-expert loop instead
        model64.set_experts_implementation("eager")
    inputs64 = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
                for k, v in inputs.items()}
    ref = forward(model, inputs, "cpu")
    with ctx():
        got = forward(copy.deepcopy(model).to("neuron"), inputs, "neuron")
    _close(got, ref, forward(model64, inputs64, "cpu"), f"{name} forward")

    c_loss, c_model = train_step(copy.deepcopy(model), inputs, "cpu")
    r_loss, r_model = train_step(model64, inputs64, "cpu")
    with ctx():
        n_loss, n_model = train_step(copy.deepcopy(model), inputs, "neuron")
    _close(n_loss, c_loss, r_loss, f"{name} loss")
    c_state, n_state, r_state = c_model.state_dict(), n_model.state_dict(), r_model.state_dict()
    assert n_state.keys() == c_state.keys()
    for key, ref in c_state.items():
        _close(n_state[key], ref, r_state[key], f"{name} {key} after one AdamW step")

    if generate_too and name in DECODERS:
        ref = generate(model, inputs, "cpu")
        with ctx():
            got = generate(copy.deepcopy(model).to("neuron"), inputs, "neuron")
        assert got.device.type == "neuron"
        assert got.cpu().tolist() == ref.tolist(), f"{name} generate"


@pytest.mark.models
@pytest.mark.parametrize("mode", ["plain", "adaptive"])
@pytest.mark.parametrize("name", list(MODELS))
def test_family_matches_cpu(name, mode, stats_delta):
    """Forward, one AdamW step and (decoders) greedy generate() equal the CPU; no fallback."""
    model, inputs = build(name)
    eager_neuron.reset_stats()
    with _fallback_raises():
        check_family(name, model, inputs,
                     contextlib.nullcontext if mode == "plain" else eager_neuron.adaptive)
    stats = stats_delta()
    assert stats["launches"] > 0
    assert not stats["fallbacks"], f"{name}: CPU fallbacks {stats['fallbacks']}"


# ---------------------------------------------------------------------------------------------
# the kernels MoE routing needed (transformers' grouped experts): _grouped_mm, integer histc
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["2d3d", "2d2d", "3d2d", "3d3d"])
def test_grouped_mm_matches_float64_loop(layout, strict_fallback):
    g = torch.Generator().manual_seed(0)
    ends = [3, 3, 7]   # an empty group, and rows/columns past the last end (zero here)
    offs = torch.tensor(ends, dtype=torch.int32)
    shapes = {"2d3d": ((8, 4), (3, 4, 5)), "2d2d": ((5, 8), (8, 6)),
              "3d2d": ((3, 4, 5), (5, 8)), "3d3d": ((3, 4, 5), (3, 5, 2))}[layout]
    x, w = (torch.randn(s, generator=g, dtype=torch.float64) for s in shapes)
    offs = None if layout == "3d3d" else offs

    def reference(x, w):
        if layout == "3d3d":
            return x @ w
        parts, start = [], 0
        for i, end in enumerate(ends):
            if layout == "2d3d":
                parts.append(x[start:end] @ w[i])
            elif layout == "2d2d":
                parts.append(x[:, start:end] @ w[start:end])
            else:
                parts.append(x[i] @ w[:, start:end])
            start = end
        if layout == "2d3d":
            return torch.cat(parts + [torch.zeros(8 - ends[-1], w.shape[2], dtype=x.dtype)])
        if layout == "2d2d":
            return torch.stack(parts)
        return torch.cat(parts + [torch.zeros(x.shape[1], 8 - ends[-1], dtype=x.dtype)], dim=1)

    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref = reference(xr, wr)
    grad = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    ref.backward(grad)
    xn = x.float().to("neuron").requires_grad_()
    wn = w.float().to("neuron").requires_grad_()
    got = torch._grouped_mm(xn, wn, None if offs is None else offs.to("neuron"))
    tol = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(got.cpu().double(), ref.detach(), **tol)
    if layout in ("2d3d", "3d3d"):   # the layouts torch differentiates (2d2d/3d2d: its backward)
        got.backward(grad.float().to("neuron"))
        torch.testing.assert_close(wn.grad.cpu().double(), wr.grad, **tol)
        torch.testing.assert_close(xn.grad.cpu().double(), xr.grad, **tol)


@pytest.mark.parametrize("layout", ["2d3d", "2d2d", "3d2d"])
def test_grouped_mm_is_one_launch_that_reads_each_calls_routing(layout):
    """The group ends are read by the kernel, not the host: one launch per call, learned by
    the fast path, and a repeat with other routing (MoE: every step) sees its own ends."""
    from eager_neuron import fastpath
    from eager_neuron.kernels.matmul import mkl_symbols

    if not mkl_symbols():
        pytest.skip("the one-launch grouped kernel needs MKL's gemm (this torch has none)")
    g = torch.Generator().manual_seed(1)
    shapes = {"2d3d": ((12, 8), (4, 8, 6)), "2d2d": ((5, 12), (12, 6)),
              "3d2d": ((4, 5, 8), (8, 12))}[layout]
    x, w = (torch.randn(s, generator=g) for s in shapes)
    xn, wn = x.to("neuron"), w.to("neuron")
    hits = []
    for ends in ([3, 3, 7, 12], [0, 5, 9, 10], [12, 12, 12, 12], [2, 4, 6, 8]):
        offs = torch.tensor(ends, dtype=torch.int32)
        eager_neuron.reset_stats()
        before = fastpath.STATS_FAST["hits"]
        got = torch._grouped_mm(xn, wn, offs.to("neuron")).cpu().double()
        hits.append(fastpath.STATS_FAST["hits"] - before)
        assert eager_neuron.stats()["launches"] == 1
        xd, wd, start = x.double(), w.double(), 0
        want = torch.zeros(got.shape, dtype=torch.float64)
        for i, end in enumerate(ends):
            if layout == "2d3d":
                want[start:end] = xd[start:end] @ wd[i]
            elif layout == "2d2d":
                want[i] = xd[:, start:end] @ wd[start:end]
            else:
                want[:, start:end] = xd[i] @ wd[:, start:end]
            start = max(start, end)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert hits[1:] == [1, 1, 1]
    if layout != "2d2d":   # more ends than groups: refused, never read past the operand
        with pytest.raises(RuntimeError):
            torch._grouped_mm(xn, wn, torch.tensor([1, 2, 3, 4, 5], dtype=torch.int32,
                                                   device="neuron"))


def test_integer_histc_counts_like_float_histc(strict_fallback):
    x = torch.tensor([0, 0, 1, 3, 3, 3, 2, 7, -1, 5], dtype=torch.int32)
    for kwargs in ({"bins": 4, "min": 0, "max": 3}, {"bins": 3}, {"bins": 5, "min": 1, "max": 6}):
        got = torch.histc(x.to("neuron"), **kwargs)
        assert got.dtype == torch.int32
        assert got.cpu().tolist() == torch.histc(x.float(), **kwargs).int().tolist(), kwargs
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(x.to("neuron"), bins=2, min=3, max=1)
