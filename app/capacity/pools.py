"""Pool lifecycle: create, update, archive (the reads are in pool_reads.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import BigInteger, Select, String, Table, bindparam, func, insert, literal, select
from sqlalchemy.dialects.postgresql import ARRAY

from app.capacity.access import (
    POOL_COLUMNS,
    LockedPool,
    check_version,
    decide_actor,
    lock_owned_pool,
    lock_owned_pool_row,
    lock_owned_pool_with_offers,
    resolve_actor,
)
from app.capacity.changes import Change, change, label_changes, policy_changes
from app.capacity.fields import QUOTA_ORDER
from app.capacity.idempotency import RECORDS, STORED_FINGERPRINT, IdempotentCreate
from app.capacity.impact import archive_impact
from app.capacity.inputs import (
    ArchivePoolInput,
    CreatePoolInput,
    LabelPoolInput,
    UpdatePoolInput,
)
from app.capacity.offers import offer_rows, offers_on, withdraw_guest_offers
from app.capacity.policy import PolicyContext, validate_policy
from app.capacity.pool_reads import OwnedParts, owned_parts, owned_pool_detail, pool_detail
from app.capacity.pool_rows import write_pool
from app.capacity.projection import authz_values, refresh_authz_rows
from app.capacity.read_rules import caller_live
from app.capacity.reads import (
    TENANT_KNOWN,
    Actor,
    OfferQuota,
    load_lineage,
    owned_parts_of,
    tenant_not_found,
)
from app.capacity.rollup import refresh_rollup
from app.capacity.views import ImpactView, PoolDetail
from app.catalog import (
    ARCHIVE_POOL,
    CREATE_POOL,
    LABEL_POOL,
    UPDATE_POOL,
)
from app.db.models import (
    AuthzRow,
    Offer,
    Pool,
    ProviderAccount,
    QuotaRow,
    Site,
    utcnow,
)
from app.db.uow import UnitOfWork
from app.errors import InvalidInput, InvalidState, NotFound
from app.events.outbox import PendingEvent, note_pool_created
from app.iam.decisions import PoolAttributes, decide_pool
from app.iam.principal import Principal

DEFAULT_OWNER_QUOTA = {"gpu": 2_147_483_647}


# -- create --------------------------------------------------------------------------------


def _effective_agent(inp: CreatePoolInput) -> str:
    """Defaults and the provider rules of the seed; all of them are input errors."""
    if inp.pool_class == "provider":
        if inp.provider_account_id is None:
            raise InvalidInput("a provider pool needs providerAccountId", field="providerAccountId")
        if inp.agent not in (None, "none"):
            raise InvalidInput("a provider pool needs agent 'none'", field="agent")
        return "none"
    if inp.provider_account_id is not None:
        raise InvalidInput(
            f"providerAccountId is only for provider pools, not {inp.pool_class}",
            field="providerAccountId",
        )
    return inp.agent or "bcd"


def _fingerprint(inp: CreatePoolInput, agent: str) -> dict[str, Any]:
    """What an idempotent retry must repeat; gpuModel, policy and ownerQuota may differ."""
    return {
        "siteId": inp.site_id,
        "class": inp.pool_class,
        "sharing": inp.sharing,
        "agent": agent,
        "providerAccountId": inp.provider_account_id,
    }


async def create_pool(uow: UnitOfWork, principal: Principal, inp: CreatePoolInput) -> PoolDetail:
    statements = uow.statements
    agent = _effective_agent(inp)
    call = IdempotentCreate(
        method="pools.create",
        prefix="pool",
        tenant_id=inp.tenant_id,
        caller_id=principal.caller_id,
        key=inp.idempotency_key,
        fingerprint=_fingerprint(inp, agent),
        conflict="idempotencyKey was used with a different site, class, sharing, agent "
        "or provider account",
    )
    pool_id = call.resource_id
    # What create checks before it writes, read in one statement (`_CREATE_FACTS`), its
    # rules then applied in their order: the first call's record, the tenant decision, the
    # tenant (no lineage: the owner acts for itself), the site, the provider account.
    facts = (
        await statements.execute(
            _CREATE_FACTS,
            {
                "rid": pool_id,
                "tenant_id": inp.tenant_id,
                "site": inp.site_id,
                "account": inp.provider_account_id,
                **uow.caller_params(),
            },
        )
    ).one()
    uow.caller_seen(facts.caller_live)
    if call.repeats(facts.stored):
        # The first call's decision stands: no second IAM decision, no second event.
        actor = Actor(principal, inp.tenant_id, await load_lineage(statements, inp.tenant_id))
        return await pool_detail(statements, actor, pool_id)

    decide_actor(principal, inp.tenant_id, CREATE_POOL)
    if not facts.tenant_known:
        raise tenant_not_found(inp.tenant_id)
    if facts.site_tenant_id is None or facts.site_tenant_id != inp.tenant_id:
        raise NotFound(f"site {inp.site_id} not found", field="siteId")
    if inp.provider_account_id is not None and facts.account_tenant != inp.tenant_id:
        raise NotFound(
            f"provider account {inp.provider_account_id} not found", field="providerAccountId"
        )
    policy = validate_policy(
        inp.policy if inp.policy is not None else {},
        PolicyContext(pool_class=inp.pool_class, sharing=inp.sharing, site_kind=facts.site_kind),
    )
    attributes = PoolAttributes(inp.gpu_model, inp.pool_class, inp.sharing, facts.site_region, True)
    # A narrowed binding may only create pools it could then manage.
    decide_pool(principal, CREATE_POOL.permission, attributes)

    now = utcnow()
    pool = LockedPool(
        id=pool_id,
        tenant_id=inp.tenant_id,
        site_id=inp.site_id,
        pool_class=inp.pool_class,
        gpu_model=inp.gpu_model,
        sharing=inp.sharing,
        agent=agent,
        policy=policy,
        provider_account_id=inp.provider_account_id,
        region=facts.site_region,
        display_name=inp.display_name or None,
        labels=dict(inp.labels or {}),
        archived=False,
        version=1,
        created_at=now,
        updated_at=now,
    )
    quota = inp.owner_quota if inp.owner_quota is not None else DEFAULT_OWNER_QUOTA
    parts = await _add_pool_rows(uow, call, pool, quota)
    note_pool_created(uow.statements, pool_id)  # its events' order: app/events/outbox.py
    uow.emit(
        PendingEvent(
            type="pool.created",
            pool_id=pool_id,
            tenant_id=inp.tenant_id,
            data={
                "siteId": inp.site_id,
                "class": inp.pool_class,
                "sharing": inp.sharing,
                "gpuModel": inp.gpu_model,
                "displayName": pool.display_name,
                "labels": pool.labels,
                "version": 1,
            },
            audience=frozenset({inp.tenant_id}),
        )
    )
    return await owned_pool_detail(statements, principal, pool, parts)


async def _add_pool_rows(
    uow: UnitOfWork, call: IdempotentCreate, pool: LockedPool, quota: dict[str, int]
) -> OwnedParts | None:
    """A new pool's rows: the call's record (first: a concurrent twin fails on its key and
    retries as a read), the pool, its owner's offer and quota rows, the owner's authz row.
    On PostgreSQL one statement (`_ADD_ROWS`) that returns the quota rows as written, in
    their order, so the answer needs no read back (its parts); elsewhere a statement per
    kind of row, and None: the answer reads them."""
    statements = uow.statements
    owner = {"pool_id": pool.id, "tenant_id": pool.tenant_id}
    offer: dict[str, Any] = {
        **owner,
        "include_descendants": False,
        "priority": 0,
        "created_at": pool.created_at,
    }
    authz = {**owner, **authz_values(pool, pool.tenant_id, include_descendants=False)}
    record = call.record()
    pool_row = {name: getattr(pool, name) for name in POOL_COLUMNS}
    if uow.dialect == "postgresql":
        params = {
            **_named("pool_", pool_row),
            **_named("offer_", offer),
            **_named("authz_", authz),
            **_named("record_", record or {}),
            "quota_pool": pool.id,
            "quota_tenant": pool.tenant_id,
            "quota_resources": list(quota),
            "quota_maxes": list(quota.values()),
        }
        written = (await statements.execute(_ADD_ROWS[record is not None], params)).all()
        rows = [
            OfferQuota(**offer, resource=q.resource, max=q.max, used=q.used) for q in written
        ] or [OfferQuota(**offer, resource=None, max=None, used=None)]
        return owned_parts_of(pool, rows)
    if record is not None:
        await statements.execute(_REMEMBER, record)
    await statements.execute(_ADD_POOL, pool_row)
    await statements.execute(_ADD_OFFER, offer)
    await statements.execute_many(
        _ADD_QUOTA, [{**owner, "resource": r, "max": m, "used": 0} for r, m in quota.items()]
    )
    await statements.execute(_ADD_AUTHZ, authz)
    return None


def _named(prefix: str, row: dict[str, Any]) -> dict[str, Any]:
    return {prefix + key: value for key, value in row.items()}


_SITES: Table = Site.__table__  # type: ignore[assignment]
_ACCOUNTS: Table = ProviderAccount.__table__  # type: ignore[assignment]
_POOLS: Table = Pool.__table__  # type: ignore[assignment]
_OFFERS: Table = Offer.__table__  # type: ignore[assignment]
_QUOTAS: Table = QuotaRow.__table__  # type: ignore[assignment]
_AUTHZ: Table = AuthzRow.__table__  # type: ignore[assignment]


def _site_column(name: str) -> Any:
    return (
        select(_SITES.c[name])
        .where(_SITES.c.id == bindparam("site"))
        .scalar_subquery()
        .label(f"site_{name}")
    )


# What create reads, built once: one row whatever is missing (a column is NULL then).
_CREATE_FACTS = select(
    STORED_FINGERPRINT.label("stored"),
    TENANT_KNOWN.label("tenant_known"),
    _site_column("tenant_id"),
    _site_column("kind"),
    _site_column("region"),
    select(_ACCOUNTS.c.tenant_id)
    .where(_ACCOUNTS.c.id == bindparam("account"))
    .scalar_subquery()
    .label("account_tenant"),
    caller_live(bindparam("token", type_=String()), bindparam("role", type_=String())).label(
        "caller_live"
    ),
)
# What create writes, a statement per kind of row (SQLite) ...
_REMEMBER = insert(RECORDS)
_ADD_POOL = insert(_POOLS)
_ADD_OFFER = insert(_OFFERS)
_ADD_QUOTA = insert(_QUOTAS)
_ADD_AUTHZ = insert(_AUTHZ)


def _inserted(table: Table, prefix: str, keys: Sequence[str]) -> Any:
    """`table`'s INSERT of one row, its values bound by name (a CTE's INSERT takes none
    from the execution's parameters)."""
    return insert(table).values(
        {key: bindparam(prefix + key, type_=table.c[key].type) for key in keys}
    )


