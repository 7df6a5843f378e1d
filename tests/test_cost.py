"""The cost model against hand-computed cases (eager_neuron/cost.py: pure functions, no torch).

Per-core figures used below: trn2 HBM 2.9e12/8 = 3.625e11 B/s, trn3 4.9e12/8 = 6.125e11 B/s;
TensorE 158/79/20 TFLOPS (fp8/bf16/fp32) on trn2, 315/79/20 on trn3; VectorE 1.0 (trn2) and
1.2 (trn3) TFLOPS; ScalarE 1.2 TFLOPS on both; launch overhead 15 us; host link 64 GB/s.
"""

import pytest

from eager_neuron import cost
from eager_neuron.cost import PROFILES

TRN2, TRN3 = PROFILES["trn2"], PROFILES["trn3"]

# (profile, flops, bytes, engine, dtype class, expected kernel body in us, why)
KERNEL_CASES = [
    (TRN2, 0, 0, "vector", "fp32", 0.0, "no work, no time"),
    (TRN2, 1e6, 0, "vector", "fp32", 1.0, "1e6 / 1.0e12"),
    (TRN2, 1e6, 3.625e6, "vector", "fp32", 10.0, "memory-bound: 3.625e6 / 3.625e11"),
    (TRN2, 1e8, 3.625e6, "vector", "fp32", 100.0, "compute-bound: 1e8 / 1e12 > 10 us"),
    (TRN2, 1.2e6, 0, "scalar", "fp32", 1.0, "1.2e6 / 1.2e12"),
    (TRN2, 7.9e9, 0, "tensor", "bf16", 100.0, "7.9e9 / 79e12"),
    (TRN2, 2e9, 0, "tensor", "fp32", 100.0, "2e9 / 20e12"),
    (TRN2, 1.58e9, 0, "tensor", "fp8", 10.0, "1.58e9 / 158e12"),
    (TRN2, 2e9, 0, "tensor", "int32", 100.0, "unknown class runs at the fp32 rate"),
    (TRN2, 7.9e9, 3.625e8, "tensor", "bf16", 1000.0, "matmul starved by HBM: 3.625e8 B"),
    (TRN3, 1.2e6, 0, "vector", "fp32", 1.0, "1.2e6 / 1.2e12"),
    (TRN3, 0, 6.125e6, "vector", "fp32", 10.0, "6.125e6 / 6.125e11"),
    (TRN3, 3.15e9, 0, "tensor", "fp8", 10.0, "3.15e9 / 315e12"),
    (TRN3, 7.9e9, 0, "tensor", "bf16", 100.0, "same TensorE BF16 rate as trn2"),
]


@pytest.mark.parametrize("profile,flops,nbytes,engine,dcls,expected,why", KERNEL_CASES,
                         ids=[c[-1] for c in KERNEL_CASES])
def test_kernel_time(profile, flops, nbytes, engine, dcls, expected, why):
    assert cost.kernel_time_us(profile, flops, nbytes, engine, dcls) == pytest.approx(expected)


@pytest.mark.parametrize("profile,flops,nbytes,engine,dcls,expected,why", KERNEL_CASES,
                         ids=[c[-1] for c in KERNEL_CASES])
def test_launch_cost_adds_the_overhead_once(profile, flops, nbytes, engine, dcls, expected, why):
    got = cost.launch_cost_us(profile, flops, nbytes, engine, dcls)
    assert got == pytest.approx(15.0 + expected)


@pytest.mark.parametrize("profile,nbytes,expected", [
    (TRN2, 0, 0.0),
    (TRN2, 64e3, 1.0),          # 64 kB over 64 GB/s
    (TRN2, 64e6, 1000.0),
    (TRN3, 64e6, 1000.0),       # same assumed host link
])
def test_transfer_time(profile, nbytes, expected):
    assert cost.transfer_time_us(profile, nbytes) == pytest.approx(expected)


