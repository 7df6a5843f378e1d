"""torch.compile(backend="neuron") against CPU eager, neuron eager and a float64 CPU reference
(tools/fuzz_compile.py): the programs the fuzzer found disagreeing, kept as regressions, and a
bounded fuzz run. `python tools/fuzz_compile.py --programs 500` runs more."""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))

import fuzz_compile  # noqa: E402
from fuzz_compile import Program  # noqa: E402

torch._dynamo.config.cache_size_limit = 64
pytestmark = pytest.mark.usefixtures("dynamo_reset")   # (tests/conftest.py)

N = int(os.environ.get("EAGER_NEURON_COMPILE_FUZZ_PROGRAMS", "40"))
FIRST = 7000


def _plain(name, dtype, dims, layout="c"):
    return {"name": name, "kind": "plain", "dtype": dtype, "dims": dims, "layout": layout}


# programs the fuzzer found disagreeing (minimized), each with what it caught
REGRESSIONS: dict[str, tuple[Program, str]] = {
    # a row kernel's matmul product stored (a result, or saved for the backward) shared its
    # memory with the stored value: a later pass re-read the product slot after the first pass
    # had written bias + product there, and added the bias again (nn.Linear -> LayerNorm in
    # training: wrong loss from the first step)
    "linear_bias_stored_then_second_pass": (Program(
        9001, [_plain("a", torch.float32, ("R", "C")), _plain("b", torch.float32, ("K", "C")),
               _plain("c", torch.float32, ("K",))],
        ["t0 = torch.nn.functional.linear(a, b, c)",
         "t1 = t0.mean(-1, keepdim=True)",
         "t2 = ((t0 - t1) * (t0 - t1)).mean(-1, keepdim=True)"],
        ["t2", "t0"], False, None), "addmm stored, re-read in a second pass"),
    "linear_layer_norm_training": (Program(
        9002, [_plain("a", torch.float32, ("R", "C")), _plain("b", torch.float32, ("K", "C")),
               _plain("c", torch.float32, ("K",))],
        ["t0 = torch.nn.functional.layer_norm(torch.nn.functional.linear(a, b, c), (b.shape[0],))"],
        ["t0"], True, None), "addmm saved for layer norm's backward"),
    "addmm_alpha_stored": (Program(
        9003, [_plain("a", torch.float64, ("R", "C")), _plain("b", torch.float64, ("C", "K")),
               _plain("c", torch.float64, ("K",))],
        ["t0 = torch.addmm(c, a, b, alpha=0.5)",
         "t1 = torch.softmax(t0, -1)"],
        ["t1", "t0"], False, False), "alpha applied twice in softmax's later passes"),
    # a Python float that changes between calls, baked into the aten graph by AOTAutograd
    # (torch.where's scalar branch): torch's AOTAutograd cache (guarded on SymInts only) served
    # the graph traced for an earlier value: results used the old value, silently
    "python_float_changes_between_calls": (Program(
        9004, [_plain("a", torch.float32, ("R", "C")),
               {"name": "s", "kind": "py", "value": 0.5}],
        ["t0 = torch.where(a > s, a, s)", "t1 = a.clamp(min=-s, max=s)"],
        ["t0", "t1"], False, None), "a changed Python float reused a cached graph's value"),
    # torch's addcmul decomposition (the backend's) refused an integer self with a float value
    # that ATen accepts (it adds 0): BackendCompilerFailed
    "addcmul_int_float_value": (Program(
        9005, [_plain("a", torch.bool, ("R", "C"), "x")],
        ["t0 = a.long() * 3", "t1 = torch.addcmul(t0, t0, t0, value=0.5)",
         "t2 = torch.addcmul(a.float(), t0, t0, value=0.5)"],
        ["t1", "t2"], False, None), "compile crashed on addcmul(int, value=0.5)"),
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_found_program_agrees(name):
    p, what = REGRESSIONS[name]
    msg = fuzz_compile.check(p, verbose=True)
    assert msg is None, f"{what}\n{msg}\n{p.describe()}"


def test_copy_into_a_base_waits_for_the_kernel_reading_it():
    """(fuzz_compile seed 7031) Views of one tensor passed to a graph (what a graph break leaves)
    reach AOTAutograd as their synthetic base; the graph ends with copy_(base, as_strided_scatter
    (...)). That copy_ was hoisted before the fused kernel of `a + 1`, which reads the base
    through an as_strided node: the result saw t3's update."""
    def g(a, t3, t0):
        t4 = a + 1
        t3.add_(t0)
        return t4

    for dtype in (torch.bool, torch.float32):
        base = torch.arange(30) % 3 == 0 if dtype is torch.bool else torch.arange(30.)
        a = base.clone()[6:].view(4, 6)
        want = a + 1                                   # before the update: exact
        want_a = a.clone()
        want_a[1:3] += a[0]
        torch._dynamo.reset()
        b = base.to("neuron")[6:].view(4, 6)
        got = torch.compile(g, backend="neuron")(b, b.narrow(0, 1, 2), b[0])
        assert torch.equal(got.cpu(), want), dtype
        assert torch.equal(b.cpu(), want_a), dtype


def test_a_store_into_an_input_waits_for_a_later_loop_reading_a_view_of_it():
    """`y = w * 0.5 + x; z = w.view(-1) * 2; w.copy_(y)`: the copy_ was absorbed into y's
    loop (y stored straight into w), and z's loop, which reads w through the view node, ran
    after it: z was twice the new w (absorb_copy looked at w's own users, not its views')."""
    def f(x, w, view):
        y = w * 0.5 + x
        z = view(w) * 2
        w.copy_(y)
        return z

    views = (lambda w: w.view(-1), lambda w: w.t().reshape(-1), lambda w: w[1:].reshape(-1))
    for view in views:
        x, w = torch.randint(-9, 9, (4, 6)).float(), torch.randint(-9, 9, (4, 6)).float()
        want_w, want = w * 0.5 + x, view(w) * 2     # small integers and halves: exact
        torch._dynamo.reset()
        wn = w.to("neuron")
        got = torch.compile(f, backend="neuron")(x.to("neuron"), wn, view)
        assert torch.equal(got.cpu(), want)
        assert torch.equal(wn.cpu(), want_w)


def test_a_store_into_an_input_waits_for_a_reader_in_another_chain():
    """(fuzz_compile --stores seed 9055, reduced) `g = c > 0; t = a * a; a.copy_(w * 0.5 + g)`:
    the store joined g's loop's chain, t's loop (an unrelated chain) was split off into a
    kernel of its own, and the kernels ran in order of their first loops: the store before t
    read a. t was the new a squared, directly or through a view."""
    def direct(a, c, w):
        g = c > 0
        t = a * a
        a.copy_(w * 0.5 + g)
        return t

    def through_a_view(a, c, w):
        g = c > 0
        t = a.flatten() * 3
        a.mul_(0.5).add_(w * g)
        return t

    for f in (direct, through_a_view):
        a, c, w = (torch.randint(-4, 4, (6, 6)).float() for _ in range(3))
        want_a = a.clone()
        want = f(want_a, c, w)                         # small integers and halves: exact
        torch._dynamo.reset()
        an = a.to("neuron")
        got = torch.compile(f, backend="neuron")(an, c.to("neuron"), w.to("neuron"))
        assert torch.equal(got.cpu(), want), f.__name__
        assert torch.equal(an.cpu(), want_a), f.__name__


def test_bounded_fuzz_run():
    """N random programs (seeds FIRST.., up to 6 lines; every fourth a row-kernel program),
    each called three times with fresh inputs (the third replays the learned plan), then with
    new sizes, dtypes, strides or big sizes (one of them by seed) and once more as first:
    compiled agrees with CPU eager and the float64 reference (a disagreement torch's own CPU
    aot_eager shares is torch's and skipped, as the fuzzer's driver does)."""
    t0 = time.time()
    bad = []
    for seed in range(FIRST, FIRST + N):
        p = fuzz_compile.generate(seed, max_lines=6, rows=seed % 4 == 0)
        msg = fuzz_compile.check(p, quick=True)
        if msg and "compiled" in msg and fuzz_compile.check(p, dev="cpu", backend="aot_eager",
                                                            quick=True):
            continue
        if msg and seed not in fuzz_compile.KNOWN:
            bad.append(f"{msg}\n{p.describe()}")
    assert not bad, f"{len(bad)} of {N} programs disagree:\n" + "\n".join(bad[:3])
    assert time.time() - t0 < 300


def test_a_returned_view_stays_a_view_of_its_base_on_every_call():
    """(fuzz_compile seed 9044, reduced) A graph returning t1 and its view t3 made t3 with the
    direct view form from its second call on: the same memory, no autograd `_base`. After the
    graph break the next frame took t1 and t3 as unrelated inputs, and read t3 before its
    write into t1 (`t3.clamp()` saw the old values). A returned view goes through the
    dispatcher, so it is a view on every call."""
    def f(a, b):
        t1 = b.new_zeros(b.shape).index_put_((torch.arange(2, device=b.device),), b[:2])
        t3 = t1[..., 1:]
        if a.sum() > 0:
            t5 = t3 + 1
        else:
            t5 = t3 * 2
        t1[1:].add_(torch.minimum(a, a))
        return t3.clamp(min=0.5), t5

    def g(b):
        t1 = b.new_zeros(b.shape).index_put_((torch.arange(2, device=b.device),), b[:2])
        return t1, t1[..., 1:]

    torch._dynamo.reset()
    cg = torch.compile(g, backend="neuron", dynamic=True)
    for _ in range(3):                         # the interpreted call, then planned ones
        t1, t3 = cg(torch.randn(4, 6).to("neuron"))
        assert t3._is_view() and t3._base is t1
    torch._dynamo.reset()
    cf = torch.compile(f, backend="neuron", dynamic=True)
    for sign in (1, -1, 1, -1):
        a = (torch.arange(6.) * 0.5 - 1) * sign
        b = (torch.arange(6.) * 0.25).expand(4, 6)
        want = f(a, b)
        got = cf(a.to("neuron"), b.to("neuron"))
        assert all(torch.equal(x.cpu(), y) for x, y in zip(got, want)), sign
