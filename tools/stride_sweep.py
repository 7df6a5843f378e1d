"""Output strides on neuron against the CPU's, over op_db: an op whose result is laid out
differently makes a later `.view()` succeed on one device and fail on the other.

    .venv/bin/python tools/stride_sweep.py                  # float32, 3 samples per op
    .venv/bin/python tools/stride_sweep.py --samples 1 --ops '^(fft|linalg)'

Prints each (op, shape, CPU strides, neuron strides) that differs and a count. Samples either
device refuses are skipped (the OpInfo tests judge values and errors).
"""

from __future__ import annotations

import argparse
import re
import warnings


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--ops", default="", help="regex over op names")
    p.add_argument("--dtype", default="float32")
    args = p.parse_args()

    import torch
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.utils._pytree import tree_flatten, tree_map

    import eager_neuron  # noqa: F401 -- the device

    warnings.filterwarnings("ignore")
    dtype = getattr(torch, args.dtype)

    def moved(x):
        return x.to("neuron") if isinstance(x, torch.Tensor) else x

    ops = [o for o in op_db if dtype in o.supported_dtypes("cpu")
           and re.search(args.ops, o.name)]
    differ = []
    for op in ops:
        try:
            samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:args.samples]
        except Exception:    # noqa: BLE001 - an OpInfo that cannot make samples here
            continue
        for s in samples:
            try:
                want = op(s.input, *s.args, **s.kwargs)
                got = op(tree_map(moved, s.input), *tree_map(moved, s.args),
                         **tree_map(moved, s.kwargs))
            except Exception:    # noqa: BLE001 - refused on either device: not a layout case
                continue
            for w, g in zip(tree_flatten(want)[0], tree_flatten(got)[0]):
                if isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor) and \
                        w.layout == torch.strided and w.numel() > 1 and \
                        w.shape == g.shape and w.stride() != g.stride():
                    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
                    differ.append(name)
                    print(f"{name}: shape {tuple(w.shape)} cpu {w.stride()} neuron {g.stride()}",
                          flush=True)
                    break
    print(f"{len(ops)} ops, {len(differ)} samples with other strides "
          f"({len(set(differ))} ops)")


if __name__ == "__main__":
    main()