def _add_rows(with_record: bool) -> Select[Any]:
    """... or all of them in one (PostgreSQL: data-modifying CTEs; the foreign keys are
    checked at the statement's end), returning the quota rows in their read order."""
    quotas = (
        insert(_QUOTAS)
        .from_select(
            ["pool_id", "tenant_id", "resource", "max", "used", "usage_tx"],
            select(
                bindparam("quota_pool", type_=_QUOTAS.c.pool_id.type),
                bindparam("quota_tenant", type_=_QUOTAS.c.tenant_id.type),
                func.unnest(bindparam("quota_resources", type_=ARRAY(_QUOTAS.c.resource.type))),
                func.unnest(bindparam("quota_maxes", type_=ARRAY(BigInteger()))),
                # Nothing used, nothing stamped (the columns' defaults, named here: a default
                # computed in Python would keep the statement off the driver path).
                literal(0, BigInteger()),
                literal(0, BigInteger()),
            ),
        )
        .returning(_QUOTAS.c.resource, _QUOTAS.c.max, _QUOTAS.c.used)
        .cte("new_quotas")
    )
    written = [
        _inserted(_POOLS, "pool_", POOL_COLUMNS).cte("new_pool"),
        _inserted(_OFFERS, "offer_", [c.key for c in _OFFERS.c]).cte("new_offer"),
        _inserted(_AUTHZ, "authz_", [c.key for c in _AUTHZ.c]).cte("new_authz"),
    ]
    if with_record:
        written.insert(0, _inserted(RECORDS, "record_", [c.key for c in RECORDS.c]).cte("record"))
    return (
        select(quotas.c.resource, quotas.c.max, quotas.c.used)
        .add_cte(*written)
        .order_by(*(quotas.c[str(c.key)] for c in QUOTA_ORDER))
    )


