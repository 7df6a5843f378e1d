"""The pipeline's depth (docs/ARCHITECTURE.md, "Call depth"): a kernel op of the common families
launches at most two Python calls below dispatch() — dispatch calls the lowering in its own
frame, the lowering makes the launch its family helper built. Counted with sys.setprofile on
the slow path (the fast path off), never timed."""

import os
import sys

import pytest
import torch
import torch.nn.functional as F

import eager_neuron  # noqa: F401 -- the device

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
from call_depth import DepthProbe  # noqa: E402

aten = torch.ops.aten

# op -> a call on neuron tensors; each family whose helper builds its launch
CASES = {
    "add": lambda x, i: x + x,
    "gelu": lambda x, i: F.gelu(x),
    "clone": lambda x, i: x.t().clone(),
    "to float64": lambda x, i: x.to(torch.float64),
    "copy_": lambda x, i: torch.empty(8, 5, device="neuron").copy_(x.t()),
    "sum": lambda x, i: x.sum(1),
    "amax": lambda x, i: x.amax(0),
    "argmax": lambda x, i: x.argmax(1),
    "var_mean": lambda x, i: torch.var_mean(x, 1),
    "softmax": lambda x, i: torch.softmax(x, 1),
    "layer_norm": lambda x, i: F.layer_norm(x, (8,)),
    "mm": lambda x, i: x @ x.t(),
    "addmm": lambda x, i: torch.addmm(x[:, 0], x, x.t()),
    "bmm": lambda x, i: torch.bmm(x.unsqueeze(0), x.t().unsqueeze(0)),
    "cat": lambda x, i: torch.cat([x, x], 0),
    "pad": lambda x, i: F.pad(x, (1, 2)),
    "flip": lambda x, i: x.flip(0),
    "tril": lambda x, i: x.tril(),
    "index_select": lambda x, i: x.index_select(0, i),
    "embedding": lambda x, i: F.embedding(i, x),
    "gather": lambda x, i: x.gather(0, i.unsqueeze(1).expand(3, 8)),
    "scatter_add": lambda x, i: torch.zeros_like(x).scatter_add(0, i.unsqueeze(1).expand(3, 8),
                                                                x[:3]),
    "index_put": lambda x, i: x.clone().index_put_((i,), x[:3], accumulate=True),
    "sort": lambda x, i: x.sort(1),
    "topk": lambda x, i: x.topk(2, 1),
    "max_pool2d": lambda x, i: F.max_pool2d(x.view(1, 1, 5, 8), 2),
    "avg_pool2d": lambda x, i: F.avg_pool2d(x.view(1, 1, 5, 8), 2),
    # casts through bit kernels: cast_steps launched by the copy lowering
    "to bfloat16": lambda x, i: x.to(torch.bfloat16),
    "to float16": lambda x, i: x.to(torch.float16),
    "to int8": lambda x, i: x.to(torch.int8),
    "bfloat16 to float64": lambda x, i: x.to(torch.bfloat16).to(torch.float64),
}


def _sq(x):
    """A well-conditioned square (5, 5) float32 matrix from x (SPD: x x^T + 5 I)."""
    return x @ x.t() + 5 * torch.eye(5, device="neuron")


