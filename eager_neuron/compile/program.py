"""A compiled graph as a program: fused-kernel steps and eager steps over an environment.

(Just over 500 lines: a program's steps, its buffer plan and its run loop are one data
structure; the partitioner, row kernels and the backend are their own modules.)

>>> import torch, eager_neuron
>>> g = torch.compile(lambda x: torch.exp(x) * 2 - 1, backend="neuron")
>>> g(torch.zeros(3, device="neuron")).tolist()
[1.0, 1.0, 1.0]
"""

from __future__ import annotations

import itertools
import sys

import numpy as np
import torch
from torch.fx import GraphModule, Node

from ..adaptive import MODULE as _adaptive
from ..config import config
from ..kernels import compile as kc
from ..launch import launch
from ..tensor import NeuronTensor
from . import elide, fold, hostscalar, planned
from .absorb import absorb_views, materialize
from .codegen import Group, LoweringError, _stack_line, fill_as_full_like, partition
from .faststep import _scalar  # (a kernel scalar argument as Numba takes it)
from .foreach import expand_foreach
from .forms import _FAKE, _FORMS, _VIEWS, _alloc
from .hostscalar import _COPY, tensorize
from .rows import find_regions, split_var_mean
from .rowstep import RowStep
from .stats import CSTATS

aten = torch.ops.aten
_PARALLEL_MIN = 1 << 18
# names graphs forward_0, backward_1, ... (compiled now or restored whole) in one sequence
GRAPH_IDS = itertools.count()
OUTPUT_VIEWS = planned.OUTPUT_VIEWS  # False: returned views by the direct form (A/B only)


def _renderer(spec: tuple, parallel: bool):
    """render() for launch(): the fused source behind the preludes its expressions call."""
    from ..kernels import fused as kf
    from ..kernels.vmath import VMATH_PRELUDE, needs_vmath
    from ..lower import elementwise as ew

    def render():
        src, name = kf.render(spec, parallel)
        vm = VMATH_PRELUDE if needs_vmath(src) else ""
        special = getattr(ew, "SPECIAL_PRELUDE", "")
        sp = special if special and ew._SPECIAL_RE.search(src) else ""
        return vm + ew.PRELUDE + sp + src, name
    return render


