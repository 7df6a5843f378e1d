"""Collective cost model: pure functions (no torch, no state) over a device profile.

A collective among p ranks is a sequence of steps; each step moves a chunk over the slowest link
the ring (or tree) crosses and pays that link's per-step latency. The classic bandwidth terms:

    ring all-reduce        2 (p-1)/p * n / bw + 2 (p-1) * lat   (reduce-scatter then all-gather)
    tree all-reduce        2 ceil(log2 p) * (n / bw + lat)       (reduce up, broadcast down)
    all-gather / reduce-scatter   (p-1)/p * n / bw + (p-1) * lat   (n = the full, gathered size)
    all-to-all             (p-1)/p * n / bw + (p-1) * lat
    broadcast / reduce     ceil(log2 p) * (n / bw + lat)
    send / recv            n / bw + lat

All-reduce takes the cheaper of ring and tree (small messages are latency bound: tree wins).

Links, by where two ranks sit (rank r uses core `local_rank` of its host; cores_per_chip per chip):
    same chip      the chip's DMA/HBM path shared by its cores: hbm_bytes_per_s / cores_per_chip
    same host      NeuronLink between chips (per device: trn2 NeuronLink-v3 1.28 TB/s, trn3
                   NeuronLink-v4 2.56 TB/s)
    across hosts   EFA (trn2.48xlarge: 3.2 Tbps EFAv3 for 16 chips = 25 GB/s per chip)

>>> from eager_neuron.cost import PROFILES
>>> link = link_for(PROFILES["trn2"], world_size=2, local_world_size=2)
>>> link.name
'chip'
>>> round(allreduce_time_us(64 << 20, 2, link), 1) > 0
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware"

# device-to-device (NeuronLink) bandwidth per chip, bytes/s
NEURONLINK_BYTES_PER_S = {
    "trn2": 1.28e12,   # Trainium2 page: NeuronLink-v3, 1.28 TB/sec per device
    "trn3": 2.56e12,   # Trainium3 page: NeuronLink-v4, 2.56 TB/sec per device
}
# inter-host network per chip, bytes/s: trn2.48xlarge has 3.2 Tbps EFAv3 for 16 Trainium2 chips.
# NOTE: trn3's per-chip network share is not published; the trn2 figure is used (an assumption).
EFA_BYTES_PER_S = {"trn2": 3.2e12 / 8 / 16, "trn3": 3.2e12 / 8 / 16}
# per-step latency, us. NOTE: not published for any link; parameters, not measurements.
LATENCY_US = {"chip": 1.0, "neuronlink": 2.0, "efa": 10.0}
SOURCES = (
    f"{_DOCS}/trainium2.html", f"{_DOCS}/trainium3.html",
    "https://aws.amazon.com/ec2/instance-types/trn2/",
)


@dataclass(frozen=True)
class Link:
    """The slowest link a collective's ring or tree crosses."""

    name: str               # "chip" | "neuronlink" | "efa" | "self"
    bytes_per_s: float
    latency_us: float


def link_for(profile, world_size: int, local_world_size: int) -> Link:
    """The bottleneck link for a group of `world_size` ranks, `local_world_size` per host.

    >>> from eager_neuron.cost import PROFILES
    >>> link_for(PROFILES["trn2"], 4, 2).name, link_for(PROFILES["trn2"], 16, 16).name
    ('efa', 'neuronlink')
    """
    if world_size <= 1:
        return Link("self", float("inf"), 0.0)
    if world_size > max(1, local_world_size):
        return Link("efa", EFA_BYTES_PER_S[profile.name], LATENCY_US["efa"])
    if world_size > profile.cores_per_chip:
        return Link("neuronlink", NEURONLINK_BYTES_PER_S[profile.name], LATENCY_US["neuronlink"])
    return Link("chip", profile.hbm_bytes_per_s / profile.cores_per_chip, LATENCY_US["chip"])


def _steps(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


def ring_allreduce_us(nbytes: float, p: int, link: Link) -> float:
    """Ring all-reduce: reduce-scatter then all-gather.

    >>> ring_allreduce_us(1e6, 2, Link("x", 1e9, 1.0))
    1002.0
    """
    if p <= 1:
        return 0.0
    return 2 * (p - 1) / p * nbytes / link.bytes_per_s * 1e6 + 2 * (p - 1) * link.latency_us


def tree_allreduce_us(nbytes: float, p: int, link: Link) -> float:
    """Tree all-reduce: reduce to the root, broadcast back.

    >>> tree_allreduce_us(1e6, 2, Link("x", 1e9, 1.0))
    2002.0
    """
    if p <= 1:
        return 0.0
    return 2 * _steps(p) * (nbytes / link.bytes_per_s * 1e6 + link.latency_us)


def allreduce_time_us(nbytes: float, p: int, link: Link) -> float:
    """The cheaper of ring and tree (the algorithm choice a collective library makes).

    >>> allreduce_time_us(1e6, 2, Link("x", 1e9, 1.0))
    1002.0
    """
    return min(ring_allreduce_us(nbytes, p, link), tree_allreduce_us(nbytes, p, link))


def allgather_time_us(total_bytes: float, p: int, link: Link) -> float:
    """Ring all-gather (or reduce-scatter) of a `total_bytes` result (input for reduce-scatter).

    >>> allgather_time_us(2e6, 2, Link("x", 1e9, 1.0))
    1001.0
    """
    if p <= 1:
        return 0.0
    return (p - 1) / p * total_bytes / link.bytes_per_s * 1e6 + (p - 1) * link.latency_us


reduce_scatter_time_us = allgather_time_us
alltoall_time_us = allgather_time_us


def broadcast_time_us(nbytes: float, p: int, link: Link) -> float:
    """Binomial tree broadcast (or reduce): ceil(log2 p) rounds.

    >>> broadcast_time_us(1e6, 4, Link("x", 1e9, 1.0))
    2002.0
    """
    return _steps(p) * (nbytes / link.bytes_per_s * 1e6 + link.latency_us)


def p2p_time_us(nbytes: float, link: Link) -> float:
    """One send/recv pair.

    >>> p2p_time_us(1e6, Link("x", 1e9, 1.0))
    1001.0
    """
    if link.name == "self":
        return 0.0
    return nbytes / link.bytes_per_s * 1e6 + link.latency_us


def barrier_time_us(p: int, link: Link) -> float:
    """A dissemination barrier: ceil(log2 p) latency-bound rounds.

    >>> barrier_time_us(8, Link("x", 1e9, 2.0))
    6.0
    """
    return _steps(p) * link.latency_us


# collective kind -> time function of (nbytes, p, link); nbytes as documented per function
TIME_FNS = {
    "all_reduce": allreduce_time_us,
    "all_gather": allgather_time_us,
    "reduce_scatter": reduce_scatter_time_us,
    "all_to_all": alltoall_time_us,
    "broadcast": broadcast_time_us,
    "reduce": broadcast_time_us,
    "gather": allgather_time_us,
    "scatter": allgather_time_us,
    "p2p": lambda n, p, link: p2p_time_us(n, link),
    "barrier": lambda n, p, link: barrier_time_us(p, link),
}


def collective_time_us(kind: str, nbytes: float, p: int, link: Link) -> float:
    """The simulated time of one collective of `kind` (a key of TIME_FNS).

    >>> collective_time_us("barrier", 0, 2, Link("x", 1e9, 1.0))
    1.0
    """
    return TIME_FNS[kind](nbytes, p, link)
