"""Hugging Face `accelerate` and `transformers` see the `neuron` device.

Both libraries already know a device called "neuron" (AWS's torch_neuronx): they pick it for
`Trainer`/`Accelerator` when `is_neuron_available()` / `is_torch_neuron_available()` say so, and
those only look for the torch_neuronx package. Their neuron paths call the `torch.neuron` API
this package provides (set_device, current_device, get_rng_state_all, ...), so we answer those
two checks with "yes" — through an import hook, since both libraries copy the function into
many modules when they are imported. `TrainingArguments(use_cpu=True)` still means the CPU.

>>> import eager_neuron, accelerate
>>> accelerate.PartialState().device.type
'neuron'
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

import torch

# module -> the availability check in it that only looks for torch_neuronx
TARGETS = {
    "accelerate.utils.imports": "is_neuron_available",
    "transformers.utils.import_utils": "is_torch_neuron_available",
}


def _available(check_device: bool = False) -> bool:
    return hasattr(torch, "neuron") and torch.neuron.is_available()


def _patch(module) -> None:
    name = TARGETS.get(module.__name__)
    if name is not None and hasattr(module, name):
        setattr(module, name, _available)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner) -> None:
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        _patch(module)        # before any other module of the library copies the name


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in TARGETS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Patch the checks now if the libraries are loaded, else when they are imported."""
    for mod_name, fn_name in TARGETS.items():
        if mod_name in sys.modules:
            prefix = mod_name.split(".")[0] + "."
            for name, module in list(sys.modules.items()):
                if name.startswith(prefix) and getattr(module, fn_name, None) is not None:
                    setattr(module, fn_name, _available)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