class FusedStep:
    """One group -> one kernel spec, its buffer plan and how to fill its arguments."""

    def __init__(self, group: Group, users_outside) -> None:
        members = group.members
        self.nodes = [el.node for el in members]
        member_set = set(self.nodes)
        bufs: list = []          # ("in", node) | ("out", node)
        buf_of: dict = {}

        def buf(kind, node):
            key = (kind, node)
            if key not in buf_of:
                buf_of[key] = len(bufs)
                bufs.append(key)
            return buf_of[key]

        # 1. which member values are stored: read after the group, by another loop, as one
        #    element, or a reduction's result
        stored = set(group.writeback)
        for el in members:
            if el.reduce or users_outside(el.node, member_set):
                stored.add(el.node)
        # an absorbed copy_: the value is stored into the graph input's own memory
        self.absorbed = [(src, dst, cp) for src, (dst, cp) in group.writeback.items()]
        into = {src: dst for src, dst, _ in self.absorbed}
        for el in members:
            li = group.loop_of[el.node]
            for t in el.tensors:
                if t in member_set and (group.loop_of[t] != li or t in group.reduced):
                    stored.add(t)
        scalar_casts: list = []
        self.scalar_args: list = []      # FX args (constants or scalar nodes), in kernel order
        loops = []
        node_id = {el.node: k for k, el in enumerate(members)}
        self.out_meta = []               # (buf index, node, dtype, device index, shape source)
        shape_src: dict = {}
        for li, (size, idxs, _) in enumerate(group.loops):
            nodes, size_buf = [], None
            for k in idxs:
                el = members[k]
                operands = []
                for t in el.tensors:
                    tv = t.meta["val"]
                    one = tv.numel() == 1 and size != (1,) if not isinstance(
                        tv.numel(), torch.SymInt) else False
                    if t in member_set and group.loop_of[t] == li and t not in group.reduced:
                        operands.append(("val", node_id[t]))
                    else:
                        j = buf("in", into[t]) if t in into else buf(
                            "out" if t in member_set else "in", t)
                        operands.append(("one" if one else "buf", j))
                        if not one and size_buf is None:
                            size_buf = j
                    if not one and el.node not in shape_src:
                        shape_src[el.node] = shape_src.get(t, ("in", t)) if t in member_set \
                            else ("in", t)
                spec = el.spec
                base = len(scalar_casts)
                scalar_casts.extend(spec.scalar_casts)
                self.scalar_args.extend(el.scalars)
                if el.node in into:
                    out_buf = buf("in", into[el.node])
                else:
                    out_buf = buf("out", el.node) if el.node in stored else None
                if el.reduce is None and out_buf is not None and size_buf is None:
                    size_buf = out_buf
                nodes.append((spec.expr, spec.loads, spec.store, tuple(operands),
                              tuple(range(base, base + len(spec.scalar_casts))), out_buf,
                              el.reduce, node_id[el.node]))
            if size_buf is None:
                raise LoweringError("a fused loop with no buffer of its size")
            loops.append((size_buf, tuple(nodes)))
        self.spec = (tuple(loops), len(bufs), tuple(scalar_casts))
        self.bufs = bufs
        for j, (kind, node) in enumerate(bufs):
            if kind == "out":
                val = node.meta["val"]
                el = members[node_id[node]]
                src = None if el.reduce else shape_src.get(node)
                if src is None and not el.reduce:
                    raise LoweringError("no shape source for a stored value")
                static = None
                if el.reduce or all(isinstance(s, int) for s in val.shape):
                    static = tuple(int(s) for s in val.shape)
                self.out_meta.append((j, node, val.dtype, val.device.index or 0, src, static))
        self.nodes += [cp for _, _, cp in self.absorbed]   # (an eager rerun copies)
        # run-time work found once: the buffers whose size must equal their loop's, the
        # scalars known now (converted) and those read from the environment
        checks = []
        for size_buf, loop_nodes in self.spec[0]:
            for node in loop_nodes:
                for kind, ref in node[3]:
                    if kind == "buf" and ref != size_buf and (size_buf, ref) not in checks:
                        checks.append((size_buf, ref))
        self.size_checks = tuple(checks)
        self.const_scalars = tuple(None if isinstance(a, Node) else _scalar(a)
                                   for a in self.scalar_args)
        self.node_scalars = tuple((i, a) for i, a in enumerate(self.scalar_args)
                                  if isinstance(a, Node))
        self.renders: dict = {}
        self.n_nodes = len(members)
        self.stores = [node for kind, node in bufs if kind == "out"]
        self.ops = sorted({el.op for el in members})
        # for profiler hooks: the user's lines this kernel computes
        self.lines = sorted({_stack_line(el.node) for el in members})

    def __getstate__(self) -> dict:
        # (stored with its Program, compile/artifact.py: the render closures are rebuilt)
        return {**self.__dict__, "renders": {}}

    def describe(self) -> str:
        lines = [f"  kernel: {self.n_nodes} ops in {len(self.spec[0])} loop(s), "
                 f"{len(self.stores)} stored, {len(self.bufs) - len(self.stores)} read"]
        for n in self.nodes[:self.n_nodes]:
            lines.append(f"    | {n.name} = {n.target}  # {_stack_line(n)}")
        for src, dst, _ in self.absorbed:
            lines.append(f"    | {src.name} stored into input {dst.name} (its copy_ absorbed)")
        return "\n".join(lines)


