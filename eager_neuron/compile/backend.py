"""The dynamo backend `neuron`: AOTAutograd forward/backward graphs -> neuron programs.

>>> import torch, eager_neuron
>>> lin = torch.nn.Linear(4, 2).to("neuron")
>>> y = torch.compile(lin, backend="neuron")(torch.ones(3, 4, device="neuron"))
>>> y.shape
torch.Size([3, 2])
"""

from __future__ import annotations

import sys
import warnings

import torch

from ..config import config
from .stats import CSTATS


def _decompositions() -> dict:
    """A few composite activations and their backwards as elementwise chains (fusible); the
    rest (softmax, norms, matmul, conv) stay whole: neuron eager has fused kernels for them."""
    from torch._decomp import get_decompositions

    aten = torch.ops.aten
    wanted = [aten.silu, aten.silu_backward, aten.sigmoid_backward, aten.tanh_backward,
              aten.threshold_backward, aten.addcmul, aten.addcdiv, aten.lerp, aten.hardswish,
              aten.hardsigmoid, aten.mish, aten.elu, aten.softplus, aten.mse_loss,
              aten.mse_loss_backward, aten.gelu_backward, aten.leaky_relu_backward,
              aten.hardtanh_backward]
    table = get_decompositions(wanted)
    # torch's addcmul decomposition refuses an integer self with a float `value` (ATen casts
    # it: addcmul(int, ..., value=0.5) adds 0): the compile crashed with "value argument of
    # type float cannot be safely cast". Decomposed for floating operands only.
    for op, fn in list(table.items()):
        if op.overloadpacket is aten.addcmul:
            table[op] = _float_only(fn)
    table.update(_row_decompositions())
    return table


def _float_only(fn):
    def decomp(self, *args, **kwargs):
        if not (self.is_floating_point() or self.is_complex()):
            return NotImplemented
        return fn(self, *args, **kwargs)
    return decomp


def _row_ok(x, dim) -> bool:
    """A last-dim float softmax/norm: its decomposition fuses into one row kernel."""
    try:
        return (x.dtype in (torch.float32, torch.float64) and x.dim() >= 1
                and isinstance(dim, int) and dim % x.dim() == x.dim() - 1
                and bool(x.is_contiguous()))
    except Exception:    # a data-dependent stride under dynamic shapes
        return False


def _row_decompositions() -> dict:
    """softmax, log_softmax, layer norm and their backwards as last-dim reductions with their
    elementwise prologue/epilogue (compile/rows.py fuses each into one kernel). Only where the
    row kernel applies: otherwise (another dim, half dtypes) the op stays whole, and neuron
    eager runs its own fused kernel."""
    from torch._decomp import get_decompositions

    aten = torch.ops.aten
    base = get_decompositions([aten._softmax, aten._log_softmax, aten._softmax_backward_data,
                               aten._log_softmax_backward_data, aten.native_layer_norm,
                               aten.native_layer_norm_backward])

    def cond(op, check):
        fn = base.get(op)
        if fn is None:
            return {}

        def decomp(*args, **kwargs):
            try:
                ok = check(*args, **kwargs)
            except Exception:
                ok = False
            return fn(*args, **kwargs) if ok else NotImplemented
        return {op: decomp}

    out: dict = {}
    out.update(cond(aten._softmax.default, lambda x, dim, half: _row_ok(x, dim) and not half))
    out.update(cond(aten._log_softmax.default,
                    lambda x, dim, half: _row_ok(x, dim) and not half))
    out.update(cond(aten._softmax_backward_data.default,
                    lambda g, y, dim, dt: _row_ok(y, dim) and g.dtype == y.dtype == dt))
    out.update(cond(aten._log_softmax_backward_data.default,
                    lambda g, y, dim, dt: _row_ok(y, dim) and g.dtype == y.dtype == dt))
    out.update(cond(aten.native_layer_norm.default,
                    lambda x, shape, w, b, eps: len(shape) == 1 and _row_ok(x, -1)))
    out.update(cond(aten.native_layer_norm_backward.default,
                    lambda g, x, shape, *rest: len(shape) == 1 and _row_ok(x, -1)
                    and g.dtype == x.dtype))
    return out


def compile_graph(gm: torch.fx.GraphModule, example_inputs, kind: str = "graph"):
    """Compile one aten graph into a Program; a graph that cannot be lowered runs in eager.

    The fallback is correct by construction (the graph module itself, each op through neuron
    dispatch); it warns once per graph and counts the reason."""
    from torch._functorch.aot_autograd import make_boxed_func

    from .codegen import LoweringError
    from .program import GRAPH_IDS, Program

    name = f"{kind}_{next(GRAPH_IDS)}"
    try:
        program = Program(gm, name)
        fn = make_boxed_func(program)
        fn._neuron_program = program       # (compile/artifact.py stores it whole)
        return fn
    except (LoweringError, Exception) as exc:   # never a crash: the graph runs eagerly
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        CSTATS.graph_fallbacks[reason] += 1
        warnings.warn(f"eager_neuron: graph {name} could not be compiled into kernels "
                      f"({reason}); it runs op by op in neuron eager", stacklevel=2)
        return make_boxed_func(gm.forward if hasattr(gm, "forward") else gm)


def _cache_safe(gm: torch.fx.GraphModule) -> bool:
    """Whether torch's AOTAutograd cache may serve this dynamo graph. Its entries are guarded
    on SymInt inputs only: a Python float that dynamo passes as a tensor (its value not
    specialized) can be specialized while AOTAutograd traces (`torch.where(x > s, x, s)` bakes
    `s` into the aten graph, guarded by `s == value`). A cache hit skips that trace: the guard
    is never installed, or an entry traced for another value is served; either way a later
    call with another `s` silently reused the old value. Such graphs compile uncached."""
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        if getattr(n.meta.get("grapharg"), "pass_arg_as_tensor", False):
            return False
        if isinstance(n.meta.get("example_value"), (torch.SymFloat, torch.SymBool)):
            return False
    return True


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """torch.compile(model, backend="neuron"): AOTAutograd with fused-kernel compilers."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import default_partition

    def fw(g, inputs):
        return compile_graph(g, inputs, "forward")

    def bw(g, inputs):
        return compile_graph(g, inputs, "backward")

    def inference(g, inputs):
        return compile_graph(g, inputs, "inference")

    if any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
        # compiled autograd's backward graph takes its tensors boxed in one list (freed as the
        # graph runs): flattened as torch's own AOT backends do, then compiled as any graph
        from torch._dynamo.utils import flatten_graph_inputs

        return flatten_graph_inputs(gm, example_inputs, neuron_backend)
    # (flatten_graph_inputs hands a GmWrapper: an nn.Module around the graph, no `.graph`)
    fx_graph = isinstance(gm, torch.fx.GraphModule)
    if "graphs" in config.log and fx_graph:
        print(f"[eager_neuron] dynamo graph with {len(gm.graph.nodes)} nodes", file=sys.stderr)
    kw = dict(partition_fn=default_partition, decompositions=_decompositions(),
              keep_inference_input_mutations=True)
    from . import artifact

    if artifact.enabled() and fx_graph and _cache_safe(gm):
        # the whole AOTAutograd result cached across processes (compile/artifact.py)
        fw_c, bw_c, inf_c = artifact.compilers(compile_graph)
        with artifact.caching(gm):
            return aot_module_simplified(gm, example_inputs, fw_compiler=fw_c, bw_compiler=bw_c,
                                         inference_compiler=inf_c, **kw)
    return aot_module_simplified(gm, example_inputs, fw_compiler=fw, bw_compiler=bw,
                                 inference_compiler=inference, **kw)
