"""torch.compile(backend="neuron") vs neuron eager vs torch CPU eager vs inductor (CPU).

Prints medians and ratios (one run on a shared machine: read ratios, not absolute times):
  1. the 6-op elementwise chain on 4M floats (the chain of tools/bench.py)
  2. an MLP training step (forward, MSE loss, backward, AdamW step)
  3. cold vs warm compile of the MLP step (a second process with the disk cache)
  4. GPT-2 tiny training step (tests/test_hf_models.py's model; AdamW): torch CPU eager,
     neuron eager, neuron compiled, inductor; cold compile of that step, neuron vs inductor
     (fresh caches, one process each), and a warm neuron process

    .venv/bin/python tools/bench_compile.py              # everything
    .venv/bin/python tools/bench_compile.py chain gpt2   # some sections
    .venv/bin/python tools/bench_compile.py gpt2-warm    # GPT-2 cold and warm compile, no inductor
"""

from __future__ import annotations

import copy
import os
import statistics
import subprocess
import sys
import time
import warnings

# OpenMP workers spin after torch's parallel regions and took a core from whatever ran next
# (tools/compile_sweep.py measured it: a compiled Llama step 59 ms next to torch's two-thread
# steps, 23 ms without them); passive workers sleep at once. Set before torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import eager_neuron  # noqa: E402

warnings.simplefilter("ignore")
torch._dynamo.config.cache_size_limit = 64


def median_time(fn, repeat: int = 7) -> float:
    fn()
    fn()  # warm: traced, compiled, kernels loaded
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def chain(x):
    return ((x * 1.5 + 0.5).relu() - 0.25).sigmoid() * x + 1.0


def chain_bench() -> None:
    print("== 6-op elementwise chain on 4M floats ==")
    n = 4 * 1024 * 1024
    x_cpu = torch.randn(n)
    x_dev = x_cpu.to("neuron")
    res = {"torch CPU eager": median_time(lambda: chain(x_cpu)),
           "neuron eager": median_time(lambda: chain(x_dev))}

    def adaptive():
        with eager_neuron.adaptive():   # leaving the context flushes the recorded group
            return chain(x_dev)
    res["neuron adaptive"] = median_time(adaptive)
    neuron_c = torch.compile(chain, backend="neuron")
    res["neuron compiled"] = median_time(lambda: neuron_c(x_dev))
    try:
        ind = torch.compile(chain)
        res["inductor (CPU)"] = median_time(lambda: ind(x_cpu))
    except Exception as exc:  # inductor needs a working C++ toolchain
        print(f"  inductor unavailable: {type(exc).__name__}: {str(exc)[:100]}")
    _report(res, "neuron compiled", targets={"inductor (CPU)": 1.0})


def _mlp():
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def _step(model, x, y):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def mlp_bench() -> None:
    print("== MLP training step (64-128-128-10, batch 32, AdamW) ==")
    torch.manual_seed(0)
    base = _mlp()
    x, y = torch.randn(32, 64), torch.randn(32, 10)
    res = {}
    res["torch CPU eager"] = median_time(_step(copy.deepcopy(base), x, y))
    xd, yd = x.to("neuron"), y.to("neuron")
    res["neuron eager"] = median_time(_step(copy.deepcopy(base).to("neuron"), xd, yd))
    res["neuron compiled"] = median_time(torch.compile(
        _step(copy.deepcopy(base).to("neuron"), xd, yd), backend="neuron"))
    try:
        res["inductor (CPU)"] = median_time(torch.compile(_step(copy.deepcopy(base), x, y)))
    except Exception as exc:
        print(f"  inductor unavailable: {type(exc).__name__}: {str(exc)[:100]}")
    _report(res, "neuron compiled", targets={"torch CPU eager": 1.0})
    s = eager_neuron.compile.stats()
    print(f"  kernels per graph {s['kernels_per_graph']}, eager ops in graphs "
          f"{sum(s['graph_eager_ops'].values())} ({len(s['graph_eager_ops'])} kinds, all "
          f"steps), host scalar ops {s['host_scalar_ops']}")


_COLD = """
import time, torch, eager_neuron
t0 = time.perf_counter()
import tools.bench_compile as b
m = b._mlp().to("neuron")
x, y = torch.randn(32, 64, device="neuron"), torch.randn(32, 10, device="neuron")
step = torch.compile(b._step(m, x, y), backend="neuron")
step(); step()
print("SECONDS", time.perf_counter() - t0, eager_neuron.stats()["compiles"])
"""


def compile_time_bench() -> None:
    print("== MLP step compile: cold process vs warm process (shared disk cache) ==")
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, EAGER_NEURON_CACHE_DIR=d, PYTHONPATH=root)
        out = []
        for label in ("cold", "warm"):
            r = subprocess.run([sys.executable, "-c", _COLD], env=env, cwd=root,
                               capture_output=True, text=True)
            line = [ln for ln in r.stdout.splitlines() if ln.startswith("SECONDS")]
            if not line:
                print(f"  {label}: failed: {r.stderr[-300:]}")
                return
            secs, compiles = float(line[0].split()[1]), int(line[0].split()[2])
            out.append(secs)
            print(f"  {label}: {secs:.2f} s to the second step, {compiles} Numba compiles")
        print(f"  warm/cold {out[1] / out[0]:.2f} (target <= 0.10)")