# linalg: each lowering is a generator of requests its driver launches (linalg_base.lowering):
# float64 staging copies, the batch kernels and the casts out, all two calls below dispatch
CASES.update({
    "linalg.solve": lambda x, i: torch.linalg.solve(_sq(x), x),
    "linalg.inv": lambda x, i: torch.linalg.inv(_sq(x)),
    "linalg.det": lambda x, i: torch.linalg.det(_sq(x)),
    "linalg.slogdet": lambda x, i: torch.linalg.slogdet(_sq(x)),
    "linalg.cholesky": lambda x, i: torch.linalg.cholesky(_sq(x)),
    "cholesky_solve": lambda x, i: torch.cholesky_solve(x, torch.linalg.cholesky(_sq(x))),
    "linalg.lu": lambda x, i: torch.linalg.lu(x),
    "lu_solve": lambda x, i: torch.linalg.lu_solve(*torch.linalg.lu_factor(_sq(x)), x),
    "solve_triangular": lambda x, i: torch.linalg.solve_triangular(_sq(x).tril(), x,
                                                                    upper=False),
    "linalg.ldl_solve": lambda x, i: torch.linalg.ldl_solve(*torch.linalg.ldl_factor(_sq(x)), x),
    "linalg.qr": lambda x, i: torch.linalg.qr(x),
    "linalg.eigh": lambda x, i: torch.linalg.eigh(_sq(x)),
    "linalg.svd": lambda x, i: torch.linalg.svd(x),
    "linalg.pinv": lambda x, i: torch.linalg.pinv(x),
    "matrix_exp": lambda x, i: torch.linalg.matrix_exp(_sq(x) / 10),
    "householder_product": lambda x, i: torch.linalg.householder_product(x.t(), x[0, :4]),
    "solve float64": lambda x, i: torch.linalg.solve(_sq(x).double(), x.double()),
    # the complex route: run_complex launches its steps (complex kernels, staging casts)
    "complex mul": lambda x, i: torch.complex(x, x) * torch.complex(x, -x),
    "complex matmul": lambda x, i: torch.complex(x, x) @ torch.complex(x, x).mT,
    "complex abs": lambda x, i: torch.complex(x, x).abs(),
    "complex prod": lambda x, i: torch.complex(x, x).prod(1),
    "complex bf16 operand": lambda x, i: torch.complex(x, x) * x.to(torch.bfloat16),
    "complex solve": lambda x, i: torch.linalg.solve(torch.complex(_sq(x), _sq(x).tril()),
                                                     torch.complex(x, x)),
    "complex32 to complex64": lambda x, i: torch.complex(x, x).to(torch.complex32).to(
        torch.complex64),
    # the half route: run_upcast launches the casts and the float32 op's request
    "bf16 mul": lambda x, i: x.to(torch.bfloat16) * 3,
    "bf16 add scalar": lambda x, i: x.to(torch.bfloat16) + 0.3,
    "f16 gelu": lambda x, i: F.gelu(x.to(torch.float16)),
    "bf16 where": lambda x, i: torch.where(x > 0, x.to(torch.bfloat16), 1.5),
    # the fp8 route: run_fp8 launches the decode/encode kernels and the float32 op's request
    "to float8": lambda x, i: x.to(torch.float8_e4m3fn),
    "float8 to bfloat16": lambda x, i: x.to(torch.float8_e5m2).to(torch.bfloat16),
    "float8 mul": lambda x, i: x.to(torch.float8_e4m3fn) * x.to(torch.float8_e4m3fn),
    # convolution, batch norm, pooling and resampling of half operands, pointwise losses
    "conv2d": lambda x, i: F.conv2d(x.view(1, 1, 5, 8), x[:3, :3].reshape(1, 1, 3, 3)),
    "conv2d bf16": lambda x, i: F.conv2d(x.view(1, 1, 5, 8).to(torch.bfloat16),
                                         x[:3, :3].reshape(1, 1, 3, 3).to(torch.bfloat16)),
    "conv_transpose2d": lambda x, i: F.conv_transpose2d(x.view(1, 1, 5, 8),
                                                        x[:3, :3].reshape(1, 1, 3, 3)),
    "batch_norm": lambda x, i: F.batch_norm(x, None, None, training=True),
    "batch_norm running": lambda x, i: F.batch_norm(x, torch.zeros(8, device="neuron"),
                                                    torch.ones(8, device="neuron"),
                                                    training=True),
    "batch_norm bf16": lambda x, i: F.batch_norm(x.to(torch.bfloat16), None, None,
                                                 training=True),
    "avg_pool2d bf16 backward": lambda x, i: torch.ops.aten.avg_pool2d_backward(
        x.view(1, 1, 5, 8)[..., :2, :4].to(torch.bfloat16),
        x.view(1, 1, 5, 8).to(torch.bfloat16), [2, 2], [2, 2], [0, 0], False, True, None),
    "grid_sample bf16": lambda x, i: F.grid_sample(
        x.view(1, 1, 5, 8).to(torch.bfloat16),
        (x[:4, :6].reshape(1, 2, 6, 2) / 4).to(torch.bfloat16), align_corners=False),
    "upsample bilinear bf16": lambda x, i: F.interpolate(x.view(1, 1, 5, 8).to(torch.bfloat16),
                                                         scale_factor=2, mode="bilinear"),
    "mse_loss": lambda x, i: F.mse_loss(x, x.flip(0)),
    "binary_cross_entropy": lambda x, i: F.binary_cross_entropy(x.sigmoid(), x.sigmoid().t().t()),
})