class Program:
    """The runnable form of one aten graph."""

    def __init__(self, gm: GraphModule, name: str) -> None:
        self.gm = gm
        self.name = name
        expand_foreach(gm)
        split_var_mean(gm)
        fill_as_full_like(gm)
        if elide.ENABLED:
            CSTATS.copies_elided += elide.fresh_copies(gm)
        graph = gm.graph
        self.placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        # get_attr nodes: constants and subgraphs (a HOP's score_mod), fetched once
        self.consts = _consts(gm)
        self.output = next(n for n in graph.nodes if n.op == "output")
        steps = partition(gm, find_regions(gm))
        # last use of every value, for freeing as the program runs (its memory goes back to
        # the core's caching pool and the next allocation of that size reuses it)
        out_users = set(self.output.all_input_nodes)

        def users_outside(node, members):
            return node in out_users or any(u not in members for u in node.users)

        self.steps = []
        for kind, x in steps:
            if kind == "group":
                self.steps.append(("fused", FusedStep(x, users_outside)))
            elif kind == "rows":
                self.steps.append(("rows", RowStep(x, users_outside)))
            else:
                self.steps.append(("node", x))
        # views read only by kernels: the kernels read their sources (compile/absorb.py)
        self.n_absorbed = absorb_views(self.steps, out_users)
        self.n_host = _host_scalars(self.steps, out_users)
        self.frees: list = []
        last: dict = {}
        for i, (kind, x) in enumerate(self.steps):
            if kind == "fused":
                for step_node in x.stores + [n for a in x.absorbed for n in (a[0], a[2])]:
                    last.setdefault(step_node, i)
            elif kind == "rows":
                for step_node in x.stores:
                    last.setdefault(step_node, i)
            else:
                last.setdefault(x.node if kind == "host" else x, i)
            for r in _reads(kind, x):
                last[r] = i
        for n in out_users:
            last[n] = len(self.steps)
        frees = [[] for _ in self.steps]
        for n, i in last.items():
            if i < len(self.steps) and n.op not in ("placeholder", "get_attr"):
                frees[i].append(n)
        self.frees = frees
        # values no input decides (masks, position ids): the first run keeps them, later runs
        # skip the steps that compute only those (compile/fold.py)
        const = fold.constants(graph, self.output)
        skip, keep = fold.plan(self.steps, _produced, _reads, const) if const else ((), ())
        self.fold_skip = skip
        self.folded: dict | None = None
        keep_set = set(keep)
        self._plan = [(kind, x, frees[i], tuple(n for n in _produced(kind, x) if n in keep_set))
                      for i, (kind, x) in enumerate(self.steps)]
        self._plan_folded = [(kind, x, fr, ()) for i, (kind, x, fr, _) in enumerate(self._plan)
                             if i not in skip]
        self.loaders = {x: _loader(x) for k, x in self.steps if k == "node"}
        self.n_kernels = sum(1 for k, _ in self.steps if k in ("fused", "rows"))
        self._counted()

    def _counted(self) -> None:
        CSTATS.graphs_compiled += 1
        CSTATS.kernels_per_graph.append(self.n_kernels)
        CSTATS.views_absorbed += getattr(self, "n_absorbed", 0)
        if "graphs" in config.log:
            print(self.describe(), file=sys.stderr)

    # -- stored whole (compile/artifact.py): a warm process neither partitions nor renders ----

    def __getstate__(self) -> dict:
        """What a later process needs besides the graph module: steps, buffer plans, kernel
        specs and row kernels' sources (FX nodes are pickled by name, compile/artifact.py).
        Not the graph module, its constants, the loaders (closures) nor kept values."""
        state = dict(self.__dict__)
        for k in ("gm", "consts", "loaders", "folded"):
            del state[k]
        state.pop("_rt", None)        # the planned runtime: arenas, kernel objects, a lock
        state.pop("_output_nodes", None)
        return state

    @classmethod
    def restore(cls, gm: GraphModule, name: str, state: dict) -> "Program":
        """The Program `state` (from __getstate__) describes, over `gm` (the graph module it
        was built from, as stored: its foreach and var_mean passes already applied)."""
        self = cls.__new__(cls)
        self.__dict__.update(state)
        self.gm, self.name, self.folded = gm, name, None
        self.consts = _consts(gm)
        self.loaders = {x: _loader(x) for k, x in self.steps if k == "node"}
        self._counted()
        return self

    def describe(self) -> str:
        lines = [f"[eager_neuron] graph {self.name}: {len(self.placeholders)} inputs, "
                 f"{self.n_kernels} fused kernels, "
                 f"{sum(1 for k, _ in self.steps if k == 'node')} eager nodes, "
                 f"{self.n_host} host scalar nodes, "
                 f"{getattr(self, 'n_absorbed', 0)} views absorbed"]
        for kind, x in self.steps:
            if kind in ("fused", "rows"):
                lines.append(x.describe())
            elif kind == "host":
                lines.append(f"  host scalar: {x.node.name} = {x.node.target}  "
                             f"# {_stack_line(x.node)}")
            else:
                lines.append(f"  eager: {x.name} = {x.target}  # {_stack_line(x)}")
        return "\n".join(lines)

    def __call__(self, *args):
        env: dict = dict(self.consts)
        for p, a in zip(self.placeholders, args):
            env[p] = a
        CSTATS.graph_launches += 1
        # views skip dispatch only when no dispatch mode (a profiler's, a tracer's) must see them
        direct = torch._C._len_torch_dispatch_stack() == 0 and \
            torch._C._get_dispatch_mode(_FAKE) is None
        # a repeat call of the same signature: the planned runtime (compile/planned.py)
        pl = planned.acquire(self) if direct and (
            not self.fold_skip or self.folded is not None) else None
        try:
            if self.n_host:
                CSTATS.host_scalar_ops += self.n_host
                with np.errstate(all="ignore"):      # (0-d torch math never warns: inf, nan)
                    return self._run(env, direct, pl)
            return self._run(env, direct, pl)
        finally:
            if pl is not None:
                pl.release()

    def _run(self, env: dict, direct: bool, pl=None):
        plan, record, start = self._plan, None, 0
        if self.fold_skip and direct:         # (never keep a value made under a mode)
            if self.folded is None:
                record = {}
            else:
                env.update(self.folded)
                plan = self._plan_folded
                CSTATS.folded_steps += len(self.fold_skip)
        if pl is not None and pl.ready:
            start = pl.run(env, self._other)
            pl = None
        elif pl is not None:
            pl.start_learning()
        if start is not None:
            self._loop(plan, env, direct, start, record, pl)
        if record is not None:
            self.folded = record
        if pl is not None:
            pl.learned()
        out = self.output.args[0]
        return tuple(_load(a, env) for a in out) if isinstance(out, (list, tuple)) else \
            _load(out, env)

    def _other(self, kind, x, env: dict, direct: bool = True) -> None:
        """A host or eager step."""
        if kind == "host":
            x.run(env)
            return
        if x.target is _COPY and hostscalar.copy_host(x, env, direct):
            return
        loader = self.loaders.get(x)
        if loader is None:
            _run_node(x, env)
        elif not (direct and (form := _FORMS.get(x.target)) is not None and
                  not (OUTPUT_VIEWS[0] and x.target in _VIEWS and x in self.output_nodes()) and
                  form(x, env, loader)):
            _run_node(x, env, loader)

    def output_nodes(self) -> frozenset:
        """The returned views whose base (through a chain of views) the graph returns too: made
        through torch's dispatcher, not the direct form (forms._run_view), since only there
        does autograd record a view of its base (ADInplaceOrView). A direct one shared the
        memory with no `_base`, so the next frame after a graph break (dynamo, then
        AOTAutograd) saw two unrelated tensors where one was a view of the other, and ordered a
        read of the view before a write into its base (fuzz_compile seed 9044: a stale
        `t3.clamp()` after `t1[1:].add_()`). A view of an input or of an intermediate the
        graph does not return is AOTAutograd's to regenerate; a saved activation's views stay
        direct (their cost: GPT-2's step was 14% slower with every returned view
        dispatched)."""
        outs = self.__dict__.get("_output_nodes")
        if outs is None:
            returned = set(self.output.all_input_nodes)

            def root(n):
                seen = 0
                while n.op == "call_function" and n.target in _VIEWS and n.args and \
                        isinstance(n.args[0], Node) and seen < 64:
                    n, seen = n.args[0], seen + 1
                return n
            outs = self._output_nodes = frozenset(
                n for n in returned if n.op == "call_function" and n.target in _VIEWS and
                root(n) in returned)
        return outs

    def _loop(self, plan, env, direct, start, record, pl) -> None:
        """The interpreter, from step `start`; `pl`: a plan learning from this call."""
        for i in range(start, len(plan)):
            kind, x, frees, keep = plan[i]
            if pl is not None:
                pl.i = i
            if kind == "fused":
                _run_fused(x, env, pl)
            elif kind == "rows":
                _run_rows(x, env, pl)
            else:
                self._other(kind, x, env, direct)
            if keep and record is not None:
                for n in keep:
                    record[n] = env[n]
            for n in frees:
                env.pop(n, None)


