"""In-place view ops (schema tag inplace_view: unsqueeze_, t_, as_strided_, resize_, set_ ...)
on neuron tensors: the wrapper's own sizes/strides/offset follow, aliasing stays real."""

import copy

import pytest
import torch

import eager_neuron
from eager_neuron.simulator import SIM

CASES = [
    ("unsqueeze_", lambda t: t.unsqueeze_(1)),
    ("squeeze_", lambda t: t.unsqueeze_(0).squeeze_()),
    ("squeeze_dim", lambda t: t.unsqueeze_(2).squeeze_(2)),
    ("transpose_", lambda t: t.transpose_(0, 1)),
    ("t_", lambda t: t.t_()),
    ("swapdims_", lambda t: t.swapdims_(1, 0)),
    ("as_strided_", lambda t: t.as_strided_((2, 2), (1, 3), 1)),
]


@pytest.mark.parametrize("name,fn", CASES, ids=[c[0] for c in CASES])
def test_inplace_view_matches_cpu(name, fn, stats_delta):
    base_c = torch.arange(12.).reshape(3, 4)
    base_n = base_c.to("neuron")
    out_c, out_n = fn(base_c[1:]), fn(base_n[1:])
    assert out_n.shape == out_c.shape
    assert out_n.stride() == out_c.stride()
    assert out_n.storage_offset() == out_c.storage_offset()
    torch.testing.assert_close(out_n.cpu(), out_c)
    # later in-place writes land in the base and show in other views of it
    other_c, other_n = base_c[2], base_n[2]
    out_c.mul_(-1)
    out_n.mul_(-1)
    torch.testing.assert_close(base_n.cpu(), base_c)
    torch.testing.assert_close(other_n.cpu(), other_c)
    assert stats_delta()["fallbacks"] == {}


def test_inplace_view_returns_self_and_other_views_keep_shape():
    x = torch.arange(6., device="neuron").reshape(2, 3)
    v = x.view(6)
    assert x.t_() is x
    assert x.shape == (3, 2) and v.shape == (6,)
    torch.testing.assert_close(x.cpu(), torch.arange(6.).reshape(2, 3).t())


def test_autograd_through_inplace_views():
    xc = torch.randn(2, 3, requires_grad=True)
    xn = xc.detach().to("neuron").requires_grad_()
    outs = []
    for x in (xc, xn):
        y = x.clone()
        y.unsqueeze_(0)
        y.transpose_(0, 2)
        y = y * torch.arange(2., device=x.device).view(1, 2, 1)
        y.sum().backward()
        outs.append(y)
    torch.testing.assert_close(outs[1].cpu(), outs[0])
    torch.testing.assert_close(xn.grad.cpu(), xc.grad)


def test_matmul_vector_matrix_and_quantile(stats_delta):
    # torch.matmul(vector, matrix) and quantile call squeeze_ from C++
    vc, mc = torch.randn(3), torch.randn(3, 4)
    torch.testing.assert_close(torch.matmul(vc.to("neuron"), mc.to("neuron")).cpu(),
                               torch.matmul(vc, mc))
    q = torch.tensor([0.25, 0.5])
    xc = torch.randn(11)
    torch.testing.assert_close(torch.quantile(xc.to("neuron"), q.to("neuron")).cpu(),
                               torch.quantile(xc, q))
    assert stats_delta()["fallbacks"] == {}


def test_group_norm_backward_and_gru_batch_first():
    torch.manual_seed(0)
    xc = torch.randn(2, 4, 5, requires_grad=True)
    xn = xc.detach().to("neuron").requires_grad_()
    torch.nn.functional.group_norm(xc, 2).pow(2).sum().backward()
    torch.nn.functional.group_norm(xn, 2).pow(2).sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, atol=1e-4, rtol=1e-4)
    gru = torch.nn.GRU(4, 5, batch_first=True)
    gru_n = copy.deepcopy(gru).to("neuron")
    s = torch.randn(2, 3, 4)
    out_c, _ = gru(s)
    out_n, _ = gru_n(s.to("neuron"))
    torch.testing.assert_close(out_n.cpu(), out_c, atol=1e-5, rtol=1e-5)


