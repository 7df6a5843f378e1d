"""The kernel disk cache: a second process compiles nothing; every failure is a counted miss.

Each test runs fresh Python processes (`sys.executable script.py`) on its own temporary
EAGER_NEURON_CACHE_DIR, so nothing depends on the user's cache or on what this process compiled.
Scripts print one JSON line of results last; `_run` returns it with the process's stderr.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

TIMEOUT = 240

# x + 1, * 2, exp, - : a handful of elementwise kernels (compiled in well under a second each)
SMALL = """
import json, torch, eager_neuron
{prelude}
x = torch.arange(6, dtype=torch.float32, device="neuron")
y = (x + 1) * 2 - x.exp()
c = torch.arange(6, dtype=torch.float32)
ok = torch.allclose(y.cpu(), (c + 1) * 2 - c.exp())
s = eager_neuron.stats()
print(json.dumps({{"ok": bool(ok), **{{k: s[k] for k in
      ("compiles", "disk_hits", "disk_misses", "disk_errors", "memory_hits")}}}}))
"""

TRAIN = """
import json, torch, eager_neuron
import numpy as np
from eager_neuron.launch import launch
{prelude}
# a parallel kernel (>= 2**18 elements: prange, the threading layer must start on load)
big = torch.ones(1 << 18, device="neuron") * 3 + 1
# a kernel calling a helper that is not inlined: the helper's code lives in the kernel's library
SRC = ("@njit(inline='never')\\ndef _twice(v):\\n    return v * 2\\n\\n"
       "@njit\\ndef k_helper(o):\\n    for i in range(o.shape[0]):\\n        o[i] = _twice(i)\\n")
helper = np.zeros(4)
launch(("test", "helper"), lambda: (SRC, "k_helper"), (helper,))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 4)).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x, y = torch.randn(8, 16).to("neuron"), torch.randn(8, 4).to("neuron")
losses = []
for _ in range(3):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
s = eager_neuron.stats()
print(json.dumps({{"losses": losses, "big": big.sum().item(), "helper": helper.tolist(),
                  **{{k: s[k] for k in
      ("compiles", "disk_hits", "disk_misses", "disk_errors")}}}}))
"""

# the second process must not reach Numba's compiler at all, not just our wrapper of it
NO_COMPILER = """
import numba.core.compiler
from eager_neuron.kernels import compile as kc

def _refuse(*a, **k):
    raise AssertionError("the compiler ran in a process that should only load kernels")

kc.timed_compile = _refuse
numba.core.compiler.compile_extra = _refuse
numba.core.compiler.compile_ir = _refuse
"""


def _env(cache_dir, **extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EAGER_NEURON_", "TORCH_NEURONX"))}
    env["EAGER_NEURON_CACHE_DIR"] = str(cache_dir)
    env.update(extra)
    return env


def _script(tmp_path, text: str, prelude: str = "") -> str:
    path = tmp_path / f"script_{abs(hash((text, prelude)))}.py"
    path.write_text(textwrap.dedent(text).format(prelude=textwrap.dedent(prelude)))
    return str(path)


def _run(script: str, cache_dir, **env) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, script], env=_env(cache_dir, **env),
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A cache filled by one training run: (cache dir, that run's results, training script)."""
    tmp = tmp_path_factory.mktemp("trained")
    script = _script(tmp, TRAIN)
    cold, _ = _run(script, tmp / "cache")
    return tmp / "cache", cold, script


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A cache filled by SMALL: (cache dir, number of kernels, the script)."""
    tmp = tmp_path_factory.mktemp("small")
    script = _script(tmp, SMALL)
    first, _ = _run(script, tmp / "cache")
    assert first["ok"] and first["compiles"] >= 3
    assert first["disk_misses"] == {"absent": first["compiles"]}
    return tmp / "cache", first["compiles"], script


# -- a second process compiles nothing -------------------------------------------------------

def test_second_training_process_compiles_nothing(trained):
    cache_dir, cold, script = trained
    assert cold["compiles"] > 0 and cold["disk_hits"] == 0
    assert cold["disk_misses"] == {"absent": cold["compiles"]} and cold["disk_errors"] == 0
    warm, _ = _run(script, cache_dir)
    assert warm["compiles"] == 0
    assert warm["disk_hits"] == cold["compiles"]
    assert warm["disk_misses"] == {} and warm["disk_errors"] == 0
    assert warm["losses"] == cold["losses"]            # bit-identical: the same machine code
    assert warm["big"] == cold["big"] == 4.0 * (1 << 18)
    assert warm["helper"] == cold["helper"] == [0.0, 2.0, 4.0, 6.0]


def test_second_process_runs_with_the_compiler_raising(trained, tmp_path):
    cache_dir, cold, _ = trained
    script = _script(tmp_path, TRAIN, prelude=NO_COMPILER)
    warm, _ = _run(script, cache_dir)
    assert warm["compiles"] == 0 and warm["disk_hits"] == cold["compiles"]
    assert warm["losses"] == cold["losses"] and warm["helper"] == cold["helper"]


# -- never fatal -------------------------------------------------------------------------------
#
# One process runs every case in turn (a process costs seconds of torch import): each case
# installs a fresh DiskTier on its own directory, empties the memory tier and the counters, and
# records the warnings it raised with the filter at "always", so a second warning would show.

SCENARIOS = """
import contextlib, json, os, resource, shutil, signal, sys, threading, warnings
import numpy as np
import torch, eager_neuron
from eager_neuron import launch
from eager_neuron.cache import disk, keys

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)    # a write past RLIMIT_FSIZE fails with EFBIG


