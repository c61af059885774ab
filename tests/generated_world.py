"""A fleet generated from a seed, built through the real domain and REST: what the read
differential test (tests/test_read_differential.py) compares the two read paths over.

`build_world(rng, client, fleet, size)` makes, all chosen by `rng`:

- tenants in lineages: `size.roots` trees, each with a chain at least `size.depth` deep
  (`r0` > `r0.1` > `r0.1.1` > ...) and side branches;
- owners (every root, and one tenant further down), each with sites in two regions and
  pools of every class and sharing mode, with owner quotas of one to three resources,
  labels and display names;
- capacity rows (nodes joined to most pools), offers to other tenants (any lineage) with
  and without includeDescendants and with priorities, the owner's own offer with
  includeDescendants (its subtree sees the pool), reservations that book quota rows (one
  to three per booking tenant and pool, some of two resources, some released);
- archived pools, among them always one that its owner had offered to its own subtree
  and to a guest (so the archived filter is what hides it from the owner's children);
- readers: callers of every role (viewer and operator: no compute:pools:share), narrowed
  role bindings (conditions), a fleet admin acting for several tenants, revoked tokens,
  a token that names no caller; and two `late` readers, whose binding the test narrows
  or whose token it revokes once they have been answered. No role of
  app/iam/roles.py lacks compute:capacity:read today; a reader of one that did would
  be generated too (roles are drawn from ROLE_PERMISSIONS).

Writes go through the plain app's REST API (`client`) with owners' and guests' admin
tokens, so the rows are what the service itself writes; tenants, sites, callers and nodes
through the same code the CLI uses (tests/support.py `Fleet`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import httpx

from app.iam.callers import revoke_token
from app.iam.roles import CAPACITY_READ, FLEET_ADMIN, FLEET_TENANT, POOLS_SHARE, ROLE_PERMISSIONS
from tests.support import Fleet

REGIONS = ("eu-west", "us-east")
GPU_MODELS = ("H100", "A100", "L4", None)
CLASSES = ("metal-host", "metal-dedicated", "vps-host")
# Narrowings a role binding may carry (app/iam/roles.py BINDING_ATTRIBUTES).
NARROWINGS: tuple[dict[str, str], ...] = (
    {"gpuModel": "H100"},
    {"class": "metal-host"},
    {"region": "eu-west"},
    {"sharing": "exclusive"},
    {"owned": "true"},
    {"gpuModel": "A100", "region": "us-east"},
)
NONSENSE_TOKEN = "not-a-token"
MISSING_POOL = "pool_01j00000000000000000000000"  # pattern-valid, no such pool


@dataclass(frozen=True)
class Size:
    roots: int  # lineages
    depth: int  # the deepest chain of each: depth + 1 generations
    branches: int  # extra tenants hung anywhere in the trees
    pools: tuple[int, int]  # pools per owner, at least and at most
    offers: tuple[int, int]  # guests per offered pool
    readers: int  # callers of generated roles, beyond those every owner gets


DEFAULT = Size(roots=2, depth=3, branches=2, pools=(2, 4), offers=(1, 2), readers=6)
# The one-sided changes' runs: the cases every world holds, little else.
BITE = Size(roots=2, depth=3, branches=0, pools=(2, 3), offers=(1, 2), readers=3)
SOAK = Size(roots=4, depth=4, branches=10, pools=(4, 8), offers=(1, 4), readers=40)


@dataclass(frozen=True)
class Reader:
    """A caller the differential test reads as, and the tenant it acts for."""

    name: str
    token: str
    tenant: str  # the tenant its requests act for (a fleet admin's: another one)
    role: str | None  # None: no such caller (a nonsense token)
    conditions: dict[str, str] = field(default_factory=dict)
    revoked: bool = False

    @property
    def shares(self) -> bool:
        return self.role is not None and POOLS_SHARE in ROLE_PERMISSIONS[self.role]

    @property
    def reads_capacity(self) -> bool:
        return self.role is not None and CAPACITY_READ in ROLE_PERMISSIONS[self.role]


@dataclass
class PoolRecord:
    id: str
    owner: str
    sharing: str
    resources: tuple[str, ...]
    archived: bool = False
    nodes: int = 0
    offered_to: dict[str, bool] = field(default_factory=dict)  # guest -> includeDescendants


@dataclass
class World:
    seed: int
    tenants: dict[str, str | None]  # tenant -> parent
    owners: list[str]
    pools: list[PoolRecord]
    readers: list[Reader]
    # Readers whose binding changes once the fast service has seen them: the first is
    # narrowed, the second's token revoked (tests/test_read_differential.py).
    late: list[Reader] = field(default_factory=list)
    reservations: int = 0
    refused_writes: list[str] = field(default_factory=list)  # generated writes refused

    def lineage(self, tenant: str) -> list[str]:
        chain: list[str] = []
        at: str | None = tenant
        while at is not None:
            chain.append(at)
            at = self.tenants.get(at)
        return chain

    def describe(self) -> str:
        archived = sum(p.archived for p in self.pools)
        offers = sum(len(p.offered_to) for p in self.pools)
        narrowed = sum(bool(r.conditions) for r in self.readers)
        return (
            f"{len(self.tenants)} tenants, {len(self.owners)} owners, {len(self.pools)} pools "
            f"({archived} archived), {offers} offers, {self.reservations} reservations, "
            f"{len(self.readers)} readers ({narrowed} narrowed)"
        )


class _Writer:
    """REST writes as a client makes them, on the plain app."""

    def __init__(self, client: httpx.AsyncClient, world: World) -> None:
        self.client = client
        self.world = world

    async def call(
        self, token: str, method: str, body: dict[str, Any], may_refuse: tuple[str, ...] = ()
    ) -> dict[str, Any] | None:
        response = await self.client.post(
            f"/api/compute/{method}", json=body, headers={"authorization": f"Bearer {token}"}
        )
        if response.status_code == 200:
            answer: dict[str, Any] = response.json()
            return answer
        code = response.json().get("error", {}).get("code")
        assert code in may_refuse, (self.world.seed, method, body, response.text)
        self.world.refused_writes.append(f"{method} {code}")
        return None


def _tenants(rng: random.Random, size: Size) -> dict[str, str | None]:
    tenants: dict[str, str | None] = {}
    for r in range(size.roots):
        parent: str | None = None
        name = f"r{r}"
        for _ in range(size.depth + 1):  # a chain: depth 0 .. size.depth
            tenants[name] = parent
            parent, name = name, f"{name}.{rng.randint(1, 3)}"
    for _ in range(size.branches):
        parent = rng.choice(sorted(tenants))
        child = f"{parent}.{len(tenants)}"
        tenants[child] = parent
    return tenants


def _owner_quota(rng: random.Random, sharing: str) -> dict[str, int]:
    gpus = rng.randint(2, 16)
    if sharing == "mig":
        return {"gpu": gpus, "gpu.mig": gpus * 7}
    if sharing == "timeslice":
        return {"gpu.slot": gpus * 4, **({"gpu": gpus} if rng.random() < 0.5 else {})}
    quota = {"gpu": gpus}
    for extra in ("cpu", "memory.gib"):
        if rng.random() < 0.4:
            quota[extra] = rng.randint(1, 512)
    return quota


def _labels(rng: random.Random) -> dict[str, str] | None:
    if rng.random() < 0.3:
        return None
    labels = {}
    if rng.random() < 0.7:
        labels["team"] = rng.choice(("ml", "web", "ops"))
    if rng.random() < 0.5:
        labels["env"] = rng.choice(("", "prod", "dev"))
    if rng.random() < 0.3:
        labels["example.com/tier"] = rng.choice(("gold", "silver"))
    return labels


async def build_world(
    rng: random.Random, seed: int, client: httpx.AsyncClient, fleet: Fleet, size: Size
) -> World:
    tenants = _tenants(rng, size)
    for tenant, parent in tenants.items():  # parents come first (insertion order)
        await fleet.tenant(tenant, parent)
    # Every root owns pools, and so does one tenant below a root with children of its own.
    middle = [t for t, p in tenants.items() if p is not None and t in tenants.values()]
    owners = [t for t, p in tenants.items() if p is None] + rng.sample(middle, k=1)
    world = World(seed, tenants, owners, [], [])
    writer = _Writer(client, world)
    admins = {owner: await fleet.caller(owner, "admin") for owner in owners}
    guests = sorted(tenants)

    for o, owner in enumerate(owners):
        sites = [await fleet.site(owner, region=region) for region in REGIONS]
        count = rng.randint(*size.pools)
        for n in range(count):
            # The first owner's first pool is the archived one its subtree and a guest
            # were offered; its second has quota rows of several resources.
            forced = o == 0 and n == 0
            sharing = (
                "exclusive" if forced else rng.choice(("exclusive",) * 3 + ("mig", "timeslice"))
            )
            body: dict[str, Any] = {
                "tenantId": owner,
                "siteId": rng.choice(sites),
                "class": rng.choice(CLASSES),
                "sharing": sharing,
                "ownerQuota": _owner_quota(rng, sharing),
            }
            if sharing == "mig" and rng.random() < 0.7:  # its rollup then has gpu.mig
                body["policy"] = {"migLayout": ["3g.40gb", "2g.20gb"]}
            model = rng.choice(GPU_MODELS)
            if model is not None:
                body["gpuModel"] = model
            labels = _labels(rng)
            if labels is not None:
                body["labels"] = labels
            if rng.random() < 0.4:
                body["displayName"] = f"{owner} pool {n}"
            created = await writer.call(admins[owner], "pools/create", body)
            assert created is not None
            pool = PoolRecord(
                created["pool"]["id"], owner, sharing, tuple(sorted(body["ownerQuota"]))
            )
            world.pools.append(pool)
            for _ in range(rng.choice((0, 1, 1, 2))):
                await fleet.node(pool.id, rng.randint(1, 8))
                pool.nodes += 1
            if sharing != "exclusive":
                continue  # shared GPU modes are offered to nobody else (INVALID_STATE)
            if forced or rng.random() < 0.3:  # the owner's subtree sees it
                quota = {"gpu": rng.randint(1, 4)}
                await writer.call(
                    admins[owner],
                    "pools/offer",
                    {
                        "tenantId": owner,
                        "poolId": pool.id,
                        "toTenantId": owner,
                        "quota": quota,
                        "includeDescendants": True,
                        "priority": rng.randint(-3, 3),
                    },
                )
                pool.offered_to[owner] = True
            if forced or rng.random() < 0.7:
                lineage = set(world.lineage(owner))
                others = [g for g in guests if g not in lineage]
                for guest in rng.sample(others, k=min(len(others), rng.randint(*size.offers))):
                    quota = {"gpu": rng.randint(0, 4)}
                    if rng.random() < 0.4:
                        quota["cpu"] = rng.randint(1, 64)
                    descendants = rng.random() < 0.5
                    await writer.call(
                        admins[owner],
                        "pools/offer",
                        {
                            "tenantId": owner,
                            "poolId": pool.id,
                            "toTenantId": guest,
                            "quota": quota,
                            "includeDescendants": descendants,
                            "priority": rng.randint(-5, 5),
                        },
                    )
                    pool.offered_to[guest] = descendants

    # Reservations: guests (and owners) book where they hold quota and nodes exist, one
    # to three each (a page of them per pool), some of two resources (the stored
    # object's order is shown), some released (ended, with endedAt).
    bookers: dict[str, str] = {}
    for pool in world.pools:
        if pool.nodes == 0 or rng.random() < 0.4:
            continue
        tenant = rng.choice([pool.owner, *pool.offered_to])
        if tenant not in bookers:
            bookers[tenant] = await fleet.caller(tenant, "operator")
        for _ in range(rng.randint(1, 3)):
            resources = {"gpu": 1}
            if pool.sharing == "mig" and rng.random() < 0.7:  # its rollup has both
                pair = [("gpu", 1), ("gpu.mig", rng.randint(1, 3))]
                rng.shuffle(pair)
                resources = dict(pair)
            booked = await writer.call(
                bookers[tenant],
                "reservations/create",
                {"tenantId": tenant, "poolId": pool.id, "resources": resources},
                may_refuse=("RESOURCE_EXHAUSTED", "INVALID_STATE", "NOT_FOUND"),
            )
            world.reservations += booked is not None
            if booked is not None and rng.random() < 0.3:
                await writer.call(
                    bookers[tenant],
                    "reservations/release",
                    {"tenantId": tenant, "reservationId": booked["reservation"]["id"]},
                )

    # Archived: the forced pool, and maybe one more of each owner (no reservation held).
    for o, owner in enumerate(owners):
        owned = [p for p in world.pools if p.owner == owner]
        chosen = [owned[0]] if o == 0 else []
        if len(owned) > 1 and rng.random() < 0.6:
            chosen.append(rng.choice(owned[1:]))
        for pool in chosen:
            archived = await writer.call(
                admins[owner],
                "pools/archive",
                {"tenantId": owner, "poolId": pool.id},
                may_refuse=("INVALID_STATE",) if pool is not owned[0] else (),
            )
            if archived is not None:
                pool.archived = True
                pool.offered_to = {t: d for t, d in pool.offered_to.items() if t == owner}

    world.readers = await _readers(rng, world, fleet, size, admins)
    return world


async def _readers(
    rng: random.Random, world: World, fleet: Fleet, size: Size, admins: dict[str, str]
) -> list[Reader]:
    readers: list[Reader] = []

    async def add(name: str, tenant: str, role: str, where: dict[str, str] | None = None) -> str:
        token = await fleet.caller(tenant, role, **(where or {}))
        readers.append(Reader(name, token, tenant, role, dict(where or {})))
        return token

    # Every owner: its admin (shares), a viewer (does not).
    for owner in world.owners:
        readers.append(Reader(f"{owner}/admin", admins[owner], owner, "admin"))
        await add(f"{owner}/viewer", owner, "viewer")
    # The first owner's children, which see its subtree's pools (and must not see the
    # archived one).
    first = world.owners[0]
    child = next(t for t, p in world.tenants.items() if p == first)
    await add(f"{child}/viewer", child, "viewer")
    # Generated: any tenant, any role, some narrowed.
    roles = sorted(r for r in ROLE_PERMISSIONS if r != FLEET_ADMIN)
    tenants = sorted(world.tenants)
    for n in range(size.readers):
        tenant, role = rng.choice(tenants), rng.choice(roles)
        where = rng.choice(NARROWINGS) if rng.random() < 0.35 else None
        await add(f"{tenant}/{role}{'/narrowed' if where else ''}#{n}", tenant, role, where)
    # Narrowed callers of an owner, whose decisions differ per pool.
    for n, where in enumerate(rng.sample(NARROWINGS, k=2)):
        await add(f"{first}/admin/narrowed#{n}", first, "admin", where)
    # The fleet admin, acting for several tenants (its own included).
    fleet_token = await fleet.caller(FLEET_TENANT, FLEET_ADMIN)
    for tenant in [FLEET_TENANT, *rng.sample(tenants, k=min(3, len(tenants)))]:
        readers.append(Reader(f"fleet-admin@{tenant}", fleet_token, tenant, FLEET_ADMIN))
    # Revoked tokens, and one that names no caller.
    for tenant in rng.sample(world.owners, k=min(2, len(world.owners))):
        role = rng.choice(roles)
        token = await fleet.caller(tenant, role)
        await revoke_token(fleet.db, token)
        readers.append(Reader(f"{tenant}/{role}/revoked", token, tenant, role, revoked=True))
    readers.append(Reader("nonsense", NONSENSE_TOKEN, rng.choice(tenants), None))
    guest = rng.choice([t for p in world.pools for t in p.offered_to if t != p.owner] or tenants)
    world.late = [
        Reader(f"{first}/admin/late", await fleet.caller(first, "admin"), first, "admin"),
        Reader(f"{guest}/viewer/late", await fleet.caller(guest, "viewer"), guest, "viewer"),
    ]
    return readers
