"""Change diffs in events (CONTRACT section 10): `data.changes` and `data.version`, enough
for a client holding the pool to patch it, and to tell a gap from a complete stream."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from app.db.engine import Database
from tests.rest.scene import Scene, events
from tests.support import Api, Fleet

Json = dict[str, Any]
TOKEN = "abcdef.0123456789abcdef"
JOIN_SET = {
    "apiServer": "https://k8s.example.com:6443",
    "token": TOKEN,
    "caCertHash": "sha256:" + "a" * 64,
}


def held(pool: Json) -> Json:
    """What a live owner UI holds of a pool, in the shape the change paths address."""
    return {
        "gpuModel": pool["gpuModel"],
        "policy": pool["policy"],
        "offers": {
            o["tenantId"]: {
                "includeDescendants": o["includeDescendants"],
                "priority": o["priority"],
                "quota": {q["resource"]: q["max"] for q in o["quotas"]},
            }
            for o in pool["offers"]
        },
    }


def apply(state: Json, changes: list[Json]) -> None:
    """Apply each change at its JSON Pointer, checking `before` is what the client holds."""
    for c in changes:
        *parents, leaf = c["path"].lstrip("/").split("/")
        node = state
        for part in parents:
            node = node.setdefault(part, {})
        assert node.get(leaf) == c["before"], c
        if c["after"] is None:
            node.pop(leaf, None)
        else:
            node[leaf] = c["after"]


async def test_a_client_patches_its_pool_from_the_events(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """After each write, the held pool patched with the event's changes equals a refetch,
    and the versions follow on without a gap."""
    s = await Scene.start(api, fleet)
    for tenant in ("beta", "gamma"):
        await s.guest(tenant)
    pool = await s.pool(gpuModel="H100", policy={"hugepages": {"2Mi": 4}})
    pool_id = pool["id"]
    state, version = held(pool), pool["version"]
    await fleet.node(pool_id, 8)

    steps: list[Callable[[], Awaitable[object]]] = [
        lambda: s.offer(pool_id, "beta", {"gpu": 2}),
        lambda: s.reserve(pool_id, {"gpu": 2}, fleet.tokens["beta"], "beta"),
        # A resize below what is in use keeps `used`: the change says what is stored.
        lambda: s.offer(pool_id, "beta", {"gpu": 1, "gpu.slot": 4}, priority=3),
        lambda: s.offer(pool_id, "gamma", {"gpu": 1}, includeDescendants=True),
        lambda: s.offer(pool_id, "acme", {"gpu": 6}),  # the owner's own offer
        lambda: api.ok(
            s.token,
            "pools/update",
            s.body(pool_id, gpuModel="A100", policy={"kubernetes": JOIN_SET}),
        ),
        lambda: s.unoffer(pool_id, "gamma"),
        lambda: api.ok(s.token, "pools/update", s.body(pool_id, policy={})),
    ]
    fleet.tokens["beta"] = await fleet.caller("beta", "admin")
    seen = len(await events(db, pool_id))
    for step in steps:
        await step()
        written = (await events(db, pool_id))[seen:]
        seen += len(written)
        for event in written:
            assert event.data["version"] == version + 1, event  # no gap
            version += 1
            apply(state, event.data["changes"])
        refetched = await s.get(pool_id)
        assert state == held(refetched) and version == refetched["version"]

    stored = await events(db, pool_id)
    assert TOKEN not in json.dumps([e.data for e in stored])
    by_type = {e.type: e for e in stored}  # the last of each
    kube = [
        c for e in stored for c in e.data.get("changes", []) if c["path"] == "/policy/kubernetes"
    ]
    assert kube[0]["before"] is None and kube[0]["after"]["tokenSet"] is True
    assert kube[1]["after"] is None  # removed by the last update
    assert by_type["pool.unoffered"].data["changes"] == [
        {
            "path": "/offers/gamma",
            "before": {"includeDescendants": True, "priority": 0, "quota": {"gpu": 1}},
            "after": None,
        }
    ]


async def test_offer_changes_name_only_what_moved(api: Api, fleet: Fleet, db: Database) -> None:
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool_id = (await s.pool())["id"]
    await s.offer(pool_id, "beta", {"gpu": 2, "gpu.mig": 1})
    await s.offer(pool_id, "beta", {"gpu": 2, "gpu.mig": 3}, priority=-1)
    await s.offer(pool_id, "beta", {"gpu": 2}, priority=-1)  # nothing moved: no change
    await api.ok(s.token, "pools/update", s.body(pool_id, gpuModel="L40S"))
    new, resized, same, updated = (await events(db, pool_id))[1:]
    assert new.data["changes"] == [
        {
            "path": "/offers/beta",
            "before": None,
            "after": {
                "includeDescendants": False,
                "priority": 0,
                "quota": {"gpu": 2, "gpu.mig": 1},
            },
        }
    ]
    assert resized.data["changes"] == [
        {"path": "/offers/beta/priority", "before": 0, "after": -1},
        {"path": "/offers/beta/quota/gpu.mig", "before": 1, "after": 3},
    ]
    assert same.data["changes"] == [] and same.data["version"] == 4
    assert updated.data["changes"] == [{"path": "/gpuModel", "before": None, "after": "L40S"}]
    assert updated.data["changed"] == ["gpuModel"] and updated.data["version"] == 5
