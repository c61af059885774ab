"""GPU sharing keys: time-slice/MPS replicas and the MIG layout.

Each key only means something for one family of sharing modes, so it is
refused on other pools rather than stored and silently ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from app.errors import InvalidInput

from .checks import (
    echo,
    expect_int,
    expect_list,
    expect_object,
    expect_str,
    item,
    reject_unknown_keys,
)
from .registry import PolicyContext, policy_key

MODULE = "sharing"

REPLICA_MODES = ("timeslice", "mps")
REPLICAS_MAX = 48
MIG_PROFILE = re.compile(r"([1-7])g\.[0-9]{1,3}gb")
# An NVIDIA GPU has 7 compute slices to hand out across its MIG instances.
MIG_SLICES_PER_GPU = 7


@policy_key("sharing", module=MODULE)
def validate_sharing(value: object, ctx: PolicyContext, field: str) -> dict[str, int]:
    if ctx.sharing not in REPLICA_MODES:
        raise InvalidInput(
            f"{field} applies only to timeslice and mps pools; this pool's sharing "
            f"mode is {ctx.sharing}",
            field=field,
        )
    obj = expect_object(value, field)
    reject_unknown_keys(obj, ("replicas",), field)
    if "replicas" not in obj:
        raise InvalidInput(f"{field}.replicas is required", field=f"{field}.replicas")
    count = expect_int(obj["replicas"], f"{field}.replicas", minimum=1, maximum=REPLICAS_MAX)
    return {"replicas": count}


@policy_key("migLayout", module=MODULE)
def validate_mig_layout(value: object, ctx: PolicyContext, field: str) -> list[str]:
    if ctx.sharing != "mig":
        raise InvalidInput(
            f"{field} applies only to mig pools; this pool's sharing mode is {ctx.sharing}",
            field=field,
        )
    items = expect_list(value, field)
    if not items:
        raise InvalidInput(f"{field} must list at least one MIG profile", field=field)
    profiles: list[str] = []
    slices = 0
    for index, raw in enumerate(items):
        profile = expect_str(raw, item(field, index))
        match = MIG_PROFILE.fullmatch(profile)
        if match is None:
            raise InvalidInput(
                f"{item(field, index)} must be a MIG profile like 1g.10gb or 3g.40gb, "
                f"got {echo(profile)}",
                field=item(field, index),
            )
        slices += int(match.group(1))
        profiles.append(profile)
    if slices > MIG_SLICES_PER_GPU:
        raise InvalidInput(
            f"{field} needs {slices} compute slices per GPU; a GPU has "
            f"{MIG_SLICES_PER_GPU}, so no GPU can take this layout",
            field=field,
        )
    return profiles


def replicas(policy: Mapping[str, Any] | None) -> int:
    """Shared slots per GPU in a timeslice/mps pool (gpu.slot = GPUs x this); default 1."""
    sharing = (policy or {}).get("sharing")
    if sharing is None:
        return 1
    value = sharing.get("replicas") if isinstance(sharing, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int):
        # Stored policies were validated; anything else is corrupt data, not a default.
        raise ValueError("policy.sharing.replicas is not an integer")
    return value


def mig_instances_per_gpu(policy: Mapping[str, Any] | None) -> int:
    """MIG instances each GPU of a mig pool yields (gpu.mig per GPU); 0 without a layout."""
    layout = (policy or {}).get("migLayout")
    if layout is None:
        return 0
    if not isinstance(layout, list | tuple):
        raise ValueError("policy.migLayout is not a list")
    return len(layout)