def small_ops():
    x = torch.arange(6, dtype=torch.float32, device="neuron")
    y = (x + 1) * 2 - x.exp()
    c = torch.arange(6, dtype=torch.float32)
    return bool(torch.allclose(y.cpu(), (c + 1) * 2 - c.exp()))


SRC = "@njit\\ndef k_fill(o, v):\\n    for i in range(o.shape[0]):\\n        o[i] = v * 2\\n"


def two_threads():
    outs = [np.zeros(5, np.float32) for _ in range(2)]
    barrier = threading.Barrier(2)

    def work(i):
        barrier.wait()
        launch.launch(("test", "fill_twice"), lambda: (SRC, "k_fill"), (outs[i], 1.5))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return all(o.tolist() == [3.0] * 5 for o in outs)


def deleted_dir(cache_dir):
    # a kernel stored, then the whole cache directory deleted while the process runs
    out = np.zeros(5, np.float32)
    launch.launch(("test", "before_rm"), lambda: (SRC, "k_fill"), (out, 2.0))
    shutil.rmtree(cache_dir)
    return small_ops() and out.tolist() == [4.0] * 5


def waited(tier, cache_dir):
    # another process compiles and stores the kernel while this one waits for the lock
    from eager_neuron.kernels import compile as kc

    out = np.zeros(5, np.float32)
    other = disk.DiskTier(cache_dir)
    real_lock = tier.lock

    @contextlib.contextmanager
    def lock(key, source):
        with real_lock(key, source):
            kernel, seconds = kc.timed_compile(source, "k_fill", (out, 1.5))
            other.store(key, kernel, source, "k_fill", seconds)
            yield

    tier.lock = lock
    launch.launch(("test", "waited"), lambda: (SRC, "k_fill"), (out, 1.5))
    return out.tolist() == [3.0] * 5


def run(cache_dir, mode):
    launch.MEMORY.clear()
    tier = disk.install(disk.DiskTier(cache_dir))
    eager_neuron.reset_stats()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    toolchain = keys.toolchain
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if mode == "full":
                tier._open()                          # the disk fills after the cache opened
            if mode in ("full", "no_writes") and os.geteuid() == 0:
                # NOTE: root ignores permissions: a process that may not write past 4 KiB of any
                # file meets the same failure as a read-only directory (every database write
                # fails) while torch's few-byte probe files still work.
                resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
            if mode == "full" and os.geteuid() != 0:
                resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
            if mode == "toolchain":
                keys.toolchain = lambda: toolchain() + (("numba", "99.0"),)
                keys.toolchain_id.cache_clear()
            if mode == "threads":
                ok = two_threads()
            elif mode == "deleted_dir":
                ok = deleted_dir(cache_dir)
            elif mode == "waited":
                ok = waited(tier, cache_dir)
            else:
                ok = small_ops()
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            keys.toolchain = toolchain
            keys.toolchain_id.cache_clear()
    s = eager_neuron.stats()
    return {"ok": ok, "warnings": [str(w.message) for w in caught
                                   if issubclass(w.category, disk.DiskCacheWarning)],
            **{k: s[k] for k in ("compiles", "disk_hits", "memory_hits", "disk_misses",
                                 "disk_errors")}}


