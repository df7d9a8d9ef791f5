"""How much of a GPU a replica holds: the whole GPU, a MIG
instance, or a time-sliced share. Pure rules, no database.

Every share is a whole number of GPU units (GPU_UNITS to a GPU), so that a
MIG instance's compute slices (out of 7) and a time-sliced share (a
percentage) are both exact: a replica's device-seconds per hour are its
units / GPU_UNITS x 3600, and cost splits by units never round a fraction.

MIG profiles are NVIDIA's, as its MIG User Guide lists them per GPU
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/#supported-mig-profiles):
a profile `Ng.Mgb` takes N of the GPU's 7 compute slices and some of its 8
memory slices; the `+me` variants (media extensions) take the same slices.
Which profiles a GPU offers depends on its memory size (A100 40 GB, A100
and H100 80 GB, H100 NVL 94 GB, H200 141 GB)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from serving.choices import GpuSharing

GPU_UNITS = 700  # lcm(7 compute slices, 100 percent)
MIG_COMPUTE_SLICES = 7
MIG_MEMORY_SLICES = 8


def _profiles(*rows: tuple[str, int, int]) -> dict[str, tuple[int, int]]:
    out = {}
    for name, compute, memory in rows:
        out[name] = (compute, memory)
        if compute == 1 and memory == 1:
            out[f"{name}+me"] = (compute, memory)
    return out


# memory GB -> profile -> (compute slices of 7, memory slices of 8)
MIG_PROFILES: dict[int, dict[str, tuple[int, int]]] = {
    40: _profiles(
        ("1g.5gb", 1, 1),
        ("1g.10gb", 1, 2),
        ("2g.10gb", 2, 2),
        ("3g.20gb", 3, 4),
        ("4g.20gb", 4, 4),
        ("7g.40gb", 7, 8),
    ),
    80: _profiles(
        ("1g.10gb", 1, 1),
        ("1g.20gb", 1, 2),
        ("2g.20gb", 2, 2),
        ("3g.40gb", 3, 4),
        ("4g.40gb", 4, 4),
        ("7g.80gb", 7, 8),
    ),
    94: _profiles(
        ("1g.12gb", 1, 1),
        ("1g.24gb", 1, 2),
        ("2g.24gb", 2, 2),
        ("3g.47gb", 3, 4),
        ("4g.47gb", 4, 4),
        ("7g.94gb", 7, 8),
    ),
    141: _profiles(
        ("1g.18gb", 1, 1),
        ("1g.35gb", 1, 2),
        ("2g.35gb", 2, 2),
        ("3g.71gb", 3, 4),
        ("4g.71gb", 4, 4),
        ("7g.141gb", 7, 8),
    ),
}


class ShareRefused(ValueError):
    """A share that does not exist or does not fit, naming the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Share:
    """One replica's hold on one GPU, as asked."""

    gpu_id: int
    sharing: str = GpuSharing.WHOLE
    mig_profile: str = ""
    mig_instance: int | None = None  # the GPU instance id (nvidia-smi's GI ID)
    share_percent: int | None = None  # of the GPU's time, when time-sliced
    replica: str = ""  # whose (in messages)
    pool_id: int | None = None

    @classmethod
    def asked(cls, gpu_id: int, fields) -> Share:
        """A share as a form or an API body names it (absent fields: defaults)."""
        return cls(
            gpu_id=gpu_id,
            sharing=fields.get("sharing") or GpuSharing.WHOLE,
            mig_profile=fields.get("mig_profile") or "",
            mig_instance=fields.get("mig_instance"),
            share_percent=fields.get("share_percent"),
        )


def mig_profiles_of(*, memory_gb: int, mig_capable: bool) -> dict[str, tuple[int, int]]:
    return MIG_PROFILES.get(memory_gb, {}) if mig_capable else {}


