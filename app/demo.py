"""`bettercompute demo`: a small realistic fleet, the shipped fleet file app/fleet/demo.yaml
applied like any other, then nodes and reservations added through the domain."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import select

from app.capacity import nodes
from app.capacity.inputs import CreateReservationInput, parse_input
from app.capacity.service import Capacity
from app.db.engine import Database
from app.db.models import Caller, RoleBinding, Tenant
from app.fleet.apply import apply_fleet
from app.fleet.schema import read_fleet
from app.iam.callers import create_token
from app.iam.principal import Principal

DEMO_FLEET = Path(__file__).with_name("fleet") / "demo.yaml"
# Nodes per pool (by its name in the fleet file), GPUs per node.
NODES = {
    "h100": [8, 8, 8, 8],
    "a100-mig": [8, 8],
    "l4-timeslice": [4, 4],
    "l40s-mps": [4],
    "h200-provider": [8],
}
# (caller, acting tenant, pool, resources)
RESERVATIONS = (
    ("globex-research-operator", "globex-research", "h100", {"gpu": 4}),
    ("initech-admin", "initech", "a100-mig", {"gpu.mig": 6}),
)


async def _existing_tokens(db: Database) -> dict[str, str]:
    """Demo data is already there: tokens are shown only once, so issue fresh ones."""
    async with db.reader.connect() as conn:
        rows = (
            await conn.execute(
                select(Caller.id, Caller.tenant_id, RoleBinding.role)
                .join(RoleBinding, RoleBinding.caller_id == Caller.id)
                .order_by(Caller.created_at)
            )
        ).all()
    tokens: dict[str, str] = {}
    # By tenant and role, not by name: a database seeded before fleet files has no names.
    for c in read_fleet(DEMO_FLEET.read_text(), str(DEMO_FLEET)).callers:
        caller = next((r for r in rows if r.tenant_id == c.tenant and r.role == c.role), None)
        if caller is not None:
            tokens[c.name] = await create_token(db, caller.id)
    return tokens


def base_url(host: str = "127.0.0.1", port: int = 8000) -> str:
    """Where a client on this machine reaches a server listening on `host`:`port` (a
    wildcard address is reached on loopback)."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def seed(db: Database, url: str | None = None) -> dict[str, Any]:
    """Seed the demo fleet once; print tokens and hints that point at `url` (the server
    that will answer them: `bettercompute serve --demo` passes its own)."""
    url = url or base_url()
    if await _seeded(db):
        fresh = await _existing_tokens(db)
        return {"seeded": False, "tokens": fresh, **_hints(fresh, url)}
    # Tenants, sites, callers, pools and offers: the shipped fleet file, applied by the
    # code behind `bettercompute apply`. Nodes and reservations are not fleet-file things.
    fleet = read_fleet(DEMO_FLEET.read_text(), str(DEMO_FLEET))
    report = await apply_fleet(db, fleet)
    ids = {(e["kind"], e.get("name")): e.get("id") for e in report["created"]}
    tokens = {e["name"]: e["token"] for e in report["created"] if e["kind"] == "caller"}
    pools = {p.name: ids[("pool", p.name)] for p in fleet.pools}
    await _add_nodes(db, pools)
    principals = {
        c.name: Principal(ids[("caller", c.name)], c.tenant, c.role) for c in fleet.callers
    }
    await _book_reservations(db, principals, pools)
    return {
        "seeded": True,
        "tokens": tokens,
        "pools": pools,
        "sites": {s.name: ids[("site", s.name)] for s in fleet.sites},
        **_hints(tokens, url),
    }


async def _seeded(db: Database) -> bool:
    async with db.reader.connect() as conn:
        return await conn.scalar(select(Tenant.id).where(Tenant.id == "acme")) is not None


async def _add_nodes(db: Database, pools: dict[str, str]) -> None:
    for name, gpus in NODES.items():
        for count in gpus:
            await nodes.add_node(db, pools[name], count)


async def _book_reservations(
    db: Database, principals: dict[str, Principal], pools: dict[str, str]
) -> None:
    capacity = Capacity(db)
    for caller, tenant, pool, resources in RESERVATIONS:
        await capacity.create_reservation(
            principals[caller],
            parse_input(
                CreateReservationInput,
                {"tenantId": tenant, "poolId": pools[pool], "resources": resources},
            ),
        )


def _hints(tokens: dict[str, str], url: str) -> dict[str, Any]:
    # -sS: no progress meter, but an error (nothing listening there) is still printed.
    return {
        "try": f"curl -sS -X POST {url}/api/compute/pools/list "
        f"-H 'authorization: Bearer {tokens.get('globex-admin', '<token>')}' "
        "-H 'content-type: application/json' -d '{\"tenantId\": \"globex\"}'",
        "graphiql": f"{url}/graphql",
        "console": f"{url}/console",
    }
