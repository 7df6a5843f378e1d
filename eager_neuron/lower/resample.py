"""Resampling backward lowerings: upsample (nearest, nearest-exact, linear, bilinear, trilinear,
bicubic) and replication padding, 1/2/3-d. Their forwards decompose into gathers that have
kernels; the backward passes are scatters, one launch each.

>>> import torch, eager_neuron
>>> x = torch.ones(1, 1, 2, device="neuron", requires_grad=True)
>>> torch.nn.functional.interpolate(x, size=4, mode="linear").sum().backward()
>>> x.grad.flatten().tolist()
[2.0, 2.0]
"""

from __future__ import annotations

from ..kernels import compile as kc
from ..kernels import resample as kresample
from ..launch import launch
from .common import NP_TYPE
from .pool import _FLOAT, PARALLEL_MIN, VERSION, _as5, _np, _numel


def _upsample_backward(mode: str, rank: int):
    scale_names = {1: ("scales",), 2: ("scales_h", "scales_w"),
                   3: ("scales_d", "scales_h", "scales_w")}[rank]

    def lower(func, a, outs):
        gi, go = outs[0], a["grad_output"]
        if gi.dtype not in _FLOAT or go.dtype != gi.dtype:
            raise NotImplementedError(f"upsample backward on {gi.dtype}")
        if gi.numel() == 0:
            return
        # 1 / scale_factor per axis (0: the sizes define the scale), unit axes in front
        inv = [1.0 / s if s is not None and s > 0 else 0.0 for s in
               (a[nm] for nm in scale_names)]
        inv = [0.0] * (3 - rank) + inv
        T = NP_TYPE[gi.dtype]
        parallel = go.numel() >= PARALLEL_MIN and kc.parallel_allowed()
        key = ("resample", "upsample_backward", VERSION, mode, T, parallel)
        taps = kresample.TAPS[mode] ** rank
        launch(key, lambda: kresample.render_upsample_backward(mode, T, parallel),
               (_np(_as5(gi, rank)), _np(_as5(go, rank))) + tuple(inv) +
               (bool(a.get("align_corners") or False),),
               flops=2.0 * go.numel() * taps, bytes_moved=_numel(gi, go) * gi.element_size(),
               engine="vector")
    return lower


def _replication_pad_backward(rank: int):
    def lower(func, a, outs):
        gi, go = outs[0], a["grad_output"]
        if gi.dtype not in _FLOAT or go.dtype != gi.dtype:
            raise NotImplementedError(f"replication_pad backward on {gi.dtype}")
        if gi.numel() == 0:
            return
        pad = tuple(a["padding"])               # (left, right, top, bottom, front, back)
        lead = (0,) * (3 - rank) + tuple(reversed(pad[0::2]))
        parallel = go.numel() >= PARALLEL_MIN and kc.parallel_allowed()
        launch(("resample", "replication_pad_backward", VERSION, parallel),
               lambda: kresample.render_replication_pad_backward(parallel),
               (_np(_as5(gi, rank)), _np(_as5(go, rank))) + lead, flops=float(go.numel()),
               bytes_moved=_numel(gi, go) * gi.element_size(), engine="vector")
    return lower


LOWERINGS = {}
for _r in (1, 2, 3):
    LOWERINGS.update({
        f"aten::upsample_nearest{_r}d_backward": _upsample_backward("nearest", _r),
        f"aten::_upsample_nearest_exact{_r}d_backward": _upsample_backward("nearest_exact", _r),
        f"aten::replication_pad{_r}d_backward": _replication_pad_backward(_r),
    })
LOWERINGS.update({
    "aten::upsample_linear1d_backward": _upsample_backward("linear", 1),
    "aten::upsample_bilinear2d_backward": _upsample_backward("linear", 2),
    "aten::upsample_trilinear3d_backward": _upsample_backward("linear", 3),
    "aten::upsample_bicubic2d_backward": _upsample_backward("cubic", 2),
})