def share_units(share: Share, *, memory_gb: int = 0, mig_capable: bool = False) -> int:
    """The share's GPU units; ShareRefused if it cannot exist on its GPU."""
    if share.sharing == GpuSharing.WHOLE:
        return GPU_UNITS
    if share.sharing == GpuSharing.MIG:
        profiles = mig_profiles_of(memory_gb=memory_gb, mig_capable=mig_capable)
        if not profiles:
            raise ShareRefused(
                "mig_profile",
                f"GPU {share.gpu_id} cannot be partitioned with MIG (its SKU is not "
                "MIG-capable, or NVIDIA lists no MIG profiles for its memory size)",
            )
        if share.mig_profile not in profiles:
            raise ShareRefused(
                "mig_profile",
                f"MIG profile {share.mig_profile!r} does not exist on GPU {share.gpu_id} "
                f"({memory_gb} GB): it offers {', '.join(sorted(profiles))}",
            )
        if share.mig_instance is None:
            raise ShareRefused("mig_instance", "a MIG share names its GPU instance id")
        return profiles[share.mig_profile][0] * (GPU_UNITS // MIG_COMPUTE_SLICES)
    if share.sharing == GpuSharing.TIME_SLICED:
        percent = share.share_percent
        if percent is None or not 1 <= percent <= 100:
            raise ShareRefused(
                "share_percent", "a time-sliced share is a percentage of the GPU, 1 to 100"
            )
        return percent * (GPU_UNITS // 100)
    raise ShareRefused(
        "sharing", f"unknown sharing {share.sharing!r}: one of {', '.join(GpuSharing.values)}"
    )


def shares_check(shares: Sequence[Share], *, memory_gb: int, mig_capable: bool) -> None:
    """Every replica's share of one GPU together: ShareRefused unless they
    fit it. A whole GPU is one replica's alone; MIG instances take at most
    the 7 compute and 8 memory slices, one replica per instance; time-sliced
    shares take at most 100% and sit in one pool (time-slicing isolates
    nothing: the pool's tenants share the GPU's cost by their use)."""
    if not shares:
        return
    kinds = {s.sharing for s in shares}
    gpu = shares[0].gpu_id
    for share in shares:
        share_units(share, memory_gb=memory_gb, mig_capable=mig_capable)
    if len(kinds) > 1:
        raise ShareRefused(
            "sharing",
            f"GPU {gpu} is held in more than one way ({', '.join(sorted(kinds))}): "
            "a GPU is whole, MIG-partitioned or time-sliced",
        )
    kind = kinds.pop()
    holders = ", ".join(s.replica for s in shares if s.replica)
    if kind == GpuSharing.WHOLE and len(shares) > 1:
        raise ShareRefused(
            "gpus",
            f"GPU {gpu} is held whole by more than one replica ({holders}): "
            "partition it with MIG or share it by time slices",
        )
    if kind == GpuSharing.MIG:
        instances = [s.mig_instance for s in shares]
        taken = sorted({i for i in instances if instances.count(i) > 1})
        if taken:
            raise ShareRefused(
                "mig_instance",
                f"MIG instance {taken[0]} of GPU {gpu} is held by more than one replica "
                f"({holders})",
            )
        profiles = mig_profiles_of(memory_gb=memory_gb, mig_capable=mig_capable)
        compute = sum(profiles[s.mig_profile][0] for s in shares)
        memory = sum(profiles[s.mig_profile][1] for s in shares)
        if compute > MIG_COMPUTE_SLICES or memory > MIG_MEMORY_SLICES:
            raise ShareRefused(
                "mig_profile",
                f"the MIG instances of GPU {gpu} ({holders}) take {compute} of its "
                f"{MIG_COMPUTE_SLICES} compute slices and {memory} of its "
                f"{MIG_MEMORY_SLICES} memory slices",
            )
    if kind == GpuSharing.TIME_SLICED:
        total = sum(s.share_percent or 0 for s in shares)
        if total > 100:
            raise ShareRefused(
                "share_percent",
                f"the time-sliced shares of GPU {gpu} ({holders}) add up to {total}%",
            )
        if len({s.pool_id for s in shares}) > 1:
            raise ShareRefused(
                "pool",
                f"the replicas time-slicing GPU {gpu} ({holders}) are in different pools: "
                "a time-sliced GPU's cost is its pool's",
            )
