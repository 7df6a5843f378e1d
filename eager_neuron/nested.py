"""nn.TransformerEncoder's nested-tensor path and jagged attention on neuron, without strided
nested tensors.

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

`F.scaled_dot_product_attention` on jagged nested tensors (layout=torch.jagged): off CUDA, torch
takes its math path, which converts each operand to a strided nested tensor and runs the math
attention on those; a neuron device holds no strided nested tensors, so NJT attention failed.
The math path attends within each sequence of the batch (one dense attention per component);
_jagged_sdpa runs exactly that, one dense attention per component on the device, and packs the
results into a jagged tensor with the query's offsets (equal bits to the CPU's math path,
dropout's random draws included). torch's own checks and backend choice run first, so what the
CPU refuses (masks, is_causal) is refused with its words.

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


def _jagged_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False):
    """torch.nested._internal.ops' jagged attention, for neuron jagged operands on torch's math
    path: one dense attention per component (see the module docstring)."""
    from torch.nested._internal import sdpa as _sdpa
    from torch.nested._internal.nested_tensor import (
        NestedTensor,
        nested_view_from_values_offsets_lengths,
    )

    # (a batch ragged in its second dim, dim > 3, runs torch's dense path on the values: works)
    ours = isinstance(query, NestedTensor) and query.device.type == "neuron" and not (
        query.dim() > 3 and key.dim() > 3 and value.dim() > 3 and query._ragged_idx == 1)
    if ours:
        q, k, v, mask = _sdpa._autocast(query, key, value, attn_mask)
        _sdpa._validate_sdpa_input(q, k, v, mask, dropout_p, is_causal, scale)
        ours = isinstance(k, NestedTensor) and isinstance(v, NestedTensor) and all(
            t.dim() == 4 and t._ragged_idx == 2 for t in (q, k, v)) and \
            _sdpa._select_sdp_backend(q, k, v, mask, dropout_p, is_causal, enable_gqa) \
            is torch.nn.attention.SDPBackend.MATH
    if not ours:
        return _TORCH_JAGGED_SDPA[0](query, key, value, attn_mask, dropout_p, is_causal, scale,
                                     enable_gqa)
    # (B, H, j, E) operands: components (H, L_i, E), as the math path's strided nested
    # tensor holds them
    outs = [torch.nn.functional.scaled_dot_product_attention(
                qi, ki, vi, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa)
            for qi, ki, vi in zip(q.unbind(), k.unbind(), v.unbind())]
    values = torch.cat([o.transpose(0, 1) for o in outs])   # (sum L_i, H, Ev)
    return nested_view_from_values_offsets_lengths(
        values, q.offsets(), lengths=q.lengths(), min_seqlen=q._maybe_min_seqlen,
        max_seqlen=q._maybe_max_seqlen).transpose(1, 2)


_TORCH_JAGGED_SDPA: list = []
_LIB: list = []


def install() -> None:
    from torch.nested._internal import ops as _njt_ops  # (~3 ms: NJT's op table)

    torch.nn.TransformerEncoder.forward = forward
    if not _TORCH_JAGGED_SDPA:
        _TORCH_JAGGED_SDPA.append(_njt_ops.jagged_scaled_dot_product_attention)
        _njt_ops.jagged_scaled_dot_product_attention = _jagged_sdpa
    torch._nested_tensor_from_mask = _from_mask
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(_strided_nested, "NestedTensorPrivateUse1")
    _LIB.append(lib)   # (a Library deregisters its kernels when collected)
