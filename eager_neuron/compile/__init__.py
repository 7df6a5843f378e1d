"""torch.compile for neuron: `torch.compile(model, backend="neuron")` (see docs/COMPILE.md).

Importing eager_neuron imports this package; it is cheap (torch._dynamo is not imported here):
the backend registers itself when dynamo is first imported, and neuron tensors become
traceable as plain device tensors (tracing.install).

>>> import torch, eager_neuron
>>> f = torch.compile(lambda x: x.sin() + 1, backend="neuron")
>>> f(torch.zeros(2, device="neuron")).tolist()
[1.0, 1.0]
>>> eager_neuron.compile.stats()["graph_launches"] >= 1
True
"""

from __future__ import annotations

import importlib.abc
import sys

from . import tracing as _tracing
from .stats import CSTATS

_tracing.install()


def stats() -> dict:
    """Graph-mode counters: graphs compiled, graph launches, kernels per graph, eager ops."""
    return CSTATS.snapshot()


def reset_stats() -> None:
    CSTATS.reset()


def _on_dynamo() -> None:
    """Called once torch._dynamo's backend registry exists: register `neuron`, skip our code."""
    import torch._dynamo.trace_rules as tr
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    from .backend import neuron_backend

    if "neuron" not in _COMPILER_FNS:
        register_backend(neuron_backend, name="neuron")
    # dynamo must never trace into the neuron runtime (dispatch, lowerings, Numba) when a
    # graph break runs user code eagerly: it runs outside graphs, as a CUDA driver does
    tr.add("eager_neuron")


class _DynamoHook(importlib.abc.MetaPathFinder):
    """Runs _on_dynamo after `torch._dynamo` finishes importing (no dynamo import of our own:
    it costs ~1.7 s and most eager programs never compile)."""

    def find_spec(self, name, path, target=None):
        if name != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        orig = loader.exec_module

        def exec_module(module):
            orig(module)
            _on_dynamo()

        loader.exec_module = exec_module
        return spec


if "torch._dynamo" in sys.modules:
    _on_dynamo()
else:
    sys.meta_path.insert(0, _DynamoHook())

__all__ = ["stats", "reset_stats"]
