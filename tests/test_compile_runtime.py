"""torch.compile(backend="neuron"): the planned runtime (compile/planned.py).

A repeat call of a compiled graph with the same input signature runs a plan: kernels called
directly (pre-resolved), values no one else reads in an arena planned once. Checked here by
counters (never times): the plan is used, intermediates are not allocated, results equal neuron
eager and a float64 CPU reference; a changed signature, a busy plan (another thread), a
profiler hook and a cleared kernel cache all take the interpreter, with right answers.
"""

from __future__ import annotations

import gc
import pickle
import threading

import pytest
import torch
import torch.nn.functional as F

import eager_neuron
from eager_neuron import launch as L
from eager_neuron.compile import faststep, planned
from eager_neuron.compile import program as P
from eager_neuron.compile import stats as cstats

torch._dynamo.config.cache_size_limit = 64
N = "neuron"


pytestmark = pytest.mark.usefixtures("dynamo_reset")   # (tests/conftest.py)


def _close(a, b, dtype, scale):
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    assert a.shape == b.shape
    tol = 16 * torch.finfo(dtype).eps * scale * (1 + b.abs())
    bad = ~((a - b).abs() <= tol)
    assert not bad.any(), f"max error {(a - b).abs().max().item()} (bound {tol.max().item()})"


class _Block(torch.nn.Module):
    """GPT-2 in small: layer norms, causal attention (softmax of a masked product), a GELU MLP,
    residuals, a cross-entropy head."""

    def __init__(self, C=16, H=2, V=11) -> None:
        super().__init__()
        self.H = H
        self.ln1, self.ln2 = torch.nn.LayerNorm(C), torch.nn.LayerNorm(C)
        self.qkv, self.proj = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)
        self.up, self.down = torch.nn.Linear(C, 4 * C), torch.nn.Linear(4 * C, C)
        self.head = torch.nn.Linear(C, V)
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)

    def forward(self, x, y):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (C // self.H) ** -0.5
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        h = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
        h = h + self.down(F.gelu(self.up(self.ln2(h)), approximate="tanh"))
        return F.cross_entropy(self.head(h).view(B * T, -1), y.view(-1))


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(12, 32), torch.nn.Linear(32, 5)
        g = torch.Generator().manual_seed(4)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)

    def forward(self, x, y):
        return F.cross_entropy(self.b(torch.relu(self.a(x))), y)


def _data(kind, seed=0, B=3):
    g = torch.Generator().manual_seed(seed)
    if kind == "gpt":
        return torch.randn(B, 6, 16, generator=g), torch.randint(0, 11, (B, 6), generator=g)
    return torch.randn(B * 2, 12, generator=g), torch.randint(0, 5, (B * 2,), generator=g)