def test_resize_grows_keeps_data_and_accounts():
    core = SIM.core(0)
    x = torch.arange(4., device="neuron")
    before = core.allocated
    assert x.resize_(100_000) is x
    assert x.shape == (100_000,) and x.is_contiguous()
    assert core.allocated - before >= 100_000 * 4 - 4096
    torch.testing.assert_close(x[:4].cpu(), torch.arange(4.))
    x.fill_(2.0)
    assert x.sum().item() == 200_000.0
    x.resize_(2, 3)
    assert x.shape == (2, 3) and x.stride() == (3, 1)
    torch.testing.assert_close(x.cpu(), torch.full((2, 3), 2.0))
    y = torch.empty(0, device="neuron").resize_as_(x)
    assert y.shape == x.shape


def test_resize_growing_a_shared_block_is_a_clear_error():
    x = torch.zeros(4, device="neuron")
    v = x[:2]
    # the CPU grows the storage in place and v still aliases x; a new block could not: refuse
    with pytest.raises(RuntimeError, match="other tensors .views. share"):
        x.resize_(70_000)
    del v
    x.resize_(70_000)
    assert x.shape == (70_000,)
    x.resize_(2)          # shrinking or staying within the block never needs a new one
    assert x.shape == (2,)


def test_detach_():
    x = torch.ones(3, device="neuron", requires_grad=True) * 2
    assert x.detach_() is x and not x.requires_grad and x.grad_fn is None


def test_set_source_tensor_aliases():
    a = torch.arange(6., device="neuron")
    b = torch.zeros(2, device="neuron")
    b.set_(a)
    assert b.shape == a.shape and b._block is a._block
    b.fill_(3.0)
    torch.testing.assert_close(a.cpu(), torch.full((6,), 3.0))


def test_out_of_another_shape_is_resized(stats_delta):
    a = torch.ones(3, device="neuron")
    out = torch.empty(0, device="neuron")
    assert torch.add(a, a, out=out) is out
    assert out.shape == (3,)
    torch.testing.assert_close(out.cpu(), torch.full((3,), 2.0))
    assert torch.arange(6, device="neuron").shape == (6,)   # arange fills an empty out=
    out = torch.empty(0, device="neuron")
    torch.randn(4, out=out)
    assert out.shape == (4,)
    assert stats_delta()["fallbacks"] == {}


def test_out_of_another_shape_under_neuron_mode():
    with eager_neuron.NeuronMode():
        out = torch.empty(0)
        torch.add(torch.ones(3), torch.ones(3), out=out)
    torch.testing.assert_close(out, torch.full((3,), 2.0))


# out= of a wider dtype than the result: ATen computes in the operands' common dtype and casts
# into out (exact references, written out: bool + bool is a logical or, int8 wraps in int8)
_B, _B2 = torch.tensor([True, False, True]), torch.tensor([True, True, False])
_I8 = torch.tensor([100, -100, 127], dtype=torch.int8)
_U8 = torch.tensor([200, 100, 255], dtype=torch.uint8)
OUT_DTYPE_CASES = [
    ("bool_add_int64", lambda o: torch.add(_B.to(o.device), _B2.to(o.device), out=o),
     torch.int64, [1, 1, 1]),
    ("int8_add_int16", lambda o: torch.add(_I8.to(o.device), _I8.to(o.device), out=o),
     torch.int16, [-56, 56, -2]),
    ("uint8_mul_int32", lambda o: torch.mul(_U8.to(o.device), 3, out=o),
     torch.int32, [88, 44, 253]),
    ("uint8_sub_float32", lambda o: torch.sub(_U8.to(o.device), _U8.flip(0).to(o.device),
                                              out=o), torch.float32, [201.0, 0.0, 55.0]),
    ("int8_square_int64", lambda o: torch.square(_I8.to(o.device), out=o),
     torch.int64, [16, 16, 1]),
    ("int8_xor_float32", lambda o: torch.bitwise_xor(_I8.to(o.device), 1, out=o),
     torch.float32, [101.0, -99.0, 126.0]),
]


@pytest.mark.parametrize("name,fn,dtype,want", OUT_DTYPE_CASES,
                         ids=[c[0] for c in OUT_DTYPE_CASES])
def test_out_of_a_wider_dtype_computes_in_the_common_dtype(name, fn, dtype, want, stats_delta):
    for adaptive in (False, True):
        out = torch.zeros(3, dtype=dtype, device="neuron")
        with eager_neuron.adaptive(adaptive):
            assert fn(out) is out
        assert out.cpu().tolist() == want, (name, adaptive)
        assert fn(torch.zeros(3, dtype=dtype)).tolist() == want   # the CPU's own answer
    assert stats_delta()["fallbacks"] == {}


