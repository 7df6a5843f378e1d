"""The cost model: pure functions over a device profile. No state, no torch.

>>> from eager_neuron.cost import PROFILES, kernel_time_us
>>> round(kernel_time_us(PROFILES["trn2"], flops=0, bytes_moved=2.9e6, engine="vector"), 3)
8.0
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    cores_per_chip: int
    hbm_bytes: int               # per chip
    hbm_bytes_per_s: float       # per chip
    tensor_flops: dict           # dtype class -> FLOP/s per core ("bf16", "fp32")
    vector_flops: float          # FP32 FLOP/s per core (VectorE)
    scalar_flops: float          # FP32 FLOP/s per core (ScalarE, transcendental ops)
    sbuf_bytes: int
    psum_bytes: int
    dma_bytes_per_s: float       # host <-> device
    launch_overhead_us: float    # NOTE: not published; a documented parameter


GiB = 1 << 30
MiB = 1 << 20

PROFILES = {
    "trn2": DeviceProfile(
        name="trn2", cores_per_chip=8, hbm_bytes=96 * GiB, hbm_bytes_per_s=2.9e12,
        tensor_flops={"bf16": 79e12, "fp32": 20e12}, vector_flops=1.0e12, scalar_flops=1.0e12,
        sbuf_bytes=28 * MiB, psum_bytes=2 * MiB, dma_bytes_per_s=64e9, launch_overhead_us=15.0,
    ),
    "trn3": DeviceProfile(
        name="trn3", cores_per_chip=8, hbm_bytes=144 * GiB, hbm_bytes_per_s=4.9e12,
        tensor_flops={"bf16": 79e12, "fp32": 20e12}, vector_flops=1.2e12, scalar_flops=1.2e12,
        sbuf_bytes=32 * MiB, psum_bytes=2 * MiB, dma_bytes_per_s=128e9, launch_overhead_us=15.0,
    ),
}


def engine_flops(profile: DeviceProfile, engine: str, dtype_class: str = "fp32") -> float:
    """FLOP/s of one core's engine for a dtype class ("bf16" or "fp32")."""
    if engine == "tensor":
        return profile.tensor_flops.get(dtype_class, profile.tensor_flops["fp32"])
    if engine == "scalar":
        return profile.scalar_flops
    return profile.vector_flops


def core_bandwidth(profile: DeviceProfile) -> float:
    """HBM bytes/s one core sees: the chip's bandwidth shared by its cores."""
    return profile.hbm_bytes_per_s / profile.cores_per_chip


def kernel_time_us(profile: DeviceProfile, flops: float, bytes_moved: float, engine: str,
                   dtype_class: str = "fp32") -> float:
    """Device time of one kernel body: the larger of its compute and its HBM traffic.

    Launch overhead is charged separately (see launch_cost_us) so fused groups pay it once.
    """
    compute_s = flops / engine_flops(profile, engine, dtype_class) if flops else 0.0
    memory_s = bytes_moved / core_bandwidth(profile) if bytes_moved else 0.0
    return max(compute_s, memory_s) * 1e6


def launch_cost_us(profile: DeviceProfile, flops: float, bytes_moved: float, engine: str,
                   dtype_class: str = "fp32") -> float:
    """Launch overhead + max(compute, memory): what one kernel launch costs on the device."""
    return profile.launch_overhead_us + kernel_time_us(
        profile, flops, bytes_moved, engine, dtype_class)


def transfer_time_us(profile: DeviceProfile, nbytes: float) -> float:
    """Host <-> device copy over the DMA link."""
    return nbytes / profile.dma_bytes_per_s * 1e6


def cross_core_time_us(profile: DeviceProfile, nbytes: float) -> float:
    """Core -> core copy: read and write through HBM."""
    return 2 * nbytes / core_bandwidth(profile) * 1e6
