"""Compiled programs cached across processes through torch's AOTAutograd cache.

A warm process used to redo AOTAutograd's tracing (functionalization, the joint graph, the
partitioner: a third of its time to the first step) because torch's AOTAutogradCache only
serves compilers that return a serializable `OutputCode`. The neuron backend's compilers do:
`NeuronOutputCode` holds the aten graph it compiled (with its fake values, pickled by torch's
GraphPickler) and the Program built from it, stored whole (its steps, buffer plans, kernel specs
and row kernels' sources, FX nodes by name): a later process that loads the entry skips
AOTAutograd's tracing, the partition and every kernel render (the kernels come from the disk
cache's render index by key). A Program that cannot be stored (a symbolic size in a plan, under
dynamic shapes) is rebuilt from the stored graph instead.

Rules, the disk cache's:
- never fatal: any failure to key, save or load an entry is a cache bypass (torch counts it,
  the graph compiles as if uncached);
- versioned: the key carries FORMAT, the backend's name and a hash of eager_neuron's source
  (a change to the partitioner, the decompositions or a fake implementation can never load a
  stale graph), next to torch's own key (the dynamo graph, the input signature, torch's
  version and configs);
- off with the disk cache (`EAGER_NEURON_DISK_CACHE=0`).
Entries live in torch's cache directory (`TORCHINDUCTOR_CACHE_DIR`, .../aotautograd), as
inductor's do; the kernels they run stay in the neuron disk cache.

>>> import torch, eager_neuron
>>> from eager_neuron.compile.artifact import cache_salt
>>> cache_salt().startswith("eager_neuron/")
True
"""

from __future__ import annotations

import contextlib
import functools
import io
import pickle
import time

import torch
from torch._inductor.output_code import OutputCode

from .stats import CSTATS

# bump when what an entry holds changes meaning (the graph's pickled form, the Program's input)
FORMAT = 2
# the attribute of dynamo's GraphModule that salts torch's AOTAutograd cache key (its __dict__
# is part of the key; torch's key otherwise ignores which backend compiles the graph)
SALT_ATTR = "_eager_neuron_cache_salt"


@functools.cache
def cache_salt() -> str:
    """The backend's part of the cache key: format, and a hash of the package's source — the
    graph compiler, its decompositions, and whatever shapes the traced graph (meta and fake
    implementations, custom ops' registrations) and the kernels' renderers (kernels/: a stored
    Program holds row kernels' sources): any edit makes every entry a miss (~30 ms once per
    process to hash: the disk cache's render index shares the hash)."""
    from ..cache import keys

    return f"eager_neuron/{FORMAT}/{keys.source_hash()[:24]}"


def enabled() -> bool:
    from ..config import config

    return bool(config.disk_cache)


def _ops_ok(name: str) -> bool:
    """Ops GraphPickler may store by name: torch's and registered custom ops (a missing one
    fails the load, which is a bypass)."""
    return name.startswith("torch.ops.")


class NeuronOutputCode(OutputCode):
    """One compiled aten graph (forward, backward or inference) as torch's caches keep it."""

    def __init__(self, gm: torch.fx.GraphModule, kind: str, compile_graph) -> None:
        super().__init__()
        self._gm = gm
        self._kind = kind
        # backend.compile_graph, handed in (this module sits below the backend in the import
        # graph); pickled by reference with the entry, so a loading process finds it
        self._compile = compile_graph
        self._blob: bytes | None = None
        self._program: bytes | None = None   # the Program stored whole (None: rebuild it)
        self._boxed_call = True
        t0 = time.time_ns()
        self._fn = compile_graph(gm, None, kind)
        # (torch's cache reports the time an entry saves; None there fails its hit path)
        self._time_taken_ns = time.time_ns() - t0

    def __call__(self, inputs):
        return self._fn(inputs)

    def prepare_for_serialization(self) -> None:
        # (called on a shallow copy: the live program keeps its graph and callable)
        from torch.fx._graph_pickler import GraphPickler, Options

        if self._gm is not None:
            self._blob = GraphPickler.dumps(self._gm, options=Options(ops_filter=_ops_ok))
            self._program = dump_program(self._fn)
        self._gm = None
        self._fn = None
        CSTATS.programs_saved += 1

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        if self._fn is not None:
            return
        from torch._guards import detect_fake_mode
        from torch.fx._graph_pickler import GraphPickler

        fake_mode = detect_fake_mode(example_inputs)
        if fake_mode is None:
            from torch._subclasses import FakeTensorMode
            from torch.fx.experimental.symbolic_shapes import ShapeEnv

            fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        gm = GraphPickler.loads(self._blob, fake_mode)
        gm.recompile()
        self._gm = gm
        blob = getattr(self, "_program", None)
        self._fn = load_program(gm, blob, self._kind) if blob else None
        if self._fn is None:
            self._fn = self._compile(gm, None, self._kind)
        else:
            CSTATS.programs_restored += 1
        CSTATS.programs_loaded += 1

    def set_triton_bundle(self, triton_bundle) -> None:
        pass


class _Unsaved(Exception):
    """A Program holds something that is not stored by value (a tensor, a symbolic size)."""


