"""The capacity domain's one entry point. Every transport (REST, GraphQL, CLI) calls this.

Reads run on a read connection of their own, or on the caller's read scope (`reads=`: a
GraphQL request's one connection); each write runs in exactly one unit of work.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

import orjson
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from app import metrics
from app.capacity import (
    booking,
    booking_release,
    explain,
    json_reads,
    lending,
    offers,
    pool_events,
    pool_reads,
    pools,
    reservations,
)
from app.capacity.event_reads import EventPoolReads
from app.capacity.event_visibility import PoolEventFilter, PoolEventVisibility
from app.capacity.fields import ACCESS
from app.capacity.inputs import (
    ArchivePoolInput,
    CapacityInput,
    CreatePoolInput,
    CreateReservationInput,
    ExplainAccessInput,
    GetPoolInput,
    LabelPoolInput,
    LendingInput,
    ListPoolsInput,
    ListQuotasInput,
    ListReservationsInput,
    OfferPoolInput,
    PoolEventsInput,
    ReleaseReservationInput,
    UnofferPoolInput,
    UpdatePoolInput,
    parse_input,
)
from app.capacity.json_sql import DIALECTS
from app.capacity.node_ids import PoolOffer, parse_node_id
from app.capacity.paging import (
    Page,
    PageRequest,
    pools_page_request,
    reservations_page_request,
)
from app.capacity.shapes import AccessShape, Constant, Shape
from app.capacity.view_json import view_json
from app.capacity.views import (
    DETAIL_PARTS,
    AccessExplanation,
    CapacityView,
    Grant,
    ImpactView,
    LendingRowView,
    PoolDetail,
    PoolPart,
    QuotaView,
    ReservationView,
)
from app.db.engine import Database
from app.db.errors import connection_fault, to_domain_error
from app.db.read_scope import ReadScope
from app.db.uow import CallerChanged as CallerChanged  # the transports catch it from here
from app.db.uow import Notify, UnitOfWork
from app.errors import DomainError, InvalidInput, NotFound, PermissionDenied
from app.events.relay import Relay, Subscription
from app.iam.principal import Principal
from app.iam.roles import POOLS_SHARE

T = TypeVar("T")

# The token hash of a caller admission remembered (app/http/admission.py), for the writes
# of this context (Capacity.token_checked): checked in each write's own transaction.
_CHECKED_TOKEN: ContextVar[str | None] = ContextVar("bettercompute_checked_token", default=None)
# Whether the remembered caller's token and binding hold, built once (booking.caller_live:
# the token live, its binding the role it was remembered with and not narrowed).
_CALLER_LIVE = select(booking.caller_live())


class Capacity:
    def __init__(
        self,
        db: Database,
        notify: Notify | None = None,
        *,
        relay: Relay[PoolEventFilter] | None = None,
        events: PoolEventVisibility | None = None,
        event_pool_reads: int = 2,
    ) -> None:
        self.db = db
        self._notify = notify
        self._relay = relay  # this process's event relay; only a server has one
        # The relay's rule, with the open subscriptions' live bindings (the same object).
        self.events = events or PoolEventVisibility()
        self.event_reads = EventPoolReads(db, event_pool_reads, self.read_json)

    def unit_of_work(self) -> UnitOfWork:
        return UnitOfWork(self.db, self._notify)

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[AsyncConnection]:
        async with self.db.reader.connect() as conn:
            yield conn

    def read_scope(self) -> ReadScope:
        """One read connection for many reads (a GraphQL request's); close it when done."""
        return ReadScope(self.db)

    async def _read(
        self, reads: ReadScope | None, work: Callable[[AsyncConnection], Awaitable[T]]
    ) -> T:
        if reads is not None:
            return await reads.run(work)
        async with self.reading() as conn:
            return await work(conn)

    @contextmanager
    def token_checked(self, token_hash: str) -> Iterator[None]:
        """The writes in this block are a remembered caller's: each checks, first in its
        own transaction, that its token and binding still hold (CallerChanged if not)."""
        reset = _CHECKED_TOKEN.set(token_hash)
        try:
            yield
        finally:
            _CHECKED_TOKEN.reset(reset)

    async def _write(
        self,
        work: Callable[[UnitOfWork], Awaitable[T]],
        *,
        retry: bool,
        principal: Principal | None = None,
    ) -> T:
        """Run `work` in one unit of work. With an idempotency key, a concurrent twin that
        won the insert makes ours fail on the key; running again then reads its result.
        A remembered caller's (token_checked) is checked in the same transaction before it
        commits, and before a refusal is answered (one decided on a caller that changed is
        not its answer): by the write's first statement where it carries the check
        (access.lock_owned_pool_row), else by a statement of its own. A connection found
        dead before its COMMIT (the server kept nothing) runs it once more, on a new
        connection (app/db/engine.py)."""
        twins = 2 if retry else 0  # runs again after a twin's insert
        reconnects = 1  # runs again after a connection found dead (uow.met_a_dead_connection)
        token = _CHECKED_TOKEN.get()
        while True:
            uow = self.unit_of_work()
            try:
                async with uow:
                    if token is not None and principal is not None:
                        if principal.conditions:
                            raise CallerChanged
                        uow.caller = {"token": token, "role": principal.role}
                    try:
                        answer = await work(uow)
                    except DomainError:
                        await _check_caller(uow)
                        raise
                    await _check_caller(uow)
                    return answer
            except IntegrityError:
                if twins == 0:
                    raise
                twins -= 1
            except DBAPIError as exc:
                if reconnects == 0 or not uow.met_a_dead_connection(exc):
                    raise
                reconnects -= 1

    # -- pools ---------------------------------------------------------------------------

    async def list_pools(
        self,
        principal: Principal,
        inp: ListPoolsInput,
        *,
        page: PageRequest | None = None,
        parts: frozenset[PoolPart] = DETAIL_PARTS,
        reads: ReadScope | None = None,
    ) -> Page[PoolDetail]:
        """Every pool the tenant may read, or one keyset page of them, with `parts`."""
        return await self._read(
            reads, lambda conn: pool_reads.list_pools(conn, principal, inp, parts, page)
        )

    async def get_pool(
        self,
        principal: Principal,
        inp: GetPoolInput,
        *,
        parts: frozenset[PoolPart] = DETAIL_PARTS,
        reads: ReadScope | None = None,
    ) -> PoolDetail:
        return await self._read(
            reads, lambda conn: pool_reads.get_pool(conn, principal, inp, parts)
        )

    async def node(
        self,
        principal: Principal,
        node_id: str,
        *,
        parts: frozenset[PoolPart] = DETAIL_PARTS,
        reads: ReadScope | None = None,
    ) -> PoolDetail | PoolOffer | None:
        """Relay's `node(id:)`: the object as the caller's OWN tenant sees it (a fleet
        admin's is `fleet`, which owns and is offered nothing). A pool: what `get` answers;
        an offer: one of the pool's `offers` as its owner sees them. None wherever `get`
        would be NOT_FOUND (or the id is no id the service gives out), so `node` leaks
        nothing `get` would not; PERMISSION_DENIED stays an error, as on `get` and on
        `Pool.offers`."""
        ref = parse_node_id(node_id)
        if ref is None:
            return None
        try:
            inp = parse_input(
                GetPoolInput, {"tenantId": principal.tenant_id, "poolId": ref.pool_id}
            )
        except InvalidInput:
            return None
        wanted = parts if ref.kind == "pool" else frozenset[PoolPart](("offers",))
        try:
            detail = await self.get_pool(principal, inp, parts=wanted, reads=reads)
        except NotFound:
            return None
        if ref.kind == "pool":
            return detail
        if isinstance(detail.offers, PermissionDenied):  # as `Pool.offers` withholds them
            raise detail.offers
        if detail.offers is None:  # not the owner: no offers to show
            return None
        for offer in detail.offers:
            if offer.tenant_id == ref.tenant_id:
                return PoolOffer(ref.pool_id, offer)
        return None

    async def pool_parts(
        self,
        principal: Principal,
        detail: PoolDetail,
        parts: frozenset[PoolPart],
        *,
        reads: ReadScope | None = None,
    ) -> PoolDetail:
        """A pool a write returned, with `parts` read now (its quota rows kept)."""

        async def work(conn: AsyncConnection) -> PoolDetail:
            quotas = {detail.pool.id: detail.quotas}
            found = await pool_reads.read_parts(
                conn, principal, [detail.pool], parts, quotas=quotas
            )
            return found[0]

        return await self._read(reads, work)

    async def capacity(
        self, principal: Principal, inp: CapacityInput, *, reads: ReadScope | None = None
    ) -> tuple[CapacityView, ...]:
        return await self._read(reads, lambda conn: pool_reads.pool_capacity(conn, principal, inp))

    async def list_quotas(
        self, principal: Principal, inp: ListQuotasInput, *, reads: ReadScope | None = None
    ) -> list[QuotaView]:
        return await self._read(reads, lambda conn: pool_reads.list_quotas(conn, principal, inp))

    @property
    def compiles_reads(self) -> bool:
        """Whether compiled reads answer here: on both dialects (json_reads)."""
        return self.db.dialect in DIALECTS

    @property
    def compiles_writes(self) -> bool:
        """Whether bookings and releases may be one statement (PostgreSQL: booking.py,
        booking_release.py); elsewhere the plain writes answer."""
        return self.db.dialect == "postgresql"

    def compile_read(
        self, shape: Shape, root: tuple[Constant, ...] = ()
    ) -> json_reads.CompiledRead | None:
        """`list` (a PageShape: a page; a ListShape: every pool), `get` (a PoolShape),
        `quotas` (a QuotasShape), `capacity` (a CapacityShape), `lending` (a
        LendingShape) or `access` (an AccessShape: its facts) as one statement for this
        store's dialect that answers in JSON, with `root`'s constants beside it; None when
        no statement builds it."""
        return json_reads.compile_read(shape, root, dialect=self.db.dialect)

    async def read_json(
        self,
        principal: Principal,
        token_hash: str,
        read: json_reads.CompiledRead,
        args: dict[str, object],
        *,
        under_key: bool = False,
    ) -> Any:
        """A compiled read's answer, parsed JSON under the shape's keys (`under_key`: the
        value under the shape's one key, json_reads.answer_under_key); None when this
        path does not give the answer (input the plain read refuses, a caller whose
        decisions differ per pool, a token no longer live, a pool not visible):
        the plain read then gives it, error and all. `args` are the method's input as
        sent (REST's body, GraphQL's arguments), validated whole by the method's model as
        the plain read validates them (an unknown field is refused), with a page's first
        and after beside it. A database out of reach raises Unavailable (the caller
        answers it at once: the plain path would wait for it again); any other failure
        is raised as it is, for the plain path to meet and report."""
        if not self.compiles_reads:
            return None
        arguments: dict[str, object]
        asked: ExplainAccessInput | None = None  # `access`'s: decided once parsed
        paged: dict[str, object] = {}  # each `Pool.reservations`' page (`_paged_arguments`)
        if read.pages:  # GraphQL's plan's names; REST's bodies keep theirs (refused)
            paged = {k: v for k, v in args.items() if k.startswith(PAGED)}
            args = {k: v for k, v in args.items() if not k.startswith(PAGED)}
        try:
            paged = _paged_arguments(paged)
            if read.access:
                explain_input = parse_input(read.input, args)
                assert isinstance(explain_input, ExplainAccessInput)
                asked = explain_input
                tenant_id, arguments = asked.tenant_id, {"pool_id": asked.pool_id}
            elif read.reservations:
                listed_rsv = parse_input(read.input, args)
                assert isinstance(listed_rsv, ListReservationsInput)
                tenant_id, arguments = listed_rsv.tenant_id, {"pool_id": listed_rsv.pool_id}
            elif read.lending:
                lent = parse_input(read.input, args)
                assert isinstance(lent, LendingInput)
                tenant_id, arguments = lent.tenant_id, {"first": lent.first}
            elif read.quotas:
                quotas = parse_input(read.input, args)
                assert isinstance(quotas, ListQuotasInput)
                tenant_id, arguments = quotas.tenant_id, {"pool_id": quotas.pool_id}
            elif read.every:
                listed = parse_input(read.input, args)
                assert isinstance(listed, ListPoolsInput)
                if listed.label_selector is not None:
                    return None  # the compiled list does not select by labels: plain path
                tenant_id, arguments = listed.tenant_id, {}
            elif read.page:
                # `first` and `after` page; the rest is the method's input (a `list`).
                given = {k: v for k, v in args.items() if k not in ("first", "after")}
                listed = parse_input(read.input, given)
                assert isinstance(listed, ListPoolsInput)
                if listed.label_selector is not None:
                    return None  # the compiled page does not select by labels: plain path
                page = pools_page_request(
                    args.get("first"),  # type: ignore[arg-type]
                    args.get("after"),  # type: ignore[arg-type]
                )
                tenant_id, arguments = listed.tenant_id, {"after": page.after, "first": page.first}
            else:  # `get`, or `capacity` (a CapacityInput: a pool's)
                get = parse_input(read.input, args)
                assert isinstance(get, GetPoolInput)
                tenant_id, arguments = get.tenant_id, {"pool_id": get.pool_id}
        except DomainError:
            return None
        if not json_reads.eligible(principal, tenant_id, read):
            return None
        arguments.update(paged)
        shares = principal.has(POOLS_SHARE)
        params = read.params(tenant_id, token_hash, principal.role, shares, **arguments)
        try:
            text = await json_reads.fetch(self.db, read.sql, params)
        except Exception as exc:
            if connection_fault(exc):  # the plain path would wait for it again
                raise to_domain_error(exc) from exc
            raise
        if text is None:
            return None
        if asked is not None:
            return _explained(principal, asked, read, text)
        if under_key:
            return json_reads.answer_under_key(text, read)
        return json_reads.answer(text, read)

    async def create_pool(self, principal: Principal, inp: CreatePoolInput) -> PoolDetail:
        return await self._write(
            lambda uow: pools.create_pool(uow, principal, inp),
            retry=inp.idempotency_key is not None,
            principal=principal,
        )

    async def offer_pool(self, principal: Principal, inp: OfferPoolInput) -> PoolDetail:
        return await self._write(
            lambda uow: offers.offer_pool(uow, principal, inp), retry=False, principal=principal
        )

    async def unoffer_pool(self, principal: Principal, inp: UnofferPoolInput) -> bool | ImpactView:
        return await self._write(
            lambda uow: offers.unoffer_pool(uow, principal, inp), retry=False, principal=principal
        )

    async def update_pool(self, principal: Principal, inp: UpdatePoolInput) -> PoolDetail:
        return await self._write(
            lambda uow: pools.update_pool(uow, principal, inp), retry=False, principal=principal
        )

    async def label_pool(self, principal: Principal, inp: LabelPoolInput) -> PoolDetail:
        return await self._write(
            lambda uow: pools.label_pool(uow, principal, inp), retry=False, principal=principal
        )

    async def archive_pool(
        self, principal: Principal, inp: ArchivePoolInput
    ) -> PoolDetail | ImpactView:
        return await self._write(
            lambda uow: pools.archive_pool(uow, principal, inp), retry=False, principal=principal
        )

    async def explain_access(
        self, principal: Principal, inp: ExplainAccessInput, *, reads: ReadScope | None = None
    ) -> AccessExplanation:
        return await self._read(reads, lambda conn: explain.explain_access(conn, principal, inp))

    async def lending(
        self, principal: Principal, inp: LendingInput, *, reads: ReadScope | None = None
    ) -> list[LendingRowView]:
        return await self._read(reads, lambda conn: lending.lending(conn, principal, inp))

    # -- reservations --------------------------------------------------------------------

    async def book(
        self, principal: Principal, inp: CreateReservationInput, token_hash: str | None
    ) -> ReservationView | None:
        """`create_reservation` as one statement (PostgreSQL, app/capacity/booking.py), or
        None: `create_reservation` then answers, error and all. With `token_hash`, the
        principal was remembered by admission and the statement checks its token."""
        if not self.compiles_writes:
            return None
        return await _counted("booking", booking.book(self.db, principal, inp, token_hash))

    async def create_reservation(
        self, principal: Principal, inp: CreateReservationInput
    ) -> ReservationView:
        return await self._write(
            lambda uow: reservations.create_reservation(uow, principal, inp),
            retry=inp.idempotency_key is not None,
        )

    async def release(
        self, principal: Principal, inp: ReleaseReservationInput, token_hash: str | None
    ) -> ReservationView | None:
        """`release_reservation` as one statement (app/capacity/booking_release.py), or
        None: `release_reservation` then answers."""
        if not self.compiles_writes:
            return None
        released = booking_release.release(self.db, principal, inp, token_hash)
        return await _counted("release", released)

    async def release_reservation(
        self, principal: Principal, inp: ReleaseReservationInput
    ) -> ReservationView:
        return await self._write(
            lambda uow: reservations.release_reservation(uow, principal, inp), retry=False
        )

    async def list_reservations(
        self, principal: Principal, inp: ListReservationsInput
    ) -> list[ReservationView]:
        async with self.reading() as conn:
            return await reservations.list_reservations(conn, principal, inp)

    async def reservation_pages(
        self,
        principal: Principal,
        tenant_id: str,
        pools: Sequence[tuple[str, Grant]],
        page: PageRequest,
        *,
        reads: ReadScope | None = None,
    ) -> dict[str, Page[ReservationView] | PermissionDenied]:
        """One page of the tenant's reservations in each of many pools it sees (GraphQL's
        `Pool.reservations`, batched)."""
        return await self._read(
            reads,
            lambda conn: pool_reads.reservation_pages(conn, principal, tenant_id, pools, page),
        )

    # -- events --------------------------------------------------------------------------

    async def open_pool_events(
        self, principal: Principal, inp: PoolEventsInput
    ) -> Subscription[PoolEventFilter]:
        if self._relay is None:
            raise RuntimeError("pool events need a server's relay (Capacity(relay=...))")
        return await pool_events.open_pool_events(
            self._relay, self.db, self.events.bindings, principal, inp
        )


def _explained(
    principal: Principal, asked: ExplainAccessInput, read: json_reads.CompiledRead, text: str
) -> dict[str, Any]:
    """`access`'s compiled answer: the statement's facts decided by the plain read's rule
    (explain.explained) and rendered by the shape (view_json), as REST's plain answer is."""
    data: dict[str, Any] = orjson.loads(text)
    shape = read.shape
    assert isinstance(shape, AccessShape)
    view = explain.explained(principal, asked, data[shape.key])
    absent = shape.optional_keys_absent
    data[shape.key] = view_json(view, shape.fields, ACCESS, optional_absent=absent)
    return data


async def _check_caller(uow: UnitOfWork) -> None:
    """The remembered caller's check, by a statement of its own, unless a statement of the
    write carried it already."""
    if uow.caller is not None and not uow.caller_checked:
        uow.caller_seen(bool(await uow.statements.scalar(_CALLER_LIVE, uow.caller)))


# The arguments of a page nested in a read (GraphQL's `Pool.reservations`), beside the
# root field's: `#<param>:first` and `#<param>:after` (schema/compiled_reads.py).
PAGED = "#"


def _paged_arguments(given: dict[str, object]) -> dict[str, object]:
    """Each nested page's `first` and `after`, validated and decoded as the plain read
    does (paging.reservations_page_request: INVALID_INPUT, then the plain path answers),
    as the statement's parameters `<param>_first` and `<param>_after`."""
    found: dict[str, object] = {}
    for param in {k[len(PAGED) :].split(":")[0] for k in given}:
        page = reservations_page_request(
            given.get(f"{PAGED}{param}:first"),  # type: ignore[arg-type]
            given.get(f"{PAGED}{param}:after"),  # type: ignore[arg-type]
        )
        found[f"{param}_first"], found[f"{param}_after"] = page.first, page.after
    return found


async def _counted(write: str, answer: Awaitable[ReservationView | None]) -> ReservationView | None:
    """A one-statement write's answer, counted by outcome (bettercompute_compiled_writes_total)."""
    try:
        view = await answer
    except DomainError:
        metrics.COMPILED_WRITES.labels(write, "refused").inc()
        raise
    metrics.COMPILED_WRITES.labels(write, "declined" if view is None else "answered").inc()
    return view