def test_inplace_of_a_narrower_dtype_computes_in_the_common_dtype(stats_delta):
    # uint8 x.floor_divide_(int64 y): ATen divides in int64, then casts (exact references)
    x = torch.tensor([128, 127, 249, 7], dtype=torch.uint8)
    y = torch.tensor([-1, 2, -2, 3])
    big = torch.tensor([-128, 127, -7, 7], dtype=torch.int32)
    cases = [(lambda d: x.to(d, copy=True).floor_divide_(y.to(d)), [128, 63, 131, 2]),
             (lambda d: x.to(d, copy=True).remainder_(y.to(d)), [0, 1, 255, 1]),
             (lambda d: big.to(d, copy=True).remainder_(y.to(d) * 2**33 + 3),
              [-128, 127, -7, 7]),
             (lambda d: big.to(d, copy=True).floor_divide_(y.to(d) * 2**33 + 3), [0, 0, 0, 0])]
    for fn, want in cases:
        assert fn("cpu").tolist() == want
        for adaptive in (False, True):
            with eager_neuron.adaptive(adaptive):
                got = fn("neuron")
            assert got.cpu().tolist() == want, adaptive
    # float32 x.mul_(float64 y): one rounding of the float64 product (not y rounded first)
    a = torch.tensor([1.0, 3.0], dtype=torch.float32)
    b = torch.tensor([1 + 2.0 ** -24 + 2.0 ** -40, 1 - 2.0 ** -25 - 2.0 ** -45],
                     dtype=torch.float64)
    want = (a.double() * b).float()
    assert torch.equal(a.clone().mul_(b), want)
    assert torch.equal(a.to("neuron").mul_(b.to("neuron")).cpu(), want)
    assert stats_delta()["fallbacks"] == {}


def test_out_of_a_wider_dtype_under_neuron_mode():
    # (the CPU's refusal was asked inside the mode: the out= call fell back to the CPU)
    eager_neuron.reset_stats()
    with eager_neuron.NeuronMode():
        out = torch.zeros(3, dtype=torch.int16)
        torch.add(_I8, _I8, out=out)
        with pytest.raises(RuntimeError, match="Found dtype Short but expected Char"):
            torch.neg(_I8, out=out)
    assert out.tolist() == [-56, 56, -2]
    assert eager_neuron.stats()["fallbacks"] == {}


def test_out_of_a_float16_sum_rounds_to_float16():
    a = torch.tensor([1000.0, 0.1, 3.3], dtype=torch.float16)
    want = (a + a.flip(0)).float()          # float16's sums, then widened
    out = torch.zeros(3, device="neuron")
    torch.add(a.to("neuron"), a.flip(0).to("neuron"), out=out)
    assert torch.equal(out.cpu(), want)


@pytest.mark.parametrize("fn", [
    lambda x, o: torch.neg(x, out=o), lambda x, o: torch.bitwise_not(x, out=o),
    lambda x, o: torch.clamp(x, 0, 5, out=o)], ids=["neg", "bitwise_not", "clamp"])
def test_out_of_another_dtype_refused_as_on_the_cpu(fn):
    x = torch.tensor([1, -2, 3], dtype=torch.int8)
    with pytest.raises(RuntimeError, match="Found dtype Long but expected Char"):
        fn(x, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="Found dtype Long but expected Char"):
        fn(x.to("neuron"), torch.zeros(3, dtype=torch.int64, device="neuron"))


def test_set_storage_is_a_clear_error():
    a = torch.zeros(2, device="neuron")
    with pytest.raises(RuntimeError, match="storage argument is not supported on neuron"):
        a.set_(torch.zeros(3).untyped_storage())


def test_inplace_view_under_mode_runs_on_cpu():
    with eager_neuron.NeuronMode():
        x = torch.zeros(2, 3)
        x.t_()
    assert x.shape == (3, 2) and x.device.type == "cpu"


