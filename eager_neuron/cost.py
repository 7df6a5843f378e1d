"""The cost model: pure functions over a device profile. No state, no torch.

A kernel costs launch overhead + max(compute on its engine, HBM traffic / bandwidth); a
host <-> device copy costs bytes / DMA bandwidth. Every figure below cites its source; the two
that are not published (launch overhead, host link bandwidth) say so. docs/SIMULATOR.md explains
the model and what it leaves out.

>>> from eager_neuron.cost import PROFILES, kernel_time_us
>>> round(kernel_time_us(PROFILES["trn2"], flops=0, bytes_moved=2.9e6, engine="vector"), 3)
8.0
"""

from __future__ import annotations

from dataclasses import dataclass, field

GiB = 1 << 30
MiB = 1 << 20

ENGINES = ("tensor", "vector", "scalar")   # where a kernel body runs; "dma" is for copies
DTYPE_CLASSES = ("fp8", "bf16", "fp32")


@dataclass(frozen=True)
class DeviceProfile:
    """One chip generation. Throughputs are per NeuronCore; memory figures per chip."""

    name: str
    core_name: str
    cores_per_chip: int
    hbm_bytes: int               # per chip; a core's share is hbm_bytes / cores_per_chip
    hbm_bytes_per_s: float       # per chip; shared by its cores
    tensor_flops: dict           # dtype class -> FLOP/s of one core's TensorE
    vector_flops: dict           # dtype class -> FLOP/s of one core's VectorE
    scalar_flops: dict           # dtype class -> FLOP/s of one core's ScalarE
    sbuf_bytes: int              # per core (not modelled yet: informational)
    psum_bytes: int              # per core (not modelled yet: informational)
    dma_bytes_per_s: float       # host <-> device link. NOTE: not published; a parameter
    launch_overhead_us: float    # per kernel launch. NOTE: not published; a parameter
    sources: tuple = field(default=(), compare=False)


# NOTE: TensorE FP32 is 20 TFLOPS per core on both generations. NeuronCore-v4's page states it;
# NeuronCore-v3's page does not, but the chip totals (181 FP32 TFLOPS trn2, 183 trn3, i.e. ~22.6
# per core) include the Vector/Scalar/GpSimd engines, exactly as 8 x 79 BF16 = 632 < 667 does.
# VectorE and ScalarE publish only FP32 figures; BF16/FP8 use the same rate (no published number).
_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest"

PROFILES = {
    "trn2": DeviceProfile(
        name="trn2", core_name="NeuronCore-v3", cores_per_chip=8,
        hbm_bytes=96 * GiB, hbm_bytes_per_s=2.9e12,
        tensor_flops={"fp8": 158e12, "bf16": 79e12, "fp32": 20e12},
        vector_flops={"fp8": 1.0e12, "bf16": 1.0e12, "fp32": 1.0e12},
        scalar_flops={"fp8": 1.2e12, "bf16": 1.2e12, "fp32": 1.2e12},
        sbuf_bytes=28 * MiB, psum_bytes=2 * MiB,
        dma_bytes_per_s=64e9,        # PCIe Gen5 x16, an assumption
        launch_overhead_us=15.0,
        sources=(
            f"{_DOCS}/about-neuron/arch/neuron-hardware/trainium2.html",
            f"{_DOCS}/about-neuron/arch/neuron-hardware/neuron-core-v3.html",
            f"{_DOCS}/nki/guides/architecture/trainium2_arch.html",
        ),
    ),
    "trn3": DeviceProfile(
        name="trn3", core_name="NeuronCore-v4", cores_per_chip=8,
        hbm_bytes=144 * GiB, hbm_bytes_per_s=4.9e12,
        tensor_flops={"fp8": 315e12, "bf16": 79e12, "fp32": 20e12},
        vector_flops={"fp8": 1.2e12, "bf16": 1.2e12, "fp32": 1.2e12},
        scalar_flops={"fp8": 1.2e12, "bf16": 1.2e12, "fp32": 1.2e12},
        sbuf_bytes=32 * MiB, psum_bytes=2 * MiB,
        dma_bytes_per_s=64e9,        # PCIe Gen5 x16, an assumption (trn3's link is unpublished)
        launch_overhead_us=15.0,
        sources=(
            f"{_DOCS}/about-neuron/arch/neuron-hardware/trainium3.html",
            f"{_DOCS}/about-neuron/arch/neuron-hardware/neuron-core-v4.html",
            f"{_DOCS}/nki/about/trainium3_arch.html",
        ),
    ),
}


def dtype_class(dtype_name: str) -> str:
    """The throughput class of a dtype, by name ("torch.bfloat16", "float16", "float8_e4m3fn").

    >>> dtype_class("torch.bfloat16"), dtype_class("float32"), dtype_class("int64")
    ('bf16', 'fp32', 'fp32')
    """
    name = str(dtype_name).rsplit(".", 1)[-1]
    if name.startswith("float8"):
        return "fp8"
    if name in ("bfloat16", "float16", "half"):
        return "bf16"
    return "fp32"