def restore_graph(gm: GraphModule, state: dict, kind: str = "graph"):
    """The compiled callable of a Program stored whole (compile/artifact.py): no partition, no
    kernel rendered; its kernels come from the disk cache by key."""
    from torch._functorch.aot_autograd import make_boxed_func

    program = Program.restore(gm, f"{kind}_{next(GRAPH_IDS)}", state)
    fn = make_boxed_func(program)
    fn._neuron_program = program
    return fn


def _consts(gm: GraphModule) -> dict:
    """get_attr node -> its object (a constant tensor, a HOP's subgraph module)."""
    consts = {}
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            obj = gm
            for part in n.target.split("."):
                obj = getattr(obj, part)
            consts[n] = obj
    return consts


def _produced(kind: str, x) -> list:
    """The nodes one step computes."""
    if kind in ("fused", "rows"):
        return x.nodes
    return [x.node if kind == "host" else x]


def _reads(kind: str, x) -> list:
    """The values one step reads from the environment."""
    if kind == "fused":
        return [node for k, node in x.bufs if k == "in"] + [
            a for a in x.scalar_args if isinstance(a, Node)]
    if kind == "rows":
        return [node for k, node, _ in x.bufs if k == "in"] + [
            a for a in x.scalar_args if isinstance(a, Node)]
    return (x.node if kind == "host" else x).all_input_nodes