def test_as_strided_scatter_on_device(stats_delta):
    x = torch.arange(12.).reshape(3, 4)
    src = -torch.arange(4.).reshape(2, 2)
    want = torch.as_strided_scatter(x, src, (2, 2), (1, 4), 1)
    got = torch.as_strided_scatter(x.to("neuron"), src.to("neuron"), (2, 2), (1, 4), 1)
    torch.testing.assert_close(got.cpu(), want)
    assert stats_delta()["fallbacks"] == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_hash_tensor_uint64_on_device(dtype, stats_delta):
    x = torch.randn(3, 4, 5).mul(4).to(dtype)[:, ::2]
    for dim, keepdim in (([], False), ([1], True), ([0, 2], False)):
        want = torch.ops.aten.hash_tensor(x, dim, keepdim=keepdim)
        got = torch.ops.aten.hash_tensor(x.to("neuron"), dim, keepdim=keepdim)
        assert got.dtype == torch.uint64 and got.shape == want.shape
        assert torch.equal(got.cpu(), want)
    assert stats_delta()["fallbacks"] == {}


def test_unsigned_storage_dtypes_move_and_refuse_compute_in_strict_mode(strict_fallback):
    u = torch.tensor([1, 2, 3], dtype=torch.uint32).to("neuron")
    assert torch.equal(u.cpu(), torch.tensor([1, 2, 3], dtype=torch.uint32))
    with pytest.raises(eager_neuron.UnsupportedOpError):
        u * u


@torch.library.custom_op("eager_neuron_test::twice_plus", mutates_args=())
def _twice_plus(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * 2 + y


def test_python_custom_op_runs_its_implementation_on_device(stats_delta):
    # a torch.library.custom_op written in torch ops decomposes: no CPU fallback
    x, y = torch.randn(3), torch.randn(3)
    got = torch.ops.eager_neuron_test.twice_plus(x.to("neuron"), y.to("neuron"))
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), x * 2 + y)
    st = stats_delta()
    assert st["fallbacks"] == {}
    assert st["decompositions"].get("eager_neuron_test::twice_plus") == 1


def test_partial_overlap_in_place_is_refused_like_the_cpu():
    # the host views share device memory: a partly overlapping input would be read after some
    # of its elements were overwritten; ATen refuses it and so must we (never a wrong answer)
    t = torch.arange(64.0, device="neuron")
    for write in (lambda: t[:32].add_(t[16:48]), lambda: t[:32].copy_(t[16:48]),
                  lambda: torch.add(t[16:48], 1, out=t[:32])):
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            write()
    # a transposed input over the same bytes is a partial overlap too (dense, other strides)
    m = torch.randn(3, 3, device="neuron")
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        m.add_(m.t())
    # full overlap and disjoint halves are fine, as on the CPU
    x, c = torch.arange(8.0, device="neuron"), torch.arange(8.0)
    for y in (x, c):
        y.add_(y)
        y[:4].add_(y[4:])
        y.mul_(y.view(2, 4).view(8))
    torch.testing.assert_close(x.cpu(), c)


COMPOSITE_INPLACE = {          # in-place ops whose CPU kernel is PyTorch's composite
    "swapdims_": lambda t: t.swapdims_(0, 1), "swapaxes_": lambda t: t.swapaxes_(1, 0),
    "transpose_": lambda t: t.transpose_(0, 1), "absolute_": lambda t: t.absolute_(),
    "clip_": lambda t: t.clip_(0.2, 0.8), "multiply_": lambda t: t.multiply_(2.0),
    "fix_": lambda t: t.fix_(), "square_": lambda t: t.square_(),
}


@pytest.mark.parametrize("name", list(COMPOSITE_INPLACE))
def test_composite_inplace_bumps_versions_in_inference_mode(name):
    """Under inference_mode a composite in-place op (swapdims_, absolute_ ...) reaches the device
    whole; the CPU bumps a normal tensor's version counter once per call (its composite calls
    transpose_/abs_ below ADInplaceOrView), a view's base with it; an inference tensor has none
    and an update to it outside inference_mode is refused alike."""
    fn = COMPOSITE_INPLACE[name]
    seen = {}
    for dev in ("cpu", "neuron"):
        x = torch.arange(6.0, device=dev).reshape(2, 3) / 6
        base = torch.arange(12.0, device=dev).reshape(4, 3) / 12
        view = base[1:3]
        with torch.inference_mode():
            for _ in range(3):      # repeated: a replayed call bumps too
                fn(x)
            fn(view)
            inf = torch.ones(2, 3, device=dev)
            fn(inf)
        with pytest.raises(RuntimeError, match="Inplace update to inference tensor"):
            fn(inf)
        seen[dev] = (x._version, view._version, base._version, tuple(x.shape),
                     x.stride(), x.cpu().tolist(), tuple(view.shape), inf.is_inference())
    assert seen["neuron"] == seen["cpu"]
    assert seen["cpu"][:3] == (3, 1, 1)
