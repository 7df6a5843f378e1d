"""Run a script under eager_neuron.profile() and write its table and Chrome trace.

    python -m eager_neuron.tools.profile [options] SCRIPT [script args...]

Prints the table (per source line unless --group-by says otherwise) and writes
`<script>.profile.txt` and `<script>.trace.json` (open the trace in https://ui.perfetto.dev or
chrome://tracing) into --out-dir (created if missing); --timeline adds
`<script>.timeline.html`, a picture of each core's kernels; --parquet adds the raw events as
Parquet (needs pyarrow).

>>> from eager_neuron.tools.profile import main
>>> main(["--out-dir", "/tmp", "train.py"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from ..profiler import profile


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m eager_neuron.tools.profile",
        description="Run SCRIPT under eager_neuron.profile(); print the table, write the trace.")
    p.add_argument("--group-by", default="line",
                   help="line, op or kernel; several as a comma list (default: line)")
    p.add_argument("--sort-by", default="device_us",
                   help="a table column, e.g. device_us, host_ms, calls, compile_ms, or 'first'")
    p.add_argument("--rows", type=int, default=30, help="rows per table (default 30)")
    p.add_argument("--out-dir", default=".", help="where the files go (default: .)")
    p.add_argument("--trace", help="Chrome trace path (default: <script>.trace.json)")
    p.add_argument("--table", help="table text path (default: <script>.profile.txt)")
    p.add_argument("--parquet", help="also write the events as Parquet here (needs pyarrow)")
    p.add_argument("--timeline", action="store_true",
                   help="also write <script>.timeline.html: a picture of each core's kernels")
    p.add_argument("script", help="the Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the script, report, return its exit status (1 if it raised)."""
    opts = _parser().parse_args(argv)
    groups = [g.strip() for g in opts.group_by.split(",") if g.strip()]
    os.makedirs(opts.out_dir, exist_ok=True)
    stem = os.path.join(opts.out_dir, os.path.splitext(os.path.basename(opts.script))[0])
    trace_path = opts.trace or stem + ".trace.json"
    table_path = opts.table or stem + ".profile.txt"
    # 1. run the script as `python SCRIPT args` would: its argv, its directory first on sys.path
    script = os.path.abspath(opts.script)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [opts.script] + list(opts.args)
    sys.path.insert(0, os.path.dirname(script))
    status, error = 0, None
    try:
        with profile() as prof:
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as exc:
                code = exc.code
                status = code if isinstance(code, int) else (0 if code is None else 1)
            except BaseException as exc:  # noqa: BLE001 - report what ran, then re-raise
                error, status = exc, 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    # 2. views
    text = "\n\n".join(prof.table(sort_by=opts.sort_by, group_by=g, row_limit=opts.rows)
                       for g in groups)
    print(text)
    with open(table_path, "w") as f:
        f.write(text + "\n")
    prof.export_chrome_trace(trace_path)
    written = [table_path, trace_path]
    if opts.timeline:
        prof.export_timeline(stem + ".timeline.html", title=os.path.basename(opts.script))
        written.append(stem + ".timeline.html")
    if opts.parquet:
        prof.to_parquet(opts.parquet)
        written.append(opts.parquet)
    print(f"\n[eager_neuron.profile] wrote {', '.join(written)}", file=sys.stderr)
    if error is not None:
        raise error
    return status


if __name__ == "__main__":
    sys.exit(main())
