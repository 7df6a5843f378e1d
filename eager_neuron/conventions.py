"""The PyTorch device conventions CUDA users take for granted, installed at import.

Each piece lives in its own module (storage.py: storages and checkpoints; amp.py: autocast and
GradScaler; pinned.py: pinned host memory; swap.py: Module.to("neuron") while an old graph
lives; nested.py: TransformerEncoder's nested-tensor path; devapi.py: the rest of torch.neuron's
API); this
module only wires them in once, after device.register() made torch.neuron.
"""

from __future__ import annotations

import sys

import torch

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    from . import amp, devapi, functional, hf, nested, optim, pinned, storage, subclass, swap

    storage.install()
    hf.install()
    optim.install()
    pinned.install()
    devapi.install()
    amp.install()
    swap.install()
    nested.install()
    subclass.install()
    functional.install()
    mod = torch.neuron
    for name in amp.MODULE_FUNCTIONS:
        setattr(mod, name, getattr(amp, name))
    mod.amp = amp.amp_module()
    sys.modules["torch.neuron.amp"] = mod.amp