def _trainer(kind, device, compiled, dtype=torch.float32):
    torch.manual_seed(0)
    m = (_Block() if kind == "gpt" else _MLP()).to(dtype).to(device)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)

    def step(x, y):
        loss = m(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return m, (torch.compile(step, backend="neuron") if compiled else step)


def _train(kind, device, compiled, steps, dtype=torch.float32):
    m, step = _trainer(kind, device, compiled, dtype)
    losses = []
    for i in range(steps):
        x, y = _data(kind, i % 2)
        losses.append(step(x.to(dtype).to(device), y.to(device)))
    return m, losses


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_repeat_steps_run_planned_and_equal_eager_and_float64(kind):
    """Planned steps are bit for bit the interpreter's (the same kernels on the same values),
    and equal neuron eager and a float64 CPU reference within float32 bounds (AdamW at lr 1e-2
    amplifies a rounding difference in a parameter's update: the bounds on parameters are
    wider than on losses)."""
    steps = 5
    mc, lc = _train(kind, N, True, steps)
    s = cstats()
    torch._dynamo.reset()
    L.HOOKS.append(_no_hook)              # (a launch hook: every call interpreted)
    try:
        mi, li = _train(kind, N, True, steps)
    finally:
        L.HOOKS.remove(_no_hook)
    for a, b in zip(lc, li):
        assert torch.equal(a.cpu(), b.cpu())
    for a, b in zip(mc.parameters(), mi.parameters()):
        assert torch.equal(a.detach().cpu(), b.detach().cpu())
    me, le = _train(kind, N, False, steps)
    m64, l64 = _train(kind, "cpu", False, steps, torch.float64)
    # forward, backward and AdamW programs: each learned once, then planned on every step
    assert s["plans_learned"] >= 3, s
    assert s["planned_runs"] >= 3 * (steps - 2), s
    assert s["arena_values"] > 0 and s["direct_launches"] > 0, s
    assert not s["plan_fallbacks"] and not s["group_fallbacks"] and not s["graph_fallbacks"]
    for a, b, c in zip(lc, le, l64):
        _close(a, b, torch.float32, 64)
        _close(a, c, torch.float32, 256)
    for pc, pe, p64 in zip(mc.parameters(), me.parameters(), m64.parameters()):
        _close(pc, pe, torch.float32, 4096)
        _close(pc, p64, torch.float32, 4096)


def _no_hook(event):
    pass


def _programs(monkeypatch):
    """Every Program built from now on, in order."""
    made = []
    counted = P.Program._counted      # (built, or restored whole from torch's cache)

    def record(self):
        counted(self)
        made.append(self)

    monkeypatch.setattr(P.Program, "_counted", record)
    return made


def _allocs(monkeypatch):
    """Counts of program._alloc calls (the interpreter's and the plan's fresh tensors)."""
    n = [0]
    real = P._alloc

    def counted(*a):
        n[0] += 1
        return real(*a)

    monkeypatch.setattr(P, "_alloc", counted)
    monkeypatch.setattr(faststep, "ALLOC", [counted])
    return n


def _launches():
    """Kernel launches counted by eager_neuron.stats() and by the simulated core 0."""
    from eager_neuron.simulator import SIM

    return eager_neuron.stats()["launches"], SIM.cores[0].launches


def test_a_planned_call_allocates_only_escaping_values(monkeypatch):
    """The arena's values are not allocated on a planned call: an interpreted call allocates
    exactly the plan's fresh tensors plus its arena values (the same graph, the same inputs),
    and the arena's bytes are charged to the simulated HBM once, released with the Program."""
    progs = _programs(monkeypatch)
    n = _allocs(monkeypatch)
    m, step = _trainer("gpt", N, True)
    x, y = (t.to(N) for t in _data("gpt"))
    step(x, y)
    bw = next(p for p in progs if p.name.startswith("backward"))
    saved = {}
    call = P.Program.__call__

    def spy(self, *args):
        saved.setdefault(self.name, args)
        return call(self, *args)

    monkeypatch.setattr(P.Program, "__call__", spy)
    step(x, y)
    step(x, y)            # learned by now
    monkeypatch.setattr(P.Program, "__call__", call)
    args = saved[bw.name]
    before, st0 = cstats(), _launches()
    n[0] = 0
    out_planned = bw(*args)
    planned_allocs, s, st1 = n[0], cstats(), _launches()
    assert s["planned_runs"] == before["planned_runs"] + 1
    arena = s["arena_values"] - before["arena_values"]
    assert arena > 0
    plan = bw._rt.plan
    assert arena == len(plan.views) and plan.arena.nbytes > 0
    # the same call interpreted (the plan busy): every kernel store is a new tensor
    plan.lock.acquire()
    try:
        n[0] = 0
        out_interp = bw(*args)
    finally:
        plan.lock.release()
    st2, s2 = _launches(), cstats()
    assert n[0] == planned_allocs + arena, (n[0], planned_allocs, arena)
    # the same launches counted and charged either way
    assert s["direct_launches"] - before["direct_launches"] > 0
    assert s2["direct_launches"] == s["direct_launches"]
    assert [b - a for a, b in zip(st0, st1)] == [b - a for a, b in zip(st1, st2)], (st0, st1, st2)
    for k in ("fused_kernel_launches", "row_kernel_launches", "fused_nodes"):
        assert s[k] - before[k] == s2[k] - s[k] > 0, k
    for a, b in zip(out_planned, out_interp):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a.cpu(), b.cpu())
    # the arena is one block per core, charged while its Program lives
    alive = torch.neuron.memory_allocated()
    nbytes = plan.arena.nbytes
    saved.clear()
    progs.clear()
    del plan, bw, args, out_planned, out_interp, step, m
    torch._dynamo.reset()
    gc.collect()
    assert torch.neuron.memory_allocated() <= alive - nbytes


