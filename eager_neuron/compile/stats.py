"""Counters of the graph mode (merged into eager_neuron.compile.stats())."""

from __future__ import annotations

from collections import Counter


class CompileStats:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.graphs_compiled = 0          # aten graphs turned into programs
        self.graph_launches = 0           # runs of a compiled program
        self.kernels_per_graph: list = []  # fused kernels in each compiled graph (at compile)
        self.fused_kernel_launches = 0
        self.fused_nodes = 0              # aten nodes that ran inside fused kernels
        self.row_kernel_launches = 0      # of which row-region kernels (reductions, matmuls)
        self.graph_views = 0              # views made from host data, without dispatch
        self.views_absorbed = 0           # view nodes kernels read through (per graph compiled)
        self.eager_ops: Counter = Counter()        # op name -> eager calls inside graphs
        self.graph_fallbacks: Counter = Counter()  # reason -> graphs run entirely in eager
        self.group_fallbacks: Counter = Counter()  # reason -> fused groups run op by op
        self.host_scalar_ops = 0          # 0-d CPU nodes run as numpy scalar math
        self.host_copies = 0              # copy_ of a host value into a 0-d CPU tensor (fill_)
        self.direct_moves = 0             # host -> device _to_copy nodes without dispatch
        self.direct_eager = 0             # a plan's eager nodes sent to neuron dispatch directly
        self.programs_saved = 0           # compiled graphs written to torch's AOTAutograd cache
        self.programs_loaded = 0          # ... and rebuilt from it (no AOTAutograd tracing)
        self.programs_restored = 0        # ... of which stored whole (no partition, no render)
        self.folded_steps = 0             # steps skipped: values no input decides, kept
        self.copies_elided = 0            # copies of a fresh value into its own layout (elide.py)
        # the planned runtime (compile/planned.py)
        self.planned_runs = 0             # calls that ran a learned plan
        self.plans_learned = 0            # plans learned (one per program and signature)
        self.arena_values = 0             # kernel stores written into an arena, not a tensor
        self.direct_launches = 0          # kernels called directly (pre-resolved)
        self.plan_fallbacks: Counter = Counter()   # reason -> calls interpreted instead

    def snapshot(self) -> dict:
        return {
            "graphs_compiled": self.graphs_compiled,
            "graph_launches": self.graph_launches,
            "kernels_per_graph": list(self.kernels_per_graph),
            "fused_kernel_launches": self.fused_kernel_launches,
            "fused_nodes": self.fused_nodes,
            "row_kernel_launches": self.row_kernel_launches,
            "graph_views": self.graph_views,
            "views_absorbed": self.views_absorbed,
            "graph_eager_ops": dict(self.eager_ops),
            "graph_fallbacks": dict(self.graph_fallbacks),
            "group_fallbacks": dict(self.group_fallbacks),
            "host_scalar_ops": self.host_scalar_ops,
            "host_copies": self.host_copies,
            "direct_moves": self.direct_moves,
            "direct_eager": self.direct_eager,
            "programs_saved": self.programs_saved,
            "programs_loaded": self.programs_loaded,
            "programs_restored": self.programs_restored,
            "folded_steps": self.folded_steps,
            "copies_elided": self.copies_elided,
            "planned_runs": self.planned_runs,
            "plans_learned": self.plans_learned,
            "arena_values": self.arena_values,
            "direct_launches": self.direct_launches,
            "plan_fallbacks": dict(self.plan_fallbacks),
        }


CSTATS = CompileStats()
