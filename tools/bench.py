"""make bench: measured numbers for the README and the closing notes (medians, one run).

Everything is compared with torch CPU eager in the same process. The machine is shared and noisy:
read ratios, not absolute times.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import warnings

# torch's and Numba's OpenMP workers spin after a parallel op and take a core from whichever
# side is timed next on a 2-core machine (docs/COMPILE.md, "Session 9"): passive workers sleep
# at once; set before torch loads OpenMP (a value the caller exported wins)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn as nn

import eager_neuron

warnings.simplefilter("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))


def median_time(fn, repeat: int = 7, number: int = 1) -> float:
    fn()  # warm: compile / load kernels, fault pages in
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return statistics.median(times)


def sync(t):
    # neuron results are complete when the op returns (kernels run synchronously on the host);
    # the item() read is what a user would do to observe it
    return t


def _interleaved(fns: dict, n: int, rounds: int = 9) -> dict:
    """Median seconds per call of each fn, the fns measured in turn within every round, so a
    load spike on the shared machine hits all of them alike. Time is this thread's CPU time
    (time.thread_time): what the op costs the host, without the time the thread waited for a
    core on a busy machine."""
    times = {k: [] for k in fns}
    for fn in fns.values():
        for _ in range(50):
            fn()
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.thread_time()
            for _ in range(n):
                fn()
            times[k].append((time.thread_time() - t0) / n)
    return {k: statistics.median(v) for k, v in times.items()}


def per_op_overhead() -> None:
    print("== per-op host cost, warm (us/op of thread CPU time; torch CPU eager and neuron "
          "measured in turn) ==")
    cases = {
        "binary a+b (4 floats)": lambda a, b, m: a + b,
        "unary a.neg()": lambda a, b, m: a.neg(),
        "in-place a.add_(b)": lambda a, b, m: a.add_(b),
        "view a.view(2, 2)": lambda a, b, m: a.view(2, 2),
        "view m[0][1]": lambda a, b, m: m[0][1],
        "view m[0].t()": lambda a, b, m: m[0].t(),
        "view m[0][1:3]": lambda a, b, m: m[0][1:3],
        "reduction a.sum()": lambda a, b, m: a.sum(),
        "mm 64x64": lambda a, b, m: m[0] @ m[1],   # two matrices (m @ m is never learned)
    }
    targets = {"binary a+b (4 floats)": 7.0, "view a.view(2, 2)": 3.0}
    tensors = {dev: (torch.randn(4, device=dev), torch.randn(4, device=dev),
                     (torch.randn(64, 64, device=dev), torch.randn(64, 64, device=dev)))
               for dev in ("cpu", "neuron")}
    print(f"  {'op':<24} {'torch':>8} {'neuron':>8} {'ratio':>7}  target")
    for name, fn in cases.items():
        fns = {dev: (lambda fn=fn, t=tensors[dev]: fn(*t)) for dev in ("cpu", "neuron")}
        res = _interleaved(fns, 2000)
        cpu, neu = res["cpu"] * 1e6, res["neuron"] * 1e6
        goal = targets.get(name)
        verdict = "" if goal is None else (
            f"<= {goal:g} us: {'met' if neu <= goal else f'missed by {neu / goal:.1f}x'}")
        print(f"  {name:<24} {cpu:8.2f} {neu:8.2f} {neu / cpu:6.1f}x  {verdict}")
    _breakdown()
    _view_breakdown()


def _breakdown() -> None:
    """Where a repeat `a + b` spends its microseconds: each stage of the fast path's runner
    timed alone (see eager_neuron/fastpath.py), next to the whole op."""
    import numpy as np

    from eager_neuron import fastpath
    from eager_neuron.launch import MEMORY
    from eager_neuron.simulator import SIM
    from eager_neuron.tensor import DEVICES, NeuronTensor

    a = torch.randn(4, device="neuron")
    b = torch.randn(4, device="neuron")
    a + b
    a + b
    kernel = next(k for key, k in MEMORY._kernels.items()
                  if "aten::add" in key and "elementwise" in key)
    ad, bd = a._data, b._data
    an, bn, on = ad.numpy(), bd.numpy(), np.empty(4, np.float32)
    core = SIM.cores[0]
    charge = core.cost_of(4.0, 48.0, "vector", "fp32")[1:] + ("vector", 48.0)
    entry = fastpath._entry_point(kernel, (on, an, bn, 1)) or kernel

    def _drop(make):
        # what a dropped result costs: the wrapper, its host view and its HBM block
        r = make(NeuronTensor, (4,), (1,), 0, None, torch.float32, torch.strided, dev)
        r._data, r._block = torch.from_numpy(np.empty(4, np.float32)), core.alloc_small(512)
        r._index = 0

    class _Floor(torch.Tensor):
        """A wrapper subclass whose __torch_dispatch__ returns a ready tensor: the floor of
        Python dispatch for any wrapper-subclass device."""

        @staticmethod
        def __new__(cls):
            return torch.Tensor._make_wrapper_subclass(cls, (4,), dtype=torch.float32)

        __torch_function__ = torch._C._disabled_torch_function_impl

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return ready

    ready = _Floor()
    fa, fb = _Floor(), _Floor()
    # a recycling runner's allocation (fastpath._recycle_lines): the reference-count check of a
    # dead output's buffer, then its block (a HostBlock, which lists the buffer when it dies)
    free, dead = [], fastpath._fresh_host(4, np.float32, None)
    want = fastpath._RECYCLE_CHECK[0]

    def _recycled():
        h = free.pop() if free else dead
        if fastpath._host_refs(h) == want:
            core.alloc_small(512, h, free)
    make = torch.Tensor._make_wrapper_subclass
    dev = DEVICES[0]
    run, dispatch = _runner(torch.ops.aten.add.Tensor, (a, b))
    stages = {
        "whole op (a + b)": lambda: a + b,
        "dispatch() alone": lambda: dispatch(torch.ops.aten.add.Tensor, (a, b), {}),
        "runner alone": lambda: run((a, b), {}),
        "Python dispatch floor": lambda: fa + fb,
        "signature": lambda: fastpath.signature((a, b), {}, False),
        "out alloc (core + numpy)": lambda: (core.alloc_small(512), torch.from_numpy(
            np.empty(4, np.float32))),
        "out alloc, recycled": _recycled,
        "operand numpy views x2 (cached)": lambda: (fastpath.flat_np(a), fastpath.flat_np(b)),
        "kernel call (Numba)": lambda: kernel(on, an, bn, 1),
        "kernel entry point": lambda: entry(on, an, bn, 1),
        "simulator charge": lambda: core.charge(*charge),
        "wrap (wrapper subclass)": lambda: make(NeuronTensor, (4,), (1,), 0, None,
                                                torch.float32, torch.strided, dev),
        "torch CPU a + b": lambda: ad + bd,
        "a result made and dropped": lambda: _drop(make),
    }
    res = _interleaved(stages, 2000, rounds=5)
    print("  breakdown of a repeat a + b (each stage alone, us):")
    for name, t in res.items():
        print(f"    {name:<28} {t * 1e6:6.2f}")
    drop = (res["a result made and dropped"] - res["out alloc (core + numpy)"]
            - res["wrap (wrapper subclass)"]) * 1e6
    parts = sum(res[k] for k in list(stages)[3:-2]
                if k not in ("kernel call (Numba)", "out alloc (core + numpy)")) * 1e6 + drop
    print(f"    {'-> dropping a result':<28} {drop:6.2f}  (made and dropped - alloc - wrap)")
    print(f"    {'sum of the stages':<28} {parts:6.2f}  (the rest is the runner's own Python)")
    _split(res, "whole op (a + b)")


def _runner(func, args):
    """The learned runner of func(*args) (called twice first) and dispatch() itself."""
    from eager_neuron import fastpath
    from eager_neuron.dispatch import dispatch

    tab = fastpath.TABLES[func]
    return tab[1][fastpath.signature(args, {}, tab[0])], dispatch


def _split(res: dict, whole: str) -> None:
    """The op in three: torch's C++ -> Python door, the funnel's entry (dispatch.py's checks,
    the signature and its lookup), the runner."""
    w, d, r = (res[k] * 1e6 for k in (whole, "dispatch() alone", "runner alone"))
    print(f"    {'-> door | entry | runner':<28} {w - d:6.2f} | {d - r:.2f} | {r:.2f}"
          "  (whole - dispatch() | dispatch() - runner | runner)")


def _view_breakdown() -> None:
    """Where a repeat view `x.view(-1)` spends its microseconds: the view runner's stages
    (eager_neuron/fastpath.py, learn_view) timed alone, next to the floor of any wrapper
    subclass: a __torch_dispatch__ that only makes the output wrapper."""
    from eager_neuron import fastpath
    from eager_neuron.tensor import DEVICES, NeuronTensor

    x = torch.randn(4, 4, device="neuron")
    xd = x._data
    cx = torch.randn(4, 4)
    make = torch.Tensor._make_wrapper_subclass
    dev = DEVICES[0]

    class _Floor(torch.Tensor):
        """A wrapper subclass whose __torch_dispatch__ makes the view's wrapper and nothing
        else (autograd still records the view around it, as for ours)."""

        @staticmethod
        def __new__(cls):
            return make(cls, (4, 4), dtype=torch.float32)

        __torch_function__ = torch._C._disabled_torch_function_impl

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return make(cls, (16,), (1,), 0, None, torch.float32, torch.strided, None)

    fx = _Floor()
    args = (x, [-1])
    x.view(-1)
    x.view(-1)
    run, dispatch = _runner(torch.ops.aten.view.default, args)
    stages = {
        "whole op (x.view(-1))": lambda: x.view(-1),
        "dispatch() alone": lambda: dispatch(torch.ops.aten.view.default, args, {}),
        "runner alone": lambda: run(args, {}),
        "floor: wrapper-only subclass": lambda: fx.view(-1),
        "signature": lambda: fastpath.signature(args, {}, True),
        "host view (Tensor.view)": lambda: xd.view(-1),
        "host view (aten overload)": lambda: torch.ops.aten.view.default(xd, [-1]),
        "wrap (wrapper subclass)": lambda: make(NeuronTensor, (16,), (1,), 0, None,
                                                torch.float32, torch.strided, dev),
        "torch CPU view": lambda: cx.view(-1),
    }
    res = _interleaved(stages, 2000, rounds=5)
    print("  breakdown of a repeat x.view(-1) (each stage alone, us):")
    for name, t in res.items():
        print(f"    {name:<28} {t * 1e6:6.2f}")
    floor = res["floor: wrapper-only subclass"] * 1e6
    print(f"    {'-> above the floor':<28} {res['whole op (x.view(-1))'] * 1e6 - floor:6.2f}"
          f"  (target 3 us is {3.0 / floor:.2f}x the floor)")
    _split(res, "whole op (x.view(-1))")


def _tp_interleaved(fns: dict, repeat: int = 15, clock=time.perf_counter) -> dict:
    """Median seconds per function, the functions timed in turn within each repetition (so a
    burst of load on this shared machine hits all of them, not one)."""
    for fn in fns.values():
        fn()
        fn()  # warm: compile / load kernels, fault pages in, settle the allocators
    times = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = clock()
            fn()
            times[name].append(clock() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _tp_cases():
    """(name, make(dev) -> fn, kernel threads, target): "T" runs on the thread count under
    test (prange kernels, MKL), 1 is a serial kernel (torch is then timed on 1 thread too)."""
    F = torch.nn.functional
    n = 4 * 1024 * 1024

    def vec(fn, *shapes):
        def make(dev):
            g = torch.Generator().manual_seed(0)
            xs = [torch.randn(s, generator=g).to(dev) for s in shapes]
            return lambda: fn(*xs)
        return make

    return [
        # issue 14: GELU, sum >= 1.0x, mm >= 0.95x, every other row kept >= 1.0x
        ("add 4M", vec(torch.add, n, n), "T", 1.0),
        ("gelu 4M", vec(F.gelu, n), "T", 1.0),
        ("gelu tanh 4M", vec(lambda x: F.gelu(x, approximate="tanh"), n), "T", 1.0),
        ("sum 4M", vec(torch.sum, n), 1, 1.0),
        ("mm 1024^2", vec(torch.mm, (1024, 1024), (1024, 1024)), "T", 0.95),
        ("mean 4M", vec(torch.mean, n), 1, 1.0),
        ("amax 4M", vec(torch.amax, n), "T", 1.0),
        ("sum(1) 2048^2", vec(lambda x: x.sum(1), (2048, 2048)), "T", 1.0),
        ("sum(0) 2048^2", vec(lambda x: x.sum(0), (2048, 2048)), "T", 1.0),
        ("softmax(-1) 4096x1024", vec(lambda x: x.softmax(-1), (4096, 1024)), "T", 1.0),
        # an optimizer's in-place updates on a mid-size parameter (in L2): the in-place kernels
        # read x0 from their output (kernels/elementwise.py _in_place_loop)
        ("lerp_ 64K", vec(lambda p, g: p.lerp_(g, 0.1), 1 << 16, 1 << 16), "T", 1.0),
        ("addcdiv_ 64K", _addcdiv_make(1 << 16), "T", 1.0),
    ]


def _addcdiv_make(n: int):
    def make(dev):
        g = torch.Generator().manual_seed(0)
        p, num = torch.randn(n, generator=g).to(dev), torch.randn(n, generator=g).to(dev)
        den = (torch.rand(n, generator=g) + 0.5).to(dev)
        return lambda: p.addcdiv_(num, den, value=1e-3)
    return make


def throughput() -> None:
    """Kernel throughput against torch CPU eager at equal thread counts (issue 14 item 3).

    Both sides run under each thread count T (torch.set_num_threads, numba.set_num_threads;
    MKL follows torch's). A serial neuron kernel (sum/mean of one float32 row) is compared
    with torch on one thread. Medians of interleaved repetitions, one process.
    """
    import numba

    from eager_neuron.kernels.compile import numba as _numba

    _numba()
    default = torch.get_num_threads()
    features = os.environ.get("NUMBA_CPU_FEATURES", "")
    width = 512 if "-prefer-256-bit" in features else "LLVM's default"
    print(f"== throughput vs torch CPU eager (medians of 15, interleaved; load "
          f"{os.getloadavg()[0]:.1f}; vector width {width}) ==")
    cases = _tp_cases()
    made = {name: (make("cpu"), make("neuron")) for name, make, _t, _g in cases}
    for t in sorted({1, default}):
        print(f"  -- {t} thread(s): torch.set_num_threads({t}), numba.set_num_threads({t}) --")
        for name, _make, kt, target in cases:
            threads = t if kt == "T" else kt
            # numba first: its first set_num_threads starts the OpenMP layer, which resets
            # torch's intra-op threads to the default (the first row ran torch on 2 threads)
            numba.set_num_threads(min(t, numba.config.NUMBA_NUM_THREADS))
            torch.set_num_threads(threads)
            cpu_fn, dev_fn = made[name]
            res = _tp_interleaved({"cpu": cpu_fn, "neuron": dev_fn})
            ratio = res["cpu"] / res["neuron"]
            verdict = "" if target is None else \
                f"  target >= {target}x: {'met' if ratio >= target else 'missed'}"
            cpu_time = ""
            if threads == 1:
                # one thread: the work runs on this thread, so its CPU time is the op's cost
                # without the time the scheduler gave other processes (read this under load)
                ct = _tp_interleaved({"cpu": cpu_fn, "neuron": dev_fn}, clock=time.thread_time)
                cpu_time = (f"  [cpu time {ct['cpu'] * 1e3:.3f} / {ct['neuron'] * 1e3:.3f} ms: "
                            f"{ct['cpu'] / max(ct['neuron'], 1e-9):.2f}x]")
            print(f"  {name:>21}: torch {res['cpu'] * 1e3:8.3f} ms  neuron "
                  f"{res['neuron'] * 1e3:8.3f} ms  ({threads} thread{'s' * (threads > 1)})  "
                  f"speed vs torch {ratio:5.2f}x{verdict}{cpu_time}")
    torch.set_num_threads(default)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    print(f"  (load {os.getloadavg()[0]:.1f} at the end)")


def throughput_split() -> None:
    """Where a one-thread throughput row's time goes: torch, the neuron op, and its kernels
    alone (the compiled entry points of the launches one slow call made, on that call's own
    buffers), thread-time medians in one process. op - kernels is the host path, paid with
    the caches cold: each row's kernel has just streamed 16+ MiB through them (THROUGHPUT.md).

    >>> throughput_split()   # doctest: +SKIP
    """
    import numba

    from eager_neuron import fastpath
    from eager_neuron import launch as L
    from eager_neuron.kernels.compile import numba as _numba

    _numba()
    default = torch.get_num_threads()
    numba.set_num_threads(1)
    torch.set_num_threads(1)
    orig = L.launch
    rec = []

    def spy(key, render, args, *a, **k):
        rec.append((key, args))
        return orig(key, render, args, *a, **k)

    mods = [m for m in list(sys.modules.values())
            if getattr(m, "__name__", "").startswith("eager_neuron")
            and getattr(m, "launch", None) is orig]
    print(f"== throughput rows split, 1 thread (thread-time medians of 21; load "
          f"{os.getloadavg()[0]:.1f}) ==")
    for name, make, _kt, _target in _tp_cases():
        cpu_fn, dev_fn = make("cpu"), make("neuron")
        fastpath.reset()   # the next call takes the slow path, through launch()
        rec.clear()
        for m in mods:
            m.launch = spy
        try:
            dev_fn()
        finally:
            for m in mods:
                m.launch = orig
        calls = []
        for key, args in rec:
            kern = L.MEMORY.get(L.full_key(key, args))
            cres = getattr(kern, "overloads", {}).get(
                tuple(kern.typeof_pyval(a) for a in args)) if kern is not None else None
            calls.append((cres.entry_point if cres is not None else kern, args))

        def kernels(calls=calls):
            for fn, args in calls:
                fn(*args)

        # torch runs before each of the two, so both find the caches as the op does in
        # throughput() (the kernels right after the op would find its output lines warm)
        r = _tp_interleaved({"torch": cpu_fn, "op": dev_fn, "torch again": cpu_fn,
                             "kernels": kernels}, repeat=21, clock=time.thread_time)
        print(f"  {name:>21}: torch {r['torch'] * 1e3:7.3f}  op {r['op'] * 1e3:7.3f}  kernels "
              f"{r['kernels'] * 1e3:7.3f} ms  host {(r['op'] - r['kernels']) * 1e6:5.0f} us  "
              f"op {r['torch'] / r['op']:.2f}x  kernels {r['torch'] / r['kernels']:.2f}x torch")
    torch.set_num_threads(default)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)


def _mlp():
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def _encoder():
    return nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)


def _step_fn(make, batch):
    torch.manual_seed(0)
    model = make().to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = batch().to("neuron")

    def step():
        out = model(x)
        loss = out.float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()
    return step


def adaptive_bench() -> None:
    print("== adaptive eager vs plain eager, per training step (AdamW) ==")
    models = {
        "MLP": (_mlp, lambda: torch.randn(32, 64)),
        "TransformerEncoderLayer": (_encoder, lambda: torch.randn(8, 16, 64)),
    }
    for name, (make, batch) in models.items():
        row = {}
        for mode in (False, True):
            eager_neuron.set_adaptive(mode)
            step = _step_fn(make, batch)
            step()
            step()  # warm: compile once, state initialised
            if mode:   # adaptive: the fused kernels queued by the warm steps finish building
                from eager_neuron import adaptive_compile

                # (a trace is queued when it repeats: those first seen in the second step
                # are queued by the third)
                for _ in range(2):
                    adaptive_compile.wait(300)
                    step()
            eager_neuron.reset_stats()
            from eager_neuron.simulator import SIM
            t_dev0 = SIM.device_time_us()
            wall = median_time(step, repeat=5)
            s = eager_neuron.stats()
            steps = 6  # median_time's warm call + 5 repeats
            row[mode] = (s["launches"] / steps, (SIM.device_time_us() - t_dev0) / steps, wall)
        eager_neuron.set_adaptive(False)
        (lp, dp, wp), (la, da, wa) = row[False], row[True]
        print(f"  {name}: launches/step plain {lp:.0f}, adaptive {la:.0f} (ratio 1/{lp / la:.1f};"
              f" target <= 1/5: {'met' if la * 5 <= lp else 'missed'})")
        print(f"  {'':>{len(name)}}  simulated device time/step plain {dp / 1e3:.3f} ms, "
              f"adaptive {da / 1e3:.3f} ms; wall/step plain {wp * 1e3:.1f} ms, "
              f"adaptive {wa * 1e3:.1f} ms")


def chain_bench() -> None:
    print("== 6-op elementwise chain on 4M floats ==")
    n = 4 * 1024 * 1024

    def chain(x):
        return ((x * 1.5 + 0.5).relu() - 0.25).sigmoid() * x + 1.0

    x_cpu = torch.randn(n)
    x_dev = x_cpu.to("neuron")
    t_cpu = median_time(lambda: chain(x_cpu))

    def fused():
        with eager_neuron.adaptive():
            y = chain(x_dev)
        return y
    # the first call queues the fused kernel's compile in the background (docs/ADAPTIVE.md);
    # until it lands the group runs op by op: the steady state is timed after it (the first
    # step's cost is adaptive_bench's "first step" row)
    from eager_neuron import adaptive_compile

    for _ in range(2):   # (a trace is queued when it repeats)
        fused()
        adaptive_compile.wait(600)
    t_ad = median_time(fused)
    print(f"  torch CPU eager {t_cpu * 1e3:.2f} ms; neuron adaptive {t_ad * 1e3:.2f} ms "
          f"-> {t_cpu / t_ad:.2f}x (target >= 2.5x)")
    try:
        compiled = torch.compile(chain)
        t_c = median_time(lambda: compiled(x_cpu))
        print(f"  torch.compile (inductor, CPU) {t_c * 1e3:.2f} ms -> adaptive is "
              f"{t_c / t_ad:.2f}x of it (target >= 1.5x)")
    except Exception as exc:  # inductor needs a working C++ toolchain
        print(f"  torch.compile unavailable here: {type(exc).__name__}: {str(exc)[:120]}")


def extra(script: str) -> None:
    path = os.path.join(HERE, script)
    if os.path.exists(path):
        print(f"== {script} ==", flush=True)
        subprocess.run([sys.executable, path], check=False)


def main() -> None:
    """make bench; `tools/bench.py --per-op`: the per-op table and its breakdowns only."""
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"{os.cpu_count()} cores; eager_neuron {eager_neuron.__version__}", flush=True)
    per_op_overhead()
    if "--per-op" in sys.argv[1:]:   # the per-op table and breakdowns only
        return
    throughput()
    adaptive_bench()
    chain_bench()
    sys.stdout.flush()
    extra("bench_cache.py")
    extra("bench_profiler.py")
    extra("bench_kernels.py")
    extra("bench_compile.py")


if __name__ == "__main__":
    main()