def _inference_program(monkeypatch, fn, *inputs):
    progs = _programs(monkeypatch)
    with torch.no_grad():
        torch.compile(fn, backend="neuron")(*inputs)
    (prog,) = [p for p in progs if p.name.startswith("inference")]
    return prog


def _f(x, w, b):
    h = torch.relu(x @ w + b)
    return F.layer_norm(h * 2 + 1, (h.shape[-1],)).exp() * 3 + 1


def _fin(x=None):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(8, 16, generator=g) if x is None else x,
            torch.randn(16, 16, generator=g), torch.randn(16, generator=g))


def test_a_changed_signature_never_uses_a_stale_plan(monkeypatch):
    """A non-contiguous input of the same shape: the plan's guard drops it (the interpreter
    finishes the call), the next call learns a plan for it; answers always equal eager."""
    x, w, b = _fin()
    prog = _inference_program(monkeypatch, _f, x.to(N), w.to(N), b.to(N))
    xt = _fin(torch.randn(16, 8, generator=torch.Generator().manual_seed(2)).t())[0]
    assert not xt.is_contiguous()
    calls = [x, x, x, xt, xt, xt, x, x]
    for xi in calls:
        out = prog(xi.to(N) if xi.is_contiguous() else xi.t().contiguous().to(N).t(),
                   w.to(N), b.to(N))
        out = out[0] if isinstance(out, (list, tuple)) else out
        _close(out, _f(xi.double(), w.double(), b.double()), torch.float32, 64)
    s = cstats()
    assert s["plan_fallbacks"].get("operand signature changed", 0) == 2, s["plan_fallbacks"]
    assert s["plans_learned"] == 3 and s["planned_runs"] >= 3, s


def test_another_batch_size_is_right_and_dynamic_shapes_are_not_planned():
    f = torch.compile(_f, backend="neuron")
    for B in (8, 8, 8, 5, 5, 5, 3, 3):
        x, w, b = _fin(torch.randn(B, 16, generator=torch.Generator().manual_seed(B)))
        with torch.no_grad():
            out = f(x.to(N), w.to(N), b.to(N))
        _close(out, _f(x.double(), w.double(), b.double()), torch.float32, 64)
    s = cstats()
    assert s["planned_runs"] >= 1 and not s["plan_fallbacks"], s


def test_a_busy_plan_sends_another_thread_to_the_interpreter(monkeypatch):
    x, w, b = _fin()
    prog = _inference_program(monkeypatch, _f, x.to(N), w.to(N), b.to(N))
    args = (x.to(N), w.to(N), b.to(N))
    ref = _f(x.double(), w.double(), b.double())
    prog(*args)
    prog(*args)
    plan = prog._rt.plan
    assert plan.ready
    results = []
    plan.lock.acquire()          # as if another thread were inside the plan
    try:
        t = threading.Thread(target=lambda: results.append(prog(*args)))
        t.start()
        t.join()
    finally:
        plan.lock.release()
    assert cstats()["plan_fallbacks"].get(
        "plan busy (another thread or a re-entrant call)", 0) == 1
    out = results[0][0] if isinstance(results[0], (list, tuple)) else results[0]
    _close(out, ref, torch.float32, 64)


def test_two_threads_running_one_compiled_function_get_right_answers():
    f = torch.compile(_f, backend="neuron")
    ins = {i: _fin(torch.randn(8, 16, generator=torch.Generator().manual_seed(10 + i)))
           for i in range(2)}
    refs = {i: _f(*(t.double() for t in ins[i])) for i in ins}
    with torch.no_grad():
        f(*(t.to(N) for t in ins[0]))
    errors = []
    start = threading.Barrier(2)

    def work(i):
        try:
            args = tuple(t.to(N) for t in ins[i])
            start.wait()
            for _ in range(25):
                with torch.no_grad():
                    _close(f(*args), refs[i], torch.float32, 64)
        except BaseException as exc:     # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert cstats()["planned_runs"] >= 1