results = {}
for name, cache_dir, mode in json.loads(sys.argv[1]):
    results[name] = run(cache_dir, mode)
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def never_fatal(small, tmp_path_factory):
    """Prepare one directory per case, run them all in one process: {case: results}."""
    import diskcache

    from eager_neuron.cache import disk

    source, kernels, _ = small
    tmp = tmp_path_factory.mktemp("never_fatal")
    dirs = {}
    for case in ("corrupt", "version", "toolchain", "read_only", "damaged_db"):
        dirs[case] = tmp / case
        shutil.copytree(source, dirs[case])

    def rewrite(cache_dir, change):
        with diskcache.Cache(str(cache_dir)) as cache:
            for i, key in enumerate(list(cache.iterkeys())):
                blob, tag = cache.get(key, tag=True)
                cache.set(key, change(i, blob), tag=tag)

    # half the entries truncated, half random bytes
    rewrite(dirs["corrupt"], lambda i, blob: blob[: len(blob) // 2] if i % 2 else
            os.urandom(len(blob)))

    def restamp(i, blob):                       # as if written before a numba upgrade
        header, payload = _split(blob)
        header["toolchain"] = "0123456789abcdef"
        return disk.pack(header, payload)

    rewrite(dirs["version"], restamp)
    # the SQLite index itself garbled (the value files stay behind, orphaned)
    (dirs["damaged_db"] / "cache.db").write_bytes(b"not a database " * 300)
    dirs["unusable"] = tmp / "a_file"
    dirs["unusable"].write_text("this is a file, not a cache directory")
    dirs["full"] = tmp / "full"
    dirs["threads"] = tmp / "threads"
    dirs["deleted_dir"] = tmp / "deleted_dir"
    dirs["waited"] = tmp / "waited"
    if os.geteuid() != 0:
        for root, subdirs, files in os.walk(dirs["read_only"]):
            for name in files:
                os.chmod(os.path.join(root, name), 0o444)
            for name in subdirs:
                os.chmod(os.path.join(root, name), 0o555)
        os.chmod(dirs["read_only"], 0o555)
    plan = [("corrupt", str(dirs["corrupt"]), ""),
            ("corrupt_again", str(dirs["corrupt"]), ""),
            ("version", str(dirs["version"]), ""),
            ("toolchain", str(dirs["toolchain"]), "toolchain"),
            ("unusable", str(dirs["unusable"]), ""),
            ("read_only", str(dirs["read_only"]), "no_writes"),
            ("full", str(dirs["full"]), "full"),
            ("threads", str(dirs["threads"]), "threads"),
            ("damaged_db", str(dirs["damaged_db"]), ""),
            ("damaged_db_again", str(dirs["damaged_db"]), ""),
            ("deleted_dir", str(dirs["deleted_dir"]), "deleted_dir"),
            ("waited", str(dirs["waited"]), "waited")]
    script = tmp / "scenarios.py"
    script.write_text(SCENARIOS)
    try:
        proc = subprocess.run([sys.executable, str(script), json.dumps(plan)],
                              env=_env(tmp / "unused"), capture_output=True, text=True,
                              timeout=TIMEOUT, check=False)
    finally:
        for root, _subdirs, _files in os.walk(dirs["read_only"]):
            os.chmod(root, 0o755)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    results["_dirs"] = {k: str(v) for k, v in dirs.items()}
    return results, kernels


def _split(blob):
    import struct

    _magic, n = struct.unpack_from("<4sI", blob, 0)
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def test_truncated_and_garbage_entries_are_counted_misses(never_fatal):
    results, kernels = never_fatal
    out = results["corrupt"]
    assert out["ok"] and out["compiles"] == kernels
    assert out["disk_misses"] == {"corrupt": kernels} and out["disk_errors"] == 0
    assert len(out["warnings"]) == 1
    again = results["corrupt_again"]                   # the recompiled entries replaced them
    assert again["ok"] and again["compiles"] == 0 and again["disk_hits"] == kernels
    assert again["warnings"] == []


def test_entry_from_another_toolchain_is_a_version_miss(never_fatal):
    results, kernels = never_fatal
    out = results["version"]
    assert out["ok"] and out["compiles"] == kernels
    assert out["disk_misses"] == {"version": kernels} and len(out["warnings"]) == 1


def test_toolchain_change_is_a_clean_miss(never_fatal):
    results, kernels = never_fatal
    out = results["toolchain"]
    assert out["ok"] and out["compiles"] == kernels
    assert out["disk_misses"] == {"absent": kernels} and out["disk_errors"] == 0
    assert out["warnings"] == []


def test_unusable_directory(never_fatal):
    results, kernels = never_fatal
    out = results["unusable"]
    assert out["ok"] and out["compiles"] == kernels
    assert out["disk_misses"] == {"io": kernels} and out["disk_errors"] == 1
    assert len(out["warnings"]) == 1


def test_read_only_directory(never_fatal):
    results, kernels = never_fatal
    out = results["read_only"]
    assert out["ok"]
    assert out["compiles"] + out["disk_hits"] == kernels     # loading is allowed, never wrong
    assert set(out["disk_misses"]) <= {"io"} and len(out["warnings"]) <= 1


def test_full_disk(never_fatal):
    results, kernels = never_fatal
    out = results["full"]
    assert out["ok"] and out["compiles"] == kernels
    assert out["disk_errors"] >= 1 and set(out["disk_misses"]) <= {"io", "absent"}
    assert len(out["warnings"]) == 1


def test_damaged_database_is_moved_aside_and_rebuilt(never_fatal):
    results, kernels = never_fatal
    cache_dir = results["_dirs"]["damaged_db"]
    out = results["damaged_db"]
    assert out["ok"] and out["compiles"] == kernels and out["disk_errors"] == 0
    assert out["disk_misses"] == {"absent": kernels}
    aside = [f for f in os.listdir(cache_dir) if f.startswith("cache.db.damaged-")]
    assert len(aside) == 1
    (warning,) = out["warnings"]                        # one warning, naming both paths
    assert os.path.join(cache_dir, "cache.db") in warning and aside[0] in warning
    again = results["damaged_db_again"]                  # the rebuilt cache serves the next run
    assert again["ok"] and again["compiles"] == 0 and again["disk_hits"] == kernels
    assert again["warnings"] == [] and _intact(cache_dir) == kernels


def test_cache_directory_deleted_mid_run_is_recreated(never_fatal):
    results, kernels = never_fatal
    cache_dir = results["_dirs"]["deleted_dir"]
    out = results["deleted_dir"]
    assert out["ok"] and out["compiles"] == kernels + 1 and out["disk_errors"] == 0
    assert len(out["warnings"]) == 1 and "disappeared" in out["warnings"][0]
    assert _intact(cache_dir) == kernels                # every later kernel reached the disk
    assert _orphans(cache_dir) == []


def test_kernel_loaded_after_waiting_counts_once(never_fatal):
    out = never_fatal[0]["waited"]
    assert out["ok"] and out["compiles"] == 0 and out["disk_hits"] == 1
    assert out["disk_misses"] == {} and out["memory_hits"] == 0 and out["disk_errors"] == 0


def _orphans(cache_dir) -> list:
    """Value files no entry refers to."""
    import diskcache

    with diskcache.Cache(str(cache_dir)) as cache:
        known = {row[0] for row in cache._sql(
            "SELECT filename FROM Cache WHERE filename IS NOT NULL").fetchall()}
    return [os.path.relpath(os.path.join(root, f), cache_dir)
            for root, _, files in os.walk(cache_dir) for f in files
            if f.endswith(".val") and os.path.relpath(os.path.join(root, f), cache_dir)
            not in known]


# -- concurrency -------------------------------------------------------------------------------

RACE = """
import os, time
ready = os.path.join(os.environ["RACE_DIR"], f"ready-{os.getpid()}")
open(ready, "w").close()
while len([f for f in os.listdir(os.environ["RACE_DIR"]) if f.startswith("ready-")]) < 2:
    time.sleep(0.005)
"""


def test_two_processes_compile_each_kernel_once(small, tmp_path):
    _, kernels, _ = small
    race = tmp_path / "race"
    race.mkdir()
    script = _script(tmp_path, SMALL, prelude=RACE)
    env = _env(tmp_path / "cache", RACE_DIR=str(race))
    procs = [subprocess.Popen([sys.executable, script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    assert all(o["ok"] for o in outs)
    assert sum(o["compiles"] for o in outs) == kernels          # one compile per kernel
    for o in outs:
        assert o["compiles"] + o["disk_hits"] == kernels
        assert o["disk_misses"] == ({"absent": o["compiles"]} if o["compiles"] else {})
        assert o["disk_errors"] == 0
    assert _intact(tmp_path / "cache") == kernels               # and the cache is intact


def _intact(cache_dir) -> int:
    """How many entries verify (header, key, checksum); asserts there is no other kind."""
    import diskcache

    from eager_neuron.cache import disk

    with diskcache.Cache(str(cache_dir)) as cache:
        keys = list(cache.iterkeys())
        for key in keys:
            header, _ = disk.unpack(cache.get(key))
            assert header["key"] == key
    return len(keys)


def test_two_threads_compile_once(never_fatal):
    out = never_fatal[0]["threads"]
    assert out["ok"] and out["compiles"] == 1
    assert out["memory_hits"] + out["disk_hits"] == 1 and out["warnings"] == []


# -- fork --------------------------------------------------------------------------------------

FORK = """
import json, torch, eager_neuron
from torch.utils.data import DataLoader, Dataset

N = 1 << 19                                   # >= 2**18: a parallel kernel in the parent
big = torch.ones(N, device="neuron") * 2 + 1
assert big[:3].tolist() == [3.0, 3.0, 3.0]

class Squares(Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        # workers are forked children: they run the serial variants (and compile/load them)
        t = torch.full((N,), float(i), device="neuron") * 2 + 1
        return t[:4].cpu()

model = torch.nn.Linear(4, 1).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
seen = []
for batch in DataLoader(Squares(), batch_size=2, num_workers=2,
                        multiprocessing_context="fork"):
    seen += batch[:, 0].tolist()
    loss = model(batch.to("neuron")).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
again = torch.ones(N, device="neuron") * 2 + 1          # the parent's parallel kernels still run
s = eager_neuron.stats()
print(json.dumps({"seen": sorted(seen), "again": again[-2:].tolist(),
                  "finite": bool(torch.isfinite(loss).item()), "disk_errors": s["disk_errors"]}))
"""


def test_fork_dataloader_after_parallel_kernels(tmp_path):
    out, _ = _run(_script(tmp_path, FORK.replace("{", "{{").replace("}", "}}")),
                  tmp_path / "cache")
    assert out["seen"] == [2.0 * i + 1 for i in range(8)]
    assert out["again"] == [3.0, 3.0] and out["finite"] and out["disk_errors"] == 0


# -- the tool ----------------------------------------------------------------------------------

TOOL = """
import contextlib, io, json, os, sys
from eager_neuron.tools.cache import main

def run(*argv):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(list(argv))
    return code, buf.getvalue()

src, dst, archive = sys.argv[1:4]
out = {}
out["stats"] = json.loads(run("--dir", src, "stats", "--json")[1])
out["ls"] = json.loads(run("--dir", src, "ls", "--json")[1])
out["export"] = run("--dir", src, "export", archive)
out["import"] = run("--dir", dst, "import", archive)
out["imported"] = json.loads(run("--dir", dst, "stats", "--json")[1])["entries"]
out["clear"] = run("--dir", src, "clear")
out["cleared"] = json.loads(run("--dir", src, "stats", "--json")[1])["entries"]

# the imported cache serves this process: nothing compiles
import torch, eager_neuron
from eager_neuron.cache import disk
disk.install(disk.DiskTier(dst))
eager_neuron.reset_stats()
x = torch.arange(6, dtype=torch.float32, device="neuron")
y = (x + 1) * 2 - x.exp()
c = torch.arange(6, dtype=torch.float32)
s = eager_neuron.stats()
out["loaded"] = {"ok": bool(torch.allclose(y.cpu(), (c + 1) * 2 - c.exp())),
                 "compiles": s["compiles"], "disk_hits": s["disk_hits"]}
print(json.dumps(out))
"""


def test_tool_warm_stats_ls_export_import_clear(small, tmp_path):
    _, kernels, small_script = small
    warm = subprocess.run([sys.executable, "-m", "eager_neuron.tools.cache", "--dir",
                           str(tmp_path / "a"), "warm", small_script], env=_env(tmp_path / "x"),
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert f"[warm] {kernels} kernels compiled" in warm.stderr
    script = _script(tmp_path, TOOL.replace("{", "{{").replace("}", "}}"))
    proc = subprocess.run([sys.executable, script, str(tmp_path / "a"), str(tmp_path / "b"),
                           str(tmp_path / "k.tar.gz")], env=_env(tmp_path / "x"),
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["stats"]["entries"] == kernels and out["stats"]["bytes"] > 0
    assert {r["op"] for r in out["ls"]} >= {"aten::add", "aten::mul", "aten::exp"}
    assert all(r["compile_s"] > 0 and r["bytes"] > 0 and r["last_use"] for r in out["ls"])
    assert out["export"][0] == 0 and out["import"][0] == 0
    assert out["imported"] == kernels
    assert out["clear"][0] == 0 and out["cleared"] == 0
    loaded = out["loaded"]
    assert loaded["ok"] and loaded["compiles"] == 0 and loaded["disk_hits"] == kernels


# -- in-process units (no kernels run: nothing here touches a cache but tmp_path) --------------

# -- the render index: a warm process renders nothing; a bad index is only a slower path -------

RENDERS = SMALL.replace('("compiles", "disk_hits"',
                        '("kernel_renders", "render_index_hits", "compiles", "disk_hits"')
# the index is keyed by a hash of eager_neuron's sources: pinned, so that an edit of the tree
# while the test runs cannot turn an index hit into a miss (test_source_hash_follows_edits)
PIN_SOURCES = """
from eager_neuron.cache import keys as _keys
_keys.source_hash = lambda: "pinned-by-the-test"
"""


def test_render_index_warm_process_renders_nothing_and_survives_damage(small, tmp_path):
    """A warm process finds each kernel through the render index (cache/tier.py) without
    rendering its source; a garbage index database, or index entries pointing at another
    kernel's entry, cost the renders back and nothing else (never fatal, never a wrong
    kernel: the entry must be the one the key and its own source name)."""
    import diskcache

    source, kernels, _ = small
    script = _script(tmp_path, RENDERS, prelude=PIN_SOURCES)
    dirs = {case: tmp_path / case for case in ("warm", "garbage")}
    for d in dirs.values():
        shutil.copytree(source, d)
        shutil.rmtree(d / "index", ignore_errors=True)   # (indexed by the fixture's code)
    # a fresh process first: it renders, loads from disk and indexes
    first, _ = _run(script, dirs["warm"])
    warm, err = _run(script, dirs["warm"])
    assert warm["ok"] and warm["compiles"] == 0 and "DiskCacheWarning" not in err
    assert warm["kernel_renders"] == 0 and warm["render_index_hits"] == kernels == \
        warm["disk_hits"], (first, warm)
    # the index's own database garbled: kernels render and load as before, nothing counted,
    # and the index starts afresh (the next process finds every kernel by key again)
    _run(script, dirs["garbage"])
    for name in os.listdir(dirs["garbage"] / "index"):
        if name.startswith("cache.db"):
            (dirs["garbage"] / "index" / name).write_bytes(b"not a database " * 300)
    out, err = _run(script, dirs["garbage"])
    assert out["ok"] and out["compiles"] == 0 and out["disk_hits"] == kernels
    assert out["kernel_renders"] == kernels and out["render_index_hits"] == 0
    assert out["disk_misses"] == {} and out["disk_errors"] == 0 and "Warning" not in err
    again, _ = _run(script, dirs["garbage"])
    assert again["ok"] and again["kernel_renders"] == 0 and again["render_index_hits"] == kernels
    # two kernels of one signature, their index entries swapped: each is refused (its entry
    # is not the one its key and source name), rendered and loaded right
    crossed = tmp_path / "crossed"
    script = _script(tmp_path, TWO_FILLS, prelude=PIN_SOURCES)
    _run(script, crossed)
    with diskcache.Cache(str(crossed / "index")) as index:
        ikeys = list(index.iterkeys())
        assert len(ikeys) == 2
        a, b = index[ikeys[0]], index[ikeys[1]]
        index[ikeys[0]], index[ikeys[1]] = b, a
    out, _ = _run(script, crossed)
    assert out["fills"] == [[1.0] * 3, [2.0] * 3]
    assert out["compiles"] == 0 and out["disk_hits"] == 2
    assert out["render_index_hits"] == 0 and out["kernel_renders"] == 2
    assert out["disk_misses"] == {} and out["disk_errors"] == 0
    # `cache clear` empties the index with the entries
    from eager_neuron.cache import admin
    from eager_neuron.cache.tier import DiskTier

    assert admin.clear(DiskTier(str(crossed))) == 2
    with diskcache.Cache(str(crossed / "index")) as index:
        assert len(index) == 0


TWO_FILLS = """
import json, numpy as np, eager_neuron
from eager_neuron.launch import launch
{prelude}
fills = []
for v in (1, 2):
    out = np.zeros(3, np.float32)
    src = f"@njit\\ndef k_fill(o):\\n    o[:] = {{v}}\\n"
    launch(("test", "fill", v), lambda: (src, "k_fill"), (out,))
    fills.append(out.tolist())
s = eager_neuron.stats()
print(json.dumps({{"fills": fills, **{{k: s[k] for k in ("kernel_renders", "render_index_hits",
      "compiles", "disk_hits", "disk_misses", "disk_errors")}}}}))
"""


ADAPTIVE = """
import json, torch, eager_neuron
{prelude}
from eager_neuron.adaptive import MODULE as _ad
import os
_ad.set_compile_mode(os.environ["MODE"])
x = torch.arange(6, dtype=torch.float32, device="neuron")
with eager_neuron.adaptive():
    y = ((x + 1) * 2 - x.exp()).sum()
c = torch.arange(6, dtype=torch.float32)
ok = torch.allclose(y.cpu(), ((c + 1) * 2 - c.exp()).sum())
s = eager_neuron.stats()
print(json.dumps({{"ok": bool(ok), **{{k: s[k] for k in
      ("kernel_renders", "render_index_hits", "compiles", "disk_hits", "fused_launches")}}}}))
"""


def test_fused_kernels_of_a_warm_process_come_through_the_render_index(tmp_path):
    """Adaptive eager's fused kernels are found through the render index too: a warm process
    renders no fused source (adaptive_launch._from_disk asks the index before rendering).
    The first process builds its kernels at once ("sync"); the second runs as users do (the
    background mode: a kernel not in memory is looked for on disk, never compiled inline)."""
    script = _script(tmp_path, ADAPTIVE, prelude=PIN_SOURCES)
    cold, _ = _run(script, tmp_path / "cache", MODE="sync")
    warm, err = _run(script, tmp_path / "cache", MODE="background")
    assert cold["ok"] and warm["ok"] and cold["fused_launches"] == warm["fused_launches"] >= 1
    assert cold["compiles"] >= 1 and cold["kernel_renders"] >= 1
    assert warm["compiles"] == 0 and warm["kernel_renders"] == 0, (cold, warm)
    assert warm["render_index_hits"] == warm["disk_hits"] >= 1 and "Warning" not in err


def test_source_hash_follows_edits(tmp_path, monkeypatch):
    """The render index's source hash changes with any edit of a .py file of the package (a
    renderer's edit must never find the old kernel by key), and only with those."""
    from eager_neuron.cache import keys

    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("A = 1\n")
    (pkg / "sub" / "b.py").write_text("B = 1\n")
    monkeypatch.setattr(keys, "_package_dirs", lambda: [str(pkg)])
    hashes = []
    for change in (None, ("a.py", "A = 2\n"), ("sub/b.py", "B = 2\n"), ("notes.txt", "x")):
        if change:
            (pkg / change[0]).write_text(change[1])
        keys.source_hash.cache_clear()
        hashes.append(keys.source_hash())
    keys.source_hash.cache_clear()
    assert len(set(hashes[:3])) == 3 and hashes[3] == hashes[2]
    monkeypatch.setattr(keys, "source_hash", lambda: "one")
    k1 = keys.index_key(("fused", "spec"))
    monkeypatch.setattr(keys, "source_hash", lambda: "two")
    assert keys.index_key(("fused", "spec")) != k1


def test_renderer_origin_pins_code_outside_the_package(tmp_path):
    """A kernel rendered by eager_neuron's code is pinned by the source hash; one rendered by
    other code (a user's launch() call) by its file's digest; code with no file never uses the
    render index."""
    import functools
    import importlib.util

    from eager_neuron.cache import keys
    from eager_neuron.compile import program

    assert keys.renderer_origin(program._renderer(((), 0, ()), False)) == ""
    assert keys.renderer_origin(functools.partial(program._renderer, ((), 0, ()))) == ""
    mod = tmp_path / "user_kernels.py"
    mod.write_text("def render():\n    return ('@njit\\ndef k(o):\\n    o[:] = 1\\n', 'k')\n")
    spec = importlib.util.spec_from_file_location("user_kernels", mod)
    user = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(user)
    import hashlib

    assert keys.renderer_origin(user.render) == hashlib.sha256(mod.read_bytes()).hexdigest()
    ns: dict = {}
    exec("def render():\n    return ('', 'k')\n", ns)
    assert keys.renderer_origin(ns["render"]) is None
    assert keys.index_key(("k",), "") != keys.index_key(("k",), "abc")


def test_unpack_rejects_damage():
    from eager_neuron.cache import disk, keys

    payload = b"x" * 100
    good = disk.pack({"format": keys.FORMAT_VERSION, "toolchain": keys.toolchain_id(),
                      "key": "k", "name": "n", "size": 100,
                      "sha256": __import__("hashlib").sha256(payload).hexdigest()}, payload)
    assert disk.unpack(good)[1] == payload
    for bad, reason in [(good[:50], "corrupt"), (b"", "corrupt"), (b"ENKC" + b"\xff" * 20,
                        "corrupt"), (good[:-1] + b"y", "corrupt"),
                        (good.replace(keys.toolchain_id().encode(), b"f" * 16), "version")]:
        with pytest.raises(disk._Miss) as info:
            disk.unpack(bad)
        assert info.value.reason == reason


def test_size_cap_evicts_least_recently_used(tmp_path):
    from eager_neuron.cache.disk import DiskTier

    tier = DiskTier(str(tmp_path / "cache"), size_mb=1)
    cache = tier._open()
    assert cache.eviction_policy == "least-recently-used" and cache.size_limit == 2**20
    blob = os.urandom(40_000)                          # ~25 fit; diskcache culls 10 at a time
    cache.set("first", blob)
    for i in range(60):
        time.sleep(0.001)
        cache.get("first")                             # keep using the first entry
        cache.set(f"k{i}", blob)
    assert "first" in cache and "k0" not in cache and "k59" in cache
    assert cache.volume() <= 2**20 + 40_000


# -- the tool on a damaged cache; --dir after every verb ----------------------------------------

def _tool(*argv) -> tuple[int, str]:
    """Run the cache tool in this process; --dir moves config.cache_dir, so it is put back."""
    from eager_neuron.config import config
    from eager_neuron.tools.cache import main

    buf, before = io.StringIO(), config.cache_dir
    try:
        with contextlib.redirect_stdout(buf):
            code = main(list(argv))
    finally:
        config.cache_dir = before
    return code, buf.getvalue()


def _garbled_copy(small, dest):
    shutil.copytree(small[0], dest)
    (dest / "cache.db").write_bytes(os.urandom(8192))
    return str(dest)


def test_tool_ls_and_stats_survive_a_damaged_database(small, tmp_path):
    from eager_neuron.cache.disk import DiskCacheWarning

    cache_dir = _garbled_copy(small, tmp_path / "c")
    with pytest.warns(DiskCacheWarning, match="cache.db is damaged"):
        code, text = _tool("ls", "--dir", cache_dir, "--json")
    assert code == 0 and json.loads(text) == []
    code, text = _tool("stats", "--dir", cache_dir, "--json")
    assert code == 0 and json.loads(text)["entries"] == 0


def test_tool_clear_always_leaves_a_working_cache(small, tmp_path):
    import diskcache

    from eager_neuron.cache.disk import DiskCacheWarning

    for name, damage in (("intact", False), ("garbled", True)):
        cache_dir = (_garbled_copy(small, tmp_path / name) if damage
                     else str(shutil.copytree(small[0], tmp_path / name)))
        with pytest.warns(DiskCacheWarning) if damage else contextlib.nullcontext():
            code, text = _tool("clear", "--dir", cache_dir)
        assert code == 0, text
        assert text.startswith(f"removed {0 if damage else small[1]} kernels")
        assert _orphans(cache_dir) == []
        with diskcache.Cache(cache_dir) as cache:           # it opens, reads and writes
            assert len(cache) == 0
            cache.set("probe", b"x" * 100_000)
            assert cache.get("probe") == b"x" * 100_000


def test_every_verb_takes_dir_after_the_verb(small, tmp_path):
    from eager_neuron import launch

    src = str(shutil.copytree(small[0], tmp_path / "src"))
    dst, archive = str(tmp_path / "dst"), str(tmp_path / "k.tar.gz")
    script = tmp_path / "nothing.py"
    script.write_text("pass\n")
    assert json.loads(_tool("stats", "--dir", src, "--json")[1])["entries"] == small[1]
    assert len(json.loads(_tool("ls", "--dir", src, "--json")[1])) == small[1]
    assert _tool("export", "--dir", src, archive)[0] == 0
    assert _tool("import", "--dir", dst, archive)[0] == 0
    assert json.loads(_tool("stats", "--dir", dst, "--json")[1])["entries"] == small[1]
    before = launch.DISK
    try:
        assert _tool("warm", "--dir", dst, str(script))[0] == 0
    finally:
        launch.DISK = before
    assert _tool("clear", "--dir", dst)[0] == 0
    assert json.loads(_tool("stats", "--dir", dst, "--json")[1])["entries"] == 0


def test_cache_verify_catches_a_key_that_misses_a_field():
    from eager_neuron.cache.verify import CacheKeyError, Verifier
    from eager_neuron.config import Config

    assert Config({"EAGER_NEURON_CACHE_VERIFY": "1"}).cache_verify
    v = Verifier()
    flag = {"v": 1}

    def render():                    # reads `flag`, which the key below does not hold
        return f"@njit\ndef k(o):\n    o[:] = {flag['v']}\n", "k"

    key = (1, "test", "fill", ("f", 1, "C"))
    v.seen(key, render)
    v.seen(key, render)              # same source: fine
    flag["v"] = 2
    with pytest.raises(CacheKeyError, match=r"line 3 was '    o\[:\] = 1', now '    o\[:\] = 2'"):
        v.seen(key, render)
    v.seen(key + (2,), render)       # the field in the key: a new kernel, no error
    assert v.checked == 4


_VERIFY_PASS = """
import json, sys, torch, eager_neuron
from torch.testing._internal.common_methods_invocations import op_db
from eager_neuron.cache import verify
NAMES = {"add", "sub", "mul", "div", "clamp", "pow", "where", "lerp", "addcmul",
         "nn.functional.leaky_relu",
         "nn.functional.hardtanh", "nn.functional.elu", "nn.functional.softplus", "sum", "mean",
         "amax", "cumsum", "softmax", "gather", "index_select", "cat", "nn.functional.pad",
         "masked_fill", "rsub", "remainder", "fmod", "nn.functional.threshold", "logsumexp"}
bad, ran = [], 0
for op in op_db:
    if op.name not in NAMES or op.variant_test_name:
        continue
    for dtype in (torch.float32, torch.int64):
        if dtype not in op.supported_dtypes("cpu"):
            continue
        for i, s in enumerate(op.sample_inputs("cpu", dtype)):
            if i >= 4:
                break
            mv = lambda t: t.to("neuron") if isinstance(t, torch.Tensor) else t
            args = [mv(a) if not isinstance(a, (list, tuple)) else type(a)(mv(x) for x in a)
                    for a in s.args]
            kw = {k: mv(v) for k, v in s.kwargs.items()}
            try:
                op(mv(s.input) if isinstance(s.input, torch.Tensor) else
                   [mv(x) for x in s.input], *args, **kw)
                ran += 1
            except verify.CacheKeyError as exc:
                bad.append(f"{op.name} {dtype}: {exc}")
            except Exception:
                pass    # the OpInfo tests judge results; this pass judges only the keys
print(json.dumps({"checked": verify.VERIFIER.checked, "ran": ran, "bad": bad}))
"""


def test_cache_verify_over_a_bounded_opinfo_pass(tmp_path):
    """EAGER_NEURON_CACHE_VERIFY=1 over op_db samples of ops with static scalars and shapes:
    every memory hit re-renders, and no key may render two different sources."""
    script = tmp_path / "verify_pass.py"
    script.write_text(_VERIFY_PASS)
    cache = os.environ.get("EAGER_NEURON_CACHE_DIR") or str(tmp_path / "cache")
    out, _err = _run(str(script), cache, EAGER_NEURON_CACHE_VERIFY="1")
    assert out["bad"] == []
    assert out["ran"] > 50 and out["checked"] > out["ran"]