_ADD_ROWS = {False: _add_rows(False), True: _add_rows(True)}


# -- update --------------------------------------------------------------------------------


async def update_pool(uow: UnitOfWork, principal: Principal, inp: UpdatePoolInput) -> PoolDetail:
    if inp.policy is None and inp.gpu_model is None:
        raise InvalidInput("give policy, gpuModel or both", field="policy")
    # The offers come with the lock (one statement less), unless the pool moved while the
    # lock was awaited: then they are read now, under it.
    pool, offer_quotas = await lock_owned_pool_with_offers(
        uow, principal, inp.tenant_id, inp.pool_id, UPDATE_POOL
    )
    check_version(pool, inp.version)
    if inp.gpu_model is not None:
        # A narrowed binding may only leave the pool where it could then manage it (as
        # create requires of a new pool).
        moved = PoolAttributes(inp.gpu_model, pool.pool_class, pool.sharing, pool.region, True)
        decide_pool(principal, UPDATE_POOL.permission, moved)
    if pool.archived:
        raise InvalidState(f"pool {pool.id} is archived", field="poolId")
    # The offers (with the owner's quota rows, for the answer: an update changes neither),
    # or, for a caller that may not read them, the offers alone for the rules and event.
    parts = await owned_parts(uow.statements, principal, pool, offer_quotas)
    offers: Sequence[Any]
    if parts is not None:
        offers = parts[0]
    elif offer_quotas is not None:
        offers = owned_parts_of(pool, offer_quotas)[0]
    else:
        offers = await offer_rows(uow.statements, pool.id)
    changed: list[str] = []
    changes: list[Change] = []
    written: dict[str, Any] = {}
    if inp.policy is not None:
        site = await uow.session.get_one(Site, pool.site_id)  # (a session made only here)
        policy = validate_policy(
            inp.policy, PolicyContext(pool.pool_class, pool.sharing, site.kind), pool.policy
        )
        if policy.get("singleTenant") and not pool.policy.get("singleTenant"):
            guests = [o for o in offers if o.tenant_id != pool.tenant_id]
            if len(guests) > 1 or any(o.include_descendants for o in offers):
                raise InvalidState(
                    "singleTenant needs at most one offered tenant and no includeDescendants",
                    field="policy.singleTenant",
                )
        if policy.get("prewarmImages") != pool.policy.get("prewarmImages"):
            # The site's agents pick up the new desired state. Incremented in the UPDATE:
            # another pool of the site may be changing its images in this instant.
            site.agent_revision = Site.agent_revision + 1
        changes += policy_changes(pool.policy, policy)
        written["policy"] = policy
        changed.append("policy")
    moved_model = inp.gpu_model is not None and inp.gpu_model != pool.gpu_model
    if inp.gpu_model is not None:
        if moved_model:
            changes.append(change("/gpuModel", pool.gpu_model, inp.gpu_model))
        written["gpu_model"] = inp.gpu_model
        changed.append("gpuModel")
    written["version"] = pool.version + 1
    written["updated_at"] = utcnow()
    if "policy" in written:
        # The rollup follows the sharing, the policy and the nodes: of these an update
        # changes only the policy, so a gpuModel alone leaves it as it is.
        await refresh_rollup(uow.statements, replace(pool, **written))
    # The pool's row and its authz rows: blind writes, carried by the event's INSERT.
    pool = await write_pool(uow.statements, pool, written)
    if moved_model:  # the same model leaves every authz row as it is
        await refresh_authz_rows(uow.statements, pool)
    _emit_updated(uow, inp.tenant_id, pool, offers, changed, changes)
    return await owned_pool_detail(uow.statements, principal, pool, parts)


