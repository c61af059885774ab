"""`bettercompute export`: the fleet as a fleet file, so `export | apply` changes nothing.

Secrets stay out: no tokens, and a Kubernetes join token appears as `tokenSet: true`,
which `apply` reads as "keep the stored one". A thing no file named is written under its
id, which `apply` accepts as its name (ADR 0005). The built-in `fleet` tenant is written
only through its callers: the schema makes it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import select

from app.db.engine import Database
from app.db.models import (
    Caller,
    FleetName,
    Node,
    Offer,
    Pool,
    ProviderAccount,
    QuotaRow,
    RoleBinding,
    Site,
    Tenant,
)
from app.fleet.apply import ACCOUNT, CALLER, NODE, POOL, SITE
from app.iam.roles import FLEET_TENANT


def _redacted(policy: dict[str, Any]) -> dict[str, Any]:
    kube = policy.get("kubernetes")
    if not isinstance(kube, dict) or "token" not in kube:
        return policy
    rest = {k: v for k, v in kube.items() if k != "token"}
    return {**policy, "kubernetes": {**rest, "tokenSet": True}}


async def export_fleet(db: Database) -> dict[str, Any]:
    async with db.reader.connect() as conn:
        names = {
            (row.kind, row.resource_id): row.name for row in await conn.execute(select(FleetName))
        }
        tenants = (await conn.execute(select(Tenant).order_by(Tenant.created_at, Tenant.id))).all()
        sites = (await conn.execute(select(Site).order_by(Site.id))).all()
        accounts = (await conn.execute(select(ProviderAccount).order_by(ProviderAccount.id))).all()
        callers = (
            await conn.execute(
                select(Caller.id, Caller.tenant_id, RoleBinding.role, RoleBinding.conditions)
                .join(RoleBinding, RoleBinding.caller_id == Caller.id)
                .order_by(Caller.id)
            )
        ).all()
        pools = (await conn.execute(select(Pool).order_by(Pool.id))).all()
        offers = (await conn.execute(select(Offer).order_by(Offer.pool_id, Offer.tenant_id))).all()
        nodes = (await conn.execute(select(Node).order_by(Node.created_at, Node.id))).all()
        quotas = (
            await conn.execute(
                select(QuotaRow).order_by(QuotaRow.pool_id, QuotaRow.tenant_id, QuotaRow.resource)
            )
        ).all()

    def name(kind: str, resource_id: str) -> str:
        return str(names.get((kind, resource_id), resource_id))

    quota: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for row in quotas:
        quota[(row.pool_id, row.tenant_id)][row.resource] = row.max

    nodes_by_pool: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for n in nodes:  # so an exported fleet keeps its capacity
        node: dict[str, Any] = {"name": name(NODE, n.id), "gpus": n.gpus}
        if n.owner_tenant_id is not None:
            node["ownerTenant"] = n.owner_tenant_id
        nodes_by_pool[n.pool_id].append(node)
    offers_by_pool: dict[str, list[dict[str, Any]]] = defaultdict(list)
    owners = {p.id: p.tenant_id for p in pools}
    for o in offers:
        if o.tenant_id == owners[o.pool_id]:
            continue  # the owner's rows are the pool's quota
        offer: dict[str, Any] = {"tenant": o.tenant_id, "quota": quota[(o.pool_id, o.tenant_id)]}
        if o.include_descendants:
            offer["includeDescendants"] = True
        if o.priority:
            offer["priority"] = o.priority
        offers_by_pool[o.pool_id].append(offer)

    document: dict[str, Any] = {
        "tenants": [
            {"id": t.id, **({"parent": t.parent_id} if t.parent_id else {})}
            for t in tenants
            if t.id != FLEET_TENANT
        ],
        "sites": [
            {"tenant": s.tenant_id, "name": name(SITE, s.id), "kind": s.kind, "region": s.region}
            for s in sites
        ],
        "providerAccounts": [
            {"tenant": a.tenant_id, "name": name(ACCOUNT, a.id)} for a in accounts
        ],
        "callers": [
            {
                "tenant": c.tenant_id,
                "name": name(CALLER, c.id),
                "role": c.role,
                **({"where": dict(c.conditions)} if c.conditions else {}),
            }
            for c in callers
        ],
        "pools": [],
    }
    for p in pools:
        pool: dict[str, Any] = {
            "tenant": p.tenant_id,
            "name": name(POOL, p.id),
            "site": name(SITE, p.site_id),
            "class": p.pool_class,
        }
        if p.display_name is not None:
            pool["displayName"] = p.display_name
        if p.labels:
            pool["labels"] = dict(p.labels)
        if p.gpu_model is not None:
            pool["gpuModel"] = p.gpu_model
        pool["sharing"] = p.sharing
        pool["agent"] = p.agent
        if p.provider_account_id is not None:
            pool["providerAccount"] = name(ACCOUNT, p.provider_account_id)
        if p.policy:
            pool["policy"] = _redacted(p.policy)
        pool["quota"] = quota[(p.id, p.tenant_id)]
        if offers_by_pool[p.id]:
            pool["offers"] = offers_by_pool[p.id]
        if nodes_by_pool[p.id]:
            pool["nodes"] = nodes_by_pool[p.id]
        if p.archived:
            pool["archived"] = True
        document["pools"].append(pool)
    return document
