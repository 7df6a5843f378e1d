"""torch.nn.functional calls whose CUDA path a neuron tensor does not take, made to work alike.

`F.ctc_loss(log_probs, targets, input_lengths, target_lengths)` with the lengths as CPU
tensors (the documented, usual form: nn.CTCLoss in speech models) works on CUDA because ATen's
CUDA path reads the lengths into int lists first. A neuron tensor is a tensor subclass to
ATen, which then takes its composite path instead: `_ctc_loss` with the length tensors, then
the 'mean' reduction divides the device loss by the CPU `target_lengths`, a device mix CUDA's
rule refuses. Here CPU integer length tensors of a neuron call are read as int lists (the
IntList overload, whose reduction makes its lengths on the loss's device): the same loss and
gradients as with the lengths on the device.

>>> import torch, eager_neuron
>>> lp = torch.randn(6, 2, 4).log_softmax(-1)
>>> tg, il, tl = torch.tensor([[1, 2], [3, 1]]), torch.tensor([6, 5]), torch.tensor([2, 2])
>>> got = torch.nn.CTCLoss()(lp.to("neuron"), tg.to("neuron"), il, tl)
>>> bool(torch.isclose(got.cpu(), torch.nn.CTCLoss()(lp, tg, il, tl)))
True
"""

from __future__ import annotations

import functools

import torch

from .tensor import NeuronTensor

_TORCH_CTC = torch.nn.functional.ctc_loss


def _lengths(v):
    if isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dim() == 1 and \
            not v.dtype.is_floating_point and not v.dtype.is_complex and v.dtype != torch.bool \
            and not v.requires_grad:
        return tuple(v.tolist())
    return v   # anything else as torch takes it (its own errors for bad lengths)


@functools.wraps(_TORCH_CTC)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean",
             zero_infinity=False):
    if isinstance(log_probs, NeuronTensor):
        input_lengths, target_lengths = _lengths(input_lengths), _lengths(target_lengths)
    return _TORCH_CTC(log_probs, targets, input_lengths, target_lengths, blank=blank,
                      reduction=reduction, zero_infinity=zero_infinity)


def install() -> None:
    torch.nn.functional.ctc_loss = ctc_loss
