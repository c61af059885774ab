"""The fleet-file engine (`bettercompute apply`/`export`) in process, on both dialects."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import func, select

from app.capacity.inputs import CreatePoolInput, OfferPoolInput, UnofferPoolInput, parse_input
from app.capacity.service import Capacity
from app.db.engine import Database
from app.db.models import Event, FleetName, Offer, Pool, RoleBinding, Tenant
from app.demo import DEMO_FLEET
from app.errors import Conflict, InvalidInput, NotFound
from app.fleet.apply import OPERATOR, apply_fleet
from app.fleet.export import export_fleet
from app.fleet.schema import parse_fleet, read_fleet
from tests.support import Fleet

FLEET = """
tenants:
  - {id: acme-lab, parent: acme}   # before its parent: apply orders them
  - {id: acme}
  - {id: globex}
  - {id: initech}
sites:
  - {tenant: acme, name: eu, kind: platform, region: eu-west}
providerAccounts:
  - {tenant: acme, name: main}
callers:
  - {tenant: acme, name: ops, role: admin, where: {gpuModel: H100}}
pools:
  - tenant: acme
    name: h100
    site: eu
    class: metal-host
    gpuModel: H100
    policy: {hugepages: {1Gi: 64}}
    quota: {gpu: 64}
    offers:
      - {tenant: globex, quota: {gpu: 16}, includeDescendants: true, priority: 10}
      - {tenant: initech, quota: {gpu: 4}}
  - tenant: acme
    name: spare
    site: eu
    class: provider
    providerAccount: main
