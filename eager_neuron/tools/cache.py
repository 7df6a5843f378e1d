"""Inspect and manage the kernel disk cache (the NEFF cache of TorchNeuron).

    python -m eager_neuron.tools.cache stats                 entries, bytes, hit rate
    python -m eager_neuron.tools.cache ls [--op OP]          kernels by op: compile time, size, use
    python -m eager_neuron.tools.cache clear                 delete every entry
    python -m eager_neuron.tools.cache warm SCRIPT [ARGS]    run a script to fill the cache
    python -m eager_neuron.tools.cache export FILE.tar.gz    the entries of this toolchain
    python -m eager_neuron.tools.cache import FILE.tar.gz    add a teammate's entries

`--dir DIR` (before or after the verb) picks the cache (default: EAGER_NEURON_CACHE_DIR, else
~/.cache/eager_neuron); `--json` prints stats / ls as JSON.

>>> from eager_neuron.tools.cache import main
>>> main(["--dir", "/tmp/eager_neuron_doctest_cache", "stats", "--json"])  # doctest: +ELLIPSIS
{...}
0
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time

from eager_neuron.cache.disk import DiskTier
from eager_neuron.config import config


def _kb(n: int) -> str:
    return f"{n / 1024:.0f} KB" if n < 2**20 else f"{n / 2**20:.1f} MB"


def _ago(t: float | None) -> str:
    if not t:
        return "-"
    s = max(0.0, time.time() - t)
    for unit, width in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= width:
            return f"{s / width:.0f} {unit} ago"
    return f"{s:.0f} s ago"


def cmd_stats(tier: DiskTier, args) -> int:
    info = tier.info()
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    from eager_neuron.cache import keys

    current = keys.toolchain_id()
    here = info["toolchains"].get(current, 0)
    rate = "-" if info["hit_rate"] is None else f"{100 * info['hit_rate']:.1f}%"
    print(f"kernel cache  {info['directory']}  ({'on' if info['enabled'] else 'off'})")
    print(f"entries       {info['entries']} ({here} for this toolchain {current}, "
          f"{info['entries'] - here} from others)")
    print(f"size          {_kb(info['bytes'])} of {_kb(info['size_limit'])} "
          "(least recently used evicted beyond)")
    print(f"lookups       {info['hits']} hits, {info['misses']} misses ({rate} hit rate)")
    if "error" in info:
        print(f"error         {info['error']}")
    return 0


def cmd_ls(tier: DiskTier, args) -> int:
    from eager_neuron.cache import keys

    rows = [r for r in tier.entries() if not args.op or args.op in str(r.get("op", ""))]
    rows.sort(key=lambda r: (str(r.get("op")), -(r.get("last_use") or 0)))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    current = keys.toolchain_id()
    print(f"{'op':34s} {'family':12s} {'kernel':18s} {'compile':>9s} {'size':>8s}  last use")
    stale = 0
    for r in rows:
        mark = "" if r.get("toolchain") == current else " *"
        stale += bool(mark)
        ms = f"{1e3 * r['compile_s']:.0f} ms" if "compile_s" in r else "-"
        print(f"{r.get('op', '?')!s:34.34s} {r.get('family', '?')!s:12.12s} "
              f"{r.get('name', '?')!s:18.18s} {ms:>9s} {_kb(r['bytes']):>8s}  "
              f"{_ago(r.get('last_use'))}{mark}")
    print(f"{len(rows)} kernels" + (f"; * = another toolchain ({stale}), never loaded here"
                                    if stale else ""))
    return 0


def cmd_clear(tier: DiskTier, args) -> int:
    n = tier.clear()
    print(f"removed {n} kernels from {tier.directory}")
    return 0


def cmd_export(tier: DiskTier, args) -> int:
    n = tier.export(args.archive)
    print(f"exported {n} kernels to {args.archive}")
    return 0


def cmd_import(tier: DiskTier, args) -> int:
    counts = tier.import_(args.archive)
    print(f"imported {counts['added']} kernels into {tier.directory} "
          f"({counts['present']} already there, {counts['skipped']} for another toolchain, "
          f"{counts['bad']} damaged)")
    return 0 if not counts["bad"] else 1


class _Progress:
    """One status line on stderr, redrawn at most 10 times a second."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.compiled = self.loaded = self.launches = 0
        self.compile_s = 0.0
        self._drawn = 0.0
        self._tty = sys.stderr.isatty()

    def __call__(self, event: dict) -> None:
        self.launches += 1
        if event["outcome"] == "compile":
            self.compiled += 1
            self.compile_s += event["compile_s"]
        elif event["outcome"] == "disk":
            self.loaded += 1
        else:
            return
        now = time.perf_counter()
        if now - self._drawn > 0.1 or not self._tty:
            self._drawn = now
            self.draw()

    def line(self) -> str:
        return (f"[warm] {self.compiled} kernels compiled ({self.compile_s:.1f} s), "
                f"{self.loaded} loaded from disk, {self.launches} launches, "
                f"{time.perf_counter() - self.t0:.1f} s")

    def draw(self, end: str = "") -> None:
        if self._tty:
            sys.stderr.write("\r" + self.line() + end)
        else:
            sys.stderr.write(self.line() + "\n")
        sys.stderr.flush()