# -- label ---------------------------------------------------------------------------------


async def label_pool(uow: UnitOfWork, principal: Principal, inp: LabelPoolInput) -> PoolDetail:
    """Names and labels (CONTRACT section 10, GCE's setLabels): `labels` replaces the map,
    `displayName` "" removes the name. A call that changes nothing moves no version and
    emits nothing."""
    if inp.display_name is None and inp.labels is None:
        raise InvalidInput("give displayName, labels or both", field="displayName")
    session = uow.session
    actor = await resolve_actor(uow.statements, principal, inp.tenant_id, LABEL_POOL)
    pool = await lock_owned_pool(session, actor, inp.pool_id, LABEL_POOL.permission)
    check_version(pool, inp.version)
    if pool.archived:
        raise InvalidState(f"pool {pool.id} is archived", field="poolId")
    changed: list[str] = []
    changes: list[Change] = []
    if inp.display_name is not None:
        name = inp.display_name or None
        if name != pool.display_name:
            changes.append(change("/displayName", pool.display_name, name))
            pool.display_name = name
            changed.append("displayName")
    if inp.labels is not None:
        found = label_changes(pool.labels, inp.labels)
        if found:
            changes += found
            pool.labels = dict(inp.labels)
            changed.append("labels")
    if not changes:
        return await pool_detail(uow.statements, actor, pool.id)
    pool.version += 1
    pool.updated_at = utcnow()
    await session.flush()
    offers = await offers_on(session, pool.id)
    _emit_updated(uow, actor.tenant_id, pool, offers, changed, changes)
    return await pool_detail(uow.statements, actor, pool.id)