# dynamic (data-dependent) ops: dispatch calls their lowering in its own frame; one written as
# steps (count, allocate, fill) has each launch made by dispatch itself
CASES.update({
    "nonzero": lambda x, i: (x > 0).nonzero(),
    "argwhere": lambda x, i: torch.argwhere(x > 0),
    "masked_select": lambda x, i: x.masked_select(x > 0),
    "x[mask]": lambda x, i: x[x > 0],
    "x[index]": lambda x, i: x[i],
    "take": lambda x, i: x.take(i),
    "unique": lambda x, i: torch.unique(i, return_inverse=True, return_counts=True),
    "unique bf16": lambda x, i: torch.unique(x.t().to(torch.bfloat16)),
    "unique_consecutive": lambda x, i: torch.unique_consecutive(i),
    "unique dim": lambda x, i: torch.unique(x.round(), dim=1),
    "bincount": lambda x, i: torch.bincount(i),
    "histogram": lambda x, i: torch.histogram(x, torch.linspace(-2, 2, 5, device="neuron")),
    "histogramdd": lambda x, i: torch.histogramdd(x.t()[:, :2], bins=[3, 4]),
    "repeat_interleave": lambda x, i: torch.repeat_interleave(i),
    "geqrf": lambda x, i: torch.geqrf(x),
    "linalg.lstsq": lambda x, i: torch.linalg.lstsq(x, x[:, :2]),
    # (strided log_probs: copied first)
    "ctc_loss": lambda x, i: F.ctc_loss(x.view(5, 8, 1).expand(5, 8, 2).log_softmax(1)
                                        .transpose(1, 2), torch.tensor([[1, 2], [3, 3]],
                                                                       device="neuron"),
                                        [5, 5], [2, 2]),
    # index_put with a mask: the mask's count and coordinates, then put, all one call below
    "index_put mask": lambda x, i: x.clone().index_put_((x > 0,), torch.tensor(1.0)),
    "index_put mask bf16": lambda x, i: x.to(torch.bfloat16).index_put_(
        (x > 0,), torch.tensor(1.0, dtype=torch.bfloat16), accumulate=True),
    "histc bf16": lambda x, i: torch.histc(x.t().to(torch.bfloat16), 4),
    "bucketize": lambda x, i: torch.bucketize(x, torch.tensor([-1.0, 0.0, 1.0])
                                              .to("neuron")),
    "isin": lambda x, i: torch.isin(i, torch.tensor([0, 2], device="neuron")),
    "addr": lambda x, i: torch.addr(x, x[:, 0], x[0]),
    "addr bf16": lambda x, i: torch.addr(*(t.to(torch.bfloat16) for t in (x, x[:, 0], x[0]))),
    "linalg.eig": lambda x, i: torch.linalg.eig(_sq(x).t()),
    # the FFT family: each pass's launch made by the lowering
    "rfft": lambda x, i: torch.fft.rfft(x),
    "fft2 c64": lambda x, i: torch.fft.fft2(x.to(torch.complex64), s=(6, 8)),
    "irfftn": lambda x, i: torch.fft.irfftn(torch.fft.rfftn(x)),
    "fftn no dims": lambda x, i: torch.fft.fftn(x.to(torch.complex64), dim=()),
})

# the dtype routes' steps driven by dispatch itself: a half or complex op whose float32 family
# builds no request (reductions, scans, shape ops) runs its lowering two calls up
CASES.update({
    "sum bf16": lambda x, i: x.to(torch.bfloat16).sum(1),
    "softmax bf16": lambda x, i: torch.softmax(x.to(torch.bfloat16), 1),
    "cumsum f16": lambda x, i: x.to(torch.float16).cumsum(1),
    "sum c64": lambda x, i: x.to(torch.complex64).sum(1),
    "cat c64": lambda x, i: torch.cat([x.to(torch.complex64)] * 2),
})

# the last helpers that launched for their lowering (a cell kernel, trilinear's mul/sum, the hash
# cast, the half segment reduce): each builds the request the lowering launches
CASES.update({
    "frexp": lambda x, i: torch.frexp(x),
    "bilinear": lambda x, i: F.bilinear(x, x, x[:2].reshape(2, 1, 8).expand(2, 8, 8)),
    "hash_tensor": lambda x, i: torch.hash_tensor(x, dim=1),
    "segment_reduce bf16": lambda x, i: torch.segment_reduce(
        x.reshape(-1).to(torch.bfloat16), "sum", lengths=torch.tensor([10, 30], device="neuron")),
})


@pytest.mark.parametrize("name", sorted(CASES))
def test_launch_is_at_most_two_calls_below_dispatch(name):
    x = torch.randn(5, 8, device="neuron")
    i = torch.tensor([4, 0, 2], device="neuron")
    with DepthProbe() as probe:
        CASES[name](x, i)
    assert probe.depths, f"{name}: no launch seen"
    deepest = max(range(len(probe.depths)), key=probe.depths.__getitem__)
    assert probe.depths[deepest] <= 2, (
        f"{name}: launch {probe.depths[deepest]} calls below dispatch: dispatch > "
        + " > ".join(probe.chains[deepest] + ["launch"]))


def test_the_probe_sees_a_deeper_launch(monkeypatch):
    # the probe itself: a lowering whose helper makes a launch (mask.count_nonzero) is counted
    # three calls below dispatch
    from eager_neuron.lower.mask import count_nonzero
    from eager_neuron.plan import _PLANS

    x = torch.tensor([0.0, 1.0, 2.0], device="neuron")
    x.nonzero()   # the op's plan
    plan = _PLANS[aten.nonzero.default]
    steps = plan.lower

    def deeper(func, a, index):
        count_nonzero(a["self"])   # dispatch > deeper > count_nonzero > launch
        return steps(func, a, index)

    monkeypatch.setattr(plan, "lower", deeper)
    with DepthProbe() as probe:
        got = x.nonzero()
    assert got.cpu().tolist() == [[1], [2]]
    assert max(probe.depths) == 3, probe.chains