def engine_flops(profile: DeviceProfile, engine: str, dtype_cls: str = "fp32") -> float:
    """FLOP/s of one core's engine for a dtype class ("fp8", "bf16" or "fp32").

    >>> engine_flops(PROFILES["trn2"], "tensor", "bf16")
    79000000000000.0
    """
    if engine == "tensor":
        table = profile.tensor_flops
    elif engine == "scalar":
        table = profile.scalar_flops
    elif engine == "vector":
        table = profile.vector_flops
    else:
        raise ValueError(f"unknown engine {engine!r}; expected one of {ENGINES}")
    return table.get(dtype_cls, table["fp32"])


def core_bandwidth(profile: DeviceProfile) -> float:
    """HBM bytes/s one core sees: the chip's bandwidth shared evenly by its cores."""
    return profile.hbm_bytes_per_s / profile.cores_per_chip


def core_hbm_bytes(profile: DeviceProfile) -> int:
    """HBM capacity of one core: the chip's capacity split evenly."""
    return profile.hbm_bytes // profile.cores_per_chip


def kernel_time_us(profile: DeviceProfile, flops: float, bytes_moved: float, engine: str,
                   dtype_class: str = "fp32") -> float:
    """Device time of one kernel body: the larger of its compute and its HBM traffic.

    Launch overhead is charged separately (see launch_cost_us) so fused groups pay it once.

    >>> kernel_time_us(PROFILES["trn2"], flops=2e9, bytes_moved=0, engine="tensor")
    100.0
    """
    compute_s = flops / engine_flops(profile, engine, dtype_class) if flops else 0.0
    memory_s = bytes_moved / core_bandwidth(profile) if bytes_moved else 0.0
    return max(compute_s, memory_s) * 1e6


def launch_cost_us(profile: DeviceProfile, flops: float, bytes_moved: float, engine: str,
                   dtype_class: str = "fp32") -> float:
    """Launch overhead + max(compute, memory): what one kernel launch costs on the device.

    >>> launch_cost_us(PROFILES["trn2"], 0, 0, "vector")
    15.0
    """
    return profile.launch_overhead_us + kernel_time_us(
        profile, flops, bytes_moved, engine, dtype_class)


def transfer_time_us(profile: DeviceProfile, nbytes: float) -> float:
    """Host <-> device copy over the DMA link.

    >>> transfer_time_us(PROFILES["trn2"], 64e3)
    1.0
    """
    return nbytes / profile.dma_bytes_per_s * 1e6


def cross_core_time_us(profile: DeviceProfile, nbytes: float) -> float:
    """Core -> core copy on one chip: read and write through HBM at one core's share.

    >>> round(cross_core_time_us(PROFILES["trn2"], 2.9e6 / 16), 6)
    1.0
    """
    return 2 * nbytes / core_bandwidth(profile) * 1e6


# -- what kernel families report: (flops, bytes moved) for common shapes ---------------------------
# NOTE: bytes are HBM traffic assuming each operand is read once and each result written once
# (perfect SBUF reuse); real kernels that re-read tiles move more.

def elementwise_work(numel: int, in_itemsizes: tuple, out_itemsize: int,
                     flops_per_element: float = 1.0) -> tuple[float, float]:
    """An n-ary elementwise op on `numel` outputs (broadcast inputs counted at full size).

    >>> elementwise_work(1000, (4, 4), 4)
    (1000.0, 12000.0)
    """
    return (float(numel * flops_per_element),
            float(numel * (sum(in_itemsizes) + out_itemsize)))


def reduction_work(numel_in: int, numel_out: int, itemsize: int) -> tuple[float, float]:
    """A reduction: one FLOP per input element; read the input, write the output.

    >>> reduction_work(1024, 4, 4)
    (1024.0, 4112.0)
    """
    return float(numel_in), float((numel_in + numel_out) * itemsize)


def matmul_work(batch: int, m: int, n: int, k: int, itemsize_a: int, itemsize_b: int,
                itemsize_out: int) -> tuple[float, float]:
    """(batch x) [m, k] @ [k, n]: 2*m*n*k FLOPs; A, B read once, C written once.

    >>> matmul_work(1, 2, 3, 4, 4, 4, 4)
    (48.0, 104.0)
    """
    flops = 2.0 * batch * m * n * k
    nbytes = batch * (m * k * itemsize_a + k * n * itemsize_b + m * n * itemsize_out)
    return flops, float(nbytes)


def conv_work(n: int, c_in: int, c_out: int, out_spatial: int, kernel_spatial: int,
              in_spatial: int, groups: int, itemsize: int) -> tuple[float, float]:
    """A convolution as an implicit GEMM: 2 * N * C_out * out_pixels * (C_in/groups) * k_pixels.

    `*_spatial` are products of the spatial sizes (H*W for 2-d).

    >>> conv_work(1, 3, 8, 4, 9, 16, 1, 4)
    (1728.0, 1184.0)
    """
    flops = 2.0 * n * c_out * out_spatial * (c_in // groups) * kernel_spatial
    nbytes = itemsize * (n * c_in * in_spatial + c_out * (c_in // groups) * kernel_spatial
                         + n * c_out * out_spatial)
    return flops, float(nbytes)