def _emit_updated(
    uow: UnitOfWork,
    tenant_id: str,
    pool: Pool | LockedPool,
    offers: Any,
    changed: Any,
    changes: Any,
) -> None:
    """`pool.updated`, for the owner and every tenant offered the pool (update and label)."""
    uow.emit(
        PendingEvent(
            type="pool.updated",
            pool_id=pool.id,
            tenant_id=tenant_id,
            data={"version": pool.version, "changed": changed, "changes": changes},
            audience=frozenset(o.tenant_id for o in offers) | {pool.tenant_id},
        )
    )


# -- archive -------------------------------------------------------------------------------


async def archive_pool(
    uow: UnitOfWork, principal: Principal, inp: ArchivePoolInput
) -> PoolDetail | ImpactView:
    pool = await lock_owned_pool_row(uow, principal, inp.tenant_id, inp.pool_id, ARCHIVE_POOL)
    check_version(pool, inp.version)
    if inp.dry_run:
        return await archive_impact(uow.session, principal, pool)
    if pool.archived:
        return await owned_pool_detail(uow.statements, principal, pool)
    # On PostgreSQL with the owner's offer and quota rows, for the answer, locked by the
    # same statement: their last commit's values, final while the archive holds them.
    # Every booking locks the pool's row where it is not archived before any row it
    # books, and we hold that lock since our first statement: no booking commits between
    # here and our commit, and none after it (docs/decisions/0004).
    removed, own = await withdraw_guest_offers(uow.statements, pool)
    # Else read now, before the pool's row is written, so that its UPDATE rides in the
    # event's INSERT (the archive changes none).
    parts = await owned_parts(uow.statements, principal, pool, own)
    archived = {"archived": True, "version": pool.version + 1, "updated_at": utcnow()}
    pool = await write_pool(uow.statements, pool, archived)
    uow.emit(
        PendingEvent(
            type="pool.archived",
            pool_id=pool.id,
            tenant_id=inp.tenant_id,
            data={"removedTenantIds": removed, "version": pool.version},
            audience=frozenset(removed) | {pool.tenant_id},
        )
    )
    return await owned_pool_detail(uow.statements, principal, pool, parts)
