"""nn.TransformerEncoder's nested-tensor path on neuron, without nested tensors.

In eval mode, with no grad and a `src_key_padding_mask`, TransformerEncoder (whose
`enable_nested_tensor=True` is the default) packs its input into a nested tensor: that path is
taken for the PrivateUse1 device as for CUDA, and a neuron device holds no nested tensors, so
inference with a stock encoder and a padding mask failed in `_nested_tensor_from_mask`.

What the nested path computes is, at each unpadded position, the layers' output with the padded
keys left out of attention, and zero at every padded position (`to_padded_tensor(0.0)`), then
the final norm. The layers compute the first from the dense input and the same mask, so the
encoder's forward is wrapped: when it reaches `_nested_tensor_from_mask` with a neuron tensor
(which happens before any layer runs), it runs the layers on the dense input with the mask,
zeroes the padded positions and applies the norm. Every other call is torch's, unchanged.

>>> import torch, eager_neuron
>>> layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
>>> enc = torch.nn.TransformerEncoder(layer, 1).eval().to("neuron")
>>> pad = torch.tensor([[False, False, True]], device="neuron")
>>> with torch.no_grad():
...     out = enc(torch.ones(1, 3, 8, device="neuron"), src_key_padding_mask=pad)
>>> out[0, 2].abs().sum().item()
0.0
"""

from __future__ import annotations

import threading

import torch
from torch.nn.modules import transformer as _tr

_TORCH_FORWARD = torch.nn.TransformerEncoder.forward
_TORCH_FROM_MASK = torch._nested_tensor_from_mask
_inside = threading.local()


class _NestedWanted(Exception):
    """The encoder chose its nested path for a neuron input (raised before any layer ran)."""


def _from_mask(t, mask, mask_check=True):
    if getattr(_inside, "encoder", False) and t.device.type == "neuron":
        raise _NestedWanted
    return _TORCH_FROM_MASK(t, mask, mask_check=mask_check)


def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
    if src.device.type != "neuron" or src_key_padding_mask is None or \
            self.layers[0].training or torch.compiler.is_compiling():
        # (the nested path is never taken in training mode nor while compiling)
        return _TORCH_FORWARD(self, src, mask, src_key_padding_mask, is_causal)
    _inside.encoder = True
    try:
        return _TORCH_FORWARD(self, src, mask, src_key_padding_mask, is_causal)
    except _NestedWanted:
        pass
    finally:
        _inside.encoder = False
    # the nested path, dense: `mask` is None here (the nested path refuses both masks)
    batch_first = self.layers[0].self_attn.batch_first
    pad = torch.nn.functional._canonical_mask(
        mask=src_key_padding_mask, mask_name="src_key_padding_mask", other_type=None,
        other_name="", target_type=src.dtype)
    causal = _tr._detect_is_causal_mask(None, is_causal, _tr._get_seq_len(src, batch_first))
    output = src
    for mod in self.layers:
        output = mod(output, src_mask=None, is_causal=causal, src_key_padding_mask=pad)
    padded = src_key_padding_mask if batch_first else src_key_padding_mask.t()
    if padded.dtype != torch.bool:   # a float mask: -inf (or any nonzero) marks padding
        padded = padded != 0
    output = output.masked_fill(padded.unsqueeze(-1), 0.0)
    if self.norm is not None:
        output = self.norm(output)
    return output


forward.__doc__ = _TORCH_FORWARD.__doc__
forward.__wrapped__ = _TORCH_FORWARD


def _strided_nested(op, *args, **kwargs):
    """Every op on a strided nested tensor on neuron (the dispatcher's fallback for the
    NestedTensorPrivateUse1 key): PyTorch makes one (`torch.nested.nested_tensor(ts,
    device="neuron")`: its CPU form moved over), but its kernels are CPU/CUDA ones. Raised as
    the dispatcher's own NotImplementedError, naming the layout that works here."""
    from .errors import where

    raise NotImplementedError(
        f"{op}: strided nested tensors (torch.nested without layout=torch.jagged) have no "
        f"kernels on neuron\n{where()}\n  fix: make it with layout=torch.jagged (jagged nested "
        "tensors run on neuron: their values are a plain neuron tensor), or keep this nested "
        "tensor on the CPU")


_LIB: list = []


def install() -> None:
    torch.nn.TransformerEncoder.forward = forward
    torch._nested_tensor_from_mask = _from_mask
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(_strided_nested, "NestedTensorPrivateUse1")
    _LIB.append(lib)   # (a Library deregisters its kernels when collected)
