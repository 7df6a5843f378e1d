"""No crash from Python: errors during a neuron backward and bad arguments to any op end in a
Python exception or a result, never a signal, and leave no half-written state.

Each case runs in a subprocess (a crash must fail the test, not end the session): the process
must exit normally and report what it saw.

    .venv/bin/python -m pytest tests/test_crashes.py -q
    .venv/bin/python tools/crash_hunt.py          # the full crash hunt (make fuzz-crash)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import crash_hunt  # noqa: E402


def run_script(src: str, timeout: float = 300) -> dict:
    """Run `src` in a fresh interpreter; it prints one JSON line (its last output line)."""
    p = subprocess.run([sys.executable, "-c", src], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, (f"exit {p.returncode} (a negative code is a signal)\n"
                               f"{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


BACKWARD_CASES = r'''
import json, torch, eager_neuron
out = {}

def grad_list(t):
    return None if t.grad is None else t.grad.cpu().tolist()

# 1. a tensor hook raising during a neuron backward: catchable, as on the CPU
x = torch.ones(3, device="neuron", requires_grad=True)
y = x * 2
y.register_hook(lambda g: 1 / 0)
try:
    y.sum().backward()
    out["hook"] = "no error"
except ZeroDivisionError as e:
    out["hook"] = ["ZeroDivisionError", grad_list(x)]

# 2. a custom Function whose backward raises
class Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a * 1

    @staticmethod
    def backward(ctx, g):
        raise ValueError("boom in backward")

x = torch.ones(4, device="neuron", requires_grad=True)
x.grad = torch.ones(4, device="neuron")
try:
    Boom.apply(x).sum().backward()
    out["function"] = "no error"
except ValueError as e:
    out["function"] = ["ValueError", "boom in backward" in str(e), grad_list(x)]

# 3. a kernel error inside backward (an out-of-range gather in a backward formula): the CPU's
#    RuntimeError; an already-accumulated .grad stays [1, 1, 1, 1]; opt.step() writes no NaN
bad = torch.tensor([0, 1, 2, 9], device="neuron")

class Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a * 1

    @staticmethod
    def backward(ctx, g):
        return g.gather(0, bad)

w = torch.nn.Parameter(torch.ones(4, device="neuron"))
w.grad = torch.ones(4, device="neuron")
opt = torch.optim.SGD([w], lr=0.5)
try:
    (Gather.apply(w) * 3).sum().backward()
    out["kernel"] = "no error"
except RuntimeError as e:
    opt.step()
    out["kernel"] = [type(e).__name__, "gather" in str(e), grad_list(w), w.detach().cpu().tolist()]

# 4. a post-accumulate-grad hook raising
p = torch.ones(2, device="neuron", requires_grad=True)
p.register_post_accumulate_grad_hook(lambda t: 1 / 0)
try:
    (p * 2).sum().backward()
    out["post_acc"] = "no error"
except ZeroDivisionError:
    out["post_acc"] = "ZeroDivisionError"

# 5. torch.autograd.grad takes the same path
x = torch.ones(3, device="neuron", requires_grad=True)
y = x * 2
y.register_hook(lambda g: [][1])
try:
    torch.autograd.grad(y.sum(), x)
    out["grad"] = "no error"
except IndexError:
    out["grad"] = "IndexError"

# 6. the engine still works: a clean backward after all of the above
x = torch.arange(3.0, device="neuron", requires_grad=True)
(x * x).sum().backward()
out["after"] = grad_list(x)
print(json.dumps(out))
'''


def test_errors_during_backward_are_raised_to_the_caller_and_leave_grad_unchanged():
    r = run_script(BACKWARD_CASES)
    assert r["hook"] == ["ZeroDivisionError", None]
    assert r["function"] == ["ValueError", True, [1.0] * 4]
    assert r["kernel"] == ["RuntimeError", True, [1.0] * 4, [0.5] * 4]   # step used grad 1
    assert r["post_acc"] == "ZeroDivisionError"
    assert r["grad"] == "IndexError"
    assert r["after"] == [0.0, 2.0, 4.0]



NODE_HOOK_CASES = r"""
import json, torch, eager_neuron