def _gpt2_parts():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "tests"))
    import test_hf_models as hf

    model, batches = hf.build("gpt2")
    for sub in model.modules():
        if getattr(getattr(sub, "config", None), "use_cache", None):
            sub.config.use_cache = False    # training: no KV cache
    return model, batches, hf


def _gpt2_step(model, batch, hf, device):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-4)
    inputs = hf.to_device(batch, device)

    def step():
        opt.zero_grad()
        loss = model(**inputs).loss
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def gpt2_bench() -> None:
    print("== GPT-2 tiny training step (AdamW) ==")
    model, batches, hf = _gpt2_parts()
    res = {}
    res["torch CPU eager"] = median_time(_gpt2_step(copy.deepcopy(model), batches[0], hf, "cpu"))
    res["neuron eager"] = median_time(_gpt2_step(copy.deepcopy(model).to("neuron"), batches[0],
                                                 hf, "neuron"))
    compiled = torch.compile(_gpt2_step(copy.deepcopy(model).to("neuron"), batches[0], hf,
                                        "neuron"), backend="neuron")
    res["neuron compiled"] = median_time(compiled)
    eager_neuron.compile.reset_stats()
    compiled()                       # the counters of one step
    s = eager_neuron.compile.stats()
    try:
        res["inductor (CPU)"] = median_time(torch.compile(_gpt2_step(
            copy.deepcopy(model), batches[0], hf, "cpu")))
    except Exception as exc:
        print(f"  inductor unavailable: {type(exc).__name__}: {str(exc)[:100]}")
    _report(res, "neuron compiled", targets={"torch CPU eager": 1.0})
    print(f"  one step: {s['graph_launches']} graph launches, {s['fused_kernel_launches']} "
          f"kernels ({s['row_kernel_launches']} row kernels), "
          f"{sum(s['graph_eager_ops'].values())} eager ops in graphs, "
          f"{s['host_scalar_ops']} host scalar ops, graph fallbacks {s['graph_fallbacks']}")


class Phases:
    """Inclusive seconds spent inside a few functions of torch's and ours, wrapped in place
    (module attributes looked up at call time): where a warm compile goes, without cProfile's
    distortion of Python-heavy code. `report()` splits the compile into torch's and ours."""

    def __init__(self) -> None:
        self.t: dict = {}

    def wrap(self, owner, attr: str, label: str) -> None:
        import functools

        fn = getattr(owner, attr, None)
        if fn is None:                        # (an older tree without it: not timed)
            return
        depth = [0]

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if depth[0]:                      # (recursive: counted once, outermost)
                return fn(*args, **kwargs)
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                self.t[label] = self.t.get(label, 0.0) + time.perf_counter() - t0
        if isinstance(owner, type) and isinstance(owner.__dict__.get(attr), staticmethod):
            timed = staticmethod(timed)
        setattr(owner, attr, timed)

    def install(self) -> None:
        import torch._dynamo.convert_frame as cf
        import torch._functorch._aot_autograd.autograd_cache as ac
        import torch._functorch.aot_autograd as aa
        from torch.fx._graph_pickler import GraphPickler

        from eager_neuron import launch
        from eager_neuron.compile import artifact, backend
        from eager_neuron.kernels import compile as kc

        self.wrap(cf, "_compile", "dynamo")                  # a frame: trace + backend
        self.wrap(aa, "aot_module_simplified", "aot")        # the backend's AOTAutograd call
        self.wrap(ac, "autograd_cache_key", "aot_key")       # torch's cache key
        self.wrap(GraphPickler, "loads", "graph_load")       # a stored aten graph
        self.wrap(GraphPickler, "dumps", "graph_save")
        self.wrap(backend, "compile_graph", "partition")      # ours: graph -> Program
        self.wrap(artifact, "load_program", "restore")       # ours: a stored Program
        self.wrap(launch, "_build", "kernels")               # ours: kernel load or compile
        self.wrap(kc, "numba", "numba_import")

    def report(self, compile_s: float) -> str:
        t = self.t
        ours_in_aot = t.get("partition", 0) + t.get("restore", 0)
        torch_s = t.get("dynamo", 0) - ours_in_aot
        ours_s = ours_in_aot + t.get("kernels", 0)
        parts = " ".join(f"{k}={v:.2f}" for k, v in sorted(t.items()))
        return (f"torch (dynamo + AOTAutograd, its cache) {torch_s:.2f} s, ours (programs, "
                f"kernels) {ours_s:.2f} s, the rest (first runs) "
                f"{max(compile_s - torch_s - ours_s, 0.0):.2f} s [{parts}]")