"""


def document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(FLEET)
    return loaded


async def apply(
    db: Database, doc: dict[str, Any], *, dry_run: bool = False, prune: bool = False
) -> dict[str, Any]:
    return await apply_fleet(db, parse_fleet(copy.deepcopy(doc)), dry_run=dry_run, prune=prune)


async def events(db: Database) -> list[tuple[str, dict[str, Any]]]:
    async with db.reader.connect() as conn:
        rows = await conn.execute(select(Event.type, Event.data).order_by(Event.seq))
        return [(row.type, row.data) for row in rows]


def keys(entries: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (e["kind"], e.get("name") or e.get("pool") or e.get("id"), e.get("to"), e.get("action"))
        for e in entries
    ]


async def test_applying_a_file_twice_creates_once_then_changes_nothing(db: Database) -> None:
    first = await apply(db, document())
    assert first["changes"] == len(first["created"]) and first["changed"] == []
    assert keys(first["created"]) == [
        ("tenant", "acme", None, None),
        ("tenant", "globex", None, None),
        ("tenant", "initech", None, None),
        ("tenant", "acme-lab", None, None),
        ("site", "eu", None, None),
        ("providerAccount", "main", None, None),
        ("caller", "ops", None, None),
        ("pool", "h100", None, None),
        ("offer", "h100", "globex", None),
        ("offer", "h100", "initech", None),
        ("pool", "spare", None, None),
    ]
    caller = next(e for e in first["created"] if e["kind"] == "caller")
    assert caller["id"].startswith("caller_") and caller["token"].startswith("bct_")
    # Every write went through the domain: its events, in the same transaction.
    assert [t for t, _ in await events(db)] == [
        "pool.created",
        "pool.offered",
        "pool.offered",
        "pool.created",
    ]

    second = await apply(db, document())
    assert second["changes"] == 0 and second["created"] == second["changed"] == []
    assert second["summary"] == "no changes: the fleet already matches the file"
    assert len(second["unchanged"]) == len(first["created"])
    assert all("token" not in e for e in second["unchanged"])
    assert len(await events(db)) == 4


async def test_a_changed_file_makes_exactly_its_changes(db: Database) -> None:
    await apply(db, document())
    before = len(await events(db))
    changed = document()
    changed["sites"].append({"tenant": "acme", "name": "us", "kind": "custom", "region": "us"})
    changed["callers"][0]["role"] = "operator"
    h100, spare = changed["pools"]
    h100["policy"] = {"hugepages": {"1Gi": 32}}
    h100["offers"] = [
        {"tenant": "globex", "quota": {"gpu": 24}, "includeDescendants": True, "priority": 10},
        {"tenant": "acme-lab", "quota": {"gpu": 2}},
    ]
    spare["archived"] = True

    report = await apply(db, changed)
    assert keys(report["created"]) == [
        ("site", "us", None, None),
        ("offer", "h100", "acme-lab", None),
    ]
    assert keys(report["changed"]) == [
        ("caller", "ops", None, "rebind"),
        ("pool", "h100", None, "update"),
        ("offer", "h100", "globex", "offer"),
        ("offer", "h100", "initech", "unoffer"),
        ("pool", "spare", None, "archive"),
    ]
    assert report["changes"] == 7
    assert ("pool", "spare", None, None) not in keys(report["unchanged"])  # listed once
    assert [t for t, _ in (await events(db))[before:]] == [
        "pool.updated",
        "pool.offered",
        "pool.offered",
        "pool.unoffered",
        "pool.archived",
    ]
    fleet = await export_fleet(db)
    exported = {p["name"]: p for p in fleet["pools"]}
    assert exported["h100"]["policy"] == {"hugepages": {"1Gi": 32}}
    assert [(o["tenant"], o["quota"]) for o in exported["h100"]["offers"]] == [
        ("acme-lab", {"gpu": 2}),
        ("globex", {"gpu": 24}),
    ]
    assert exported["spare"]["archived"] is True
    async with db.reader.connect() as conn:
        assert await conn.scalar(select(RoleBinding.role)) == "operator"

    # Leaving a pool out of the file leaves it alone: never an archive.
    del changed["pools"][0]
    again = await apply(db, changed)
    assert again["changes"] == 0
    async with db.reader.connect() as conn:
        assert await conn.scalar(select(func.count()).where(Pool.archived.is_(False))) == 1


async def test_a_dry_run_prints_the_plan_and_writes_nothing(db: Database) -> None:
    await apply(db, document())
    state, seen = await export_fleet(db), await events(db)
    changed = document()
    changed["tenants"].append({"id": "umbrella"})
    changed["callers"].append({"tenant": "umbrella", "name": "root", "role": "admin"})
    changed["pools"][0]["offers"] = []
    changed["pools"][1]["archived"] = True

    plan = await apply(db, changed, dry_run=True)
    assert plan["dryRun"] is True and plan["changes"] == 5
    assert "would be made" in plan["summary"]
    assert keys(plan["created"]) == [
        ("tenant", "umbrella", None, None),
        ("caller", "root", None, None),
    ]
    assert keys(plan["changed"]) == [
        ("offer", "h100", "globex", "unoffer"),
        ("offer", "h100", "initech", "unoffer"),
        ("pool", "spare", None, "archive"),
    ]
    assert "token" not in plan["created"][1]  # a token that was never stored
    assert await export_fleet(db) == state and await events(db) == seen

    done = await apply(db, changed)
    assert keys(done["changed"]) == keys(plan["changed"]) and done["changes"] == 5


@pytest.mark.parametrize(
    ("edit", "error", "message"),
    [
        (
            lambda d: d["pools"][1].update(quota={"gpu": -1}),
            InvalidInput,
            "pools[1].quota.gpu: must be a non-negative integer",
        ),
        (
            lambda d: d["pools"][0]["offers"][1].update(quota={"gpu": "4"}),
            InvalidInput,
            "pools[0].offers[1].quota.gpu: must be a non-negative integer",
        ),
        (lambda d: d["sites"][0].update(zone="a"), InvalidInput, "sites[0].zone: unknown field"),
        (lambda d: d["callers"][0].pop("role"), InvalidInput, "callers[0].role: required"),
        (
            lambda d: d["sites"].append(dict(d["sites"][0])),
            InvalidInput,
            "sites[1].name: name eu of tenant acme appears twice in the file",
        ),
        # Found only while applying, after tenants, sites and callers were written:
        (
            lambda d: d["pools"][1].update(site="nowhere"),
            NotFound,
            "pools[1].site: tenant acme has no site named nowhere",
        ),
        (
            lambda d: d["pools"][1].update(policy={"hugepages": {"1Gi": -1}}),
            InvalidInput,
            "pools[1].policy.hugepages.1Gi: ",
        ),
        (
            lambda d: d["pools"][0]["offers"][1].update(tenant="ghost"),
            NotFound,
            "pools[0].offers[1].tenant: tenant ghost not found",
        ),
    ],
)
async def test_a_bad_file_names_the_path_and_changes_nothing(
    db: Database, edit: Any, error: type[Exception], message: str
) -> None:
    bad = document()
    edit(bad)
    with pytest.raises(error) as raised:
        await apply(db, bad)
    assert str(raised.value).startswith(message), str(raised.value)
    async with db.reader.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(Tenant)) == 1  # fleet only
        assert await conn.scalar(select(func.count()).select_from(FleetName)) == 0
    assert await events(db) == []


async def test_what_cannot_change_is_a_conflict_naming_the_field(db: Database) -> None:
    await apply(db, document())
    for edit, message in [
        (lambda d: d["pools"][0].update(sharing="mig"), "pools[0].sharing: pool h100 has"),
        (lambda d: d["sites"][0].update(region="us"), "sites[0].region: site eu has region"),
        (lambda d: d["tenants"][0].update(parent="globex"), "tenants[0].parent: tenant acme-lab"),
    ]:
        bad = document()
        edit(bad)
        with pytest.raises(Conflict) as raised:
            await apply(db, bad)
        assert str(raised.value).startswith(message), str(raised.value)


async def test_export_then_apply_is_a_no_op_without_secrets(db: Database, fleet: Fleet) -> None:
    """Things made without a file (CLI, REST) are exported under their ids."""
    await apply(db, document())
    await fleet.tenant("umbrella")
    site = await fleet.site("umbrella", "custom", "ap-south")
    await fleet.caller("umbrella", "viewer", region="ap-south")
    capacity = Capacity(db)
    join = {
        "apiServer": "https://k8s.umbrella.example:6443",
        "token": "join-secret-0123456789",
        "caCertHash": "sha256:" + "ab" * 32,
    }
    body = {
        "tenantId": "umbrella",
        "siteId": site,
        "class": "metal-host",
        "policy": {"kubernetes": join},
        "ownerQuota": {"gpu": 8},
    }
    created = await capacity.create_pool(OPERATOR, parse_input(CreatePoolInput, body))
    offer = {
        "tenantId": "umbrella",
        "poolId": created.pool.id,
        "toTenantId": "acme",
        "quota": {"gpu": 1},
    }
    await capacity.offer_pool(OPERATOR, parse_input(OfferPoolInput, offer))

    exported = await export_fleet(db)
    text = yaml.safe_dump(exported, sort_keys=False)
    assert "join-secret" not in text and "bct_" not in text
    pool = next(p for p in exported["pools"] if p["tenant"] == "umbrella")
    assert pool["name"] == created.pool.id and pool["site"] == site
    assert pool["policy"]["kubernetes"]["tokenSet"] is True

    report = await apply_fleet(db, read_fleet(text, "fleet.yaml"))
    assert report["changes"] == 0, report

    # Changing the join set's server keeps the stored token.
    pool["policy"]["kubernetes"]["apiServer"] = "https://k8s2.umbrella.example:6443"
    report = await apply_fleet(db, parse_fleet(exported))
    assert keys(report["changed"]) == [("pool", created.pool.id, None, "update")]
    async with db.reader.connect() as conn:
        policy = await conn.scalar(select(Pool.policy).where(Pool.id == created.pool.id))
    assert policy["kubernetes"]["token"] == "join-secret-0123456789"


async def test_the_readme_fleet_file_applies_and_the_demo_file_parses(db: Database) -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    report = await apply_fleet(db, read_fleet(block, "README.md"))
    assert report["changes"] == len(report["created"]) == 9
    assert (await apply_fleet(db, read_fleet(block, "README.md")))["changes"] == 0
    read_fleet(DEMO_FLEET.read_text(), str(DEMO_FLEET))


async def _offer_through_the_api(db: Database, pool_id: str, to: str, gpus: int) -> None:
    body = {"tenantId": "acme", "poolId": pool_id, "toTenantId": to, "quota": {"gpu": gpus}}
    await Capacity(db).offer_pool(OPERATOR, parse_input(OfferPoolInput, body))


async def _offered(db: Database, pool_id: str) -> list[str]:
    async with db.reader.connect() as conn:
        rows = await conn.scalars(
            select(Offer.tenant_id).where(Offer.pool_id == pool_id).order_by(Offer.tenant_id)
        )
        return [t for t in rows if t != "acme"]


async def test_apply_keeps_offers_no_file_declared_and_prune_withdraws_them(db: Database) -> None:
    """As `kubectl apply`: what the file applied before and no longer lists is withdrawn;
    an offer made through the API survives, until `--prune`."""
    first = await apply(db, document())
    h100 = next(e["id"] for e in first["created"] if e["kind"] == "pool" and e["name"] == "h100")
    await _offer_through_the_api(db, h100, "acme-lab", 2)

    again = await apply(db, document())
    assert again["changes"] == 0 and await _offered(db, h100) == ["acme-lab", "globex", "initech"]
    kept = [e for e in again["unchanged"] if e.get("declared") is False]
    assert keys(kept) == [("offer", "h100", "acme-lab", None)] and "--prune" in kept[0]["note"]

    dropped = document()
    dropped["pools"][0]["offers"] = dropped["pools"][0]["offers"][:1]  # initech left out
    report = await apply(db, dropped)
    assert keys(report["changed"]) == [("offer", "h100", "initech", "unoffer")]
    assert await _offered(db, h100) == ["acme-lab", "globex"]

    plan = await apply(db, dropped, prune=True, dry_run=True)  # says what it would remove
    assert keys(plan["changed"]) == [("offer", "h100", "acme-lab", "unoffer")]
    assert await _offered(db, h100) == ["acme-lab", "globex"]
    await apply(db, dropped, prune=True)
    assert await _offered(db, h100) == ["globex"]


async def test_an_offer_withdrawn_elsewhere_is_no_longer_the_files(db: Database) -> None:
    """The file's record of an offer goes with the offer: withdrawn through the API and
    offered again there, it is the API's, and survives an apply that does not list it."""
    first = await apply(db, document())
    h100 = next(e["id"] for e in first["created"] if e["kind"] == "pool" and e["name"] == "h100")
    capacity = Capacity(db)
    unoffer = {"tenantId": "acme", "poolId": h100, "toTenantId": "initech"}
    await capacity.unoffer_pool(OPERATOR, parse_input(UnofferPoolInput, unoffer))
    await _offer_through_the_api(db, h100, "initech", 1)
    without = document()
    without["pools"][0]["offers"] = without["pools"][0]["offers"][:1]
    await apply(db, without)
    assert await _offered(db, h100) == ["globex", "initech"]