def _run_rows(step, env: dict, pl=None) -> None:
    from .rowstep import run

    _adaptive.flush("compiled graph")
    try:
        ok = run(step, env, _run_node, _alloc, _flat, pl)
    except Exception as exc:      # nothing was stored into env: the nodes rerun eagerly
        CSTATS.group_fallbacks[f"row kernel failed: {type(exc).__name__}"] += 1
        if "graphs" in config.log:
            print(f"[eager_neuron] row kernel failed ({type(exc).__name__}: {exc}); "
                  "running its ops one by one", file=sys.stderr)
        ok = False
    else:
        if not ok:
            CSTATS.group_fallbacks["row operand layout at run time"] += 1
    if not ok:
        materialize(step, env, _run_node)
        tensorize(env, step.nodes)
        for node in step.nodes:
            _run_node(node, env)


def _host_scalars(steps: list, out_users) -> int:
    """Eager 0-d CPU arithmetic nodes become host steps (compile/hostscalar.py); a value that
    is not only a kernel's scalar argument or another host node's operand stays a tensor."""
    forms = {x: f for kind, x in steps if kind == "node" and (f := hostscalar.plan(x))}
    if not forms:
        return 0
    eager = {x for kind, x in steps if kind == "node" and x not in forms}
    bufs = set()
    for kind, x in steps:
        if kind == "fused":
            bufs.update(node for k, node in x.bufs if k == "in")
        elif kind == "rows":
            bufs.update(node for k, node, _ in x.bufs if k == "in")
    for i, (_kind, x) in enumerate(steps):
        if x in forms:
            # (a copy_ of the value into a 0-d CPU tensor takes the numpy value: copy_host)
            tensor = x in out_users or x in bufs or any(
                u in eager and not hostscalar.copy_takes_host(u, x) for u in x.users)
            steps[i] = ("host", hostscalar.HostScalar(x, forms[x], tensor))
    return len(forms)


def _load(a, env):
    if isinstance(a, Node):
        return env[a]
    if isinstance(a, (list, tuple)):
        return type(a)(_load(x, env) for x in a)
    if isinstance(a, dict):
        return {k: _load(v, env) for k, v in a.items()}
    return a


def _hop_impl(t):
    """A higher-order op inside an AOT graph runs below autograd: its implementation directly
    (FlexAttention's HOP would re-enter its autograd rule under a torch-function mode no real
    tensor answers): one fused kernel, the dense path behind it (compile/flex.py)."""
    name = getattr(t, "_name", None)
    if name in ("flex_attention", "flex_attention_backward"):
        from . import flex

        return flex.forward if name == "flex_attention" else flex.backward
    return t