def test_profiler_hooks_see_every_kernel_with_its_source_lines():
    m, step = _trainer("mlp", N, True)
    x, y = (t.to(N) for t in _data("mlp"))
    for _ in range(3):
        step(x, y)
    events = []
    L.HOOKS.append(events.append)
    try:
        before = cstats()
        step(x, y)
        after = cstats()
    finally:
        L.HOOKS.remove(events.append)
    graph_events = [e for e in events if e.get("graph")]
    launched = after["fused_kernel_launches"] - before["fused_kernel_launches"]
    assert launched > 0 and len(graph_events) == launched
    assert all(e["source_lines"] and all(isinstance(s, str) for s in e["source_lines"])
               for e in graph_events)
    assert after["planned_runs"] == before["planned_runs"]
    assert after["direct_launches"] == before["direct_launches"]
    step(x, y)                  # hooks gone: planned again
    assert cstats()["planned_runs"] > after["planned_runs"]


def test_a_cleared_kernel_cache_retires_the_plans(monkeypatch):
    x, w, b = _fin()
    prog = _inference_program(monkeypatch, _f, x.to(N), w.to(N), b.to(N))
    args = (x.to(N), w.to(N), b.to(N))
    ref = _f(x.double(), w.double(), b.double())
    for _ in range(3):
        prog(*args)
    learned = cstats()["plans_learned"]
    L.MEMORY.clear()
    for _ in range(3):
        out = prog(*args)
        _close(out[0] if isinstance(out, (list, tuple)) else out, ref, torch.float32, 64)
    assert cstats()["plans_learned"] == learned + 1


def test_stored_program_state_holds_no_runtime(monkeypatch):
    x, w, b = _fin()
    prog = _inference_program(monkeypatch, _f, x.to(N), w.to(N), b.to(N))
    for _ in range(3):
        prog(x.to(N), w.to(N), b.to(N))
    assert prog._rt.plan.ready
    state = prog.__getstate__()
    assert "_rt" not in state
    for v in state.values():
        assert not isinstance(v, (planned.Runtime, planned.Plan, planned.Arena))
    pickle.dumps([v for k, v in state.items() if k in ("n_kernels", "n_host", "fold_skip")])


@pytest.mark.parametrize("strided", [False, True])
def test_an_input_changed_in_place_is_read_anew(strided):
    """A plan keeps the operand views of graph inputs that come back (parameters); an input
    whose values change in place between calls (an optimizer's update) is read anew, and one
    a kernel can only read through a copy (a strided matrix) is copied anew."""
    def g(a, w):
        return torch.softmax(a @ w + 1, -1) * 2

    f = torch.compile(g, backend="neuron")
    gen = torch.Generator().manual_seed(7)
    base = torch.randn(6, 10 if strided else 5, generator=gen).to(N)
    a = base[:, ::2] if strided else base
    w = torch.randn(5, 4, generator=gen).to(N)
    assert a.is_contiguous() != strided
    with torch.no_grad():
        for _ in range(5):
            out = f(a, w)
            _close(out, g(a.cpu().double(), w.cpu().double()), torch.float32, 64)
            base.mul_(-1.5)
            w.add_(0.25)
    s = cstats()
    assert s["planned_runs"] >= 2 and not s["plan_fallbacks"], s


