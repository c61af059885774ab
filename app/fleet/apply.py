"""`bettercompute apply`: make the fleet what a fleet file declares, in one transaction.

Every write is a call of the capacity domain (the functions REST and GraphQL reach through
`Capacity`), made by a fleet admin, so validation, IAM and events are theirs; all of them
share one unit of work, so a file that fails anywhere changes nothing. The file is
declarative for what it names: a tenant, site, provider account, caller or pool left out
of it is left alone. A pool's offers follow `kubectl apply`: each one the file lists is
made as listed; one the file listed when last applied and lists no more is withdrawn;
one no file ever declared (made through the API) is left alone, unless `prune` (then a
pool's offers are exactly the ones it lists). A pool is archived only when the file says
`archived: true`. See ADR 0005 and ADR 0010.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from app.capacity import nodes, offers, pools
from app.capacity.inputs import (
    ArchivePoolInput,
    CreatePoolInput,
    LabelPoolInput,
    OfferPoolInput,
    UnofferPoolInput,
    UpdatePoolInput,
    parse_input,
)
from app.capacity.inventory import add_provider_account, add_site, add_tenant
from app.capacity.policy import PolicyContext, validate_policy
from app.db.engine import Database
from app.db.models import (
    Caller,
    FleetName,
    FleetOffer,
    Node,
    Offer,
    Pool,
    ProviderAccount,
    QuotaRow,
    RoleBinding,
    Site,
    Tenant,
)
from app.db.uow import Notify, UnitOfWork
from app.errors import Conflict, DomainError, InvalidInput, InvalidState, NotFound
from app.fleet.schema import FleetFile, OfferEntry, PoolEntry
from app.iam.callers import rebind_caller
from app.iam.issuing import add_caller
from app.iam.principal import Principal
from app.iam.roles import FLEET_ADMIN, FLEET_TENANT

# The fleet admin a fleet file acts as. No token stands behind it: the operator running
# the command already holds the database.
OPERATOR = Principal(caller_id="bettercompute-apply", tenant_id=FLEET_TENANT, role=FLEET_ADMIN)

# Kinds of named things, as stored in fleet_names and printed in the report.
SITE, ACCOUNT, CALLER, POOL, NODE = "site", "providerAccount", "caller", "pool", "node"
_ROWS: dict[str, Any] = {SITE: Site, ACCOUNT: ProviderAccount, CALLER: Caller, POOL: Pool}

# The domain names its inputs' fields; the file names them so.
_FILE_FIELDS = {
    "tenantId": "tenant",
    "toTenantId": "tenant",
    "siteId": "site",
    "providerAccountId": "providerAccount",
    "ownerQuota": "quota",
    "poolId": "",
}


def located(exc: DomainError, path: str, fields: dict[str, str] | None = None) -> DomainError:
    """The same error, its message and field prefixed with where in the file it arose."""
    name = exc.field or ""
    name = {**_FILE_FIELDS, **(fields or {})}.get(name, name)
    where = f"{path}.{name}" if name else path
    details = {k: v for k, v in exc.details.items() if k != "field"}
    return type(exc)(f"{where}: {exc.message}", field=where, **details)


@dataclass
class Report:
    created: list[dict[str, Any]] = field(default_factory=list)
    changed: list[dict[str, Any]] = field(default_factory=list)
    unchanged: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self, *, dry_run: bool) -> dict[str, Any]:
        count = len(self.created) + len(self.changed)
        if count == 0:
            summary = "no changes: the fleet already matches the file"
        else:
            summary = f"{count} change{'s' if count != 1 else ''}"
            summary += " would be made (dry run: nothing written)" if dry_run else " made"
        return {
            "dryRun": dry_run,
            "changes": count,
            "summary": summary,
            "created": self.created,
            "changed": self.changed,
            "unchanged": self.unchanged,
        }


class _DryRun(Exception):
    """Raised at the end of a dry run so the unit of work rolls everything back."""


async def apply_fleet(
    db: Database,
    fleet: FleetFile,
    *,
    dry_run: bool = False,
    prune: bool = False,
    notify: Notify | None = None,
) -> dict[str, Any]:
    """Apply `fleet` in one unit of work; a dry run makes every call, then rolls back.
    `prune` also withdraws the offers of the file's pools that no file declared."""
    report = Report()
    try:
        async with UnitOfWork(db, notify) as uow:
            await _Apply(uow, report, dry_run=dry_run, prune=prune).run(fleet)
            if dry_run:
                raise _DryRun
    except _DryRun:
        pass
    return report.as_dict(dry_run=dry_run)


