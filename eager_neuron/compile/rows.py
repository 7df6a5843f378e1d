"""Row regions: reductions over the last dimension with their prologue and epilogue, broadcast
operands and matmul epilogues, each compiled into one kernel.

A region has a frame shape F = (*lead, C): R = prod(lead) rows of C elements. Every member is
either *full* (a value per (r, c)) or *row* (a value per r: a last-dim sum/mean/amax/amin, or
an elementwise op of row values). External operands of any shape that broadcasts to the frame
(a bias `[C]`, a mask `[1, 1, T, T]`, a row statistic `[R, 1]`, a scalar) are read through
2-D strided views, so broadcasting costs no copy. A matmul (mm/addmm) whose product is the
frame is computed first in the same kernel (BLAS through np.dot) and its epilogue reads it.

The kernel, per row r (rows in parallel for large frames):

    stage 0: row values computable from inputs
    pass 0:  for c in range(C): full values in registers, accumulate reductions, store
    stage 1: reductions of pass 0 finalized, row values that need them
    pass 1:  ... (softmax is 2 passes + a storing pass, layer norm 3)

A full value needed in several passes is recomputed from its loads (no row scratch), so only
values read after the region are written to memory.

>>> import torch, eager_neuron
>>> f = torch.compile(lambda x: torch.softmax(x * 2, -1), backend="neuron")
>>> x = torch.randn(3, 5, device="neuron")
>>> bool(torch.allclose(f(x).cpu(), torch.softmax(x.cpu() * 2, -1), atol=1e-6))
True
"""

from __future__ import annotations

import math

import torch
from torch.fx import GraphModule, Node

from .codegen import _bind, _classify, _is_contig

aten = torch.ops.aten
_RED = {"aten::sum.dim_IntList": "sum", "aten::mean.dim": "mean", "aten::amax": "amax",
        "aten::amin": "amin"}
# column totals (every leading dim reduced): rowstep accumulates them across rows
_COLRED = {"aten::sum.dim_IntList": "sum", "aten::mean.dim": "mean"}
_IDENT = {"aten::detach", "aten::alias", "aten::clone"}
_MM = {"aten::mm", "aten::addmm"}
_FLOATS = (torch.float32, torch.float64)
MAX_NODES = 96      # Numba compile time grows with the kernel body
PARALLEL_MIN = 1 << 15


def _key(shape) -> tuple:
    return tuple(str(s.node.expr) if isinstance(s, torch.SymInt) else int(s) for s in shape)