def test_host_to_device_move_in_a_graph_skips_dispatch():
    """`x.to("neuron")` of a contiguous CPU tensor inside a compiled graph (a training step's
    batch) is lower/host.py's plain move without dispatch (forms._run_to_device): the same
    values, dtype and strides, the transfer charged as dispatch charges it, the op counted;
    a cast, a non-contiguous source or a CPU result still go through dispatch."""
    from eager_neuron.compile import forms
    from eager_neuron.simulator import SIM
    from eager_neuron.stats import STATS

    def f(x, y):
        a = x.to(N)
        return a * 2, y.to(N, torch.float64), x.t().to(N) + 1

    def run(moves):
        forms.MOVES[0] = moves
        try:
            torch._dynamo.reset()
            eager_neuron.compile.reset_stats()
            g = torch.compile(f, backend="neuron")
            x, y = torch.randn(3, 4), torch.randn(5)
            g(x, y)                       # (the first call runs under a dispatch mode)
            b0, o0 = SIM.cores[0].transfer_bytes, STATS.ops
            outs = g(x, y)
            return outs, x, y, SIM.cores[0].transfer_bytes - b0, STATS.ops - o0, \
                eager_neuron.compile.stats()
        finally:
            forms.MOVES[0] = True

    (a, b, c), x, y, nbytes, ops, s = run(True)
    (a0, b0, c0), _, _, nbytes0, ops0, s0 = run(False)
    assert s["direct_moves"] == 1 and s0["direct_moves"] == 0, (s, s0)
    # the same transfers charged and ops counted as through dispatch; _to_copy still counted
    assert nbytes == nbytes0 > 0 and ops == ops0, (nbytes, nbytes0, ops, ops0)
    assert s["graph_eager_ops"]["aten::_to_copy"] == s0["graph_eager_ops"]["aten::_to_copy"]
    assert torch.equal(a.cpu(), x * 2) and a.device.type == N and a.stride() == (4, 1)
    assert b.dtype == torch.float64 and torch.equal(b.cpu(), y.double())
    assert torch.equal(c.cpu(), x.t() + 1)


def _mlp_steps(direct, funnel=None, steps=3):
    """A compiled MLP training step (bias gradients: eager sum.dim_IntList nodes, with the row
    regions' column totals off) with a plan's direct eager calls on or off; `funnel` wraps
    neuron dispatch's entry."""
    from eager_neuron import tensor as T
    from eager_neuron.compile import rows

    old, old_funnel = planned.DIRECT_EAGER[0], T._dispatch
    planned.DIRECT_EAGER[0] = direct
    cols = dict(rows._COLRED)
    rows._COLRED.clear()
    if funnel is not None:
        T._dispatch = funnel(old_funnel)
    try:
        torch._dynamo.reset()
        eager_neuron.compile.reset_stats()
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(),
                                torch.nn.Linear(8, 3)).to(N)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)

        @torch.compile(backend="neuron")
        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        g = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(steps):
            x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
            losses.append(step(x.to(N), y.to(N)).cpu())
        return torch.stack(losses), [p.detach().cpu() for p in m.parameters()], \
            eager_neuron.compile.stats()
    finally:
        planned.DIRECT_EAGER[0], T._dispatch = old, old_funnel
        rows._COLRED.update(cols)
        torch._dynamo.reset()      # (no later test runs a graph compiled without them)


def test_plan_eager_nodes_call_neuron_dispatch_directly():
    """A plan's functional eager nodes (bias-gradient sums, the loss and its backward) call
    neuron dispatch directly, with plain lists where FX keeps immutable ones (the dispatcher's
    form, which dispatch's fast path keys on): each node reaches dispatch once, as through the
    dispatcher, and the step is the same bit for bit."""
    from torch.fx.immutable_collections import immutable_list

    def spy(seen):
        def funnel(inner):
            def f(func, args, kwargs):
                if func is torch.ops.aten.sum.dim_IntList:
                    seen.append(tuple(type(a) for a in args))
                return inner(func, args, kwargs)
            return f
        return funnel

    seen_d, seen_o = [], []
    ld, pd, sd = _mlp_steps(True, spy(seen_d))
    lo, po, so = _mlp_steps(False, spy(seen_o))
    assert sd["planned_runs"] >= 2 and sd["direct_eager"] > 0 and so["direct_eager"] == 0
    assert len(seen_d) == len(seen_o) > 0
    assert all(immutable_list not in ts and list in ts for ts in seen_d), seen_d
    assert sd["graph_eager_ops"] == so["graph_eager_ops"]
    assert torch.equal(ld, lo) and all(torch.equal(a, b) for a, b in zip(pd, po))


