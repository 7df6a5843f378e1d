"""A small kernel library written with `eager_neuron.kernel` (NKI-lib's counterpart), as examples.

Each op is a `torch.ops.neuronlib.*` operator that runs on neuron tensors (and on CPU tensors,
for comparison), with autograd where the op is trained through:

- `rms_norm(x, weight, eps)`: RMSNorm forward + backward, one kernel each
- `apply_rotary(x, cos, sin)`: rotary position embedding (half-split), forward + backward
- `flash_attention(q, k, v, causal, scale)`: tiled online-softmax attention, forward + backward,
  O(sequence) extra memory
- `topk_router(logits, k)`, `moe_dispatch(x, idx, n_experts)`, `moe_combine(ys, src, weights)`,
  `moe_forward(...)`: a top-k mixture-of-experts router with expert dispatch and combine

>>> import torch
>>> from eager_neuron.kernel_lib import rms_norm
>>> rms_norm(torch.ones(2, 8, device="neuron"), torch.ones(8, device="neuron")).shape
torch.Size([2, 8])
"""

from __future__ import annotations

from .flash_attention import flash_attention
from .moe import moe_combine, moe_dispatch, moe_forward, topk_router
from .rmsnorm import rms_norm
from .rotary import apply_rotary

__all__ = ["apply_rotary", "flash_attention", "moe_combine", "moe_dispatch", "moe_forward",
           "rms_norm", "topk_router"]
