"""The dynamo backend `neuron`: AOTAutograd forward/backward graphs -> neuron programs.

>>> import torch, eager_neuron
>>> lin = torch.nn.Linear(4, 2).to("neuron")
>>> y = torch.compile(lin, backend="neuron")(torch.ones(3, 4, device="neuron"))
>>> y.shape
torch.Size([3, 2])
"""

from __future__ import annotations

import itertools
import sys
import warnings

import torch

from ..config import config
from .stats import CSTATS

_ids = itertools.count()


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
    return get_decompositions(wanted)


def compile_graph(gm: torch.fx.GraphModule, example_inputs, kind: str = "graph"):
    """Compile one aten graph into a Program; a graph that cannot be lowered runs in eager.

    The fallback is correct by construction (the graph module itself, each op through neuron
    dispatch); it warns once per graph and counts the reason."""
    from torch._functorch.aot_autograd import make_boxed_func

    from .codegen import LoweringError
    from .program import Program

    name = f"{kind}_{next(_ids)}"
    try:
        return make_boxed_func(Program(gm, name))
    except (LoweringError, Exception) as exc:   # never a crash: the graph runs eagerly
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        CSTATS.graph_fallbacks[reason] += 1
        warnings.warn(f"eager_neuron: graph {name} could not be compiled into kernels "
                      f"({reason}); it runs op by op in neuron eager", stacklevel=2)
        return make_boxed_func(gm.forward if hasattr(gm, "forward") else gm)


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

    if "graphs" in config.log:
        print(f"[eager_neuron] dynamo graph with {len(gm.graph.nodes)} nodes", file=sys.stderr)
    return aot_module_simplified(gm, example_inputs, fw_compiler=fw, bw_compiler=bw,
                                 inference_compiler=inference,
                                 partition_fn=default_partition,
                                 decompositions=_decompositions(),
                                 keep_inference_input_mutations=True)