async def test_nodes_in_a_file_join_once_and_export_keeps_capacity(db: Database) -> None:
    doc = document()
    doc["pools"][0]["nodes"] = [{"name": "rack1-a", "gpus": 8}, {"name": "rack1-b", "gpus": 8}]
    first = await apply(db, doc)
    assert [e["name"] for e in first["created"] if e["kind"] == "node"] == ["rack1-a", "rack1-b"]
    assert (await apply(db, doc))["changes"] == 0

    exported = await export_fleet(db)
    h100 = next(p for p in exported["pools"] if p["name"] == "h100")
    assert h100["nodes"] == [{"name": "rack1-a", "gpus": 8}, {"name": "rack1-b", "gpus": 8}]
    assert (await apply_fleet(db, parse_fleet(exported)))["changes"] == 0

    grown = copy.deepcopy(doc)
    grown["pools"][0]["nodes"][1]["gpus"] = 4
    with pytest.raises(InvalidInput, match=r"pools\[0\]\.nodes\[1\]: .*fixed"):
        await apply(db, grown)
    twice = copy.deepcopy(doc)
    twice["pools"][1]["nodes"] = [{"name": "rack1-a", "gpus": 8}]
    with pytest.raises(InvalidInput, match=r"pools\[1\]\.nodes\[0\]\.name: .*twice"):
        await apply(db, twice)


