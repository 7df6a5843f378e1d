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
    from .flex import FSTATS

    return {**CSTATS.snapshot(), "flex": FSTATS.snapshot()}


def reset_stats() -> None:
    from .flex import FSTATS

    CSTATS.reset()
    FSTATS.reset()


def _on_dynamo() -> None:
    """Called once torch._dynamo's backend registry exists: register `neuron`, skip our code."""
    import torch._dynamo.trace_rules as tr
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    from .backend import neuron_backend

    if "neuron" not in _COMPILER_FNS:
        register_backend(neuron_backend, name="neuron")
    # dynamo must never trace into the neuron runtime (dispatch, lowerings, Numba) when a
    # graph break runs user code eagerly: it runs outside graphs, as a CUDA driver does
    _skip_dirs(tr)
    skip_runtime()
    _tracing.trace_tensor_ctor_on_cpu()
    _after_import("transformers.utils.logging", _quiet_hf_warning_once)
    _allow_flex_attention()
    from .. import hops

    hops.install()                  # the HOPs dynamo's import registered (hops.py)
    custom = sys.modules.get("eager_neuron.custom.core")
    if custom is not None:          # loaded later, it applies this itself
        custom.trace_into_call()


def _allow_flex_attention() -> None:
    """FlexAttention refuses devices outside its list; on neuron its HOP runs as on the CPU:
    eager (dynamo's eager backend over the dense implementation) and compiled (the HOP is one
    node of the graph, run through neuron dispatch), forward and backward."""
    try:
        import torch.nn.attention.flex_attention as fa
    except Exception:    # noqa: BLE001 - an older torch without FlexAttention
        return
    check = fa._validate_device
    if getattr(check, "_en_neuron", False):
        return

    def _validate_device(query, key, value):
        if query.device.type == "neuron" and key.device == query.device == value.device:
            return
        check(query, key, value)

    _validate_device._en_neuron = True
    fa._validate_device = _validate_device
    try:
        import importlib

        # (the package re-exports the HOP under the module's name: import the module itself)
        hops = importlib.import_module("torch._higher_order_ops.flex_attention")

        from ..tensor import NeuronTensor
        from . import flex

        # one fused kernel each way (compile/flex.py), the dense implementations behind it
        hops.flex_attention.py_impl(NeuronTensor)(flex.forward)
        hops.flex_attention_backward.py_impl(NeuronTensor)(flex.backward)
        hops.create_fw_bw_graph = flex.trace_joint_on_cpu(hops.create_fw_bw_graph)
    except Exception:    # noqa: BLE001 - another torch layout: FlexAttention stays refused
        fa._validate_device = check


# user-level wrappers made of torch ops and registered custom kernels: dynamo traces them
# (their kernels become custom-op nodes of the graph, run as their kernel by the program);
# nested.py's TransformerEncoder.forward defers to torch's own while compiling
_TRACED = ("kernel_lib", "nested.py")


def _skip_dirs(tr) -> None:
    """Skip the runtime's files for dynamo, except the traced packages (kernel_lib)."""
    import os

    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for entry in sorted(os.listdir(pkg)):
        if entry in _TRACED or entry.startswith(("_", ".")) and entry != "__init__.py":
            continue
        path = os.path.join(pkg, entry)
        if entry.endswith(".py") or os.path.isdir(path):
            tr.SKIP_DIRS.append(path + (os.sep if os.path.isdir(path) else ""))
    tr._recompile_re()


def skip_runtime() -> int:
    """Mark every function of eager_neuron as skipped by dynamo, with everything it calls
    (Numba's typing, numpy): the neuron runtime is entered from C++ (__torch_dispatch__, the
    PrivateUse1 fallback, autograd hooks) while a dynamo callback may be active. A flag on the
    code objects, so the eager hot path pays nothing. Returns the number of code objects."""
    import os
    import types

    from torch._C._dynamo.eval_frame import _FrameAction as A
    from torch._C._dynamo.eval_frame import _FrameExecStrategy as S
    from torch._C._dynamo.eval_frame import set_code_exec_strategy

    seen = set()
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # ours only: kernels/ and cache/ install as eager_neuron.kernels/.cache from the repo top;
    # never a code object shared with torch (a decorator's wrapper)
    ours = (pkg + os.sep, os.path.join(os.path.dirname(pkg), "kernels") + os.sep,
            os.path.join(os.path.dirname(pkg), "cache") + os.sep)

    def mark(obj, depth=0):
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            for f in (obj.fget, obj.fset):
                if f is not None:
                    mark(f, depth)
            return
        code = getattr(obj, "__code__", None)
        if isinstance(code, types.CodeType) and id(code) not in seen and \
                os.path.abspath(code.co_filename).startswith(ours):
            seen.add(id(code))
            set_code_exec_strategy(code, S(A.SKIP, A.SKIP))
        elif isinstance(obj, type) and depth == 0:
            for v in list(vars(obj).values()):
                mark(v, 1)

    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == "eager_neuron" or name.startswith("eager_neuron.")):
            continue
        if any(name.startswith(f"eager_neuron.{t.removesuffix('.py')}") for t in _TRACED):
            continue
        for v in list(vars(mod).values()):
            if getattr(v, "__module__", name) == name or isinstance(v, type):
                mark(v)
    return len(seen)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `fn` after the module `name` finishes importing (no import of our own: dynamo's
    costs ~1.7 s and most eager programs never compile)."""

    def __init__(self, name: str, fn) -> None:
        self.name, self.fn = name, fn

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        import importlib.util

        # NOTE: stay installed until the module really executes: a bare find_spec() probe
        # (no import) must not use the hook up
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        orig = loader.exec_module
        hook = self

        def exec_module(module):
            orig(module)
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)
            hook.fn()

        loader.exec_module = exec_module
        return spec


def _after_import(name: str, fn) -> None:
    if name in sys.modules:
        fn()
    else:
        sys.meta_path.insert(0, _AfterImport(name, fn))


def _quiet_hf_warning_once() -> None:
    """Hugging Face's `logger.warning_once` (GPT-2's `loss_type=None ... unrecognized` on every
    forward with labels) is a logging call dynamo cannot trace: a graph break inside the model
    whose resume frames dynamo retraces (~5 restarts, 6 graphs for a GPT-2 training step
    instead of 4, ~20% of a warm compile). Told to dynamo as an ignored logging function (as
    `torch._dynamo.config.ignore_logging_functions` documents): inside compiled code the
    one-time warning is not printed; eager code still prints it."""
    try:
        import torch._dynamo.config as dconfig
        from transformers.utils import logging as hf_logging

        dconfig.ignore_logging_functions.add(hf_logging.warning_once)
    except Exception:    # noqa: BLE001 - another transformers or torch layout: the break stays
        pass


_after_import("torch._dynamo", _on_dynamo)

__all__ = ["stats", "reset_stats"]
