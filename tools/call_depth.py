"""Call depth from dispatch() to launch(): how many Python calls a kernel op's launch sits below
the funnel (docs/ARCHITECTURE.md, "Call depth"), over op_db's samples in plain eager with the
fast path off (a runner replays from dispatch() directly).

    .venv/bin/python tools/call_depth.py                     # float32, 2 samples per op
    .venv/bin/python tools/call_depth.py --ops '^(mm|sum)$' --dtype float64 --top 20

Prints the histogram of launches by depth, the ops by their deepest launch, and the deepest
chains (the frames between dispatch and launch, outermost first).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import warnings

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]


class DepthProbe:
    """A sys.setprofile hook: for each launch() call, the frames up to the nearest dispatch().

    >>> import torch, eager_neuron
    >>> probe = DepthProbe()
    >>> with probe:
    ...     _ = torch.ones(3, device="neuron") * 2
    >>> max(probe.depths)
    1
    """

    def __init__(self) -> None:
        from eager_neuron import dispatch, launch

        self._dispatch = dispatch.dispatch.__code__
        self._launch = launch.launch.__code__
        self.depths: list[int] = []
        self.chains: list[list[str]] = []

    def _hook(self, frame, event, arg):
        if event != "call" or frame.f_code is not self._launch:
            return
        f, chain = frame.f_back, []
        while f is not None and f.f_code is not self._dispatch:
            chain.append(f.f_code.co_name)
            f = f.f_back
        if f is not None:   # a launch outside any op (a flush at exit) is not counted
            self.depths.append(len(chain) + 1)
            self.chains.append(chain[::-1])

    def __enter__(self):
        from eager_neuron.config import config

        self._fast = config.fastpath
        config.fastpath = False
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc):
        from eager_neuron.config import config

        sys.setprofile(None)
        config.fastpath = self._fast
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default=".", help="regex on OpInfo names (name.variant)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--top", type=int, default=30, help="deepest chains to print")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    import eager_neuron  # noqa: F401 -- the device

    dtype = getattr(torch, args.dtype)
    rx = re.compile(args.ops)
    hist = collections.Counter()
    worst: dict = {}
    for op in op_db:
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if not rx.search(name) or dtype not in op.supported_dtypes("cpu"):
            continue
        try:
            samples = list(op.sample_inputs("neuron", dtype))[:args.samples]
        except Exception:
            continue
        probe = DepthProbe()
        for s in samples:
            with probe:
                try:
                    op(s.input, *s.args, **s.kwargs)
                except Exception:
                    pass
        hist.update(probe.depths)
        if probe.depths:
            i = max(range(len(probe.depths)), key=probe.depths.__getitem__)
            worst[name] = (probe.depths[i], probe.chains[i])
    total = sum(hist.values())
    shallow = sum(n for d, n in hist.items() if d <= 2)
    print(f"launches by depth: {dict(sorted(hist.items()))}; {total} launches, "
          f"{100.0 * shallow / max(total, 1):.1f} % at depth <= 2")
    by_op = collections.Counter(d for d, _ in worst.values())
    ok = sum(n for d, n in by_op.items() if d <= 2)
    print(f"ops by their deepest launch: {dict(sorted(by_op.items()))}; {len(worst)} ops, "
          f"{100.0 * ok / max(len(worst), 1):.1f} % at depth <= 2")
    for name, (d, chain) in sorted(worst.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{d:3d} {name}: dispatch > {' > '.join(chain + ['launch'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