def cmd_warm(tier: DiskTier, args) -> int:
    """Run SCRIPT as __main__ with the disk tier on; every kernel it compiles is stored."""
    from eager_neuron import launch
    from eager_neuron.cache import disk

    if not config.disk_cache:
        print("the kernel disk cache is off (EAGER_NEURON_DISK_CACHE=0): nothing to warm",
              file=sys.stderr)
        return 2
    disk.install(tier)
    progress = _Progress()
    launch.HOOKS.append(progress)
    argv, sys.argv = sys.argv, [args.script] + list(args.script_args)
    status = 0
    try:
        runpy.run_path(args.script, run_name="__main__")
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # still report what was cached
        print(f"\n[warm] {args.script} raised {type(exc).__name__}: {exc}", file=sys.stderr)
        status = 1
    finally:
        sys.argv = argv
        launch.HOOKS.remove(progress)
    progress.draw(end="\n")
    info = tier.info()
    print(f"[warm] cache {info['directory']}: {info['entries']} kernels, {_kb(info['bytes'])}",
          file=sys.stderr)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eager_neuron.tools.cache",
                                     description=__doc__.split("\n\n")[0])
    dir_help = "cache directory (default: EAGER_NEURON_CACHE_DIR or ~/.cache/eager_neuron)"
    parser.add_argument("--dir", help=dir_help)
    # every verb takes --dir too (`cache stats --dir D`), as docs/CACHE.md says
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", default=argparse.SUPPRESS, help=dir_help)
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("stats", parents=[common], help="entries, bytes, hit rate")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("ls", parents=[common], help="kernels by op with compile time, size, "
                       "last use")
    p.add_argument("--op", help="only ops containing this text")
    p.add_argument("--json", action="store_true")
    sub.add_parser("clear", parents=[common], help="delete every entry")
    p = sub.add_parser("warm", parents=[common], help="run a script to fill the cache")
    p.add_argument("script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    p = sub.add_parser("export", parents=[common],
                       help="write this toolchain's entries to an archive")
    p.add_argument("archive")
    p = sub.add_parser("import", parents=[common], help="add the entries of an exported archive")
    p.add_argument("archive")
    args = parser.parse_args(argv)
    # NOTE: --dir also moves config.cache_dir while the verb runs (a warmed script's own tier
    # then writes there too); put back after, so calling main() leaves the process unchanged
    before = config.cache_dir
    if args.dir:
        config.cache_dir = os.path.abspath(args.dir)
    tier = DiskTier(args.dir)
    verbs = {"stats": cmd_stats, "ls": cmd_ls, "clear": cmd_clear, "warm": cmd_warm,
             "export": cmd_export, "import": cmd_import}
    try:
        return verbs[args.verb](tier, args)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        config.cache_dir = before


if __name__ == "__main__":
    sys.exit(main())