def cases(dev):
    out = {}

    def attempt(name, setup):
        x = torch.ones(3, device=dev, requires_grad=True)
        x.grad = torch.ones(3, device=dev)
        y = x * 2
        setup(x, y)
        try:
            y.sum().backward()
            out[name] = ["no error", x.grad.cpu().tolist()]
        except BaseException as e:   # KeyboardInterrupt included: as the CPU raises it
            out[name] = [type(e).__name__, str(e).split(" (hook")[0][:60], x.grad.cpu().tolist()]

    def boom(*a):
        raise ValueError("boom")

    # hooks registered on C++ nodes (MulBackward0, AccumulateGrad) raising or returning what the
    # engine rejects; module full backward hooks (nodes of custom Functions)
    attempt("post_raises", lambda x, y: y.grad_fn.register_hook(boom))
    attempt("pre_raises", lambda x, y: y.grad_fn.register_prehook(boom))
    attempt("acc_raises", lambda x, y: y.grad_fn.next_functions[0][0].register_prehook(boom))
    attempt("post_not_tuple", lambda x, y: y.grad_fn.register_hook(lambda gi, go: 5))
    attempt("pre_item_not_tensor", lambda x, y: y.grad_fn.register_prehook(lambda go: ("a",)))
    attempt("post_wrong_length", lambda x, y: y.grad_fn.register_hook(lambda gi, go: (None, None)))
    attempt("tensor_hook_not_tensor", lambda x, y: y.register_hook(lambda g: 5))
    attempt("post_acc_not_tensor", lambda x, y: x.register_post_accumulate_grad_hook(lambda t: 5))
    attempt("interrupt", lambda x, y: y.grad_fn.register_hook(
        lambda gi, go: (_ for _ in ()).throw(KeyboardInterrupt())))

    def unpack_raises(x, y):
        def unpack(t):
            raise ValueError("unpack")
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
            return (x * x).sum()

    def recompute_raises(x, y):
        calls = []
        def f(a):
            calls.append(1)
            if len(calls) > 1:
                raise ValueError("recompute")
            return a.sin()
        return torch.utils.checkpoint.checkpoint(f, x, use_reentrant=False).sum()

    for name, make in (("unpack_raises", unpack_raises), ("recompute_raises", recompute_raises)):
        x = torch.ones(3, device=dev, requires_grad=True)
        try:
            make(x, None).backward()
            out[name] = "no error"
        except ValueError as e:
            out[name] = [str(e), x.grad]
    m = torch.nn.Linear(3, 3).to(dev)
    m.register_full_backward_pre_hook(lambda mod, go: (5,))
    try:
        m(torch.ones(2, 3, device=dev)).sum().backward()
        out["module_pre"] = "no error"
    except TypeError as e:
        out["module_pre"] = str(e).split(" (hook")[0]
    # the engine still works afterwards
    x = torch.arange(3.0, device=dev, requires_grad=True)
    (x * x).sum().backward()
    out["after"] = x.grad.cpu().tolist()
    return out


# one interpreter: the CPU's outcome is the oracle; a neuron abort ends the process
print(json.dumps({dev: cases(dev) for dev in ("cpu", "neuron")}))
"""


def test_node_hooks_failing_during_backward_raise_as_on_the_cpu():
    """A hook on an autograd node (`y.grad_fn.register_hook`) or a saved-tensor unpack hook
    (checkpointing's recomputation) that raises, or returns what the engine rejects, used to
    end the process during a neuron backward (torch 2.13's device guard calls Python with the
    error pending): it raises what the CPU raises."""
    got = run_script(NODE_HOOK_CASES)
    assert got["neuron"] == got["cpu"]
    assert got["neuron"]["post_raises"] == ["ValueError", "boom", [1.0] * 3]   # grad unchanged
    assert got["neuron"]["post_not_tuple"][:2] == ["TypeError",
                                                   "expected tuple, but hook returned 'int'"]
    assert got["neuron"]["interrupt"][0] == "KeyboardInterrupt"
    assert got["neuron"]["recompute_raises"] == ["recompute", None]   # checkpoint's recompute
    assert got["neuron"]["after"] == [0.0, 2.0, 4.0]

def test_crash_hunt_finds_a_signal_and_names_its_call():
    """The hunt itself can fail: a call that kills its worker is reported by name, and the
    calls after it still run (in a new worker)."""
    s = crash_hunt.hunt(pattern=r"^gather$", mutations=["cpu_arg", "selftest:segv", "dim:99"],
                        timeout=120)
    assert s["signals"] == ["gather selftest:segv (exit -11, SIGSEGV)"], s["signals"]
    # the calls around the dead one ran: before it in the first worker, after it in a new one
    assert s["ops"] == 1 and s["calls"] == 3 and s["results"] + s["exceptions"] == 2, s
    assert s["by_type"]["IndexError"] == 1   # dim:99


def test_crash_hunt_bounded():
    """Every 25th op of op_db with bad arguments (tools/crash_hunt.py --quick): each call ends in
    a Python exception or a result; none wrote to its tensors and then raised."""
    s = crash_hunt.hunt(quick=True, timeout=240)
    print(f"crash hunt (quick): {s['ops']} ops, {s['calls']} calls, {s['exceptions']} exceptions,"
          f" signals {s['signals']}, hangs {s['hangs']}, wrote {s['wrote']}")
    assert s["ops"] >= 25 and s["calls"] >= 50
    assert s["signals"] == [] and s["hangs"] == [] and s["wrote"] == []



def test_custom_function_gradient_on_the_wrong_device_is_refused():
    """The engine skips its device check for tensor subclasses: a custom Function returning a
    CPU gradient for a neuron input put a CPU tensor in `.grad`. Refused as CUDA refuses it;
    a 0-d gradient is moved; mixed CPU/neuron inputs with right gradients pass."""
    import torch

    class Cpu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, k, b):
            return a * k

        @staticmethod
        def backward(ctx, g):
            return torch.ones(4), None, None

    class Scalar(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            return a * b.sum().item()

        @staticmethod
        def backward(ctx, g):
            return g, torch.tensor(2.0, device="neuron")   # 0-d, for the CPU input b

    x = torch.ones(4, device="neuron", requires_grad=True)
    w = torch.tensor(1.0, requires_grad=True)
    try:
        Cpu.apply(x, 2, w).sum().backward()
    except RuntimeError as e:
        assert "invalid gradient at index 0 - expected device neuron:0 but got cpu" in str(e)
    else:
        raise AssertionError("no error")
    assert x.grad is None
    Scalar.apply(x, w).sum().backward()
    assert x.grad.device.type == "neuron" and w.grad.device.type == "cpu"
    assert x.grad.cpu().tolist() == [1.0] * 4 and w.grad.item() == 2.0
