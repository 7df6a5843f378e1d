"""The planned runtime of a Program: repeat calls launch its kernels directly over an arena.

A Program (compile/program.py) interprets its steps: each kernel step allocates its stored
values through dispatch's allocator (a block, a host tensor, a NeuronTensor wrapper), takes
numpy views of every operand, and goes through `launch()` (key building with the arguments'
types, the memory-cache lookup). On a repeat call with the same input signature all of that
is the same every time. A *plan* (one per Program, for the signature it last saw) keeps it:

- the **arena**: a value that a kernel step stores and that only later kernel steps of the
  same program read as a buffer (not a graph output, not read by an eager node, a view, a host
  step or a kernel's scalar; not a folded constant) lives in memory planned once: slots reused
  by lifetime (two values share a slot when no step both reads one and the other is live),
  charged once to the simulated HBM as one block per core, released when the plan dies (with
  its Program, or when another signature replaces it). A row kernel's scratch matmul product
  lives there too. Its numpy operands (flat, `(A, B, C)`, `(R, C)` views) are made once.
- **pre-resolved kernels**: the plan is learned on one interpreted call (the arena's values
  as NeuronTensors over the arena memory, every launch through `launch()`, which builds or
  loads the kernel); later calls call each kernel object directly with the argument tuple
  kept from that call, filling only what changes: operands that come from outside the arena
  (graph inputs, eager nodes' results) and the values that escape (fresh neuron tensors, as
  before), and the scalar arguments. Each launch still counts `launches` and a memory hit,
  charges the simulated core, and counts the compile counters.

Guards, all cheap: every operand from outside the arena must have the dtype, shape and layout
it had when the plan was learned, every scalar its Python type (Numba's kernel is fixed by
them). A mismatch (another batch size, a non-contiguous input) drops the plan before that
step writes anything: the arena values still needed are copied into fresh tensors and the
interpreter runs the rest of the call; the next call learns a plan for the new signature
(after `MAX_REPLANS` a program keeps the interpreter). Not planned, the interpreter as before:
dynamic shapes, a profiler's launch hooks or `EAGER_NEURON_LOG=kernels` (every kernel's event
and source lines), any dispatch mode, a launcher or fast-path capture on the thread, the cache
verifier, and a plan in use by another thread or a re-entrant call (each plan has a busy
lock). A kernel cache cleared (`MEMORY.clear()`) retires every plan's kernels.

A ready plan's call runs as one generated function (compile/planrun.py: its steps written out
as straight-line Python; `planrun.GENERATED[0] = False` loops over the step list instead).

Counted in `eager_neuron.compile.stats()`: `planned_runs` (calls that ran a learned plan),
`plans_learned`, `arena_values` (kernel-stored values written into an arena instead of a new
tensor), `direct_launches`, `plan_fallbacks` (reason -> count).
"""

from __future__ import annotations

import operator
import threading
import weakref

import numpy as np
import torch
from torch.fx import Node

from .. import launch as _launch
from .. import tensor as _tensor_mod
from ..adaptive import MODULE as _adaptive
from ..backward import POISON as _POISON
from ..config import config
from ..context import _TLS
from ..simulator import SIM
from ..tensor import NeuronTensor
from . import faststep, hostscalar, planrun
from .faststep import FastFused, FastRows, _NotFast
from .forms import _FORMS
from .forms import _VIEW_METHODS as VIEWS
from .stats import CSTATS

OUTPUT_VIEWS = [True]    # (program.OUTPUT_VIEWS: the same list, bound in program.py)

_ALIGN = 64
HOST_BLOCKS = [True]     # consecutive host steps as one generated function (False: one by one)
MAX_REPLANS = 4          # plans dropped (signature changes) before a program stops planning
_GEN = [0]               # bumped when the kernel memory cache is cleared
_launch.MEMORY.on_clear.append(lambda: _GEN.__setitem__(0, _GEN[0] + 1))


class Runtime:
    """Per Program: whether it can be planned, its arena analysis, its current plan."""

    def __init__(self, program) -> None:
        self.off = not _static(program)
        self.plan: Plan | None = None
        self.replans = 0
        self.analysis = None        # (plan list, {node: (first step, last step, nbytes, core)})