def test_a_direct_eager_node_failing_in_backward_raises_its_error():
    """An op failing on the autograd engine's thread (dispatch stashes the error and returns
    POISON) stops the compiled backward; backward() raises the op's own error, as through the
    dispatcher."""
    from eager_neuron import backward as B

    def failing(inner):
        calls = [0]

        def f(func, args, kwargs):
            if func is torch.ops.aten.sum.dim_IntList and B.in_backward():
                calls[0] += 1
                if calls[0] > 6:        # the fourth step's: its backward runs a plan
                    return B.failed(ValueError("bias gradient refused"))
            return inner(func, args, kwargs)
        return f

    for direct in (True, False):
        with pytest.raises(ValueError, match="bias gradient refused"):
            _mlp_steps(direct, failing, steps=4)
        s = eager_neuron.compile.stats()
        assert s["planned_runs"] >= 2 and (s["direct_eager"] > 0) == direct, s


def test_plan_takes_tuple_items_by_subscript(monkeypatch):
    """getitem of a multi-output op's tuple (split) is one subscript step in a plan, not the
    interpreter's node call: the interpreter runs the node once (learning), the plan never."""
    made = _programs(monkeypatch)

    def f(x):
        a, b, c = torch.split(x, 2, dim=-1)
        return (a * b).relu() + c

    x = torch.randn(3, 6)
    g = torch.compile(f, backend="neuron")
    calls = []
    real = P._run_node

    def spy(node, env, loader=None):
        calls.append(node.target)
        return real(node, env, loader)

    monkeypatch.setattr(P, "_run_node", spy)
    outs = [g(x.to(N)) for _ in range(4)]
    prog = made[-1]
    assert prog._rt.plan.ready and eager_neuron.compile.stats()["planned_runs"] >= 2
    import operator

    # 3 getitems per interpreted call (the first under a dispatch mode, the second learning)
    assert calls.count(operator.getitem) == 6, calls
    for o in outs:
        torch.testing.assert_close(o.cpu(), f(x), rtol=0, atol=0)


def test_direct_eager_calls_only_where_the_dispatcher_would_add_nothing():
    """The direct call is planned for functional, non-aliasing ops that reach
    __torch_dispatch__ whole (not an implicit composite, which the dispatcher decomposes first,
    nor a mutation or a view), and taken only with grad mode off (the autograd key would
    record the op) and torch's profiler off; otherwise the interpreter's step runs."""
    aten = torch.ops.aten
    g = torch.fx.Graph()
    x = g.placeholder("x")
    nodes = {op: g.call_function(op, args) for op, args in [
        (aten.sum.dim_IntList, (x, [0])), (aten.linear.default, (x, x)),
        (aten.add_.Tensor, (x, x)), (aten.view.default, (x, [-1])),
        (aten.transpose.int, (x, 0, 1))]}

    class Prog:
        loaders = {n: P._loader(n) for n in nodes.values()}

        def other(self, kind, node, env):
            env[node] = "interpreted"

    other = Prog().other
    fn = planned._direct_fn(nodes[aten.sum.dim_IntList], other)
    assert fn is not None
    for op in (aten.linear.default, aten.add_.Tensor, aten.view.default, aten.transpose.int):
        assert planned._direct_fn(nodes[op], other) is None, op
    t = torch.arange(6.0).reshape(2, 3).to(N)
    n = nodes[aten.sum.dim_IntList]
    before = eager_neuron.compile.stats()["direct_eager"]
    with torch.no_grad():
        env = {x: t}
        fn(env)
    assert env[n].cpu().tolist() == [3.0, 5.0, 7.0]
    assert eager_neuron.compile.stats()["direct_eager"] == before + 1
    with torch.enable_grad():
        env = {x: t}
        fn(env)
    assert env[n] == "interpreted"
    with torch.no_grad(), torch.autograd.profiler.profile():
        env = {x: t}
        fn(env)
    assert env[n] == "interpreted"
    assert eager_neuron.compile.stats()["direct_eager"] == before + 1


