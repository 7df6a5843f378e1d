"""Compile one aten FX graph (from AOTAutograd) into a program of fused Numba kernels.

1. partition: walk the nodes in order; an elementwise node whose tensor operands are contiguous
   and of its own size (or a single element), with a kernel in lower/elementwise.py's table,
   joins the open group; a full sum/mean of such a value is the group's epilogue; any other node
   closes the group and runs as its own eager call (neuron dispatch), counted by op name.
2. each group is one kernel spec for kernels/fused.py (the renderer adaptive eager uses): values
   flow in registers, and only values read after the group (by a later node or as graph output)
   are stored to memory. Specs carry no sizes: a new batch size runs the same machine code.
3. the program: a list of steps, each (kind, ...); at run time a fused step allocates its stored
   outputs straight from the simulated HBM (no dispatch), takes flat numpy views and calls
   launch(), which finds the kernel in the memory/disk cache (cached like a NEFF).

>>> import torch, eager_neuron
>>> f = torch.compile(lambda x: (x * 2 + 1).relu(), backend="neuron")
>>> f(torch.arange(-2., 2., device="neuron")).tolist()
[0.0, 0.0, 1.0, 3.0]
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch
from torch.fx import GraphModule, Node

aten = torch.ops.aten
_REDUCE = {"aten::sum": "sum", "aten::sum.dim_IntList": "sum", "aten::mean.dim": "mean",
           "aten::mean": "mean"}
_FUSIBLE_DTYPES = frozenset({torch.float32, torch.float64, torch.int64, torch.int32, torch.bool})
MAX_GROUP_NODES = 512  # Numba compile time grows with the kernel body (split() keeps kernels small)
# an open group takes up to this many nodes before it closes; split() then cuts it into its
# independent chains, and a chain longer than MAX_GROUP_NODES into runs of whole loops. (The
# open group used to close at MAX_GROUP_NODES: an AdamW step over BART tiny's 125 parameters
# is 11 ops a parameter, so the cap fell mid-chain and every parameter's update became three
# kernels, 364 in all instead of 125.)
MAX_OPEN_NODES = 16 * MAX_GROUP_NODES


class LoweringError(Exception):
    """The graph cannot be compiled into kernels (it then runs in eager, with one warning)."""


def _sizes_key(val) -> tuple:
    """A hashable, symbolic-aware key of a value's number of elements."""
    n = val.numel()
    return (str(n.node.expr),) if isinstance(n, torch.SymInt) else (int(n),)


def _concrete(v):
    """Compile-time stand-in for an argument: symbolic scalars by their Python type."""
    if isinstance(v, torch.SymInt):
        return 1
    if isinstance(v, torch.SymFloat):
        return 1.0
    if isinstance(v, torch.SymBool):
        return True
    return v


def _is_contig(val) -> bool:
    try:
        return bool(val.is_contiguous())
    except Exception:   # a data-dependent stride under dynamic shapes
        return False


def _stack_line(node: Node) -> str:
    """The user's line of a node, from the FX stack trace (its last 'File' entry)."""
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File "):
            code = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("File ") \
                else ""
            return f"{lines[i]}: {code}".rstrip(": ")
    return "<no stack trace>"


class _Elementwise:
    """What a fusible node is: its rendered spec pieces and its tensor operand nodes."""

    __slots__ = ("node", "op", "spec", "tensors", "scalars", "reduce")

    def __init__(self, node, op, spec, tensors, scalars, reduce=None):
        self.node, self.op, self.spec = node, op, spec
        self.tensors, self.scalars, self.reduce = tensors, scalars, reduce