async def test_an_exported_fleet_keeps_its_capacity_in_a_new_database(
    db: Database, fresh_database_url: str
) -> None:
    """Nodes added without a file are exported under their ids; applied to an empty
    database, the fleet has the same GPUs."""
    from app.capacity.nodes import add_node
    from app.db.engine import create_database
    from app.db.migrate import upgrade
    from app.db.models import CapacityRow

    first = await apply(db, document())
    h100 = next(e["id"] for e in first["created"] if e["kind"] == "pool" and e["name"] == "h100")
    await add_node(db, h100, 8)
    await add_node(db, h100, 4)
    exported = await export_fleet(db)

    await upgrade(fresh_database_url)
    other = create_database(fresh_database_url)
    try:
        await apply_fleet(other, parse_fleet(exported))

        async def gpus(on: Database) -> list[int]:
            async with on.reader.connect() as conn:
                rows = await conn.scalars(
                    select(CapacityRow.allocatable)
                    .join(Pool, Pool.id == CapacityRow.pool_id)
                    .where(CapacityRow.resource == "gpu")
                    .order_by(CapacityRow.allocatable)
                )
                return list(rows)

        assert await gpus(other) == await gpus(db) and 12 in await gpus(other)
    finally:
        await other.dispose()


async def test_names_and_labels_round_trip_through_apply_and_export(db: Database) -> None:
    """A file's displayName and labels are created, changed through `label` (pool.updated),
    exported, and an exported file applies as a no-op; a file that leaves them out leaves
    a name or labels set through the API alone."""
    doc = document()
    doc["pools"][0]["displayName"] = "Training H100s"
    doc["pools"][0]["labels"] = {"team": "ml", "example.com/tier": "gold"}
    await apply(db, doc)
    async with db.reader.connect() as conn:
        row = (await conn.execute(select(Pool).where(Pool.pool_class == "metal-host"))).one()
    assert (row.display_name, row.labels) == ("Training H100s", doc["pools"][0]["labels"])

    doc["pools"][0]["labels"] = {"team": "web"}
    report = await apply(db, doc)
    assert keys(report["changed"]) == [("pool", "h100", None, "update")]
    assert report["changed"][0]["fields"] == ["labels"]
    kind, data = (await events(db))[-1]
    assert kind == "pool.updated" and data["changed"] == ["labels"]

    exported = await export_fleet(db)
    pool = next(p for p in exported["pools"] if p["name"] == "h100")
    assert (pool["displayName"], pool["labels"]) == ("Training H100s", {"team": "web"})
    spare = next(p for p in exported["pools"] if p["name"] == "spare")
    assert "displayName" not in spare and "labels" not in spare
    text = yaml.safe_dump(exported, sort_keys=False)
    assert (await apply_fleet(db, read_fleet(text, "fleet.yaml")))["changes"] == 0

    del doc["pools"][0]["displayName"], doc["pools"][0]["labels"]
    assert (await apply(db, doc))["changes"] == 0  # left out: left alone