def _static(program) -> bool:
    for p in program.placeholders:
        v = p.meta.get("val")
        if not isinstance(v, torch.Tensor):
            if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return False
            continue
        if not all(isinstance(s, int) for s in v.shape):
            return False
    return True


def acquire(program):
    """The plan this call may use (learned or to learn), busy-locked; None: interpret."""
    rt = program.__dict__.get("_rt")
    if rt is None:
        rt = program._rt = Runtime(program)
    if rt.off or _launch.HOOKS or "kernels" in config.log or config.cache_verify:
        return None
    ctx = getattr(_TLS, "ctx", None)
    if ctx is not None and (ctx.launcher is not None or ctx.capture is not None):
        return None
    p = rt.plan
    if p is None or p.dead or p.gen != _GEN[0]:
        if rt.analysis is None:
            rt.analysis = _analyse(program)
        p = rt.plan = Plan(rt)
    if not p.lock.acquire(False):
        CSTATS.plan_fallbacks["plan busy (another thread or a re-entrant call)"] += 1
        return None
    return p


def _analyse(program):
    """The arena's values: stored by a kernel step, read only as kernel buffers."""
    plan_list = program._plan_folded if program.fold_skip else program._plan
    out_users = set(program.output.all_input_nodes)
    made: dict = {}      # node -> step index (kernel-stored values)
    bad: set = set(out_users)
    last: dict = {}
    for i, (kind, x, _frees, keep) in enumerate(plan_list):
        bad.update(keep)
        if kind == "fused":
            for _j, node, *_ in x.out_meta:
                made.setdefault(node, i)
            bufs = {n for k, n in x.bufs if k == "in"}
            reads = [(n, True) for n in bufs] + [
                (a, False) for a in x.scalar_args if isinstance(a, Node)]
        elif kind == "rows":
            for _j, node, *_ in x.outs:
                made.setdefault(node, i)
            reads = [(n, True) for _j, n, _m in x.ins] + [
                (a, False) for a in x.scalar_args if isinstance(a, Node)]
        else:
            node = x.node if kind == "host" else x
            reads = [(a, False) for a in node.all_input_nodes]
        for n, as_buf in reads:
            if not as_buf:
                bad.add(n)
            last[n] = i
    out = {}
    for n, i in made.items():
        val = n.meta.get("val")
        if n in bad or not isinstance(val, torch.Tensor) or not all(
                isinstance(s, int) for s in val.shape) or val.numel() == 0:
            continue
        nbytes = val.numel() * val.dtype.itemsize
        out[n] = (i, max(i, last.get(n, i)), nbytes, val.device.index or 0)
    return plan_list, out


