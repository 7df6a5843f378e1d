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

import hashlib
import math

import numpy as np
import torch
from torch.fx import GraphModule, Node

from .codegen import _bind, _classify, _is_contig, _stack_line

aten = torch.ops.aten
_RED = {"aten::sum.dim_IntList": "sum", "aten::mean.dim": "mean", "aten::amax": "amax",
        "aten::amin": "amin"}
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
    return None


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
    if not any(m.kind in ("red", "mm") or any(
            oc[0] == "b" and (oc[1] != "full" or _key(_val(t).shape) != fr.F)
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


# ---------------------------------------------------------------------------------------------
# the step: buffers, source, run
# ---------------------------------------------------------------------------------------------

class RowStep:
    """One region -> one kernel: its source, buffer plan and how to fill its arguments."""

    def __init__(self, reg: Region, users_outside) -> None:
        fr = reg.fr
        self.fr = fr
        self.nodes = list(reg.order)
        mset = set(self.nodes)
        members = [reg.members[n] for n in self.nodes]
        for k, m in enumerate(members):
            m.idx = k
        self.bufs: list = []       # ("in", node, mode) | ("out", node, form) | ("mm", node)
        idx: dict = {}

        def buf(kind, node, mode):
            key = (kind, node, mode)
            if key not in idx:
                idx[key] = len(self.bufs)
                self.bufs.append(key)
            return idx[key]

        # 1. availability: the pass after which a member's value exists
        for m in members:
            ins = [oc[1].avail for _, oc in m.operands if oc[0] == "m"]
            base = max(ins, default=0)
            m.avail = base + 1 if m.kind == "red" else base
        stored = [m for m in members if users_outside(m.node, mset)]
        for m in members:
            if m.kind == "mm":
                buf("mm", m.node, "full")
        # the shape source: an input of exactly the frame shape, else the static frame
        self.shape_src = None
        self.scalar_args: list = []
        scalar_casts: list = []
        mm_lines: list = []
        passes = sorted({oc[1].avail if oc[0] == "m" else 0
                         for m in members if m.kind == "red" for _, oc in m.operands}
                        | {m.avail for m in stored if m.form == "full"})
        stages = range(0, max([m.avail for m in members] + passes + [0]) + 1)

        def ref(t, oc, in_loop):
            if oc[0] == "m":
                src = oc[1]
                return f"v{src.idx}" if src.cls == "full" else f"w{src.idx}"
            v = _val(t)
            mode = oc[1]
            if mode == "full" and _key(v.shape) == fr.F and self.shape_src is None:
                self.shape_src = t
            if t in mset:
                from .codegen import LoweringError
                raise LoweringError(f"row region reads its own member {t.name} as an input")
            j = buf("in", t, mode)
            return f"b{j}[q{j}, p{j}, c]" if mode == "full" else f"b{j}[q{j}, p{j}, 0]"

        sbase: dict = {}

        def expr_of(m, in_loop):
            if m.kind == "ident":
                t, oc = m.operands[0]
                return ref(t, oc, in_loop)
            if m.kind == "mm":
                j = idx[("mm", m.node, "full")]
                x, w, bias, beta, alpha = m.mm
                e = f"b{j}[r, c]"
                if alpha != 1:
                    e = f"{_npt(m.node)}({alpha!r}) * {e}"
                if m.operands:
                    t, oc = m.operands[0]
                    b = ref(t, oc, in_loop)
                    e = f"{_npt(m.node)}({beta!r}) * {b} + {e}" if beta != 1 else f"{b} + {e}"
                return e
            spec = m.spec
            names = [f"{spec.loads[i]}({ref(t, oc, in_loop)})"
                     for i, (t, oc) in enumerate(m.operands)]
            base = sbase.get(m.idx)
            if base is None:
                base = sbase[m.idx] = len(scalar_casts)
                scalar_casts.extend(spec.scalar_casts)
                self.scalar_args.extend(m.scalars)
            import re
            e = re.sub(r"\bx(\d+)\b", lambda mt: f"({names[int(mt.group(1))]})", spec.expr)
            e = re.sub(r"\bc(\d+)\b", lambda mt: f"c{base + int(mt.group(1))}", e)
            return spec.store.format(e)

        # rows: stage s computes row values with avail s; pass s loops over c
        body: list = []
        emitted_row: set = set()
        for s in stages:
            for m in members:
                if m.cls != "row" or m.avail != s or m.idx in emitted_row:
                    continue
                emitted_row.add(m.idx)
                if m.kind == "red":
                    fin = {"sum": f"a{m.idx}", "mean": f"a{m.idx} / C",
                           "amax": f"a{m.idx}", "amin": f"a{m.idx}"}[m.red]
                    body.append(f"        w{m.idx} = {_npt(m.node)}({fin})")
                else:
                    body.append(f"        w{m.idx} = {expr_of(m, False)}")
                if m in stored and m.form != "full":
                    j = buf("out", m.node, m.form)
                    body.append(f"        b{j}[r] = w{m.idx}")
            if s not in passes:
                continue
            reds = [m for m in members if m.kind == "red" and (
                m.operands[0][1][1].avail if m.operands[0][1][0] == "m" else 0) == s]
            outs = [m for m in stored if m.form == "full" and m.avail == s]
            need: set = set()

            def want(m, need=need):
                if m.idx in need or m.cls != "full":
                    return
                need.add(m.idx)
                for _, oc in m.operands:
                    if oc[0] == "m":
                        want(oc[1], need)
            for m in reds:
                t, oc = m.operands[0]
                if oc[0] == "m":
                    want(oc[1])
            for m in outs:
                want(m)
            for m in reds:
                init = {"sum": "0.0", "mean": "0.0", "amax": "-np.inf", "amin": "np.inf"}[m.red]
                body.append(f"        a{m.idx} = {init}")
            body.append("        for c in range(C):")
            for m in members:
                if m.idx in need:
                    body.append(f"            v{m.idx} = {expr_of(m, True)}")
            for m in reds:
                t, oc = m.operands[0]
                e = ref(t, oc, True)
                if m.red in ("sum", "mean"):
                    body.append(f"            a{m.idx} += {e}")
                else:
                    cmp = ">" if m.red == "amax" else "<"
                    body.append(f"            t{m.idx} = {e}")
                    body.append(f"            if t{m.idx} {cmp} a{m.idx} or t{m.idx} != "
                                f"t{m.idx}:")
                    body.append(f"                a{m.idx} = t{m.idx}")
            for m in outs:
                j = buf("out", m.node, "full")
                v = f"v{m.idx}" if m.cls == "full" else f"w{m.idx}"
                body.append(f"            b{j}[r, c] = {v}")
        # matmul products first, into their scratch (or stored) buffers
        for m in members:
            if m.kind == "mm":
                j = idx[("mm", m.node, "full")]
                x, w = m.mm[0], m.mm[1]
                ja, jb = buf("in", x, "mat"), buf("in", w, "mat")
                mm_lines.append(f"    np.dot(b{ja}, b{jb}, b{j})")
        if self.shape_src is None:
            if not all(isinstance(s, int) for s in fr.F):
                mm = next((m for m in members if m.kind == "mm"), None)
                if mm is None:
                    from .codegen import LoweringError
                    raise LoweringError("row region with no input of the frame's shape")
            self.static_F = tuple(fr.F) if all(isinstance(s, int) for s in fr.F) else None
        else:
            self.static_F = None
        self.mm_nodes = [m.node for m in members if m.kind == "mm"]
        self.stores = [m.node for m in stored]
        self.n_nodes = len(members)
        parallel_src, name = self._render(body, mm_lines, scalar_casts, True)
        serial_src, _ = self._render(body, mm_lines, scalar_casts, False)
        self.src = {True: parallel_src, False: serial_src}
        self.digest = {k: hashlib.sha1(v.encode()).hexdigest() for k, v in self.src.items()}
        self.ops = sorted({str(n.target) for n in self.nodes})
        self.lines = sorted({_stack_line(n) for n in self.nodes})
        self.stored_set = set(self.stores)
        # run-time plan (no FX or meta lookups per launch)

        self.ins = [(j, node, mode) for j, (kind, node, mode) in enumerate(self.bufs)
                    if kind == "in"]
        self.outs = [(j, node, mode, kind == "mm", _val(node).dtype,
                      _val(node).device.index or 0)
                     for j, (kind, node, mode) in enumerate(self.bufs) if kind != "in"]
        self.mm_ops = [_mm_args(n) for n in self.mm_nodes]
        self.render = {k: _renderer_src(v) for k, v in self.src.items()}
        self.extra = {"group_ops": self.n_nodes, "graph": True, "graph_ops": self.ops,
                      "source_lines": self.lines}

    def _render(self, body, mm_lines, scalar_casts, parallel):
        n_bufs = len(self.bufs)
        params = (["R", "C"] + [f"b{j}" for j in range(n_bufs)]
                  + [f"s{j}" for j in range(len(scalar_casts))])
        digest = hashlib.sha1(("\n".join(body + mm_lines) + repr(scalar_casts) + repr(
            [b[2] for b in self.bufs]) + str(parallel)).encode()).hexdigest()[:12]
        name = f"rows_{digest}"
        extra = ", parallel=True" if parallel else ""
        lines = [f'@njit(error_model="numpy", nogil=True{extra})',
                 f"def {name}({', '.join(params)}):"]
        lines += [f"    c{j} = {cast}(s{j})" for j, cast in enumerate(scalar_casts)]
        lines += mm_lines
        lines.append(f"    for r in {'prange' if parallel else 'range'}(R):")
        # inputs are (A, B, C) views of the frame's broadcast: row r is [r // B, r % B]
        for j, b in enumerate(self.bufs):
            if b[0] == "in" and b[2] != "mat":
                lines.append(f"        q{j} = r // b{j}.shape[1]")
                lines.append(f"        p{j} = r - q{j} * b{j}.shape[1]")
        lines += body or ["        pass"]
        return "\n".join(lines) + "\n", name

    def describe(self) -> str:
        lines = [f"  kernel (rows, frame {list(self.fr.F)}): {self.n_nodes} ops, "
                 f"{len(self.stores)} stored, "
                 f"{sum(1 for b in self.bufs if b[0] == 'in')} read"]
        for n in self.nodes:
            lines.append(f"    | {n.name} = {n.target}  # {_stack_line(n)}")
        return "\n".join(lines)


def _npt(node) -> str:
    return "np.float32" if _val(node).dtype == torch.float32 else (
        "np.float64" if _val(node).dtype == torch.float64 else {
            torch.int64: "np.int64", torch.int32: "np.int32", torch.bool: "np.bool_"}[
            _val(node).dtype])


def _view3d(arr: np.ndarray, mode: str, F: tuple, R: int):
    """The operand as an (A, B, C) strided view of its broadcast to the frame (C is 1 for row
    modes), R = A * B, or None when its leading dimensions need more than two strides. A
    writeable view of the operand's own memory (kernels only read it)."""
    if arr.size == 0:
        return None
    if mode == "rowflat":
        shape, strides = arr.shape + (1,), arr.strides + (0,)
        target = tuple(F[:-1]) + (1,)
    else:
        shape, strides = arr.shape, arr.strides
        target = tuple(F) if mode == "full" else tuple(F[:-1]) + (1,)
    C = target[-1]
    if shape == target and arr.flags.c_contiguous:
        return arr.reshape(1, R, C)          # the common case: no stride arithmetic
    nd = len(target)
    if len(shape) > nd:
        return None
    pad = nd - len(shape)
    st = [0] * pad + [0 if n == 1 else s for n, s in zip(shape, strides)]
    for n, t in zip((1,) * pad + tuple(shape), target):
        if n != t and n != 1:
            return None
    cs = st[-1] if C != 1 else 0
    # leading dims (size > 1) as runs that collapse into one stride each; at most two runs
    runs: list = []           # [size, stride of its innermost dim], innermost run first
    for size, s_ in zip(reversed(target[:-1]), reversed(st[:-1])):
        if size == 1:
            continue
        if runs and s_ == runs[-1][1] * runs[-1][0]:
            runs[-1][0] *= size
        else:
            runs.append([size, s_])
    if len(runs) > 2:
        return None
    if not runs:
        v_shape, v_strides = (1, 1, C), (0, 0, cs)
    elif len(runs) == 1:
        v_shape, v_strides = (1, runs[0][0], C), (0, runs[0][1], cs)
    else:
        v_shape, v_strides = (runs[1][0], runs[0][0], C), (runs[1][1], runs[0][1], cs)
    return np.lib.stride_tricks.as_strided(arr, v_shape, v_strides)


def run(step: RowStep, env: dict, run_node, alloc, flat) -> bool:
    """Launch the step's kernel; False when it must run its nodes eagerly (then nothing ran)."""
    from ..kernels import compile as kc
    from ..launch import launch
    from ..tensor import NeuronTensor
    from .stats import CSTATS

    if step.shape_src is not None:
        F = tuple(env[step.shape_src].shape)
    elif step.static_F is not None:
        F = step.static_F
    else:
        x, w = step.mm_ops[0]
        F = (env[x].shape[0], env[w].shape[1])
    R, C = int(math.prod(F[:-1])), int(F[-1])
    if R == 0 or C == 0:
        return False
    args = [None] * len(step.bufs)
    outs = {}
    for j, node, mode in step.ins:
        t = env[node]
        if type(t) is not NeuronTensor:
            return False
        arr = t._data.numpy()
        if mode == "mat":
            if arr.ndim != 2:
                return False
            if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
                arr = np.ascontiguousarray(arr)   # a strided row pick (BERT's pooler): a copy
            args[j] = arr
            continue
        v = _view3d(arr, mode, F, R)
        if v is None:
            return False
        args[j] = v
    rowkd = tuple(F[:-1]) + (1,)
    for j, node, mode, is_mm, dtype, index in step.outs:
        shape = F if (is_mm or mode == "full") else (rowkd if mode == "rowkd" else F[:-1])
        t = outs.get(node)
        if t is None:
            t = alloc(shape, dtype, index)
            if not is_mm or node in step.stored_set:
                outs[node] = t
        a = t._data.numpy()
        args[j] = a.reshape(R, C) if (is_mm or mode == "full") else a.reshape(R)
    scalars = []
    for a in step.scalar_args:
        v = env[a] if isinstance(a, Node) else a
        if isinstance(v, torch.Tensor):
            v = v.item()
        elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            v = v.node.pytype(v)
        elif isinstance(v, bool) or v is None:
            v = bool(v)
        scalars.append(v)
    parallel = R * C >= PARALLEL_MIN and R >= 2 and kc.parallel_allowed()
    flops = float(R * C * step.n_nodes)
    if step.mm_ops:
        from ..lower.matmul import blas_threads

        for x, _ in step.mm_ops:
            k = env[x].shape[1]
            flops += 2.0 * R * C * k
            blas_threads(2.0 * R * C * k)
    params = (R, C) + tuple(args) + tuple(scalars)
    launch(("rows", step.digest[parallel]), step.render[parallel], params,
           flops=flops, bytes_moved=float(sum(a.nbytes for a in args)),
           engine="vector", extra=step.extra)
    CSTATS.fused_kernel_launches += 1
    CSTATS.fused_nodes += step.n_nodes
    CSTATS.row_kernel_launches += 1
    env.update(outs)
    return True


def _mm_args(node):
    a = _bind(node.target, node)
    return (a["self"] if node.target is aten.mm.default else a["mat1"]), a["mat2"]


def _renderer_src(src: str):
    """render() for a kernel whose source is already built (row regions)."""
    from ..kernels.vmath import VMATH_PRELUDE, needs_vmath
    from ..lower import elementwise as ew

    def render():
        vm = VMATH_PRELUDE if needs_vmath(src) else ""
        special = getattr(ew, "SPECIAL_PRELUDE", "")
        sp = special if special and ew._SPECIAL_RE.search(src) else ""
        name = src.split("def ", 1)[1].split("(", 1)[0]
        return vm + ew.PRELUDE + sp + src, name
    return render