class _Apply:
    def __init__(self, uow: UnitOfWork, report: Report, *, dry_run: bool, prune: bool) -> None:
        self.uow = uow
        self.session = uow.session
        # Its ORM reads (self.session) interleave with the domain's writes and do not go
        # through uow.statements, which would send a held write before them.
        uow.statements.holding = False
        self.report = report
        self.dry_run = dry_run
        self.prune = prune

    async def run(self, fleet: FleetFile) -> None:
        await self._tenants(fleet)
        for i, site in enumerate(fleet.sites):
            await self._site(f"sites[{i}]", site.tenant, site.name, site.kind, site.region)
        for i, account in enumerate(fleet.provider_accounts):
            await self._account(f"providerAccounts[{i}]", account.tenant, account.name)
        for i, caller in enumerate(fleet.callers):
            await self._caller(
                f"callers[{i}]",
                caller.tenant,
                caller.name,
                caller.role,
                {str(k): v for k, v in caller.where.items()},
            )
        for i, pool in enumerate(fleet.pools):
            await self._pool(f"pools[{i}]", pool)

    # -- names ---------------------------------------------------------------------------

    async def _lookup(self, kind: str, tenant_id: str, name: str) -> str | None:
        """The id a name stands for. A name that is the id of the tenant's own thing of
        that kind stands for it too: that is how `export` names what no file created."""
        found = await self.session.scalar(
            select(FleetName.resource_id).where(
                FleetName.kind == kind, FleetName.tenant_id == tenant_id, FleetName.name == name
            )
        )
        if found is not None:
            return str(found)
        row = await self.session.get(_ROWS[kind], name)
        if row is not None and row.tenant_id == tenant_id:
            return name
        return None

    async def _remember(self, kind: str, tenant_id: str, name: str, resource_id: str) -> None:
        self.session.add(
            FleetName(kind=kind, tenant_id=tenant_id, name=name, resource_id=resource_id)
        )
        await self.session.flush()

    async def _resolve(self, kind: str, tenant_id: str, name: str, where: str) -> str:
        found = await self._lookup(kind, tenant_id, name)
        if found is None:
            raise NotFound(f"{where}: tenant {tenant_id} has no {kind} named {name}", field=where)
        return found

    # -- tenants, sites, provider accounts, callers --------------------------------------

    async def _tenants(self, fleet: FleetFile) -> None:
        """Parents first, wherever they stand in the file."""
        pending = list(enumerate(fleet.tenants))
        while pending:
            waiting = []
            for i, entry in pending:
                if (
                    entry.parent is not None
                    and await self.session.get(Tenant, entry.parent) is None
                ):
                    waiting.append((i, entry))
                    continue
                path = f"tenants[{i}]"
                row = await self.session.get(Tenant, entry.id)
                item = {"kind": "tenant", "id": entry.id}
                if row is None:
                    try:
                        await add_tenant(self.uow.rows, entry.id, entry.parent)
                    except DomainError as exc:
                        raise located(exc, path, {"tenantId": "id"}) from None
                    self.report.created.append(item)
                elif row.parent_id != entry.parent:
                    where = f"{path}.parent"
                    raise Conflict(
                        f"{where}: tenant {entry.id} has parent {row.parent_id}; "
                        "a tenant's parent cannot change",
                        field=where,
                    )
                else:
                    self.report.unchanged.append(item)
            if len(waiting) == len(pending):
                i, entry = waiting[0]
                where = f"tenants[{i}].parent"
                raise NotFound(f"{where}: tenant {entry.parent} not found", field=where)
            pending = waiting

    async def _site(self, path: str, tenant_id: str, name: str, kind: str, region: str) -> None:
        item = {"kind": SITE, "tenant": tenant_id, "name": name}
        site_id = await self._lookup(SITE, tenant_id, name)
        if site_id is None:
            try:
                site_id = await add_site(self.uow.rows, tenant_id, kind, region)
            except DomainError as exc:
                raise located(exc, path) from None
            await self._remember(SITE, tenant_id, name, site_id)
            self.report.created.append({**item, "id": site_id})
            return
        site = await self.session.get_one(Site, site_id)
        for key, have, want in (("kind", site.kind, kind), ("region", site.region, region)):
            if have != want:
                raise Conflict(
                    f"{path}.{key}: site {name} has {key} {have}; a site's {key} cannot change",
                    field=f"{path}.{key}",
                )
        self.report.unchanged.append({**item, "id": site_id})

    async def _account(self, path: str, tenant_id: str, name: str) -> None:
        item = {"kind": ACCOUNT, "tenant": tenant_id, "name": name}
        account_id = await self._lookup(ACCOUNT, tenant_id, name)
        if account_id is None:
            try:
                account_id = await add_provider_account(self.uow.rows, tenant_id)
            except DomainError as exc:
                raise located(exc, path) from None
            await self._remember(ACCOUNT, tenant_id, name, account_id)
            self.report.created.append({**item, "id": account_id})
        else:
            self.report.unchanged.append({**item, "id": account_id})

    async def _caller(
        self, path: str, tenant_id: str, name: str, role: str, where: dict[str, str]
    ) -> None:
        item: dict[str, Any] = {"kind": CALLER, "tenant": tenant_id, "name": name}
        try:
            caller_id = await self._lookup(CALLER, tenant_id, name)
            if caller_id is None:
                caller_id, token = await add_caller(self.uow.rows, tenant_id, role, dict(where))
                await self._remember(CALLER, tenant_id, name, caller_id)
                # Shown once, as `caller create` does; a dry run's token never existed.
                self.report.created.append(
                    {**item, "id": caller_id, **({} if self.dry_run else {"token": token})}
                )
                return
            binding = await self.session.get_one(RoleBinding, caller_id)
            changed = [
                key
                for key, have, want in (
                    ("role", binding.role, role),
                    ("where", dict(binding.conditions), dict(where)),
                )
                if have != want
            ]
            if changed:
                await rebind_caller(self.uow, caller_id, role, dict(where))
                self.report.changed.append(
                    {**item, "id": caller_id, "action": "rebind", "fields": changed}
                )
            else:
                self.report.unchanged.append({**item, "id": caller_id})
        except DomainError as exc:
            raise located(exc, path) from None

    # -- pools -----------------------------------------------------------------------------

    async def _pool(self, path: str, entry: PoolEntry) -> None:
        site_id = await self._resolve(SITE, entry.tenant, entry.site, f"{path}.site")
        account_id = None
        if entry.provider_account is not None:
            account_id = await self._resolve(
                ACCOUNT, entry.tenant, entry.provider_account, f"{path}.providerAccount"
            )
        item = {"kind": POOL, "tenant": entry.tenant, "name": entry.name}
        pool_id = await self._lookup(POOL, entry.tenant, entry.name)
        try:
            if pool_id is None:
                pool_id = await self._create_pool(entry, site_id, account_id)
                await self._remember(POOL, entry.tenant, entry.name, pool_id)
                self.report.created.append({**item, "id": pool_id})
                pool = await self.session.get_one(Pool, pool_id)
            else:
                pool = await self.session.get_one(Pool, pool_id)
                self._check_fixed(entry, pool, site_id, account_id)
                if pool.archived and not entry.archived:
                    raise InvalidState(
                        f"pool {entry.name} is archived, and an archived pool cannot come back",
                        field="archived",
                    )
                fields = await self._update_pool(entry, pool)
                fields += await self._label_pool(entry, pool)
                fields += await self._owner_quota(entry, pool)
                entry_item = {**item, "id": pool_id}
                if fields:
                    self.report.changed.append({**entry_item, "action": "update", "fields": fields})
                elif not entry.archived:  # an archived pool is reported below
                    self.report.unchanged.append(entry_item)
        except DomainError as exc:
            raise located(exc, path) from None
        await self._offers(path, entry, pool)
        await self._nodes(path, entry, pool)
        if entry.archived and not pool.archived:
            try:
                await pools.archive_pool(
                    self.uow,
                    OPERATOR,
                    parse_input(ArchivePoolInput, {"tenantId": entry.tenant, "poolId": pool.id}),
                )
            except DomainError as exc:
                raise located(exc, path) from None
            self.report.changed.append({**item, "id": pool.id, "action": "archive"})
        elif entry.archived:
            self.report.unchanged.append({**item, "id": pool.id})

    async def _create_pool(self, entry: PoolEntry, site_id: str, account_id: str | None) -> str:
        body = {
            "tenantId": entry.tenant,
            "siteId": site_id,
            "class": entry.pool_class,
            "gpuModel": entry.gpu_model,
            "sharing": entry.sharing,
            "agent": entry.agent,
            "policy": entry.policy,  # a new pool has no token for a tokenSet marker to keep
            "ownerQuota": entry.quota,
            "providerAccountId": account_id,
            "displayName": entry.display_name,
            "labels": entry.labels,
        }
        created = await pools.create_pool(self.uow, OPERATOR, parse_input(CreatePoolInput, body))
        return created.pool.id

    def _check_fixed(
        self, entry: PoolEntry, pool: Pool, site_id: str, account_id: str | None
    ) -> None:
        """What no method can change: the file must agree with the pool."""
        agent = entry.agent or ("none" if entry.pool_class == "provider" else "bcd")
        for key, have, want in (
            ("site", pool.site_id, site_id),
            ("class", pool.pool_class, entry.pool_class),
            ("sharing", pool.sharing, entry.sharing),
            ("agent", pool.agent, agent),
            ("providerAccount", pool.provider_account_id, account_id),
        ):
            if have != want:
                raise Conflict(
                    f"pool {entry.name} has {key} {have}; a pool's {key} cannot change",
                    field=key,
                )
        if entry.gpu_model is None and pool.gpu_model is not None:
            raise InvalidInput(
                f"pool {entry.name} has gpuModel {pool.gpu_model}, which cannot be removed",
                field="gpuModel",
            )

    async def _update_pool(self, entry: PoolEntry, pool: Pool) -> list[str]:
        site = await self.session.get_one(Site, pool.site_id)
        policy = validate_policy(
            _with_stored_token(entry.policy, pool.policy),
            PolicyContext(pool.pool_class, pool.sharing, site.kind),
        )
        new_policy = policy if policy != pool.policy else None
        new_model = entry.gpu_model if entry.gpu_model != pool.gpu_model else None
        if new_policy is None and new_model is None:
            return []
        await pools.update_pool(
            self.uow,
            OPERATOR,
            parse_input(
                UpdatePoolInput,
                {
                    "tenantId": entry.tenant,
                    "poolId": pool.id,
                    "policy": new_policy,
                    "gpuModel": new_model,
                },
            ),
        )
        return [
            name
            for name, value in (("policy", new_policy), ("gpuModel", new_model))
            if value is not None
        ]

    async def _label_pool(self, entry: PoolEntry, pool: Pool) -> list[str]:
        """The declared name and labels, through the `label` method; one left out is left
        alone."""
        body: dict[str, Any] = {}
        if entry.display_name is not None and (entry.display_name or None) != pool.display_name:
            body["displayName"] = entry.display_name
        if entry.labels is not None and dict(entry.labels) != pool.labels:
            body["labels"] = entry.labels
        if not body:
            return []
        await pools.label_pool(
            self.uow,
            OPERATOR,
            parse_input(LabelPoolInput, {"tenantId": entry.tenant, "poolId": pool.id, **body}),
        )
        return list(body)

    async def _quota_differs(self, pool_id: str, tenant_id: str, quota: dict[str, int]) -> bool:
        """Whether offering `quota` would change a row: a max below use is raised to it."""
        rows = {
            row.resource: row
            for row in (
                await self.session.execute(
                    select(QuotaRow).where(
                        QuotaRow.pool_id == pool_id, QuotaRow.tenant_id == tenant_id
                    )
                )
            ).scalars()
        }
        return any(
            (row := rows.get(resource)) is None or row.max != max(maximum, row.used)
            for resource, maximum in quota.items()
        )

    async def _owner_quota(self, entry: PoolEntry, pool: Pool) -> list[str]:
        if entry.quota is None or pool.archived:
            return []
        if not await self._quota_differs(pool.id, pool.tenant_id, entry.quota):
            return []
        own = await self.session.get_one(Offer, (pool.id, pool.tenant_id))
        # The owner's flags stay.
        await self._offer(pool, pool.tenant_id, entry.quota, own.include_descendants, own.priority)
        return ["quota"]

    async def _offer(
        self, pool: Pool, to: str, quota: dict[str, int], include_descendants: bool, priority: int
    ) -> None:
        """The domain's offer, made by the fleet admin as the file says."""
        body = {
            "tenantId": pool.tenant_id,
            "poolId": pool.id,
            "toTenantId": to,
            "quota": quota,
            "includeDescendants": include_descendants,
            "priority": priority,
        }
        await offers.offer_pool(self.uow, OPERATOR, parse_input(OfferPoolInput, body))

    async def _offers(self, path: str, entry: PoolEntry, pool: Pool) -> None:
        current = {
            offer.tenant_id: offer
            for offer in await offers.offers_on(self.session, pool.id)
            if offer.tenant_id != pool.tenant_id
        }
        declared = set(
            await self.session.scalars(
                select(FleetOffer.tenant_id).where(FleetOffer.pool_id == pool.id)
            )
        )
        for j, offer in enumerate(entry.offers):
            item = {"kind": "offer", "pool": entry.name, "tenant": entry.tenant, "to": offer.tenant}
            try:
                had = current.pop(offer.tenant, None)
                differs = had is None or await self._offer_differs(pool.id, had, offer)
                if differs:
                    await self._offer(
                        pool, offer.tenant, offer.quota, offer.include_descendants, offer.priority
                    )
            except DomainError as exc:
                raise located(exc, f"{path}.offers[{j}]") from None
            if offer.tenant not in declared:  # from now on the file's to withdraw
                self.session.add(FleetOffer(pool_id=pool.id, tenant_id=offer.tenant))
                await self.session.flush()
            if had is None:
                self.report.created.append(item)
            elif differs:
                self.report.changed.append({**item, "action": "offer"})
            else:
                self.report.unchanged.append(item)
        for tenant_id in current:  # offered, but not in the file
            item = {"kind": "offer", "pool": entry.name, "tenant": entry.tenant, "to": tenant_id}
            if tenant_id not in declared and not self.prune:
                self.report.unchanged.append(
                    {
                        **item,
                        "declared": False,
                        "note": "made through the API; --prune withdraws it",
                    }
                )
                continue
            try:
                await offers.unoffer_pool(
                    self.uow,
                    OPERATOR,
                    parse_input(
                        UnofferPoolInput,
                        {"tenantId": entry.tenant, "poolId": pool.id, "toTenantId": tenant_id},
                    ),
                )
            except DomainError as exc:
                raise located(exc, f"{path}.offers") from None
            self.report.changed.append({**item, "action": "unoffer"})

    async def _nodes(self, path: str, entry: PoolEntry, pool: Pool) -> None:
        """Each node the file lists joins the pool once; a node is never changed or
        removed by a file (one left out is left alone)."""
        for j, node in enumerate(entry.nodes):
            where = f"{path}.nodes[{j}]"
            item = {"kind": NODE, "pool": entry.name, "tenant": entry.tenant, "name": node.name}
            node_id = await self.session.scalar(
                select(FleetName.resource_id).where(
                    FleetName.kind == NODE,
                    FleetName.tenant_id == entry.tenant,
                    FleetName.name == node.name,
                )
            )
            had = await self.session.get(Node, node_id or node.name)  # export names by id
            if had is not None and had.pool_id != pool.id:
                raise InvalidInput(
                    f"{where}.name: node {node.name} is in another pool", field=f"{where}.name"
                )
            if had is None:
                try:
                    node_id = await nodes.join_node(self.uow, pool.id, node.gpus, node.owner_tenant)
                except DomainError as exc:
                    raise located(exc, where) from None
                await self._remember(NODE, entry.tenant, node.name, node_id)
                self.report.created.append({**item, "id": node_id})
            elif (had.gpus, had.owner_tenant_id) != (node.gpus, node.owner_tenant):
                raise InvalidInput(
                    f"{where}: node {node.name} has {had.gpus} GPUs owned by "
                    f"{had.owner_tenant_id or 'the pool'}; a node's GPUs and owner are fixed",
                    field=where,
                )
            else:
                self.report.unchanged.append({**item, "id": had.id})

    async def _offer_differs(self, pool_id: str, had: Offer, offer: OfferEntry) -> bool:
        return (
            had.include_descendants != offer.include_descendants
            or had.priority != offer.priority
            or await self._quota_differs(pool_id, offer.tenant, offer.quota)
        )


# A Kubernetes join token is a credential: `export` writes `tokenSet: true` in its place,
# and applying that keeps the token the pool already holds.
_TOKEN_SET = "tokenSet"


def _with_stored_token(policy: dict[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
    kube = policy.get("kubernetes")
    if not isinstance(kube, dict) or kube.get(_TOKEN_SET) is not True or "token" in kube:
        return policy
    token = (stored.get("kubernetes") or {}).get("token")
    if token is None:
        raise InvalidInput(
            "tokenSet stands for a stored token, and this pool has none",
            field="policy.kubernetes.token",
        )
    rest = {k: v for k, v in kube.items() if k != _TOKEN_SET}
    return {**policy, "kubernetes": {**rest, "token": token}}
