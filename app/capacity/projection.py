"""The IAM authz projection: one row per (tenant, pool) for every tenant holding an offer,
carrying the pool attributes role bindings may be narrowed by. Written on create and
offer, removed on unoffer and archive, refreshed on update, always beside the offer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Delete, Select, Table, bindparam, delete, insert, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.dml import UpdateBase
from sqlalchemy.sql.elements import BindParameter, ColumnElement

from app.capacity.access import LockedPool
from app.capacity.pool_rows import forget_loaded, sync_loaded
from app.db.models import AuthzRow, Pool
from app.db.session_statements import SessionStatements

_AUTHZ: Table = AuthzRow.__table__  # type: ignore[assignment]


async def write_authz_row(
    session: AsyncSession,
    pool: Pool,
    tenant_id: str,
    *,
    include_descendants: bool,
    new_offer: bool = False,
) -> None:
    """The tenant's row, after its offer is written; `new_offer` when that offer is new, so
    no row can be there yet (each row is beside its offer): it is added without a look."""
    row = None if new_offer else await session.get(AuthzRow, (tenant_id, pool.id))
    if row is None:
        row = AuthzRow(tenant_id=tenant_id, pool_id=pool.id)
        session.add(row)
    for name, value in authz_values(pool, tenant_id, include_descendants).items():
        setattr(row, name, value)


def authz_values(pool: Pool | LockedPool, tenant_id: str, include_descendants: bool) -> Any:
    """What the tenant's row carries of the pool (the attributes bindings narrow by)."""
    return {
        "gpu_model": pool.gpu_model,
        "pool_class": pool.pool_class,
        "sharing": pool.sharing,
        "region": pool.region,
        "owned": tenant_id == pool.tenant_id,
        "include_descendants": include_descendants,
    }


_PUT = (
    update(_AUTHZ)
    .where(_AUTHZ.c.tenant_id == bindparam("key_tenant"), _AUTHZ.c.pool_id == bindparam("pool_key"))
    .returning(_AUTHZ.c.tenant_id)
)
_ADD = insert(_AUTHZ)


async def put_authz_row(
    statements: SessionStatements,
    pool: LockedPool,
    tenant_id: str,
    *,
    include_descendants: bool,
    new_offer: bool = False,
) -> None:
    """`write_authz_row` by Core statements built once: the row set if it is there (not
    looked for beside a new offer), else added; a loaded object of it kept in step."""
    values = authz_values(pool, tenant_id, include_descendants)
    if not new_offer:
        key = {"key_tenant": tenant_id, "pool_key": pool.id}
        if (await statements.execute(_PUT, {**key, **values})).first() is not None:
            sync_loaded(
                statements,
                AuthzRow,
                lambda r: (r.tenant_id, r.pool_id) == (tenant_id, pool.id),
                lambda _: values,
            )
            return
    # A blind write: it may ride in the write's event INSERT (app/db/carried_writes.py).
    await statements.write_later(_ADD, {"tenant_id": tenant_id, "pool_id": pool.id, **values})


async def remove_authz_row(session: AsyncSession, pool_id: str, tenant_id: str) -> None:
    await session.execute(
        delete(AuthzRow).where(AuthzRow.pool_id == pool_id, AuthzRow.tenant_id == tenant_id)
    )


def among(column: Any, tenants: BindParameter[Any] | Select[Any]) -> ColumnElement[bool]:
    """`column` is one of `tenants`: a list bound per call (expanding), a subquery, or one
    tenant bound per call (a plain `=`: no list whose SQL is rendered again per call)."""
    if isinstance(tenants, BindParameter) and not tenants.expanding:
        return cast(ColumnElement[bool], column == tenants)
    return cast(ColumnElement[bool], column.in_(tenants))


@dataclass(frozen=True, slots=True)
class ForTenants:
    """A write over some tenants of a pool (bound: `pool_key`), built once for one tenant
    and once for a list (`among` makes the one a plain `=`)."""

    one: UpdateBase
    some: UpdateBase

    def bound(self, pool_id: str, tenant_ids: Sequence[str]) -> tuple[UpdateBase, dict[str, Any]]:
        """The statement for these tenants, with its parameters."""
        if len(tenant_ids) == 1:
            return self.one, {"pool_key": pool_id, "tenant": tenant_ids[0]}
        return self.some, {"pool_key": pool_id, "tenants": list(tenant_ids)}


def for_tenants(build: Callable[[BindParameter[Any]], UpdateBase]) -> ForTenants:
    """`build`'s statement for one tenant and for a list, each built once."""
    return ForTenants(build(bindparam("tenant")), build(bindparam("tenants", expanding=True)))


def removing_authz_rows(tenants: BindParameter[Any] | Select[Any]) -> Delete:
    """Some tenants' authz rows of a pool: `tenants` as `among` takes them (an archive's
    withdrawn guests a subquery, app/capacity/offers.py)."""
    return delete(_AUTHZ).where(
        _AUTHZ.c.pool_id == bindparam("pool_key"), among(_AUTHZ.c.tenant_id, tenants)
    )


_REMOVE = for_tenants(removing_authz_rows)


async def remove_authz_rows(
    statements: SessionStatements, pool_id: str, tenant_ids: Sequence[str], *, sent: bool = False
) -> None:
    """The tenants' rows go (their offers went); the session forgets those it had loaded.
    A blind write: it may ride in the write's event INSERT (app/db/carried_writes.py).
    `sent`: the rows went in a statement of the caller's (`removing_authz_rows`)."""
    gone = set(tenant_ids)
    forget_loaded(statements, AuthzRow, lambda r: r.pool_id == pool_id and r.tenant_id in gone)
    if not sent:
        await statements.write_later(*_REMOVE.bound(pool_id, tenant_ids))


# Every authz row of a pool, its gpuModel set; built once.
_REFRESH = (
    update(_AUTHZ)
    .where(_AUTHZ.c.pool_id == bindparam("pool_key"))
    .values(gpu_model=bindparam("model"))
)


async def refresh_authz_rows(statements: SessionStatements, pool: LockedPool) -> None:
    """After an update: only gpuModel of the narrowing attributes can change."""
    model = pool.gpu_model
    await statements.write_later(_REFRESH, {"pool_key": pool.id, "model": model})
    sync_loaded(
        statements, AuthzRow, lambda row: row.pool_id == pool.id, lambda _: {"gpu_model": model}
    )