_GPT2_COLD = """
import time, os, sys, warnings
t0 = time.perf_counter()
import torch
warnings.simplefilter("ignore")
import eager_neuron
import tools.bench_compile as b
phases = b.Phases()
phases.install()
t_import = time.perf_counter()
model, batches, hf = b._gpt2_parts()
dev = "neuron" if sys.argv[1] == "neuron" else "cpu"
step = b._gpt2_step(model.to(dev), batches[0], hf, dev)
step = torch.compile(step, backend="neuron") if dev == "neuron" else torch.compile(step)
t_build = time.perf_counter()
step(); step()
t_two = time.perf_counter()
steady = []
for _ in range(3):
    t = time.perf_counter()
    step()
    steady.append(time.perf_counter() - t)
c = eager_neuron.compile.stats()
s = eager_neuron.stats()
print("SECONDS", t_two - t0, s["compiles"], c["programs_loaded"],
      c["programs_saved"], t_import - t0, t_build - t_import, t_two - t_build, min(steady))
print("PHASES", s.get("kernel_renders", "?"), c.get("programs_restored", "?"),
      phases.report(t_two - t_build - 2 * min(steady)))
"""


def gpt2_warm_bench() -> None:
    """gpt2-compile without the inductor process (cold and warm neuron only)."""
    gpt2_compile_bench(inductor=False)


def gpt2_compile_bench(inductor: bool = True) -> None:
    """Three fresh processes (cold neuron, warm neuron on the first's caches, cold inductor),
    each timed in phases: imports (torch, eager_neuron, transformers' modules), building the
    model and the compiled step, and the first two steps. The same work in each process; the
    compile is what the first two steps cost beyond two steady steps (dynamo's tracing,
    AOTAutograd or its cache, our partition and kernels, torch's and transformers' lazy imports
    on the first trace): the target (warm <= 10% of cold) is read on it, and on the whole
    process as before."""
    print("== GPT-2 tiny step compile: cold neuron vs cold inductor vs warm neuron ==")
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out, comp = {}, {}
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, EAGER_NEURON_CACHE_DIR=os.path.join(d, "neuron"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(d, "inductor"), PYTHONPATH=root)
        sides = (("neuron cold", "neuron"), ("neuron warm", "neuron"),
                 ("inductor cold", "inductor"))
        for label, backend in sides if inductor else sides[:2]:
            r = subprocess.run([sys.executable, "-c", _GPT2_COLD, backend], env=env, cwd=root,
                               capture_output=True, text=True)
            line = [ln for ln in r.stdout.splitlines() if ln.startswith("SECONDS")]
            if not line:
                print(f"  {label}: failed: {r.stderr[-300:]}")
                continue
            parts = line[0].split()
            out[label] = float(parts[1])
            imp, build, two, steady = (float(p) for p in parts[5:9])
            comp[label] = max(two - 2 * steady, 0.0)
            print(f"  {label}: {out[label]:.2f} s to the second step ({parts[2]} Numba "
                  f"compiles, programs loaded/saved {parts[3]}/{parts[4]}): imports {imp:.2f} s,"
                  f" model + step built {build:.2f} s, first two steps {two:.2f} s (a steady "
                  f"step {steady * 1e3:.0f} ms): compile {comp[label]:.2f} s")
            ph = [ln for ln in r.stdout.splitlines() if ln.startswith("PHASES")]
            if ph:
                renders, restored, text = ph[0].split(maxsplit=3)[1:]
                print(f"    {renders} kernel renders, {restored} programs restored whole; "
                      f"compile: {text}")
    if "neuron cold" in out and "inductor cold" in out:
        r = comp["neuron cold"] / comp["inductor cold"]
        print(f"  compile: neuron cold / inductor cold {r:.2f} (target <= 1.0: "
              f"{'met' if r <= 1 else 'missed'}); whole process "
              f"{out['neuron cold'] / out['inductor cold']:.2f}")
    if "neuron cold" in out and "neuron warm" in out:
        r = comp["neuron warm"] / comp["neuron cold"]
        print(f"  compile: neuron warm / cold {r:.2f} (target <= 0.10: "
              f"{'met' if r <= 0.1 else 'missed'}); whole process "
              f"{out['neuron warm'] / out['neuron cold']:.2f}")


def _report(res: dict, ours: str, targets: dict) -> None:
    for k, v in res.items():
        print(f"  {k:>16}: {v * 1e3:9.3f} ms")
    for k, v in res.items():
        if k == ours:
            continue
        ratio = v / res[ours]
        t = targets.get(k)
        tail = f" (target >= {t}x: {'met' if ratio >= t else 'missed'})" if t else ""
        print(f"  {ours} is {ratio:.2f}x the speed of {k}{tail}")


def main() -> None:
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"{os.cpu_count()} cores", flush=True)
    only = sys.argv[1:] or ["chain", "mlp", "compile", "gpt2", "gpt2-compile"]
    for name, fn in (("chain", chain_bench), ("mlp", mlp_bench), ("compile", compile_time_bench),
                     ("gpt2", gpt2_bench), ("gpt2-compile", gpt2_compile_bench),
                     ("gpt2-warm", gpt2_warm_bench)):
        if name in only:
            fn()


if __name__ == "__main__":
    main()