class _ProgramPickler(pickle.Pickler):
    """A Program's state, FX nodes by name (the graph module is stored beside it by torch's
    GraphPickler, names kept) and host-scalar operations by their table name."""

    def __init__(self, f) -> None:
        from .hostscalar import _OPS

        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self._ops = {id(fn): name for name, fn in _OPS.items()}

    def persistent_id(self, obj):
        if isinstance(obj, torch.fx.Node):
            return ("node", obj.name)
        if isinstance(obj, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool,
                            torch.nn.Module)):
            raise _Unsaved(type(obj).__name__)
        name = self._ops.get(id(obj))
        return None if name is None else ("hostop", name)


class _ProgramUnpickler(pickle.Unpickler):
    def __init__(self, f, nodes: dict) -> None:
        super().__init__(f)
        self._nodes = nodes

    def persistent_load(self, pid):
        from .hostscalar import _OPS

        kind, name = pid
        if kind == "node":
            return self._nodes[name]
        if kind == "hostop":
            return _OPS[name]
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def dump_program(fn) -> bytes | None:
    """The bytes of the Program behind a compiled callable (backend.compile_graph's), or None
    (a graph that runs in eager, a Program holding a symbolic size: rebuilt on load)."""
    program = getattr(fn, "_neuron_program", None)
    if program is None:
        return None
    try:
        buf = io.BytesIO()
        _ProgramPickler(buf).dump(program.__getstate__())
        return buf.getvalue()
    except Exception:    # noqa: BLE001 - not storable: a later process rebuilds it
        return None


def load_program(gm: torch.fx.GraphModule, blob: bytes, kind: str):
    """The compiled callable of the stored Program over `gm`, or None (then it is rebuilt)."""
    from .program import restore_graph

    try:
        nodes = {n.name: n for n in gm.graph.nodes}
        state = _ProgramUnpickler(io.BytesIO(blob), nodes).load()
        return restore_graph(gm, state, kind)
    except Exception:    # noqa: BLE001 - a stale or damaged program: rebuild from the graph
        return None


def compilers(compile_graph):
    """(forward, backward, inference) compilers torch's AOTAutograd cache accepts, each
    compiling through `compile_graph` (backend.compile_graph)."""
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

    ty = NeuronOutputCode

    def make(kind):
        return SerializableAOTDispatchCompiler(ty, lambda gm, inputs: ty(gm, kind,
                                                                          compile_graph))
    return make("forward"), make("backward"), make("inference")


@contextlib.contextmanager
def caching(gm: torch.fx.GraphModule):
    """Within: AOTAutograd keys `gm` with the backend's salt, bundles our OutputCode into its
    entry, and compiles the backward at once (so the entry is written inside this call)."""
    import torch._functorch.config as fconfig

    unwrap_factories(gm)
    setattr(gm, SALT_ATTR, f"{cache_salt()}/{_lines_hash(gm)}")
    with fconfig.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True), \
            _no_inductor_codegen_imports():
        yield


def _lines_hash(gm: torch.fx.GraphModule) -> str:
    """A hash of where the graph's ops stand in the user's source (each node's stack trace:
    file, line, code). torch's key ignores them, so a warm entry served the source lines of
    the process that stored it: after an edit that moved the model's code, an error in a
    compiled graph named the old line number with no code (or another line's), and the
    profiler and EAGER_NEURON_LOG=graphs the old lines. Moved code is a miss (the kernels
    still come from the disk cache)."""
    import hashlib

    h = hashlib.sha1()
    for node in gm.graph.nodes:
        st = node.meta.get("stack_trace")
        if st:
            h.update(st.encode())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _no_inductor_codegen_imports():
    """torch's cache key (inductor's FxGraphHashDetails) first registers inductor's own codegen
    backends, importing every one of them (C++, Triton, Halide, Metal, ...: 1.5-4.5 s, once
    per process) only to read the custom passes registered per device. Those are registered by
    the user's `register_backend_for_device` calls, never by that import: the key is the same
    without it, so a neuron compile skips it."""
    try:
        import torch._inductor.codecache as cc
    except Exception:    # noqa: BLE001 - another torch layout: nothing to skip
        yield
        return
    orig = getattr(cc, "init_backend_registration", None)
    if orig is None:
        yield
        return
    cc.init_backend_registration = lambda: None
    try:
        yield
    finally:
        cc.init_backend_registration = orig


def unwrap_factories(gm: torch.fx.GraphModule) -> int:
    """torch's factories that eager_neuron wraps in Python (for pin_memory=True:
    eager_neuron/pinned.py) reach dynamo's graph as those wrappers, which torch's cache refuses
    (a Python function it does not list as cacheable). A call that does not pin is the
    factory itself: its node calls the builtin. Returns the number of nodes changed."""
    done = 0
    for node in gm.graph.nodes:
        t = node.target
        if node.op != "call_function" or not callable(t) or node.kwargs.get("pin_memory"):
            continue
        inner = getattr(t, "__wrapped__", None)
        if inner is not None and getattr(t, "_pinning_wrapper", False) and \
                type(inner).__name__ == "builtin_function_or_method":
            node.target = inner
            done += 1
    if done:
        gm.recompile()
    return done


__all__ = ["FORMAT", "cache_salt", "enabled", "compilers", "caching", "NeuronOutputCode"]