def _val(n):
    v = n.meta.get("val") if isinstance(n, Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _bcast_ok(s: tuple, o: tuple) -> bool:
    """Does a tensor of shape key s broadcast to shape key o without changing o?"""
    if len(s) > len(o):
        return False
    return all(a == 1 or a == b for a, b in zip(s[::-1], o[::-1]))


class Member:
    __slots__ = ("node", "kind", "cls", "form", "spec", "operands", "scalars", "red", "idx",
                 "avail", "mm")

    def __init__(self, node, kind, cls, form):
        self.node, self.kind, self.cls, self.form = node, kind, cls, form
        self.spec, self.operands, self.scalars, self.red, self.mm = None, [], (), None, None


class Frame:
    def __init__(self, F: tuple):
        self.F = F
        self.lead = F[:-1]
        self.rowkd = self.lead + (1,)

    def form(self, shape_key) -> str | None:
        if shape_key == self.F:
            return "full"
        if shape_key == self.rowkd:
            return "rowkd"
        if shape_key == self.lead:
            return "rowflat"
        return None


def classify(node: Node, fr: Frame, members: dict) -> Member | None:
    """A Member for `node` in frame `fr` (members: node -> Member already in the region)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    val = _val(node)
    name = node.target.name()
    if val is None or val.device.type != "neuron" or not (
            name == "aten::expand" or _is_contig(val)):
        return None
    if name in _COLRED:
        col = _classify_col(node, name, fr, members, val)
        if col is not None:
            return col
    form = fr.form(_key(val.shape))
    if form is None:
        return None

    def operand_cls(n, out_form):
        """('m', member) | ('b', mode) for an operand node, None when it does not fit."""
        v = _val(n)
        if v is None:
            return None
        m = members.get(n)
        sk = _key(v.shape)
        if m is not None and m.cls == "col":
            return None          # a column total exists only when the kernel ends
        if m is not None:
            if out_form == "full":
                fits = sk == fr.F or m.form == "rowkd" or all(s == 1 for s in sk)
            else:
                o = fr.rowkd if out_form == "rowkd" else fr.lead
                fits = m.cls == "row" and (sk == o or all(s == 1 for s in sk))
            return ("m", m) if fits else None
        if v.device != val.device:
            return None
        if out_form == "full":
            return ("b", "full") if _bcast_ok(sk, fr.F) else None
        o = fr.rowkd if out_form == "rowkd" else fr.lead
        if not _bcast_ok(sk, o):
            return None
        return ("b", "rowkd" if out_form == "rowkd" else "rowflat")

    if name in _RED:
        a = _bind(node.target, node)
        x, dims = a.get("self"), a.get("dim")
        xv = _val(x)
        if xv is None or xv.dtype not in _FLOATS or val.dtype != xv.dtype or a.get("dtype"):
            return None
        if _key(xv.shape) != fr.F or not isinstance(dims, (list, tuple)) or len(dims) != 1:
            return None
        if not isinstance(dims[0], int) or dims[0] % len(fr.F) != len(fr.F) - 1:
            return None
        if form == "full" and fr.F[-1] != 1:
            return None
        oc = operand_cls(x, "full")
        if oc is None:
            return None
        m = Member(node, "red", "row", form)
        m.red = _RED[name]
        m.operands = [(x, oc)]
        return m
    if name in _IDENT:
        a = _bind(node.target, node)
        x = a.get("self")
        xv = _val(x)
        if xv is None or x not in members or xv.dtype != val.dtype:
            return None
        if a.get("memory_format") not in (None, torch.contiguous_format,
                                          torch.preserve_format):
            return None
        src = members[x]
        if _key(xv.shape) != _key(val.shape):
            return None
        m = Member(node, "ident", src.cls, form)
        m.operands = [(x, ("m", src))]
        return m
    if name == "aten::expand":
        x = node.args[0]
        src = members.get(x)
        if src is None or src.cls != "row" or form != "full" or src.form != "rowkd":
            return None
        m = Member(node, "ident", "row", form)
        m.operands = [(x, ("m", src))]
        return m
    if name in _MM:
        m = _classify_mm(node, name, fr, form, val)
        if m is not None and (m.mm[0] in members or m.mm[1] in members):
            return None      # the product's operands are read from memory by BLAS
        return m
    # elementwise: the existing classifier with a broadcasting operand rule
    el = _classify(node, operand_ok=lambda n: operand_cls(n, form) is not None)
    if el is None:
        return None
    ops = []
    for t in el.tensors:
        oc = operand_cls(t, form)
        if oc is None:
            return None
        ops.append((t, oc))
    cls = "full" if form == "full" and any(
        (oc[0] == "m" and oc[1].cls == "full") or (oc[0] == "b" and oc[1] == "full")
        for _, oc in ops) else "row"
    if form != "full" and cls == "full":
        return None
    m = Member(node, "ew", cls, form)
    m.spec, m.operands, m.scalars = el.spec, ops, el.scalars
    return m


def _classify_col(node, name, fr, members, val):
    """A float sum/mean over every leading dimension of a frame-shaped value (a bias gradient,
    `sum(0)` of [R, C]; a norm's weight gradient, `sum([0, 1])` of [B, T, C]): one total per
    column, accumulated in float64 across the kernel's rows (a serial kernel) and stored when
    it ends, shape [C] or, keepdim, [1, ..., 1, C]. None when it is another reduction."""
    F = fr.F
    nd = len(F)
    if nd < 2 or not all(isinstance(s, int) for s in F) or F[-1] == 0:
        return None
    a = _bind(node.target, node)
    x, dims = a.get("self"), a.get("dim")
    xv = _val(x)
    if xv is None or xv.dtype not in _FLOATS or val.dtype != xv.dtype or a.get("dtype"):
        return None
    if _key(xv.shape) != F or not isinstance(dims, (list, tuple)) or not dims:
        return None
    if not all(isinstance(d, int) for d in dims) or sorted({d % nd for d in dims}) != list(
            range(nd - 1)) or len(dims) != nd - 1:
        return None
    keep = bool(a.get("keepdim", False))
    if _key(val.shape) != ((1,) * (nd - 1) + (F[-1],) if keep else (F[-1],)):
        return None
    src = members.get(x)
    if src is not None:
        if src.cls != "full":
            return None
        oc = ("m", src)
    elif xv.device == val.device and _key(xv.shape) == F:
        oc = ("b", "full")
    else:
        return None
    m = Member(node, "colred", "col", "colkd" if keep else "col")
    m.red = _COLRED[name]
    m.operands = [(x, oc)]
    return m


def _classify_mm(node, name, fr, form, val):
    """mm(a, b) / addmm(bias, a, b, beta, alpha): the product is computed into the frame first."""
    if form != "full" or len(fr.F) != 2 or val.dtype not in _FLOATS:
        return None
    a = _bind(node.target, node)
    x, w = a.get("self") if name == "aten::mm" else a.get("mat1"), a.get("mat2")
    for t in (x, w):
        tv = _val(t)
        if tv is None or tv.dtype != val.dtype or tv.device != val.device or tv.dim() != 2:
            return None
    m = Member(node, "mm", "full", form)
    bias = a.get("self") if name == "aten::addmm" else None
    beta, alpha = (a.get("beta", 1), a.get("alpha", 1)) if bias is not None else (1, 1)
    if not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in (beta, alpha)):
        return None
    if bias is not None:
        bv = _val(bias)
        if bv is None or bv.dtype != val.dtype or bv.device != val.device or not _bcast_ok(
                _key(bv.shape), fr.F):
            return None
    m.mm = (x, w, bias, float(beta), float(alpha))
    m.operands = [(bias, ("b", "full"))] if bias is not None and beta != 0 else []
    return m


# ---------------------------------------------------------------------------------------------
# regions
# ---------------------------------------------------------------------------------------------

class Region:
    def __init__(self, fr: Frame):
        self.fr = fr
        self.members: dict = {}      # node -> Member, insertion = topological order by build
        self.order: list = []

    @property
    def last(self):
        return self.order[-1]


def _seed_frame(node: Node):
    """The frame a node starts a region with (a last-dim reduction, a broadcasting elementwise
    op, a matmul), else None."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    name = node.target.name()
    val = _val(node)
    if val is None or val.device.type != "neuron" or val.dim() == 0:
        return None
    if name in _RED:
        x = node.args[0] if node.args else None
        xv = _val(x)
        return Frame(_key(xv.shape)) if xv is not None and xv.dim() >= 1 else None
    if name in _MM:
        return Frame(_key(val.shape)) if val.dim() == 2 else None
    if name == "aten::expand" or name in _IDENT:
        return None
    ins = [_val(n) for n in node.all_input_nodes]
    if any(v is not None and v.device == val.device and _key(v.shape) != _key(val.shape)
           and v.numel() != 1 for v in ins):
        return Frame(_key(val.shape))   # a broadcast operand: bias, mask, row statistic
    if _is_contig(val) and any(v is not None and v.device == val.device and _strided(v)
                               for v in ins):
        return Frame(_key(val.shape))   # a strided operand (an LSTM gate's chunk of the gates)
    return None


def _strided(v) -> bool:
    """A non-contiguous operand (a chunk, a slice) that a row kernel reads through an
    (A, B, C) view: unit stride in the last dimension, the leading ones in at most two runs of
    one stride each. The flat fused groups take only contiguous operands."""
    try:
        shape, strides = tuple(v.shape), tuple(v.stride())
    except Exception:    # noqa: BLE001 - no strides (a sparse or opaque value)
        return False
    if not shape or any(not isinstance(s, int) for s in shape + strides):
        return False     # symbolic: never int() them (that would specialize a dynamic size)
    if math.prod(shape) <= 1 or v.is_contiguous():
        return False
    if shape[-1] != 1 and strides[-1] != 1:
        return False
    runs: list = []
    for size, st in zip(reversed(shape[:-1]), reversed(strides[:-1])):
        if size == 1:
            continue
        if runs and st == runs[-1][0] * runs[-1][1]:
            runs[-1][0] *= size
        else:
            runs.append([size, st])
    return len(runs) <= 2


def find_regions(gm: GraphModule) -> list:
    """Regions in program order; each node belongs to at most one."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    taken: dict = {}
    regions = []
    for seed in gm.graph.nodes:
        if seed in taken:
            continue
        fr = _seed_frame(seed)
        if fr is None or len(fr.F) == 0 or fr.F[-1] == 0:
            continue
        reg = _grow(seed, fr, taken, order)
        if reg is None:
            continue
        for n in reg.order:
            taken[n] = reg
        regions.append(reg)
    return regions


def _grow(seed, fr, taken, order):
    """Grow a region around `seed`; prologue members whose values are read outside before the
    region's end are excluded (they run earlier, on their own), consumers are truncated."""
    exclude: set = set()
    for _ in range(6):
        got = _grow_once(seed, fr, taken, order, exclude)
        if got is None:
            return None
        nodes, members, bad = got
        mset = set(nodes)
        # an expand is a register value only: one read outside runs eagerly instead
        bad |= {n for n in nodes if members[n].kind == "ident" and n.target is
                aten.expand.default and any(u not in mset for u in n.users)}
        if not bad:
            break
        exclude |= bad
    else:
        return None
    nodes = _truncate(nodes, members, order)
    if seed not in nodes:
        return None
    members = {n: members[n] for n in nodes}
    if not any(m.kind in ("red", "mm", "colred") or any(
            oc[0] == "b" and (oc[1] != "full" or _key(_val(t).shape) != fr.F
                              or _strided(_val(t)))
            for t, oc in m.operands) for m in members.values()):
        return None    # plain same-size elementwise: the flat fused groups handle it
    reg = Region(fr)
    reg.members = members
    reg.order = nodes
    return reg


def _grow_once(seed, fr, taken, order, exclude):
    members: dict = {}
    cand = set()

    def producers(n, depth=0):
        ins = n.all_input_nodes
        if isinstance(n.target, torch._ops.OpOverload) and n.target.name() in _MM:
            ins = [p for p in ins if p not in _mm_args(n)]     # BLAS reads those from memory
        for p in ins:
            if p in taken or p in cand or p in exclude or p.op != "call_function" or depth > 24:
                continue
            cand.add(p)
            producers(p, depth + 1)
    producers(seed)
    for p in sorted(cand, key=order.get):
        if len(members) >= MAX_NODES // 2:
            break
        pm = classify(p, fr, members)
        if pm is not None:
            members[p] = pm
    # keep only producers that reach the seed through members (a prologue, not a stranger)
    need = {seed}
    for p in sorted(members, key=order.get, reverse=True):
        if any(u in need for u in p.users):
            need.add(p)
    keep = [p for p in sorted(members, key=order.get) if p in need]
    members = {}
    for p in keep:           # reclassify: operands that left are now external
        pm = classify(p, fr, members)
        if pm is not None:
            members[p] = pm
    m = classify(seed, fr, members)
    if m is None:
        return None
    members[seed] = m
    # consumers in program order (a heap): every member feeding a node is settled before it
    import heapq

    heap: list = []
    seen: set = set()

    def push_users(n):
        for u in n.users:
            if u not in seen and u not in members and u not in taken and u not in exclude \
                    and u.op == "call_function":
                seen.add(u)
                heapq.heappush(heap, (order[u], id(u), u))
    push_users(seed)
    while heap and len(members) < MAX_NODES:
        _, _, u = heapq.heappop(heap)
        um = classify(u, fr, members)
        if um is not None:
            members[u] = um
            push_users(u)
    nodes = sorted(members, key=order.get)
    # a prologue member read outside before the seed's position cannot wait for the region
    s_at = order[seed]
    bad = set()
    for n in nodes:
        if order[n] >= s_at:
            continue
        if any(u not in members and order.get(u, 1 << 30) < s_at for u in n.users):
            bad.add(n)
    if bad:   # with everything they depend on inside the region (those must run before too)
        stack = list(bad)
        while stack:
            n = stack.pop()
            for p in n.all_input_nodes:
                if p in members and p not in bad:
                    bad.add(p)
                    stack.append(p)
    return nodes, members, bad


def _truncate(nodes, members, order):
    """The longest prefix (program order) that can run as one step at its last member: no
    outside node between the first and last member reads a member, and no mutation in
    between (a prefix stays consistent: inputs precede their users)."""
    while nodes:
        last = order[nodes[-1]]
        first = order[nodes[0]]
        cut = None
        mset = set(nodes)
        for n in nodes:
            for u in n.users:
                if u not in mset and order.get(u, 1 << 30) < last:
                    cut = order[u] if cut is None else min(cut, order[u])
        if cut is None:
            for n in nodes[0].graph.nodes:
                i = order[n]
                if first < i < last and n not in mset and n.op == "call_function" and (
                        isinstance(n.target, torch._ops.OpOverload) and (
                        n.target._schema.is_mutable or torch.Tag.nondeterministic_seeded
                        in n.target.tags)):
                    cut = i
                    break
        if cut is None:
            return nodes
        nodes = [n for n in nodes if order[n] < cut]
    return nodes


def split_var_mean(gm: GraphModule) -> int:
    """var_mean(x, [-1], correction=0|c, keepdim=True) -> mean, (x - mean)^2, mean|sum/(C-c):
    last-dim reductions a row region fuses (layer norm's forward)."""
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.var_mean.correction:
            continue
        a = _bind(node.target, node)
        x, dims, corr, keep = a.get("self"), a.get("dim"), a.get("correction"), a.get("keepdim")
        xv = _val(x)
        if xv is None or xv.dtype not in _FLOATS or not keep or not isinstance(
                dims, (list, tuple)) or len(dims) != 1 or xv.dim() == 0:
            continue
        if dims[0] % xv.dim() != xv.dim() - 1:
            continue
        c = xv.shape[-1]
        corr = 1 if corr is None else corr
        if not isinstance(corr, (int, float)) or (corr != 0 and not isinstance(c, int)):
            continue
        if corr != 0 and c - corr <= 0:
            continue
        users = list(node.users)
        if any(u.target is not __import__("operator").getitem for u in users):
            continue
        outs = {u.args[1]: u for u in users}
        ref = next(iter(outs.values()), None)
        if ref is None:
            continue
        rv = _val(ref)
        g = gm.graph
        with g.inserting_before(node):
            mean = g.call_function(aten.mean.dim, (x, [dims[0]], True))
            d = g.call_function(aten.sub.Tensor, (x, mean))
            sq = g.call_function(aten.mul.Tensor, (d, d))
            if corr == 0:
                var = g.call_function(aten.mean.dim, (sq, [dims[0]], True))
            else:
                s = g.call_function(aten.sum.dim_IntList, (sq, [dims[0]], True))
                var = g.call_function(aten.div.Tensor, (s, float(c - corr)))
        for n, v in ((mean, rv), (d, xv), (sq, xv), (var, rv)):
            n.meta.update(node.meta)
            n.meta["val"] = v
        if corr != 0:
            s.meta.update(node.meta)
            s.meta["val"] = rv
        if 0 in outs:
            outs[0].replace_all_uses_with(var)
            g.erase_node(outs[0])
        if 1 in outs:
            outs[1].replace_all_uses_with(mean)
            g.erase_node(outs[1])
        g.erase_node(node)
        done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _mm_args(node):
    a = _bind(node.target, node)
    return (a["self"] if node.target is aten.mm.default else a["mat1"]), a["mat2"]
