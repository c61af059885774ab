"""Change diffs for events (CONTRACT section 10): `data.changes`, a list of
{path, before, after}, so a live client patches what it holds instead of refetching.

Paths are JSON Pointers (RFC 6901) into the pool as the owner reads it: `/gpuModel`,
`/policy/<key>`, `/displayName`, `/labels/<key>` (a label key's `/` escaped as `~1`),
`/offers/<tenantId>` (a whole offer added or removed), and
`/offers/<tenantId>/includeDescendants`, `/offers/<tenantId>/priority`,
`/offers/<tenantId>/quota/<resource>` (a row's max). Tenant ids and resource keys hold
neither `/` nor `~`, so they need no escaping. Policies are compared as read
(`readable_policy`): a secret is never a `before` or an `after`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.capacity.policy import readable_policy

Change = dict[str, Any]


def change(path: str, before: Any, after: Any) -> Change:
    return {"path": path, "before": before, "after": after}


def policy_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Change]:
    """One change per top-level policy key whose readable value differs."""
    old, new = readable_policy(dict(before)), readable_policy(dict(after))
    return [
        change(f"/policy/{key}", old.get(key), new.get(key))
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    ]


def pointer_token(key: str) -> str:
    """A JSON Pointer's reference token for `key` (RFC 6901: `~` as `~0`, `/` as `~1`):
    a label key may hold a `/`."""
    return key.replace("~", "~0").replace("/", "~1")


def label_changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[Change]:
    """One change per label added (before null), removed (after null) or changed, at
    `/labels/<key>`, in key order."""
    return [
        change(f"/labels/{pointer_token(key)}", before.get(key), after.get(key))
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    ]


def offer_entry(include_descendants: bool, priority: int, quota: Mapping[str, int]) -> Any:
    return {
        "includeDescendants": include_descendants,
        "priority": priority,
        "quota": dict(sorted(quota.items())),
    }


def offer_changes(
    tenant_id: str,
    before: Any | None,
    after: Any | None,
) -> list[Change]:
    """An offer added or removed is one change at /offers/<tenant>; a changed one is a
    change per field and quota row that moved."""
    base = f"/offers/{tenant_id}"
    if before is None or after is None:
        return [] if before == after else [change(base, before, after)]
    found = [
        change(f"{base}/{key}", before[key], after[key])
        for key in ("includeDescendants", "priority")
        if before[key] != after[key]
    ]
    old, new = before["quota"], after["quota"]
    found += [
        change(f"{base}/quota/{resource}", old.get(resource), new.get(resource))
        for resource in sorted(set(old) | set(new))
        if old.get(resource) != new.get(resource)
    ]
    return found