class Arena:
    """Slots over one host buffer per core, charged to the simulated HBM as one block each."""

    def __init__(self, values: dict) -> None:
        # lifetime-based slot reuse: greedy by first step, best fit among free slots
        slots: list = []        # [size, last step, core]
        where: dict = {}
        for n, (first, lst, nbytes, core) in sorted(values.items(), key=lambda kv: kv[1][0]):
            size = -(-nbytes // _ALIGN) * _ALIGN
            free = [s for s in range(len(slots)) if slots[s][1] < first and slots[s][2] == core]
            fit = [s for s in free if slots[s][0] >= size]
            if fit:
                s = min(fit, key=lambda s: slots[s][0])
            elif free:
                s = max(free, key=lambda s: slots[s][0])
                slots[s][0] = size
            else:
                slots.append([size, lst, core])
                s = len(slots) - 1
            slots[s][1] = lst
            where[n] = s
        offsets, total = {}, {}
        for s, (size, _lst, core) in enumerate(slots):
            offsets[s] = total.get(core, 0)
            total[core] = offsets[s] + size
        self.blocks, self.base = {}, {}
        for core, nbytes in total.items():
            block = SIM.core(core).alloc(nbytes)
            if block.storage is not None:
                mem = torch.empty(0, dtype=torch.uint8).set_(block.storage, 0, (nbytes,), (1,))
            else:
                mem = torch.empty(nbytes, dtype=torch.uint8)
            self.blocks[core], self.base[core] = block, mem
        self.nbytes = sum(total.values())
        self.n_slots = len(slots)
        self.span = {core: (m.data_ptr(), m.data_ptr() + m.numel())
                     for core, m in self.base.items()}
        self.where = {n: (values[n][3], offsets[s], -(-values[n][2] // _ALIGN) * _ALIGN)
                      for n, s in where.items()}

    def tensor(self, node, shape, dtype, index):
        """The arena's NeuronTensor for `node` (shape as the kernel step asks), or None."""
        w = self.where.get(node)
        if w is None or w[0] != index:
            return None
        core, off, cap = w
        numel = 1
        for s in shape:
            numel *= int(s)
        if numel * dtype.itemsize > cap:
            return None
        data = self.base[core][off:off + numel * dtype.itemsize].view(dtype).view(tuple(shape))
        return NeuronTensor(data, self.blocks[core], index), data

    def holds(self, a) -> bool:
        if type(a) is not np.ndarray:
            return False
        p = a.__array_interface__["data"][0]
        return any(lo <= p < hi for lo, hi in self.span.values())


class Plan:
    """One signature's arena and fast steps; learned by one interpreted call."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = weakref.ref(rt)   # (no cycle: a dead Program frees its arena at once)
        self.plan_list, self.values = rt.analysis
        self.lock = threading.Lock()
        self.gen = _GEN[0]
        self.dead = False
        self.ready = False
        self.arena = None
        self.fast: list = [None] * len(self.plan_list)
        self.shapes: dict = {}     # node -> (shape, dtype, index) of every kernel store
        self.views: dict = {}      # arena node -> its torch view (for a copy out)
        self.i = 0                 # the step being learned
        self.ops = None            # per step: what a planned call runs (see run)
        self.generated: dict = {}  # core -> its generated function (compile/planrun.py)
        self.failed = None

    def release(self) -> None:
        self.lock.release()

    def _replanned(self) -> None:
        rt = self._rt()
        if rt is not None:
            rt.replans += 1
            if rt.replans >= MAX_REPLANS:
                rt.off = True

    # -- learning (an interpreted call) ---------------------------------------------------------

    def start_learning(self) -> None:
        self.arena = Arena(self.values)

    def alloc(self, node, shape, dtype, index):
        """A kernel step's store while learning: the arena's tensor, or None (allocate)."""
        self.shapes[node] = (tuple(int(s) for s in shape), dtype, index)
        if node in self.values:
            got = self.arena.tensor(node, shape, dtype, index)
            if got is None:
                self.failed = "arena slot does not fit"
                return None
            self.views[node] = got[1]
            return got[0]
        return None

    def launched(self, kind, step, key, params, flops, nbytes, blas=(), F=None) -> None:
        """The launch just made through launch(): keep what a repeat call needs."""
        if self.failed:
            return
        kernel = _launch.MEMORY.get(_launch.full_key(key, params))
        if kernel is None:
            self.failed = "kernel not in the memory cache"
            return
        try:
            cls = FastFused if kind == "fused" else FastRows
            self.fast[self.i] = cls(self, step, kernel, params, flops, nbytes, blas, F)
        except _NotFast as exc:
            self.failed = str(exc)

    def learned(self) -> None:
        missing = [i for i, (k, *_) in enumerate(self.plan_list)
                   if k in ("fused", "rows") and self.fast[i] is None]
        if self.failed or missing:
            reason = self.failed or "a kernel step fell back while learning"
            CSTATS.plan_fallbacks[reason] += 1
            self.dead = True
            self._replanned()
            return
        self.ready = True
        CSTATS.plans_learned += 1

    # -- a repeat call --------------------------------------------------------------------------

    def run(self, env: dict, other) -> int | None:
        """Run every step; None when done, else the index the interpreter resumes at (the plan
        was dropped there: a guard failed; the arena values still needed are in env)."""
        ctx = getattr(_TLS, "ctx", None)
        core = ctx.core if ctx is not None else 0
        seq = self.ops
        if seq is None:
            seq = self.ops = self._sequence(other)
        if planrun.GENERATED[0]:
            # the plan as one generated function (compile/planrun.py), rebuilt when what it
            # binds changed (the step list, the core, the chip, the store allocator)
            # (one per core: threads on other cores taking turns do not rebuild it)
            g = self.generated.get(core)
            if g is None or g.key != planrun.key(seq, core):
                g = self.generated[core] = planrun.build(self, seq, core)
            return g.fn(env)
        flush = _adaptive.flush
        pop = env.pop
        for op, fs, i, frees in seq:
            if op is None:
                flush("compiled graph")      # (as the interpreter: pending eager groups first)
                if not fs.run(env, core):
                    self._drop(env, i)
                    return i
            else:
                op(env)
            for n in frees:
                pop(n, None)
        CSTATS.planned_runs += 1
        CSTATS.arena_values += len(self.views)
        return None

    def _sequence(self, other) -> list:
        """Per step: (fn(env) or None for a kernel, its fast step, its index, the values it
        frees: never the arena's, which a planned call does not put in env). Consecutive host
        steps are one generated function (hostscalar.block), freeing after the last."""
        seq: list = []
        run: list = []         # [(HostScalar, index, frees)] not yet emitted
        cps: list = []         # [(copy_ node, index, frees)] taking host values, not yet emitted

        def close_copies():
            if cps:
                frees = tuple(n for _x, _i, fr in cps for n in fr)
                seq.append((hostscalar.copies([x for x, _i, _fr in cps], other), None,
                            cps[0][1], frees))
                cps.clear()

        def close():
            if len(run) > 1:
                frees = tuple(n for _h, _i, fr in run for n in fr)
                seq.append((hostscalar.block([h for h, _i, _fr in run]), None, run[0][1],
                            frees))
            elif run:
                h, i, fr = run[0]
                seq.append((h.run, None, i, fr))
            run.clear()

        for i, (k, x, frees, _keep) in enumerate(self.plan_list):
            fr = tuple(n for n in frees if n not in self.values)
            if k == "host" and HOST_BLOCKS[0]:
                close_copies()
                run.append((x, i, fr))
                continue
            close()
            if k == "node" and HOST_BLOCKS[0] and x.target is hostscalar._COPY and \
                    len(x.args) == 2 and isinstance(x.args[1], Node) and \
                    hostscalar.copy_takes_host(x, x.args[1]):
                cps.append((x, i, fr))
                continue
            close_copies()
            seq.append((None if k in ("fused", "rows") else _step_fn(k, x, other),
                        self.fast[i], i, fr))
        close()
        close_copies()
        return seq

    def _drop(self, env: dict, i: int) -> None:
        CSTATS.plan_fallbacks["operand signature changed"] += 1
        self.dead = True
        self._replanned()
        alloc = faststep.ALLOC[0]
        for n, (first, lst, _nb, _core) in self.values.items():
            if first < i <= lst and n in self.views:
                shape, dtype, index = self.shapes[n]
                t = alloc(shape, dtype, index)
                t._data.copy_(self.views[n])
                env[n] = t


def _has_node(a) -> bool:
    if isinstance(a, Node):
        return True
    if isinstance(a, (list, tuple)):
        return any(_has_node(v) for v in a)
    return isinstance(a, dict)


def _step_fn(kind, x, other):
    """fn(env) for a host or eager step of a plan. A view of constant arguments on a neuron
    tensor is program._run_view without its per-call argument loading (the same tensor); any
    other case, or a view the host tensor refuses, takes the interpreter's step (`other`)."""
    if kind == "host":
        return x.run
    if kind == "node" and x.target is operator.getitem and not x.kwargs and len(x.args) == 2 \
            and isinstance(x.args[0], Node) and type(x.args[1]) is int:
        # an element of a multi-output op's tuple (split, SDPA, nll_loss): the interpreter's
        # step (argument loading, the node's call) cost ~3-10 us for one subscript
        src, k = x.args

        def item(env):
            env[x] = env[src][k]
        item.inline = ("getitem", x, src, k)     # (compile/planrun.py: one subscript)
        return item
    meth = VIEWS.get(x.target) if kind == "node" else None
    program = getattr(other, "__self__", None)
    if meth is not None and program is not None and OUTPUT_VIEWS[0] and \
            x in program.output_nodes():
        # a view the graph returns: through the dispatcher, where autograd records it as a
        # view of its base (Program.output_nodes)
        return lambda env: other(kind, x, env)
    if meth is None and kind == "node":
        fn = _direct_fn(x, other)
        if fn is not None:
            return fn
    if meth is None or x.kwargs or not x.args or not isinstance(x.args[0], Node) or _has_node(
            x.args[1:]):
        return lambda env: other(kind, x, env)
    src, cargs = x.args[0], tuple(x.args[1:])

    def view(env):
        base = env[src]
        if type(base) is NeuronTensor:
            data = base._data
            if not (data.is_conj() or data.is_neg()):
                try:
                    out = meth(data, *cargs)
                except Exception:      # (dispatch gives the error its neuron form)
                    out = None
                if out is not None:
                    env[x] = NeuronTensor(out, base._block, base._index)
                    CSTATS.graph_views += 1
                    return
        other(kind, x, env)
    view.inline = ("view", x, src, meth, cargs, lambda env: other(kind, x, env))
    return view



# False: a plan's eager nodes through torch's dispatcher (measurements); planrun's list (the
# generated plans read it too; planrun imports nothing of this module)
DIRECT_EAGER = planrun.DIRECT_EAGER
_profiling = torch._C._autograd._profiler_enabled
_grad_enabled = torch._C.is_grad_enabled


def _direct_fn(x, other):
    """fn(env) for an eager node of a plan whose op neither writes nor aliases an operand:
    neuron dispatch called directly when its first operand is a neuron tensor (what the
    operator's call reaches through torch's dispatcher and NeuronTensor.__torch_dispatch__,
    ~5 us a call less: the same function, with its fast path, counters and errors), else the
    interpreter's step. torch's profiler records aten ops at the dispatcher: it takes the
    dispatcher while it runs."""
    t = x.target
    loader = getattr(getattr(other, "__self__", None), "loaders", {}).get(x)
    if not isinstance(t, torch._ops.OpOverload) or loader is None or t in _FORMS:
        return None
    schema = t._schema
    if schema.is_mutable or any(r.alias_info is not None for r in schema.returns) or \
            torch.Tag.inplace_view in t.tags or torch._C._dispatch_has_kernel_for_dispatch_key(
                t.name(), "CompositeImplicitAutograd"):
        # (an implicit composite decomposes in the dispatcher before __torch_dispatch__)
        return None
    name = t.name()
    # FX keeps int[] / Tensor[] arguments as immutable lists; torch's dispatcher hands neuron
    # dispatch plain lists (its fast path's signature tells them apart: ~6 against ~60 us)
    lists = tuple(i for i, a in enumerate(x.args) if isinstance(a, (list, tuple)))
    klists = tuple(k for k, a in x.kwargs.items() if isinstance(a, (list, tuple)))

    def eager(env):
        args, kwargs = loader(env)
        for i in lists:
            args[i] = list(args[i])
        if klists:
            kwargs = dict(kwargs)
            for k in klists:
                kwargs[k] = list(kwargs[k])
        if args and type(args[0]) is NeuronTensor and DIRECT_EAGER[0] and not _profiling() \
                and not _grad_enabled():
            # (grad mode on: the dispatcher's autograd key would record the op; AOT runs its
            # graphs with it off, its backward too, even under create_graph=True)
            CSTATS.eager_ops[name] += 1
            CSTATS.direct_eager += 1
            out = _tensor_mod._dispatch(t, tuple(args), kwargs)
            if out is _POISON:
                # (an op that failed on the autograd engine's thread: dispatch stashed its error,
                # which backward() raises; the dispatcher would reject POISON with its own error)
                raise RuntimeError("a neuron op failed during backward")
            env[x] = out
            return
        other("node", x, env)
    eager.inline = ("eager", x, t, name)      # (compile/planrun.py writes it out)
    return eager


__all__ = ["acquire", "Plan", "Runtime"]