def _bind(func, node: Node) -> dict:
    """Schema argument name -> FX argument (defaults filled)."""
    schema = func._schema
    a = {}
    args = list(node.args)
    for i, arg in enumerate(schema.arguments):
        if arg.kwarg_only:
            if arg.name in node.kwargs:
                a[arg.name] = node.kwargs[arg.name]
            elif arg.has_default_value():
                a[arg.name] = arg.default_value
            continue
        if i < len(args):
            a[arg.name] = args[i]
        elif arg.name in node.kwargs:
            a[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            a[arg.name] = arg.default_value
        else:
            raise LoweringError(f"missing argument {arg.name}")
    return a


def _classify(node: Node, operand_ok=None):
    """An _Elementwise for a fusible node, else None (runs eagerly). `operand_ok(node)` (row
    regions) replaces the rule that tensor operands have the node's own size."""
    from ..lower import elementwise as ew

    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    func = node.target
    name = func.name()
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype not in _FUSIBLE_DTYPES:
        return None
    if func._schema.is_mutable or name.endswith("_") or ".out" in name:
        return None
    if val.device.type != "neuron" or not _is_contig(val):
        return None
    a = _bind(func, node)
    if name in _REDUCE and operand_ok is None:
        return _classify_reduce(node, name, a, val)
    if name == "aten::full_like":
        return _classify_full_like(node, a, val) if operand_ok is None else None
    entry = ew.OPS.get(name) or ew.OPS.get(name.split(".")[0])
    if entry is None or len(entry) > 3:
        return None
    size = _sizes_key(val)
    fake = {}
    sig = []
    cpu_scalars: set = set()
    for nm, v in a.items():
        if isinstance(v, Node):
            mv = v.meta.get("val")
            if isinstance(mv, torch.Tensor):
                if mv.device.type == "cpu" and mv.dim() == 0 and mv.dtype in _FUSIBLE_DTYPES:
                    # a CPU scalar tensor (an optimizer's bias correction): a kernel scalar
                    fake[nm] = _MetaArg((), mv.dtype)
                    cpu_scalars.add(nm)
                    sig.append((nm, fake[nm]))
                    continue
                if mv.device != val.device or mv.dtype not in _FUSIBLE_DTYPES:
                    return None
                one = _sizes_key(mv) == (1,)
                if operand_ok is not None:
                    if not operand_ok(v):
                        return None
                elif not one and (_sizes_key(mv) != size or not _is_contig(mv)
                                or tuple(mv.shape) != tuple(val.shape)):
                    return None   # broadcast or strided operand: the eager kernel handles it
                fake[nm] = _MetaArg((1,) * mv.dim(), mv.dtype)
            elif isinstance(mv, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
                fake[nm] = _concrete(mv)
                sig.append((nm, "node", type(mv).__name__))
                continue
            else:
                return None
        elif isinstance(v, (list, tuple)) and any(isinstance(x, Node) for x in v):
            return None
        else:
            fake[nm] = v
            # (1 == 1.0 == True: the type is part of the key; a float by its repr, -0.0)
            sig.append((nm, type(v).__name__, repr(v) if isinstance(v, float) else v))
            continue
        sig.append((nm, fake[nm]))
    if callable(entry[0]) and any(isinstance(v, Node) and not isinstance(
            v.meta.get("val"), torch.Tensor) for v in a.values()):
        return None   # the template depends on a value only known at run time
    spec = _spec_of(name, entry, fake, tuple(sig), frozenset(cpu_scalars), val.dtype)
    if spec is None:
        return None
    tensors = tuple(a[nm] for nm in spec.tensors)
    if not tensors or any(not isinstance(t, Node) for t in tensors):
        return None   # (fill, full_like: no operand to take the size from; eager allocates)
    scalars = tuple(a[nm] for nm in spec.scalars)
    return _Elementwise(node, name, spec, tensors, scalars)


_SPECS: dict = {}


class _MetaArg(NamedTuple):
    """A tensor operand as the spec builder sees it: a meta tensor of this shape and dtype."""
    shape: tuple
    dtype: torch.dtype


def _spec_of(name, entry, fake, sig, cpu_scalars, dtype):
    """The fused-kernel spec of one elementwise node, memoized by what it depends on: the op,
    operand kinds (a tensor's rank and dtype, a scalar's type or a constant's value) and the
    result dtype. Building one (meta tensors, the op's template) cost ~3 ms per node: a GPT-2
    step's graphs have ~700 such nodes of a few dozen kinds (re-paid by every warm process)."""
    from ..lower import elementwise as ew

    try:
        key = (name, sig, cpu_scalars, dtype)
        hash(key)
    except TypeError:    # an unhashable constant argument: build without memo
        key = None
    if key is not None and key in _SPECS:
        return _SPECS[key]
    fake = {nm: torch.empty(v.shape, dtype=v.dtype, device="meta")
            if isinstance(v, _MetaArg) else v for nm, v in fake.items()}
    spec = None
    template, rule = entry[0], entry[1]
    try:
        if callable(template):
            template = template(fake)
        names = ew._template_names(template, tuple(fake))
        spec = ew._build_spec(name, template, rule, entry[2] if len(entry) > 2 else {}, fake,
                              names, tuple(nm in cpu_scalars for nm in names), dtype)
    except NotImplementedError:
        spec = None
    except Exception:
        if not callable(entry[0]):
            raise
        spec = None
    if key is not None:
        _SPECS[key] = spec
    return spec


_NP = {torch.float32: "np.float32", torch.float64: "np.float64", torch.int64: "np.int64",
       torch.int32: "np.int32"}


def _classify_full_like(node, a, val):
    """full_like(x, v): a constant of x's size. x is an operand the expression never loads, so
    the node stays in x's loop (lerp's decomposition builds its weight this way)."""
    x, v = a.get("self"), a.get("fill_value")
    t = _NP.get(val.dtype)
    if t is None or not isinstance(x, Node) or isinstance(v, Node):
        return None
    xv = x.meta.get("val")
    if not isinstance(xv, torch.Tensor) or xv.device != val.device or tuple(xv.shape) != tuple(
            val.shape) or not _is_contig(xv) or not isinstance(v, (int, float, bool)):
        return None

    class _S:
        expr, loads, scalar_casts, store, flops, special = "c0", (t,), (t,), t + "({})", 1, False

    return _Elementwise(node, "aten::full_like", _S, (x,), (v,))


def fill_as_full_like(gm: GraphModule) -> int:
    """fill.Scalar(empty_like(x), v), the empty_like used by nothing else -> full_like(x, v)
    with empty_like's keywords: the same tensor, now a constant of x's size a flat group
    computes in registers (silu's backward builds its `1 - sigmoid` this way: two eager nodes
    per MLP, ~60-120 us each, in a Llama training step). Returns the number rewritten."""
    aten = torch.ops.aten
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.fill.Scalar:
            continue
        empty = node.args[0] if node.args else None
        value = node.args[1] if len(node.args) > 1 else node.kwargs.get("value")
        if not isinstance(empty, Node) or empty.target is not aten.empty_like.default or len(
                empty.users) != 1 or not isinstance(value, (int, float, bool)) or node.kwargs:
            continue
        with gm.graph.inserting_before(node):
            full = gm.graph.call_function(aten.full_like.default, (empty.args[0], value),
                                          dict(empty.kwargs))
        full.meta.update(node.meta)
        node.replace_all_uses_with(full)
        gm.graph.erase_node(node)
        gm.graph.erase_node(empty)
        done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _classify_reduce(node, name, a, val):
    x = a.get("self")
    if not isinstance(x, Node) or a.get("dtype") is not None:
        return None
    xv = x.meta.get("val")
    if not isinstance(xv, torch.Tensor) or xv.dtype not in (torch.float32, torch.float64):
        return None
    if xv.dtype != val.dtype or not _is_contig(xv) or _sizes_key(val) != (1,):
        return None
    if _sizes_key(xv) == (1,) or _sizes_key(xv) == (0,):
        return None
    t = "np.float32" if xv.dtype == torch.float32 else "np.float64"

    class _S:
        expr, loads, scalar_casts, store, flops, special = "x0", (t,), (), t + "({})", 1, False

    return _Elementwise(node, name, _S, (x,), (), reduce=_REDUCE[name])


# ---------------------------------------------------------------------------------------------
# partition
# ---------------------------------------------------------------------------------------------

class Group:
    """One fused kernel: loops of nodes, the buffers it reads and the values it stores."""

    def __init__(self) -> None:
        self.members: list[_Elementwise] = []
        self.loops: list[list] = []       # [size_key, [member index...]]
        self.loop_of: dict = {}           # node -> loop index
        self.reduced: set = set()         # nodes that are a reduction's result in this group
        self.pos: dict = {}               # node -> position in its loop
        self.writeback: dict = {}         # src node -> (graph input node, copy_ node)

    def accepts(self, el: _Elementwise) -> bool:
        return len(self.members) < MAX_OPEN_NODES

    def add(self, el: _Elementwise) -> None:
        size = _sizes_key(el.tensors[0].meta["val"]) if el.reduce else _sizes_key(
            el.node.meta["val"])
        # the earliest loop the node may run in: with an operand of its size computed in loop
        # L it may join L (the value stays in a register); a reduction's result or a value of
        # another size is complete only after its loop, so the node runs in a later one
        lo = 0
        for t in el.tensors:
            li = self.loop_of.get(t)
            if li is None:
                continue
            same = t not in self.reduced and _sizes_key(t.meta["val"]) == size
            lo = max(lo, li if same else li + 1)
        # join a loop of its size that it is related to (computes an operand or reads the same
        # input): unrelated chains (one per parameter) stay separate loops, then kernels
        ins = set(el.tensors)
        target = next((i for i in range(lo, len(self.loops)) if self.loops[i][0] == size
                       and (self.loops[i][2] & ins)), None)
        if target is None:
            self.loops.append([size, [], set()])
            target = len(self.loops) - 1
        self.pos[el.node] = len(self.loops[target][1])
        self.loops[target][1].append(len(self.members))
        self.loops[target][2].update(ins)
        self.loops[target][2].add(el.node)
        self.loop_of[el.node] = target
        if el.reduce:
            self.reduced.add(el.node)
        self.members.append(el)

    def split(self) -> list:
        """Independent loops as separate groups: the per-parameter chains of an optimizer step
        then have one spec (one Numba compile) instead of one long kernel per model."""
        parent = list(range(len(self.loops)))

        def find(i):
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for el in self.members:
            a = self.loop_of[el.node]
            for t in el.tensors:
                b = self.loop_of.get(t)
                if b is not None and b != a:
                    parent[find(a)] = find(b)
        # a loop reading an input's old memory stays with the loop storing into that input
        # (absorb_copy: in an earlier loop): as separate groups, ordered by their first loops,
        # the store could run first ('t = a.flatten() * a.flatten(); b = a > a; a.mul_(0.5)
        # .add_(b)': t's loop was split off after the store's)
        for src, (dst, copy) in self.writeback.items():
            a = self.loop_of[src]
            for u in _readers(dst, copy):
                b = self.loop_of.get(u)
                if b is not None and b != a:
                    parent[find(a)] = find(b)
        comps: dict = {}
        for el in self.members:
            comps.setdefault(find(self.loop_of[el.node]), []).append(el)
        if len(comps) == 1 and len(self.members) <= MAX_GROUP_NODES:
            return [self]
        out = []
        for root in sorted(comps, key=lambda r: min(i for i in range(len(self.loops))
                                                    if find(i) == r)):
            for part in self._runs(comps[root]):
                g = Group()
                for el in part:
                    g.add(el)
                    if el.node in self.writeback:
                        g.writeback[el.node] = self.writeback[el.node]
                out.append(g)
        return out

    def _runs(self, members: list) -> list:
        """One chain's members (in member order) as kernels of at most MAX_GROUP_NODES nodes,
        each a run of whole loops in loop order (a longer loop stays one kernel). Loops run in
        index order and a node reads only values of its own or earlier loops, so the runs keep
        every dependence; an absorbed copy_'s other readers of the input are in earlier loops
        or before it in its loop (absorb_copy), so they run before the run that stores it."""
        if len(members) <= MAX_GROUP_NODES:
            return [members]
        by_loop: dict = {}
        for el in members:
            by_loop.setdefault(self.loop_of[el.node], []).append(el)
        runs: list = [[]]
        for li in sorted(by_loop):
            loop = by_loop[li]
            if runs[-1] and len(runs[-1]) + len(loop) > MAX_GROUP_NODES:
                runs.append([])
            runs[-1].extend(loop)
        return runs

    def absorb_copy(self, node: Node, order: dict) -> bool:
        """copy_(input, value) at the end of a functional graph (an optimizer's new parameter):
        the kernel stores `value` straight into the input's memory instead of a new buffer
        plus a copy kernel. Only when nothing reads the input's old value after the store:
        every other reader is a member of an earlier loop, or of the same loop before it."""
        if len(node.args) != 2 or node.kwargs:
            return False
        dst, src = node.args
        if not isinstance(dst, Node) or dst.op != "placeholder" or src not in self.loop_of:
            return False
        if src in self.reduced or src in self.writeback or any(
                d is dst for d, _ in self.writeback.values()):
            return False
        dv, sv = dst.meta.get("val"), src.meta.get("val")
        if not (isinstance(dv, torch.Tensor) and isinstance(sv, torch.Tensor)):
            return False
        if dv.dtype != sv.dtype or dv.device != sv.device or tuple(dv.shape) != tuple(
                sv.shape) or not _is_contig(dv):
            return False
        ls = self.loop_of[src]
        for u in _readers(dst, node):
            if order.get(u, 1 << 30) > order[node]:
                return False            # read after the copy in program order
            if u in self.loop_of:
                lu = self.loop_of[u]
                if lu > ls or (lu == ls and self.pos[u] > self.pos[src]):
                    return False
        for u in src.users:
            if u is not node and u not in self.loop_of:
                return False            # the value is also read outside the kernel
        self.writeback[src] = (dst, node)
        return True


def _readers(dst: Node, copy: Node) -> list:
    """The nodes that read input `dst`'s memory, other than `copy`: its users and, through
    every view of it (a node sharing its storage: `w.view(-1)`, `w.t()`, `w[0]`), the views'
    users. A later loop reading `w.view(-1)` would see a store absorbed into an earlier one
    (`y = w * 0.9 + x; z = w.view(-1) * 2; w.copy_(y)`: z was 2 * the new w)."""
    mem = _storage_of(dst)
    readers, seen, todo = [], {dst, copy}, [dst]
    while todo:
        for u in todo.pop().users:
            if u in seen:
                continue
            seen.add(u)
            readers.append(u)
            if mem is not None and u.op == "call_function" and _movable(u) and \
                    _storage_of(u) == mem:
                todo.append(u)          # a view of dst: its readers read dst
    return readers


def partition(gm: GraphModule, regions=()) -> list:
    """[("group", Group) | ("node", Node) | ("rows", Region)] in program order.

    A node that is not fusible but reads nothing the open group computes (a view, a matmul of
    other values) is hoisted before the group instead of closing it, so one chain stays one
    kernel across the views and matmuls AOTAutograd interleaves. Mutating nodes are never moved.
    Row regions (rows.py: last-dim reductions, broadcast operands, matmul epilogues) are found
    first (by the caller, program.py, which passes them in: rows.py builds on this module);
    a region runs as one step where its last member stood.
    """
    steps: list = []
    group = None
    hoisted: list = []
    region_of = {n: r for r in regions for n in r.order}

    def close():
        nonlocal group
        steps.extend(hoisted)
        hoisted.clear()
        if group is not None:
            steps.extend(("group", g) for g in group.split())
            group = None

    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):   # get_attr: Program's constants
            continue
        reg = region_of.get(node)
        if reg is not None:
            if node is reg.last:
                reads = {n for m in reg.order for n in m.all_input_nodes
                         if n not in reg.members}
                if group is not None and not any(n in group.loop_of for n in reads) and \
                        not _reads_written(reads, group):
                    hoisted.append(("rows", reg))
                else:
                    close()
                    steps.append(("rows", reg))
            continue
        if (group is not None and node.target is aten.copy_.default
                and not _region_reads_later(node, region_of, order)
                and group.absorb_copy(node, order)):
            continue
        el = _classify(node) if node.op == "call_function" else None
        if el is not None:
            if group is not None and not group.accepts(el):
                close()
            if group is None:
                group = Group()
            group.add(el)
            continue
        if group is not None and not any(n in group.loop_of for n in node.all_input_nodes) and (
                _movable(node) or _movable_copy(node, group)):
            hoisted.append(("node", node))
            continue
        close()
        steps.append(("node", node))
    close()
    return steps


def _reads_written(reads: set, group: Group) -> bool:
    """Does a row region read memory the open group stores into (an absorbed copy_'s input),
    through the input's node or any view of it? Then it runs after the group."""
    mems = {_storage_of(d) for d, _ in group.writeback.values()} - {None}
    return any(d in reads for d, _ in group.writeback.values()) or bool(mems) and any(
        _storage_of(n) in mems for n in reads)


def _region_reads_later(copy: Node, region_of: dict, order: dict) -> bool:
    """copy_(input, value) may not be absorbed (stored when the group runs) while a row region
    that reads the input's old value (directly or through a view) still has to run: it runs
    where its last member stands, which may be after the group."""
    dst = copy.args[0] if copy.args else None
    if not isinstance(dst, Node):
        return False
    for u in _readers(dst, copy):
        reg = region_of.get(u)
        if reg is not None and order.get(reg.last, 1 << 30) > order[copy]:
            return True
    return False


def _movable_copy(node: Node, group: Group) -> bool:
    """A copy_ into memory the open group neither reads nor writes (an optimizer's CPU step
    counter) may run before the group. The group may read the memory through a view node
    (`as_strided(arg0)` of a synthetic base: `t4 = a + 1; t3.add_(t0)` with t3 a view of a),
    so the check is by storage, not by node."""
    if node.target is not aten.copy_.default or not node.args:
        return False
    dst = node.args[0]
    if not isinstance(dst, Node):
        return False
    touched = set()
    for el in group.members:
        touched.update(el.tensors)
    touched.update(d for d, _ in group.writeback.values())
    if dst in touched:
        return False
    mem = _storage_of(dst)
    return mem is not None and all(_storage_of(t) != mem for t in touched)


def _storage_of(node):
    """The memory a node's value lives in (its fake tensor's storage), or None."""
    from torch.multiprocessing.reductions import StorageWeakRef

    val = node.meta.get("val") if isinstance(node, Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return StorageWeakRef(val.untyped_storage())
    except Exception:    # noqa: BLE001 - no storage to compare (a symbolic or sparse value)
        return None


def _movable(node: Node) -> bool:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return not t._schema.is_mutable and not t._schema.name.endswith("_") and \
            torch.Tag.nondeterministic_seeded not in t.tags
    return t in (operator.getitem, operator.mul, operator.add, operator.sub,
                 operator.floordiv, torch.sym_sum)
