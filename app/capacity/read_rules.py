"""The read rules of CONTRACT section 2, each written once as SQLAlchemy, on both dialects.

The plain reads (app/capacity/reads.py), the compiled JSON statements
(app/capacity/json_reads.py) and the one-statement bookings (app/capacity/booking.py)
are all built from these objects; none of the rules is written again as SQL text:

- `lineage_cte`: a tenant and its ancestors, nearest first (depth 0: the tenant);
- `grant_clause` / `granting`: the authz rows that let a tenant see a pool (its own, or
  an ancestor's with includeDescendants), and `nearest_grants` (`nearest_grant_tenant`
  for one pool): the one among them that grants it (the own row first, else the nearest
  ancestor's);
- `granted_tenants`: the same grant read from the rows down, the tenants a pool's authz
  rows grant it to (what a dry run compares before and after, app/capacity/impact.py);
- `pool_seen_by`: archived pools are seen by their owner only;
- `booked_quotas`: the quota rows a viewer books against (the grant tenant's rows),
  `quota_offer`: the offer that gives a quota row (seen from an offer: its rows), and
  `quotas_with_offers`: the rows joined with it;
- `capacity_lent`: capacity rows with what their pool lent (the rows of its guests'
  quotas summed, `whole` in Python) and the overcommit that ranks them (`lending_order`),
  and `row_lent`: the same of one row;
- `offers_shown`: offers are shown to the pool's owner with compute:pools:share only;
- `token_live`: a remembered caller's token still live with the same unnarrowed role;
- `own_reservations`: the reservations a tenant lists (its own, in any pool), in the
  table of fields' order (`RESERVATION_ORDER`), keyset-paged after an id
  (`reservations_after`), and `ReservationsPage`: a page of them per pool (GraphQL's
  `Pool.reservations`), found by where it ends;
- each list's order is the table of fields' (app/capacity/fields.py, `Relation.order`).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from sqlalchemy import (
    CTE,
    BigInteger,
    ColumnElement,
    Float,
    FromClause,
    Integer,
    Join,
    ScalarSelect,
    Select,
    and_,
    case,
    cast,
    exists,
    false,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
)
from sqlalchemy.sql.util import ClauseAdapter

from app.capacity.fields import CAPACITY_ORDER, RESERVATION_ORDER
from app.capacity.json_sql import HALF, ExactQuotient, ExactSum, JsonIsEmptyObject
from app.db.collation import CodePoint
from app.db.models import (
    ApiToken,
    AuthzRow,
    CapacityRow,
    Offer,
    Pool,
    QuotaRow,
    Reservation,
    RoleBinding,
    Tenant,
)


def lineage_cte(tenant_id: str | ColumnElement[str], name: str = "chain") -> CTE:
    """The tenant (a value or a bound parameter) and its ancestors as a recursive CTE of
    (id, parent_id, depth), depth 0 for the tenant itself."""
    tree = select(Tenant.id, Tenant.parent_id, literal_column("0", Integer).label("depth")).where(
        Tenant.id == tenant_id
    )
    chain = tree.cte(name, recursive=True)
    step = chain.c.depth + literal_column("1", Integer)
    parent = select(Tenant.id, Tenant.parent_id, step.label("depth")).join(
        chain, Tenant.id == chain.c.parent_id
    )
    return chain.union_all(parent)


def grant_clause(
    own: ColumnElement[bool],
    inherited: ColumnElement[bool] | None,
    includes: ColumnElement[bool] | None = None,
) -> Any:
    """The authz rows that let a tenant see a pool: its own (`own` says which rows are),
    or an ancestor's (`inherited`) that includes descendants; None: it has no ancestors.
    `includes` is the row's includeDescendants where it is carried apart from the row
    (`granted_tenants`' walk); the row's own column otherwise."""
    if inherited is None:
        return own
    flag = AuthzRow.include_descendants if includes is None else includes
    return or_(own, and_(inherited, flag))


def granting(lineage: CTE) -> ColumnElement[bool]:
    """`grant_clause` over a lineage CTE: the authz rows of its tenants that grant."""
    return and_(
        AuthzRow.tenant_id == lineage.c.id,
        grant_clause(lineage.c.depth == literal_column("0", Integer), true()),
    )


def nearest_grants(lineage: CTE, *where: ColumnElement[bool]) -> Select[Any]:
    """(pool_id, grant_tenant) of each pool an authz row of the lineage grants (of the
    rows matching `where` too): the tenant whose row grants it, the nearest of the lineage
    (its own row first, else the nearest ancestor's with includeDescendants:
    reads.load_grants' rank)."""
    nearest = (
        select(AuthzRow.pool_id, func.min(lineage.c.depth).label("depth"))
        .select_from(lineage.join(AuthzRow.__table__, granting(lineage)))
        .where(*where)
        .group_by(AuthzRow.pool_id)
        .subquery("nearest")
    )
    return select(nearest.c.pool_id, lineage.c.id.label("grant_tenant")).join(
        lineage, lineage.c.depth == nearest.c.depth
    )


def nearest_grant_tenant(lineage: CTE, pool_id: str | ColumnElement[str]) -> ScalarSelect[Any]:
    """The tenant of `nearest_grants` for one pool (NULL: the lineage is granted none)."""
    nearest = nearest_grants(lineage, AuthzRow.pool_id == pool_id).subquery("nearest_grant")
    return select(nearest.c.grant_tenant).scalar_subquery()


def granted_tenants(*rows: ColumnElement[bool], name: str = "granted") -> CTE:
    """(pool_id, id) of every tenant that the authz rows matching `rows` grant their pool
    to: `grant_clause` read from the row down, the tenants whose lineage `granting` finds
    the row in. The row's own tenant, and each tenant below one already granted, as an
    ancestor's row grants it (not its own, inherited: when the row includes
    descendants). A tenant granted by several rows is listed once per row."""
    own = select(
        AuthzRow.pool_id,
        AuthzRow.tenant_id.label("id"),
        AuthzRow.include_descendants.label("includes"),
    ).where(*rows)
    tree = own.cte(name, recursive=True)
    below = select(tree.c.pool_id, Tenant.id, tree.c.includes).join(
        tree,
        and_(Tenant.parent_id == tree.c.id, grant_clause(false(), true(), tree.c.includes)),
    )
    return tree.union_all(below)


def pool_seen_by(
    tenant_id: str | ColumnElement[str], archived: ColumnElement[bool] | None = None
) -> ColumnElement[bool]:
    """Among granted pools, the archived ones are seen by their owner only. `archived`:
    the pool's state where it is not the stored one (a dry run's after)."""
    state = Pool.archived if archived is None else archived
    return or_(state.is_(False), Pool.tenant_id == tenant_id)


def quota_offer() -> ColumnElement[bool]:
    """The offer that gives a quota row: the row tenant's offer of the row's pool."""
    return and_(Offer.pool_id == QuotaRow.pool_id, Offer.tenant_id == QuotaRow.tenant_id)


def quotas_with_offers() -> Join:
    """Quota rows, each with the offer that gives it (outer-joined: none once it ended)."""
    return QuotaRow.__table__.outerjoin(Offer.__table__, quota_offer())


# --- the lender's view (CONTRACT section 10) -------------------------------------------
#
# What a pool lent is summed, and the owner's rows ranked and cut, by the database, for
# both reads (lending.py, json_reads). A quota's maximum, and its use, may be 2^63 - 1
# (inputs.MAX_AMOUNT): a sum of them may pass 64 bits, where SQLite's sum() raises. So
# each sum is read in two halves (json_sql.ExactSum: on SQLite summed apart, of the
# amounts' bits from 32 up and below; on PostgreSQL, whose sum is exact, 0 and the sum)
# and is high * 2^32 + low: exact in Python (`whole`), in SQL on PostgreSQL (numeric)
# and on SQLite below 2^63 (a double past it, which the compiled reads decline where
# they show it). The overcommit that ranks is exact at any size (`_overcommit`), so the
# order is Python's and the same on both dialects.

_ZERO = literal_column("0", Integer)
# An integer below 2^53 is exact as a double.
_DOUBLE_EXACT = literal_column(str(2**53), BigInteger)


def whole(high: int | Decimal, low: int | Decimal) -> int:
    """A sum of `capacity_lent`'s, exact, from its halves (PostgreSQL's are numeric)."""
    return int(high) * HALF + int(low)


def _overcommit(
    amount: ColumnElement[int], allocatable: ColumnElement[int]
) -> ColumnElement[float]:
    """The sum of `amount` over allocatable, NULL where nothing is allocatable: the
    double nearest the exact quotient, views.overcommit's value. Below 2^53 both are
    exact doubles, and IEEE division rounds their quotient as Python's int / int does;
    past it the quotient is taken exactly (json_sql.ExactQuotient, of the halves)."""
    offered = ExactSum(amount, "whole")
    high, low = ExactSum(amount, "high"), ExactSum(amount, "low")
    return case(
        (allocatable <= _ZERO, null()),
        (
            and_(offered < _DOUBLE_EXACT, allocatable < _DOUBLE_EXACT),
            cast(offered, Float).op("/", return_type=Float)(cast(allocatable, Float)),
        ),
        else_=ExactQuotient(high, low, allocatable),
    )


def _lent(owner: ColumnElement[str]) -> ColumnElement[bool]:
    """The quota rows a capacity row's pool lent of its resource: those of every tenant
    holding an offer of the pool but `owner` (the pool's), each with that offer (a row
    whose offer ended lends nothing). The offer is an EXISTS, not a join: an outer join
    to a join is a subquery to SQLite, scanned whole per capacity row (its direct reads
    build no automatic index)."""
    capacity, quota = CapacityRow.__table__.c, QuotaRow.__table__.c
    return and_(
        quota.pool_id == capacity.pool_id,
        quota.resource == capacity.resource,
        quota.tenant_id != owner,
        exists().where(quota_offer()),
    )


def _lent_values() -> list[ColumnElement[Any]]:
    """What a capacity row lent, over its `_lent` rows: `offered` (the sum of their
    maxima), `guest_used` (of their use), each in halves too (`offered_high`, ..., for
    `whole`), and `overcommit`: offered / allocatable."""
    quota = QuotaRow.__table__.c
    sums = {"offered": quota.max, "guest_used": quota.used}
    return [
        *(
            ExactSum(a, part).label(f"{name}_{part}")
            for name, a in sums.items()
            for part in ("high", "low")
        ),
        *(ExactSum(a, "whole").label(name) for name, a in sums.items()),
        _overcommit(quota.max, CapacityRow.__table__.c.allocatable).label("overcommit"),
    ]


def capacity_lent(owner: ColumnElement[str], *where: ColumnElement[bool]) -> Select[Any]:
    """The capacity rows matching `where` of pools `owner` owns, each with what it lent
    (`_lent_values`): one row per capacity row (a pool's, or every pool's of a set), to
    read as a subquery, in `lending_order` or in the capacity rows' own. The plain reads
    (lending.py) and `lending`'s compiled statement read the lender's values here.

    `where` narrows the rows summed: by pool ids, or by the pools' own columns, whose
    number PostgreSQL estimates; a set it cannot (a lineage's grant walk) narrows the
    subquery's rows instead, or it sums by an index probe per row (json_reads' lending)."""
    capacity = CapacityRow.__table__.c
    columns = [
        capacity.pool_id,
        capacity.resource,
        capacity.total,
        capacity.allocatable,
        capacity.booked,
        *_lent_values(),
    ]
    return (
        select(*columns)
        .select_from(CapacityRow.__table__.outerjoin(QuotaRow.__table__, _lent(owner)))
        .where(*where)
        .group_by(capacity.pool_id, capacity.resource)
    )


def row_lent(owner: ColumnElement[str]) -> Select[Any]:
    """What one capacity row lent (`capacity_lent`'s values, by name: `selected_columns`),
    the row the enclosing statement's (correlated to it, wherever it comes from): for a
    nested list of capacity rows (json_reads: a pool's rollup), where a subquery in
    FROM referring to the pool would not follow it."""
    return (
        select(*_lent_values())
        .where(_lent(owner))
        .correlate_except(QuotaRow.__table__, Offer.__table__)
    )


def lending_order(rows: FromClause) -> tuple[ColumnElement[Any], ...]:
    """The owner's ranking of `capacity_lent`'s rows (`rows`: a subquery of them, or of
    a selection of them): the most overcommitted first, lent capacity on a row with none
    allocatable first of all, an unlent row with none allocatable last; ties in pool id,
    then in the capacity rows' order (the table of fields'), by code point."""
    c = rows.c
    ties = (CapacityRow.__table__.c.pool_id, *CAPACITY_ORDER)
    return (
        and_(c.allocatable <= _ZERO, c.offered > _ZERO).desc(),
        c.overcommit.desc().nulls_last(),
        *(CodePoint(ClauseAdapter(rows).traverse(t)) for t in ties),
    )


def booked_quotas(
    pool_id: ColumnElement[str], grant_tenant: ColumnElement[str]
) -> ColumnElement[bool]:
    """The quota rows a pool's viewer books against: the grant tenant's, in that pool."""
    return and_(QuotaRow.pool_id == pool_id, QuotaRow.tenant_id == grant_tenant)


def offers_shown(
    owner: ColumnElement[str], tenant_id: ColumnElement[str], shares: ColumnElement[bool]
) -> ColumnElement[bool]:
    """Offers are shown to the pool's owner with compute:pools:share only."""
    return and_(owner == tenant_id, shares)


def caller_live(token: ColumnElement[str], role: ColumnElement[str]) -> ColumnElement[bool]:
    """A remembered caller still holds (`token_live`); no token (a caller looked up for
    this request): true."""
    return or_(token.is_(None), token_live(token, role))


def token_live(token: ColumnElement[str], role: ColumnElement[str]) -> Any:
    """The caller's token is live and its role binding is `role`, not narrowed: what a
    remembered principal was remembered with (an EXISTS)."""
    return exists().where(
        ApiToken.token_hash == token,
        ApiToken.revoked_at.is_(None),
        RoleBinding.caller_id == ApiToken.caller_id,
        RoleBinding.role == role,
        JsonIsEmptyObject(RoleBinding.conditions),
    )


def own_reservations(tenant_id: str | ColumnElement[str]) -> ColumnElement[bool]:
    """The reservations a tenant lists: its own, in whatever pool they book (a reservation
    outlives the offer that let it book); in `RESERVATION_ORDER`. Which pools' a caller
    with a narrowed binding reads is decided on each pool (reservations.list_reservations);
    the compiled reads answer unnarrowed callers only."""
    return Reservation.tenant_id == tenant_id


def reservations_after(
    after: str | ColumnElement[str] | None, id_: ColumnElement[str] | None = None
) -> ColumnElement[bool]:
    """A keyset page's rows: after the id a cursor names (paging.decode_cursor), or all
    (`after` None, or a NULL parameter); `id_`: the reservations' id column (an alias's)."""
    column = Reservation.__table__.c.id if id_ is None else id_
    if after is None:
        return true()
    if isinstance(after, str):
        return column > after
    return or_(after.is_(None), column > after)


class ReservationsPage:
    """A page of `first` of a tenant's `own_reservations` in one pool after `after` (a
    page per pool: GraphQL's `Pool.reservations`), given by where it ends: the `first`-th
    id (`end`, NULL when the rest of the pool's fit). `pool_id` is the column the pool is
    named by: a pool row's in a statement that has one, so the database finds the end
    once per pool by walking at most `first` entries of the (tenant_id, pool_id, id)
    index, however many reservations the pool holds (a rank counted per row grew with the
    square of them)."""

    def __init__(
        self,
        pool_id: ColumnElement[str],
        tenant_id: str | ColumnElement[str],
        after: str | ColumnElement[str] | None,
        first: int | ColumnElement[int],
    ) -> None:
        table = Reservation.__table__
        ends = table.alias("page_end")
        (order,) = RESERVATION_ORDER  # the id: a page ends at an id
        assert order.key == "id"
        self._first = first if isinstance(first, ColumnElement) else literal(first, Integer)
        skip = case((self._first >= 1, self._first - 1), else_=0)  # never a negative OFFSET
        self.end: ColumnElement[str] = (
            select(ends.c.id)
            .where(
                ends.c.tenant_id == tenant_id,
                ends.c.pool_id == pool_id,
                reservations_after(after, ends.c.id),
            )
            .order_by(ends.c.id)
            .offset(skip)
            .limit(1)
            # Explicitly: the pool row may sit more than one SELECT out (SQLite's ordered
            # arrays nest one more), past where implicit correlation looks.
            .correlate_except(ends)
            .scalar_subquery()
        )
        self._id = table.c.id

    def shown(self) -> ColumnElement[bool]:
        """A reservation after `after` is on the page (`first` 0: none is)."""
        return and_(self._first >= 1, or_(self.end.is_(None), self._id <= self.end))

    def beyond(self) -> ColumnElement[bool]:
        """A reservation after `after` is past the page: there is a next page."""
        return or_(self._first < 1, and_(self.end.is_not(None), self._id > self.end))
