"""A row region's kernel: its buffers, its source (passes over C per row) and its run.

compile/rows.py finds the regions (a frame `(*lead, C)`, the members and their forms); a
RowStep turns one region into one kernel spec and runs it: external operands as strided
`(A, B, C)` views of their memory (broadcasting costs no copy), stored values allocated
straight from the simulated HBM, a matmul's product computed first in the same kernel.

>>> import torch, eager_neuron
>>> f = torch.compile(lambda x, b: torch.relu(x @ x.T + b), backend="neuron")
>>> x, b = torch.ones(2, 3, device="neuron"), torch.ones(2, device="neuron")
>>> f(x, b).tolist()
[[4.0, 4.0], [4.0, 4.0]]
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch
from torch.fx import Node

from .. import launch as _launch
from ..kernels import compile as kc
from ..launch import launch
from ..tensor import NeuronTensor
from .absorb import apply_views
from .codegen import _stack_line
from .rows import PARALLEL_MIN, Region, _key, _mm_args, _val
from .stats import CSTATS

aten = torch.ops.aten


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
            m.avail = base + 1 if m.kind in ("red", "colred") else base
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
                         for m in members if m.kind in ("red", "colred")
                         for _, oc in m.operands}
                        | {m.avail for m in stored if m.form == "full"})
        cols = [m for m in members if m.kind == "colred"]
        col_pre: list = []      # before the row loop: each column total's float64 accumulator
        col_post: list = []     # after it: the totals (means) rounded into their stores
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
                if m in stored and cur_pass[0] > m.avail:
                    # a stored product's memory is its store's (one tensor per node): the
                    # pass that stored it left the full value there, bias and alpha applied
                    return e
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
        cur_pass = [0]
        for s in stages:
            cur_pass[0] = s
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
            creds = [m for m in cols if (
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
            for m in reds + creds:
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
            for m in creds:
                t, oc = m.operands[0]
                body.append(f"            k{m.idx}[c] += {ref(t, oc, True)}")
        for m in cols:
            j = buf("out", m.node, m.form)
            col_pre.append(f"    k{m.idx} = np.zeros(C, np.float64)")
            total = f"k{m.idx}[c] / R" if m.red == "mean" else f"k{m.idx}[c]"
            col_post += ["    for c in range(C):", f"        b{j}[c] = {_npt(m.node)}({total})"]
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
        # (a column total accumulates across rows: the kernel is serial for every size)
        parallel_src, name = self._render(body, mm_lines + col_pre, scalar_casts, not cols,
                                          col_post)
        serial_src, _ = self._render(body, mm_lines + col_pre, scalar_casts, False, col_post)
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

    def __getstate__(self) -> dict:
        # (stored with its Program, compile/artifact.py: the sources are, the closures not)
        return {k: v for k, v in self.__dict__.items() if k != "render"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.render = {k: _renderer_src(v) for k, v in self.src.items()}

    def _render(self, body, mm_lines, scalar_casts, parallel, post=()):
        _launch.RSTATS.kernel_renders += 1     # (a kernel's source built: counted as launch's)
        n_bufs = len(self.bufs)
        params = (["R", "C"] + [f"b{j}" for j in range(n_bufs)]
                  + [f"s{j}" for j in range(len(scalar_casts))])
        digest = hashlib.sha1(("\n".join(body + mm_lines + list(post)) + repr(scalar_casts)
                               + repr([b[2] for b in self.bufs]) + str(parallel)).encode()
                              ).hexdigest()[:12]
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
        lines += list(post)
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
    if STRIDED_NDARRAY[0] and arr.flags.c_contiguous:
        # the same view as as_strided's (data pointer, shape, strides, flags: a C-contiguous
        # operand exports its memory as a buffer from its first element), ~0.3 against ~5 us;
        # numpy checks the view stays inside that memory (else as_strided, unchecked)
        try:
            return np.ndarray(v_shape, arr.dtype, arr, 0, v_strides)
        except (TypeError, ValueError, BufferError):
            pass
    return np.lib.stride_tricks.as_strided(arr, v_shape, v_strides)


STRIDED_NDARRAY = [True]   # False: every strided operand view through as_strided (A/B)


def run(step: RowStep, env: dict, run_node, alloc, flat, pl=None) -> bool:
    """Launch the step's kernel; False when it must run its nodes eagerly (then nothing ran).
    `pl`: a plan learning from this call (compile/planned.py) gives the arena's stores."""
    # (a view the step absorbed, compile/absorb.py, is not in env: its static shape is known)
    vshape = getattr(step, "view_shapes", None) or {}
    in_views = getattr(step, "in_views", None) or {}

    def shape_of(n):
        return vshape[n] if n in vshape else env[n].shape

    if step.shape_src is not None:
        F = tuple(shape_of(step.shape_src))
    elif step.static_F is not None:
        F = step.static_F
    else:
        x, w = step.mm_ops[0]
        F = (shape_of(x)[0], shape_of(w)[1])
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
        if j in in_views:
            arr = apply_views(arr, in_views[j])
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
        shape = F if (is_mm or mode == "full") else _out_shape(mode, F, rowkd)
        t = outs.get(node)
        if t is None:
            t = None if pl is None else pl.alloc(node, shape, dtype, index)
            if t is None:
                t = alloc(shape, dtype, index)
            if not is_mm or node in step.stored_set:
                outs[node] = t
        a = t._data.numpy()
        args[j] = a.reshape(R, C) if (is_mm or mode == "full") else a.reshape(
            C if mode in _COL_FORMS else R)
    scalars = []
    for a in step.scalar_args:
        v = env[a] if isinstance(a, Node) else a
        if isinstance(v, (torch.Tensor, np.generic)):   # (np: a host scalar step's value)
            v = v.item()
        elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            v = v.node.pytype(v)
        elif isinstance(v, bool) or v is None:
            v = bool(v)
        scalars.append(v)
    parallel = R * C >= PARALLEL_MIN and R >= 2 and kc.parallel_allowed()
    flops = float(R * C * step.n_nodes)
    blas = []
    if step.mm_ops:
        from ..blas import blas_threads

        for x, _ in step.mm_ops:
            k = shape_of(x)[1]
            flops += 2.0 * R * C * k
            blas_threads(2.0 * R * C * k)
            blas.append(2.0 * R * C * k)
    params = (R, C) + tuple(args) + tuple(scalars)
    nbytes = float(sum(a.nbytes for a in args))
    launch(("rows", step.digest[parallel]), step.render[parallel], params,
           flops=flops, bytes_moved=nbytes, engine="vector", extra=step.extra)
    if pl is not None:
        pl.launched("rows", step, ("rows", step.digest[parallel]), params, flops, nbytes,
                    blas, F)
    CSTATS.fused_kernel_launches += 1
    CSTATS.fused_nodes += step.n_nodes
    CSTATS.row_kernel_launches += 1
    env.update(outs)
    return True


_COL_FORMS = frozenset({"col", "colkd"})


def _out_shape(mode: str, F: tuple, rowkd: tuple) -> tuple:
    """A non-full store's shape in frame F: a row value's ([*lead, 1] or [*lead]) or a column
    total's ([C], or [1, ..., 1, C] with keepdim)."""
    if mode == "rowkd":
        return rowkd
    if mode == "col":
        return (F[-1],)
    if mode == "colkd":
        return (1,) * (len(F) - 1) + (F[-1],)
    return tuple(F[:-1])


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