@pytest.mark.parametrize("profile,nbytes,expected", [
    (TRN2, 3.625e6 / 2, 10.0),  # read + write 1.8125 MB at 3.625e11 B/s
    (TRN3, 6.125e6 / 2, 10.0),
])
def test_cross_core_time(profile, nbytes, expected):
    assert cost.cross_core_time_us(profile, nbytes) == pytest.approx(expected)


@pytest.mark.parametrize("fn,args,expected", [
    (cost.elementwise_work, (1000, (4, 4), 4), (1000.0, 12000.0)),
    (cost.elementwise_work, (10, (2,), 2, 3.0), (30.0, 40.0)),            # bf16 gelu-like
    (cost.reduction_work, (1024, 4, 4), (1024.0, 4112.0)),
    (cost.matmul_work, (1, 2, 3, 4, 4, 4, 4), (48.0, 104.0)),
    (cost.matmul_work, (8, 128, 128, 64, 2, 2, 4), (16777216.0, 786432.0)),
    # N=1, C_in=3, C_out=8, 2x2 output, 3x3 kernel, 4x4 input, fp32
    (cost.conv_work, (1, 3, 8, 4, 9, 16, 1, 4), (1728.0, 1184.0)),
    (cost.conv_work, (2, 4, 4, 1, 1, 1, 4, 4), (16.0, 80.0)),               # depthwise 1x1
])
def test_work_of_kernel_families(fn, args, expected):
    assert fn(*args) == pytest.approx(expected)


@pytest.mark.parametrize("name,expected", [
    ("torch.float32", "fp32"), ("float64", "fp32"), ("torch.int64", "fp32"),
    ("torch.bfloat16", "bf16"), ("torch.float16", "bf16"),
    ("torch.float8_e4m3fn", "fp8"), ("float8_e5m2", "fp8"),
])
def test_dtype_class(name, expected):
    assert cost.dtype_class(name) == expected


# (figure, trn2, trn3) as published; see the profile's `sources`
PUBLISHED = [
    ("cores_per_chip", 8, 8),
    ("hbm_bytes", 96 * cost.GiB, 144 * cost.GiB),
    ("hbm_bytes_per_s", 2.9e12, 4.9e12),
    ("sbuf_bytes", 28 * cost.MiB, 32 * cost.MiB),
    ("psum_bytes", 2 * cost.MiB, 2 * cost.MiB),
]


@pytest.mark.parametrize("field,trn2,trn3", PUBLISHED)
def test_profiles_carry_the_published_figures(field, trn2, trn3):
    assert getattr(TRN2, field) == trn2
    assert getattr(TRN3, field) == trn3


def test_engine_rates_and_sources():
    assert TRN2.tensor_flops == {"fp8": 158e12, "bf16": 79e12, "fp32": 20e12}
    assert TRN3.tensor_flops["fp8"] == 315e12
    assert (TRN2.vector_flops["fp32"], TRN3.vector_flops["fp32"]) == (1.0e12, 1.2e12)
    assert (TRN2.scalar_flops["fp32"], TRN3.scalar_flops["fp32"]) == (1.2e12, 1.2e12)
    assert all(p.sources for p in PROFILES.values())
    assert cost.core_hbm_bytes(TRN2) == 12 * cost.GiB


def test_unknown_engine_is_an_error():
    with pytest.raises(ValueError, match="unknown engine"):
        cost.kernel_time_us(TRN2, 1, 1, "gpu")


def test_trn2_and_trn3_differ_for_the_same_work():
    # memory-bound (HBM 2.9 vs 4.9 TB/s) and vector-bound (1.0 vs 1.2 TFLOPS) work
    for flops, nbytes in ((0, 1e8), (1e9, 0)):
        t2 = cost.launch_cost_us(TRN2, flops, nbytes, "vector")
        t3 = cost.launch_cost_us(TRN3, flops, nbytes, "vector")
        assert t3 < t2