def _hop_mode_pop():
    """The context that pops AOTAutograd's first-call aliasing check (a dispatch mode that
    answers NotImplemented for tensor subclasses, "defer to the subclass") while a HOP node
    runs, else None. Its answer for a HOP is returned as the HOP's result (torch's HOP dispatch
    returns a mode's answer as is): torch.cond / while_loop / scan in a compiled graph on
    neuron tensors gave NotImplemented on their first call (the check sees ordinary ops)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode_temporarily

    mode = _get_current_dispatch_mode()
    if mode is not None and type(mode).__name__ == "_AnalyzeCustomOpInputOutputMode":
        return _pop_mode_temporarily
    return None


def _reads_env(a) -> bool:
    """Whether an FX argument holds a node (its value comes from the environment)."""
    if isinstance(a, Node):
        return True
    if isinstance(a, (list, tuple)):
        return any(_reads_env(x) for x in a)
    if isinstance(a, dict):
        return any(_reads_env(x) for x in a.values())
    return False


def _loader(node: Node):
    """env -> (args, kwargs) of one node, with the positions of its operands found once (the
    generic walk over every argument cost ~10 us per node and run). A nested argument with no
    node in it (a view's shape, a permutation) is a constant, passed as it is (aten ops do not
    mutate their int[] arguments); one with nodes (cat's tensors) is loaded by the walk."""
    args, kwargs = node.args, node.kwargs
    base = list(args)
    pos = [(i, a, type(a) is Node) for i, a in enumerate(args) if _reads_env(a)]
    kbase = dict(kwargs)
    kpos = [(k, v, type(v) is Node) for k, v in kwargs.items() if _reads_env(v)]

    def load(env):
        a = base.copy()
        for i, n, flat in pos:
            a[i] = env[n] if flat else _load(n, env)
        if not kpos:
            return a, kbase
        kw = dict(kbase)
        for k, n, flat in kpos:
            kw[k] = env[n] if flat else _load(n, env)
        return a, kw
    return load


def _run_node(node: Node, env: dict, loader=None) -> None:
    if loader is None:
        args = _load(node.args, env)
        kwargs = _load(node.kwargs, env)
    else:
        args, kwargs = loader(env)
    t = node.target
    pop = None
    if isinstance(t, torch._ops.HigherOrderOperator):
        CSTATS.eager_ops[f"higher_order.{t._name}"] += 1
        t = _hop_impl(t)
        pop = _hop_mode_pop()
    if isinstance(t, torch._ops.OpOverload):
        CSTATS.eager_ops[t.name()] += 1
    try:
        if pop is None:
            env[node] = t(*args, **kwargs)
        else:
            with pop():
                env[node] = t(*args, **kwargs)
    except Exception as exc:
        try:
            exc.add_note(f"  in a neuron-compiled graph: op {t} at {_stack_line(node)}")
        except Exception:
            pass
        raise


def _flat(t) -> np.ndarray | None:
    if type(t) is not NeuronTensor:
        return None
    arr = t._data.numpy()
    if not arr.flags.c_contiguous:
        return None
    return arr.reshape(-1)




def _run_fused(step: FusedStep, env: dict, pl=None) -> None:
    _adaptive.flush("compiled graph")
    args = [None] * len(step.bufs)
    outs = {}
    ok = True
    for j, (kind, node) in enumerate(step.bufs):
        if kind == "in":
            arr = _flat(env[node])
            if arr is None:
                ok = False
                break
            args[j] = arr
    if ok:
        for j, node, dtype, index, src, static in step.out_meta:
            if static is not None:
                shape = static
            else:
                kind, ref = src
                shape = (env[ref] if ref in env else outs[ref]).shape
            t = None if pl is None else pl.alloc(node, shape, dtype, index)
            if t is None:
                t = _alloc(shape, dtype, index)
            outs[node] = t
            args[j] = t._data.numpy().reshape(-1)
        # every flat buffer of a loop must have the loop's size (dynamic shapes: checked here)
        for size_buf, ref in step.size_checks:
            if args[ref].shape[0] != args[size_buf].shape[0]:
                ok = False
                break
    if not ok:
        CSTATS.group_fallbacks["operand layout at run time"] += 1
        materialize(step, env, _run_node)
        tensorize(env, step.nodes)
        for node in step.nodes:
            _run_node(node, env)
        return
    scalars = list(step.const_scalars)
    for i, a in step.node_scalars:
        scalars[i] = _scalar(env[a])
    numel = max(args[lp[0]].shape[0] for lp in step.spec[0])
    parallel = numel >= _PARALLEL_MIN and kc.parallel_allowed()
    nbytes = float(sum(a.nbytes for a in args))
    render = step.renders.get(parallel)
    if render is None:
        render = step.renders[parallel] = _renderer(step.spec, parallel)
    params = (*args, *scalars)
    try:
        launch(("fused", step.spec, parallel), render,
               params, flops=float(numel * step.n_nodes), bytes_moved=nbytes,
               engine="vector", extra={"group_ops": step.n_nodes, "graph": True,
                                       "graph_ops": step.ops, "source_lines": step.lines})
    except Exception as exc:
        CSTATS.group_fallbacks[f"kernel failed: {type(exc).__name__}"] += 1
        if "graphs" in config.log:
            print(f"[eager_neuron] fused kernel failed ({type(exc).__name__}: {exc}); "
                  "running its ops one by one", file=sys.stderr)
        materialize(step, env, _run_node)
        tensorize(env, step.nodes)
        for node in step.nodes:
            _run_node(node, env)
        return
    if pl is not None:
        pl.launched("fused", step, ("fused", step.spec, parallel), params,
                    float(numel * step.n_nodes), nbytes)
    CSTATS.fused_kernel_launches += 1
    CSTATS.fused_nodes += step.n_nodes
    env.update(outs)
    for src, dst, cp in step.absorbed:
        env[src] = env[cp] = env[dst]