def test_planned_stores_allocate_as_dispatch_allocates():
    """A planned kernel step's escaping values (faststep._alloc_store): a small one takes the
    core's alloc_small with its strides and rounded size found once per shape, a large one the
    caching pool through forms._alloc; the blocks, bytes and counts the simulated core accounts
    are the ones forms._alloc (dispatch's allocator) gives, and so are the tensors."""
    from eager_neuron.simulator import SIM

    def f(x, y):
        return (x * 2).relu(), (y * 3).exp()

    x, y = torch.randn(16, 31).to(N), torch.randn(300, 300).to(N)   # (1984 bytes: rounded)

    def run(store):
        faststep.ALLOC[0] = store
        try:
            torch._dynamo.reset()
            g = torch.compile(f, backend="neuron")
            g(x, y)
            g(x, y)                  # learns the plan
            core = SIM.cores[0]
            c0, b0, a0 = core.alloc_count, core.alloc_bytes_total, core._allocated
            outs = [g(x, y) for _ in range(3)]
            core._drain()
            counts = core.alloc_count - c0, core.alloc_bytes_total - b0, core._allocated - a0
            return outs, counts
        finally:
            faststep.ALLOC[0] = faststep._alloc_store

    faststep._SMALL.clear()
    new, cn = run(faststep._alloc_store)
    old, co = run(P._alloc)
    assert eager_neuron.compile.stats()["planned_runs"] >= 3
    assert cn == co and cn[0] == 6, (cn, co)
    small = [k for k, v in faststep._SMALL.items() if v is not None]
    assert ((16, 31), torch.float32, 0) in small
    assert faststep._SMALL.get(((300, 300), torch.float32, 0), "absent") is None
    for (a, b), (c, d) in zip(new, old):
        assert a.stride() == c.stride() and b.stride() == d.stride()
        assert torch.equal(a.cpu(), c.cpu()) and torch.equal(b.cpu(), d.cpu())
        assert a._block.storage is None and b._block.storage is not None


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_a_generated_plan_is_the_interpreted_plan(kind, monkeypatch):
    """A learned plan runs as one generated function (compile/planrun.py): the same losses and
    parameters bit for bit as the plan's interpreted step list, the same counters (compile and
    eager stats), the same launches and simulated time charged, and a non-contiguous input
    then drops the generated plan at its guard as the interpreted one drops it."""
    from eager_neuron.compile import planrun
    from eager_neuron.simulator import SIM

    def run(generated):
        old = planrun.GENERATED[0]
        planrun.GENERATED[0] = generated
        try:
            torch._dynamo.reset()
            eager_neuron.compile.reset_stats()
            eager_neuron.reset_stats()
            core = SIM.cores[0]
            l0 = core.launches
            built = planrun.BUILT[0]
            m, losses = _train(kind, N, True, 5)
            x, w, b = _fin()
            prog = _inference_program(monkeypatch, _f, x.to(N), w.to(N), b.to(N))
            xt = _fin(torch.randn(16, 8, generator=torch.Generator().manual_seed(2)).t())[0]
            outs = []
            for xi in (x, x, x, xt, x):
                xi = xi.to(N) if xi.is_contiguous() else xi.t().contiguous().to(N).t()
                out = prog(xi, w.to(N), b.to(N))
                outs.append(out[0] if isinstance(out, (list, tuple)) else out)
            s, e = cstats(), eager_neuron.stats()
            return (m, losses, outs, s, {k: e[k] for k in ("launches", "memory_hits", "ops")},
                    core.launches - l0, planrun.BUILT[0] - built)
        finally:
            planrun.GENERATED[0] = old

    run(False)     # (every kernel built or loaded: both runs below find them in memory)
    mg, lg, og, sg, eg, ng, bg = run(True)
    mi, li, oi, si, ei, ni, bi = run(False)
    assert bg >= 4 and bi == 0, (bg, bi)          # forward, backward, AdamW, inference
    assert sg["planned_runs"] >= 3 * 3 + 2 and sg == si, (sg, si)
    assert sg["plan_fallbacks"] == {"operand signature changed": 1}, sg["plan_fallbacks"]
    assert eg == ei and ng == ni, (eg, ei, ng, ni)
    for a, b in zip(lg + og, li + oi):
        assert torch.equal(a.cpu(), b.cpu())
    for a, b in zip(mg.parameters(), mi.parameters()):
        assert torch.equal(a.detach().cpu(), b.detach().cpu())
