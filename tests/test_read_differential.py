"""The plain path is the reference: over data generated per run (tests/generated_world.py),
every read the compiled path may answer (GraphQL `pools`, `pool`, `quotas`, `capacity`,
`lending` and `access`, and `Pool.reservations`; REST `pools/get`, `pools/list`,
`pools/capacity`, `pools/lending`, `pools/explain` and `reservations/list`) answers
exactly as the plain path answers it, on both dialects.

Two services share one database: `fast`, with the compiled reads on
(BETTERCOMPUTE_COMPILED_READS), and `plain`, with every fast mechanism off
(BETTERCOMPUTE_FAST_PATH=false: stock strawberry over the domain, the reference). Each
request goes to `plain` once and to `fast` twice (the first teaches it the query text,
the second may be compiled), and each of `fast`'s answers is compared with `plain`'s:

- the HTTP status, the response headers but `EXCLUDED_HEADERS` (as a set of lines: the
  order of distinct fields means nothing in HTTP), the body's bytes;
- the error codes (REST `error.code`, GraphQL `errors[].extensions.code`);
- the request's access-log line (app/observe.py, logger `app.access`, captured by a
  handler on that logger): its message and every field but `ACCESS_LOG_EXCLUDED`;
- with tracing on (`test_the_traces_name_the_same_spans`), the request's trace: its HTTP
  spans' names, its GraphQL operation span's name, and at least one SQL span each.

Whether `fast` answered by its compiled statement is read per request from
`bettercompute_compiled_reads_total{outcome="answered"}`: where the store compiles reads
(`Capacity.compiles_reads`: both dialects since issue 21) every surface must have been
answered so at least once, or the comparison could not fail; where it does not, both
services answer on the plain path and the test still runs.

The seed is printed with every failure; BETTERCOMPUTE_TEST_READ_SEED=<seed> replays it.
`test_a_one_sided_change_is_reported` shows the comparison bites: each of four
one-sided changes, patched into the real modules before the services are built, makes
the same comparison report differences.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field, replace
from typing import Any, get_args

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app.capacity.inputs import PoolPermission
from app.capacity.service import Capacity
from app.config import Settings
from app.iam.callers import authenticate, rebind_caller, revoke_token
from app.metrics import COMPILED_READS
from app.server import create_app
from tests.compiled_world import Pair
from tests.generated_world import (
    BITE,
    DEFAULT,
    MISSING_POOL,
    NARROWINGS,
    SOAK,
    Reader,
    Size,
    World,
    build_world,
)
from tests.graphql.test_compiled_parity import CAPACITY, OFFERS, POOL_VALUES, QUOTA, generated
from tests.operability.test_tracing import spans
from tests.support import Fleet, by_size

__all__ = ["spans"]  # fixture

SEED_ENV = "BETTERCOMPUTE_TEST_READ_SEED"
# Made per request, so never alike: the request id (app/observe.py); `date` and `server`
# are uvicorn's (a served process), absent under the ASGI transport the test uses.
EXCLUDED_HEADERS = frozenset({"x-request-id", "date", "server"})
# The access log's fields that are per request: its id, and how long it took.
ACCESS_LOG_EXCLUDED = frozenset({"request_id", "duration_ms"})
# Every attribute a record has of itself: the rest are the line's fields (`extra=`).
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message"}


def run_seed() -> int:
    given = os.environ.get(SEED_ENV, "").strip()
    return int(given) if given else random.SystemRandom().randrange(2**31)


def replay(seed: int) -> str:
    return f"seed {seed} (replay: {SEED_ENV}={seed})"


# --- the two services ------------------------------------------------------------------


def _settings(database_url: str, compiled: bool, **more: Any) -> Settings:
    # No allowance per client address (app/http/address_budget.py): revoked and nonsense
    # tokens are sent many times from one address.
    common: dict[str, Any] = {"database_url": database_url, "unauthenticated_burst": 0, **more}
    if compiled:
        # Given, not defaulted: in a plain-path run (BETTERCOMPUTE_FAST_PATH=false) the
        # defaults are off, and this side must still compile.
        return Settings(**common, compiled_reads=True)
    return Settings(**common, fast_path=False)


@asynccontextmanager
async def _client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield client


@asynccontextmanager
async def services(database_url: str) -> AsyncIterator[Pair]:
    """`fast` (compiled reads on) and `plain` (the reference) on one database."""
    async with (
        _client(_settings(database_url, compiled=True)) as fast,
        _client(_settings(database_url, compiled=False)) as plain,
    ):
        yield Pair(fast, plain)


def compiles(client: httpx.AsyncClient) -> bool:
    """Whether this service's store answers compiled reads (both dialects)."""
    app: Any = client._transport.app  # type: ignore[attr-defined]
    return bool(app.state.capacity.compiles_reads and app.state.settings.compiled_reads)


def _answered() -> float:
    # From the one counter: REGISTRY.get_sample_value collects every metric of the process
    # per call, which was a third of this test's time.
    for metric in COMPILED_READS.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.labels.get("outcome") == "answered":
                return sample.value
    return 0.0


# --- one request, observed -------------------------------------------------------------


class AccessLog(logging.Handler):
    """The `app.access` records (app/observe.py), one per request."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def take(self) -> tuple[tuple[str, Any], ...]:
        records, self.records = self.records, []
        assert len(records) == 1, [r.getMessage() for r in records]
        record = records[0]
        fields = sorted(
            (name, value)
            for name, value in vars(record).items()
            if name not in _RECORD_ATTRIBUTES and name not in ACCESS_LOG_EXCLUDED
        )
        assert fields, "the access log line has no fields"
        return (("line", record.getMessage()), *fields)


@contextmanager
def access_log() -> Iterator[AccessLog]:
    logger = logging.getLogger("app.access")
    handler = AccessLog()
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # a failure's report shows the differences, not every line
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


@dataclass(frozen=True)
class Call:
    """One request: `kind` names the read (`graphql pools`, `graphql pool`, `rest get`)."""

    kind: str
    reader: Reader
    path: str
    body: Any  # sent as JSON, or bytes as they are
    note: str = ""

    def describe(self) -> str:
        sent = self.body
        body = sent.decode(errors="replace") if isinstance(sent, bytes) else json.dumps(sent)
        if len(body) > 400:
            body = body[:400] + "..."
        return f"{self.kind} as {self.reader.name} ({self.note}): {body}"


@dataclass(frozen=True)
class Answer:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    codes: tuple[str, ...]
    access: tuple[tuple[str, Any], ...]

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def _codes(body: Any) -> tuple[str, ...]:
    if not isinstance(body, dict):
        return ()
    if isinstance(body.get("error"), dict):  # REST
        return (str(body["error"].get("code")),)
    return tuple(
        str((e.get("extensions") or {}).get("code")) for e in body.get("errors") or () if e
    )


async def send(client: httpx.AsyncClient, call: Call) -> httpx.Response:
    headers = {"authorization": f"Bearer {call.reader.token}"}
    if isinstance(call.body, bytes):
        headers["content-type"] = "application/json"
        return await client.post(call.path, content=call.body, headers=headers)
    return await client.post(call.path, json=call.body, headers=headers)


async def observe(client: httpx.AsyncClient, log: AccessLog, call: Call) -> Answer:
    response = await send(client, call)
    # Compared as a set of lines: the order of distinct fields carries no meaning in HTTP.
    headers = tuple(
        sorted((k, v) for k, v in response.headers.items() if k not in EXCLUDED_HEADERS)
    )
    try:
        parsed = json.loads(response.content)
    except ValueError:
        parsed = None
    return Answer(response.status_code, headers, response.content, _codes(parsed), log.take())


@dataclass(frozen=True)
class Difference:
    call: Call
    attempt: int  # fast's first or second answer
    compiled: bool  # that answer came from a compiled statement
    aspect: str
    plain: Any
    fast: Any

    def describe(self) -> str:
        how = "compiled" if self.compiled else "not compiled"
        plain, fast = _around_first_difference(self.plain, self.fast)
        return (
            f"- {self.call.describe()}\n  fast #{self.attempt} ({how}) differs in {self.aspect}:"
            f"\n    plain: {plain}\n    fast:  {fast}"
        )


def _around_first_difference(plain: Any, fast: Any, width: int = 160) -> tuple[str, str]:
    """Both values' text, a long one cut to a window around where the two first differ."""
    a, b = repr(plain), repr(fast)
    if len(a) <= 2 * width and len(b) <= 2 * width:
        return a, b
    at = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    start = max(0, at - width)

    def cut(text: str) -> str:
        tail = "..." if len(text) > at + width else ""
        return f"{'...' if start else ''}{text[start : at + width]}{tail} (at {at} of {len(text)})"

    return cut(a), cut(b)


ASPECTS = ("status", "headers", "body", "codes", "access")


@dataclass
class Report:
    """What one differential run compared, and the differences it found."""

    seed: int
    world: World
    comparisons: int = 0
    differences: list[Difference] = field(default_factory=list)
    compiled: Counter[str] = field(default_factory=Counter)  # kind -> compiled answers
    outcomes: Counter[str] = field(default_factory=Counter)  # kind + plain status/code
    seconds: float = 0.0
    # The run stops at the first difference this holds for (None: it runs to the end).
    until: Callable[[Difference], bool] | None = None

    def summary(self) -> str:
        return (
            f"{replay(self.seed)}; world: {self.world.describe()}; {self.comparisons} "
            f"comparisons in {self.seconds:.1f} s, compiled answers {dict(self.compiled)}; "
            f"plain outcomes {dict(self.outcomes)}"
        )

    def failure(self, most: int = 8) -> str:
        shown = "\n".join(d.describe() for d in self.differences[:most])
        more = len(self.differences) - most
        tail = f"\n... and {more} more" if more > 0 else ""
        return f"{len(self.differences)} differences; {self.summary()}\n{shown}{tail}"


async def compare(pair: Pair, log: AccessLog, call: Call, report: Report) -> Answer:
    """The comparison: plain once, fast twice, every aspect of each fast answer against
    plain's. Differences go to the report; returns plain's answer."""
    plain = await observe(pair.plain, log, call)
    report.comparisons += 1
    report.outcomes[f"{call.kind} {plain.status} {'/'.join(plain.codes) or 'ok'}"] += 1
    for attempt in (1, 2):
        before = _answered()
        fast = await observe(pair.fast, log, call)
        compiled = _answered() > before
        report.compiled[call.kind] += compiled
        for aspect in ASPECTS:
            if getattr(fast, aspect) != getattr(plain, aspect):
                found = Difference(
                    call, attempt, compiled, aspect, getattr(plain, aspect), getattr(fast, aspect)
                )
                report.differences.append(found)
                if report.until is not None and report.until(found):
                    raise _Enough
    return plain


class _Enough(Exception):
    """The difference the run was looking for (`Report.until`) is found."""


# --- the requests ----------------------------------------------------------------------

GRANT_FIELDS = ["via", "tenantId", "includeDescendants", "priority", "offeredAt", "__typename"]
# A capacity row's lender's values: the owner with compute:pools:share sees them.
LENDER_FIELDS = ["offered", "guestUsed", "overcommit"]
CAPACITY_FIELDS = CAPACITY.split() + LENDER_FIELDS
QUOTA_FIELDS = ["resource", "max", "used", "poolId"]
LENDING_FIELDS = ["poolId", *CAPACITY_FIELDS]
# `access`: why the caller holds a permission on a pool.
ACCESS_FIELDS = ["allowed", "permission", "__typename"]
BINDING_FIELDS = ["callerId", "tenantId", "role", "where", "actingFor", "fleetAdmin"]
DENIAL_FIELDS = ["check", "message", "key", "__typename"]
PERMISSIONS: tuple[str, ...] = get_args(PoolPermission)
RESERVATION_FIELDS = [
    "id",
    "poolId",
    "tenantId",
    "state",
    "createdAt",
    "endedAt",
    "__typename",
    "resources { resource amount }",
]


def _sample(rng: random.Random, names: list[str], least: int) -> str:
    return " ".join(rng.sample(names, k=rng.randint(least, len(names))))


def _quota_selection(rng: random.Random) -> str:
    """Some values of a quota row, and its grant, mostly."""
    grant = f" grant {{ {_sample(rng, GRANT_FIELDS, 1)} }}" if rng.random() < 0.8 else ""
    return f"{_sample(rng, QUOTA_FIELDS, 1)}{grant}"


def _access_selection(rng: random.Random) -> str:
    """Some of `access`'s values, and mostly its binding, grant and denial."""
    parts = [_sample(rng, ACCESS_FIELDS, 1)]
    for name, names in (
        ("binding", BINDING_FIELDS),
        ("grant", GRANT_FIELDS),
        ("deniedBy", DENIAL_FIELDS),
    ):
        if rng.random() < 0.8:
            parts.append(f"{name} {{ {_sample(rng, names, 1)} }}")
    rng.shuffle(parts)
    return " ".join(parts)


def _pool_selection(rng: random.Random, offers: bool) -> str:
    """A Pool selection: `id`, some values, quotas (with a grant, mostly), capacity, and
    the owner's offers when asked."""
    parts = ["id", _sample(rng, POOL_VALUES[1:], 3)]
    parts.append(f"quotas {{ {_quota_selection(rng)} }}")
    if rng.random() < 0.7:
        parts.append(f"capacity {{ {_sample(rng, CAPACITY_FIELDS, 1)} }}")
    if offers:
        parts.append(f"offers {{ {OFFERS} }}")
    rng.shuffle(parts)
    return " ".join(parts)


@dataclass(frozen=True)
class Queries:
    """This run's GraphQL texts, generated from its seed."""

    page: str  # edges, cursors, pageInfo: walked with first/after
    nodes: str  # nodes and pageInfo
    offers: str  # nodes with the owner's offers (PERMISSION_DENIED without share)
    one: str  # pool(id)
    full: str  # pool(id) with every value, quotas, capacity, offers
    quotas: str  # quotas(tenantId, poolId?): every pool's rows, or one's
    capacity: str  # capacity(tenantId, poolId): one pool's rollup, lender's values too
    lending: str  # lending(tenantId, first): the owner's ranked capacity rows
    access: str  # access(tenantId, poolId, permission): why the caller may or may not
    reservations: str  # pool(id) { reservations(first, after) }: walked by its cursors
    drawn: list[tuple[str, dict[str, Any]]]  # tests/graphql/test_compiled_parity.generated

    @classmethod
    def generate(cls, rng: random.Random, seed: int) -> Queries:
        page = (
            "query Page($t: String!, $first: Int, $after: String) {"
            " pools(tenantId: $t, first: $first, after: $after) {"
            " pageInfo { hasNextPage hasPreviousPage startCursor endCursor }"
            f" edges {{ cursor node {{ {_pool_selection(rng, False)} }} }} }} }}"
        )
        nodes = (
            "query Nodes($t: String!, $first: Int, $after: String) {"
            " pools(tenantId: $t, first: $first, after: $after) {"
            f" nodes {{ {_pool_selection(rng, False)} }} pageInfo {{ hasNextPage endCursor }} }} }}"
        )
        offers = (
            "query Offers($t: String!) { pools(tenantId: $t, first: 10) {"
            f" nodes {{ {_pool_selection(rng, True)} }} }} }}"
        )
        one = (
            "query One($t: String!, $p: ID!) { pool(tenantId: $t, poolId: $p) {"
            f" {_pool_selection(rng, rng.random() < 0.3)} }} }}"
        )
        full = (
            "query Full($t: String!, $p: ID!) { pool(tenantId: $t, poolId: $p) {"
            f" {' '.join(POOL_VALUES)} quotas {{ {QUOTA} }} capacity {{ {CAPACITY} }}"
            f" offers {{ {OFFERS} }} }} }}"
        )
        quotas = (
            "query Quotas($t: String!, $p: ID) { quotas(tenantId: $t, poolId: $p) {"
            f" {_quota_selection(rng)} }} }}"
        )
        capacity = (
            "query Capacity($t: String!, $p: ID!) { capacity(tenantId: $t, poolId: $p) {"
            f" {_sample(rng, CAPACITY_FIELDS, 1)} }} }}"
        )
        lending = (
            "query Lending($t: String!, $first: Int) { lending(tenantId: $t, first: $first) {"
            f" {_sample(rng, LENDING_FIELDS, 1)} }} }}"
        )
        access = (
            "query Access($t: String!, $p: ID!, $perm: String!) {"
            " access(tenantId: $t, poolId: $p, permission: $perm) {"
            f" {_access_selection(rng)} }} }}"
        )
        node = _sample(rng, RESERVATION_FIELDS, 1)
        reservations = (
            "query Reservations($t: String!, $p: ID!, $first: Int, $after: String) {"
            " pool(tenantId: $t, poolId: $p) { id reservations(first: $first, after: $after) {"
            " pageInfo { hasNextPage hasPreviousPage startCursor endCursor }"
            f" edges {{ cursor node {{ {node} }} }} nodes {{ id }} }} }} }}"
        )
        return cls(
            page,
            nodes,
            offers,
            one,
            full,
            quotas,
            capacity,
            lending,
            access,
            reservations,
            generated(6, seed),
        )


def _graphql(kind: str, reader: Reader, query: str, variables: dict[str, Any], note: str) -> Call:
    return Call(kind, reader, "/graphql", {"query": query, "variables": variables}, note)


def _get(reader: Reader, body: Any, note: str) -> Call:
    return Call("rest get", reader, "/api/compute/pools/get", body, note)


def _list(reader: Reader, body: Any, note: str) -> Call:
    return Call("rest list", reader, "/api/compute/pools/list", body, note)


def _capacity(reader: Reader, body: Any, note: str) -> Call:
    return Call("rest capacity", reader, "/api/compute/pools/capacity", body, note)


def _lending(reader: Reader, body: Any, note: str) -> Call:
    return Call("rest lending", reader, "/api/compute/pools/lending", body, note)


def _explain(reader: Reader, body: Any, note: str) -> Call:
    return Call("rest explain", reader, "/api/compute/pools/explain", body, note)


def _access_reads(
    reader: Reader, queries: Queries, pool_id: str, permission: str, note: str
) -> list[Call]:
    """Why the reader may or may not use `permission` on the pool, on each surface."""
    t = reader.tenant
    variables = {"t": t, "p": pool_id, "perm": permission}
    return [
        _graphql("graphql access", reader, queries.access, variables, f"{note} {permission}"),
        _explain(reader, {"tenantId": t, "poolId": pool_id, "permission": permission}, note),
    ]


def _lending_reads(reader: Reader, queries: Queries, first: int | None, note: str) -> list[Call]:
    """The owner's ranked capacity rows on each surface, `first` of them (None: unsaid)."""
    t = reader.tenant
    body = {"tenantId": t} if first is None else {"tenantId": t, "first": first}
    variables = {"t": t} if first is None else {"t": t, "first": first}
    return [
        _graphql("graphql lending", reader, queries.lending, variables, note),
        _lending(reader, body, note),
    ]


def _reservations(reader: Reader, body: Any, note: str) -> Call:
    return Call("rest reservations", reader, "/api/compute/reservations/list", body, note)


def _node_ids(answer: Answer) -> list[str]:
    data = (answer.json() or {}).get("data") or {}
    pools = data.get("pools") or {}
    return [n["id"] for n in pools.get("nodes") or () if isinstance(n, dict) and "id" in n]


UNKNOWN_FIELDS: tuple[dict[str, Any], ...] = (
    {"colour": "red"},
    {"tenantid": "x"},
    {"version": 1},
    {"dryRun": False},
    {"first": 1},
)


async def run_differential(
    pair: Pair,
    world: World,
    rng: random.Random,
    max_pages: int = 4,
    until: Callable[[Difference], bool] | None = None,
) -> Report:
    """Every reader's reads, each compared (`compare`); the order and choices are `rng`'s.
    With `until`, the run ends at the first difference it holds for."""
    report = Report(world.seed, world, until=until)
    started = time.perf_counter()
    with suppress(_Enough):
        await _read_as_every_reader(pair, world, rng, max_pages, report)
    report.seconds = time.perf_counter() - started
    return report


async def _read_as_every_reader(
    pair: Pair, world: World, rng: random.Random, max_pages: int, report: Report
) -> None:
    queries = Queries.generate(rng, world.seed)
    archived = [p.id for p in world.pools if p.archived]
    all_ids = [p.id for p in world.pools]
    with access_log() as log:
        for reader in world.readers:
            t = reader.tenant
            # GraphQL pools: one listing to learn what the reader sees, then a walk.
            listing = await compare(
                pair,
                log,
                _graphql("graphql pools", reader, queries.nodes, {"t": t, "first": 100}, "all"),
                report,
            )
            visible = _node_ids(listing)
            first = rng.choice((1, 2, 3))
            after: str | None = None
            for n in range(max_pages):
                variables = {"t": t, "first": first, "after": after}
                call = _graphql("graphql pools", reader, queries.page, variables, f"page {n + 1}")
                answer = await compare(pair, log, call, report)
                page = ((answer.json() or {}).get("data") or {}).get("pools") or {}
                info = page.get("pageInfo") or {}
                if not info.get("hasNextPage"):
                    break
                after = info.get("endCursor")
            odd: dict[str, Any] = rng.choice(
                [
                    {"first": 101},  # INVALID_INPUT
                    {"first": 0},
                    {"first": 2, "after": "bm90LWEtY3Vyc29y"},  # not a cursor
                    {"first": None, "after": None},  # nulls: the default page
                    {"t": rng.choice(sorted(world.tenants))},  # another tenant
                ]
            )
            variables = {"t": t, **odd}
            await compare(
                pair,
                log,
                _graphql("graphql pools", reader, queries.nodes, variables, "odd"),
                report,
            )
            if rng.random() < 0.5:
                call = _graphql("graphql pools", reader, queries.offers, {"t": t}, "offers")
                await compare(pair, log, call, report)
            # One pool: one it sees, one it does not, an archived one, a missing one.
            hidden = [i for i in all_ids if i not in visible]
            targets = {
                "visible": rng.choice(visible) if visible else rng.choice(all_ids),
                "hidden": rng.choice(hidden) if hidden else MISSING_POOL,
                "archived": rng.choice(archived),
                "missing": MISSING_POOL,
            }
            for note, pool_id in targets.items():
                query = queries.full if rng.random() < 0.3 else queries.one
                call = _graphql("graphql pool", reader, query, {"t": t, "p": pool_id}, note)
                await compare(pair, log, call, report)
                await compare(
                    pair, log, _get(reader, {"tenantId": t, "poolId": pool_id}, note), report
                )
                # Why it may or may not use two permissions there.
                for permission in rng.sample(PERMISSIONS, k=2):
                    for call in _access_reads(reader, queries, pool_id, permission, note):
                        await compare(pair, log, call, report)
            if rng.random() < 0.3:
                call = _graphql(
                    "graphql pool", reader, queries.one, {"t": t, "p": "nope"}, "bad id"
                )
                await compare(pair, log, call, report)
            # The tenant's quota rows in every pool, then in one; one pool's rollup (the
            # visible target, and one other).
            every = _graphql("graphql quotas", reader, queries.quotas, {"t": t}, "every pool")
            await compare(pair, log, every, report)
            others = [k for k in targets if k != "visible"]
            for note in ("visible", rng.choice(others)):
                for call in _one_pool_reads(reader, queries, targets[note], note)[2:]:
                    await compare(pair, log, call, report)
            # A random selection (tests/graphql/test_compiled_parity.generated).
            query, drawn = rng.choice(queries.drawn)
            variables = {
                **drawn,
                "t": t,
                **({"p": targets["visible"]} if "p" in drawn else {}),
            }
            kind = "graphql pools" if "$first" in query else "graphql pool"
            await compare(pair, log, _graphql(kind, reader, query, variables, "generated"), report)
            # REST get: bad bodies, unknown fields.
            valid = {"tenantId": t, "poolId": targets["visible"]}
            bad: list[tuple[Any, str]] = [
                ("x", "a string"),
                ([], "a list"),
                (b"null", "null"),  # (httpx sends no body for json=None)
                (b"{not json", "not JSON"),
                ({"tenantId": t}, "no poolId"),
                ({"tenantId": t, "poolId": "x"}, "a bad poolId"),
                ({**valid, **rng.choice(UNKNOWN_FIELDS)}, "an unknown field"),
                ({**valid, "tenantId": rng.choice(sorted(world.tenants))}, "another tenant"),
            ]
            for body, note in rng.sample(bad, k=3):
                await compare(pair, log, _get(reader, body, note), report)
            body, note = rng.choice(bad)  # `capacity` takes `get`'s input
            await compare(pair, log, _capacity(reader, body, note), report)
            # `explain`: odd input (`get`'s, so no permission), a permission it does not know.
            body, note = rng.choice(bad)
            await compare(pair, log, _explain(reader, body, note), report)
            flying = {**valid, "permission": "compute:pools:fly"}
            await compare(pair, log, _explain(reader, flying, "a bad permission"), report)
            # The owner's ranked capacity rows: all, a few, and odd input.
            odd_first = rng.choice([0, 101, -1])  # 101 and -1: INVALID_INPUT
            for first, note in (
                (None, "all"),
                (rng.choice((1, 2, 3)), "a few"),
                (odd_first, "odd"),
            ):
                for call in _lending_reads(reader, queries, first, note):
                    await compare(pair, log, call, report)
            unknown = {"tenantId": t, **rng.choice(UNKNOWN_FIELDS[:-1])}  # `first` is known
            await compare(pair, log, _lending(reader, unknown, "an unknown field"), report)
            # REST list: every pool, then a body the compiled list leaves to the plain path
            # (a selector) or that the plain path refuses.
            await compare(pair, log, _list(reader, {"tenantId": t}, "all"), report)
            odd_list: list[tuple[Any, str]] = [
                ({"tenantId": t, "labelSelector": "tier=gold"}, "a selector"),
                ({"tenantId": t, "labelSelector": "=="}, "a bad selector"),
                ({"tenantId": t, **rng.choice(UNKNOWN_FIELDS)}, "an unknown field"),
                ({"tenantId": rng.choice(sorted(world.tenants))}, "another tenant"),
                ({}, "no tenantId"),
                (b"[]", "a list"),
            ]
            body, note = rng.choice(odd_list)
            await compare(pair, log, _list(reader, body, note), report)
            # REST reservations: every pool's, each target pool's (seen, hidden, archived,
            # missing), then bodies the plain path refuses.
            await compare(pair, log, _reservations(reader, {"tenantId": t}, "all"), report)
            for note, pool_id in targets.items():
                body = {"tenantId": t, "poolId": pool_id}
                await compare(pair, log, _reservations(reader, body, note), report)
            odd_rsv: list[tuple[Any, str]] = [
                ({"tenantId": t, "poolId": "x"}, "a bad poolId"),
                ({"tenantId": t, **rng.choice(UNKNOWN_FIELDS)}, "an unknown field"),
                ({"tenantId": rng.choice(sorted(world.tenants))}, "another tenant"),
                ({}, "no tenantId"),
                (b"[]", "a list"),
            ]
            for body, note in rng.sample(odd_rsv, k=2):
                await compare(pair, log, _reservations(reader, body, note), report)
            # GraphQL: a pool's reservations walked by their cursors, then odd paging.
            for note in ("visible", rng.choice(others)):
                first_rsv, after_rsv = rng.choice((1, 2)), None
                for _ in range(max_pages):
                    variables = {"t": t, "p": targets[note], "first": first_rsv}
                    variables["after"] = after_rsv
                    call = _graphql(
                        "graphql reservations", reader, queries.reservations, variables, note
                    )
                    answer = await compare(pair, log, call, report)
                    pool_data = ((answer.json() or {}).get("data") or {}).get("pool") or {}
                    info = (pool_data.get("reservations") or {}).get("pageInfo") or {}
                    if not info.get("hasNextPage"):
                        break
                    after_rsv = info.get("endCursor")
            odd_page = rng.choice(
                [{"first": 101}, {"first": 0}, {"first": 1, "after": "bm90LWEtY3Vyc29y"}, {}]
            )
            variables = {"t": t, "p": targets["visible"], **odd_page}
            call = _graphql("graphql reservations", reader, queries.reservations, variables, "odd")
            await compare(pair, log, call, report)
        await _late_changes(pair, world, rng, queries, log, report)


def _reads_of(reader: Reader, queries: Queries, pool_id: str, note: str) -> list[Call]:
    t = reader.tenant
    return [
        _graphql("graphql pools", reader, queries.nodes, {"t": t, "first": 100}, note),
        *_one_pool_reads(reader, queries, pool_id, note),
        _list(reader, {"tenantId": t}, note),
        *_lending_reads(reader, queries, None, note),
        # A narrowed binding's `where` check (its explanation is the plain path's).
        *_access_reads(reader, queries, pool_id, "compute:pools:read", note),
        _reservations(reader, {"tenantId": t}, note),
        _reservations(reader, {"tenantId": t, "poolId": pool_id}, note),
    ]


def _one_pool_reads(reader: Reader, queries: Queries, pool_id: str, note: str) -> list[Call]:
    """`pool` and `get`, then the pool's quota rows and its rollup on each surface."""
    t = reader.tenant
    return [
        _graphql("graphql pool", reader, queries.one, {"t": t, "p": pool_id}, note),
        _get(reader, {"tenantId": t, "poolId": pool_id}, note),
        _graphql("graphql quotas", reader, queries.quotas, {"t": t, "p": pool_id}, note),
        _graphql("graphql capacity", reader, queries.capacity, {"t": t, "p": pool_id}, note),
        _capacity(reader, {"tenantId": t, "poolId": pool_id}, note),
    ]


async def _late_changes(
    pair: Pair, world: World, rng: random.Random, queries: Queries, log: AccessLog, report: Report
) -> None:
    """Readers the fast service has answered (and remembers), then narrowed or revoked:
    each is answered as it is now."""
    app: Any = pair.plain._transport.app  # type: ignore[attr-defined]
    capacity: Capacity = app.state.capacity
    for n, reader in enumerate(world.late):
        listing = _reads_of(reader, queries, MISSING_POOL, "before")[0]
        seen = _node_ids(await compare(pair, log, listing, report))
        pool_id = rng.choice(seen or [p.id for p in world.pools])
        for call in _reads_of(reader, queries, pool_id, "before")[1:]:
            await compare(pair, log, call, report)
        if n == 0:
            where = rng.choice(NARROWINGS)
            principal = await authenticate(capacity.db, f"Bearer {reader.token}")
            async with capacity.unit_of_work() as uow:
                await rebind_caller(uow, principal.caller_id, reader.role or "admin", where)
            changed = replace(reader, name=f"{reader.name}/narrowed", conditions=where)
        else:
            await revoke_token(capacity.db, reader.token)
            changed = replace(reader, name=f"{reader.name}/revoked", revoked=True)
        for call in _reads_of(changed, queries, pool_id, "after"):
            await compare(pair, log, call, report)


# --- the tests -------------------------------------------------------------------------


async def _generated(pair: Pair, fleet: Fleet, size: Size) -> tuple[World, random.Random]:
    seed = run_seed()
    rng = random.Random(seed)
    try:
        world = await build_world(rng, seed, pair.plain, fleet, size)
    except BaseException as exc:
        exc.add_note(f"building the world: {replay(seed)}")
        raise
    return world, rng


@by_size("size", DEFAULT, SOAK, ids=("default", "soak"))
@pytest.mark.slow
async def test_the_read_paths_answer_alike_over_generated_data(
    database_url: str, fleet: Fleet, size: Size
) -> None:
    async with services(database_url) as pair:
        world, rng = await _generated(pair, fleet, size)
        report = await run_differential(pair, world, rng, max_pages=8 if size is SOAK else 2)
        compiling = compiles(pair.fast)
    print(report.summary())
    assert not report.differences, report.failure()
    kinds = (
        "graphql pools",
        "graphql pool",
        "graphql quotas",
        "graphql capacity",
        "rest get",
        "rest list",
        "rest capacity",
        "graphql lending",
        "rest lending",
        "graphql access",
        "rest explain",
        "rest reservations",
        "graphql reservations",
    )
    if compiling:  # the compiled path answered every surface: the comparison could fail
        missing = [k for k in kinds if report.compiled[k] == 0]
        assert not missing, f"never compiled: {missing}; {report.summary()}"
    else:
        assert sum(report.compiled.values()) == 0, report.summary()
    # The data reached every case: pools seen and not, errors of each kind.
    for outcome in ("graphql pool 200 ok", "graphql pool 200 NOT_FOUND", "rest get 404 NOT_FOUND"):
        assert report.outcomes[outcome], (outcome, report.summary())
    for outcome in (
        "rest get 200 ok",
        "rest get 400 INVALID_INPUT",
        "rest get 401 UNAUTHENTICATED",
        "rest list 200 ok",
        "rest capacity 200 ok",
        "rest capacity 404 NOT_FOUND",
        "graphql quotas 200 ok",
        "graphql quotas 200 NOT_FOUND",
        "graphql capacity 200 ok",
        "graphql lending 200 ok",
        "rest lending 200 ok",
        "rest lending 400 INVALID_INPUT",
        "graphql access 200 ok",
        "graphql access 200 NOT_FOUND",
        "rest explain 200 ok",
        "rest explain 404 NOT_FOUND",
        "rest explain 400 INVALID_INPUT",
        "rest reservations 200 ok",
        "rest reservations 404 NOT_FOUND",
        "rest reservations 400 INVALID_INPUT",
        "graphql reservations 200 ok",
        "graphql reservations 200 INVALID_INPUT",
    ):
        assert report.outcomes[outcome], (outcome, report.summary())


# --- the traces ------------------------------------------------------------------------


@dataclass(frozen=True)
class Trace:
    """The spans of one request's trace that are compared, and its SQL spans' count."""

    http: tuple[str, ...]  # the server span and its http send/receive spans, sorted
    graphql: tuple[str, ...]  # the GraphQL operation's span (component graphql)
    sql: int

    @classmethod
    def of(cls, finished: tuple[Any, ...]) -> Trace:
        (server,) = [s for s in finished if (s.attributes or {}).get("http.route")]
        mine = [s for s in finished if s.context.trace_id == server.context.trace_id]
        sql = [s for s in mine if (s.attributes or {}).get("db.system")]
        operations = [
            s.name
            for s in mine
            if s.name.startswith("GraphQL Query")
            and (s.attributes or {}).get("component") == "graphql"
        ]
        http = [s.name for s in mine if s not in sql and not s.name.startswith("GraphQL")]
        return cls(tuple(sorted(http)), tuple(sorted(operations)), len(sql))


async def _traces(
    database_url: str, compiled: bool, calls: list[Call], exporter: InMemorySpanExporter
) -> list[tuple[Trace, bool]]:
    """Each call's trace on one service alone (tracing instruments the process's engines
    once: two services at once would share it), and whether it was answered compiled."""
    quiet = {"event_poll_interval_s": 3600, "revocation_poll_interval_s": 3600}
    found: list[tuple[Trace, bool]] = []
    async with _client(_settings(database_url, compiled, **quiet)) as client:
        for call in calls:
            for _ in range(2 if compiled else 1):  # the first teaches the query text
                exporter.clear()
                before = _answered()
                await send(client, call)
            found.append((Trace.of(exporter.get_finished_spans()), _answered() > before))
    return found


async def test_the_traces_name_the_same_spans(
    database_url: str,
    fleet: Fleet,
    spans: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With tracing on, each read's trace names the same HTTP and GraphQL spans on both
    paths, and holds a SQL span on each. Compared: the HTTP server span and its
    send/receive spans, and the GraphQL operation span (`GraphQL Query: <name>`).
    Not compared: strawberry's parsing, validation and resolver spans (a compiled read
    runs no GraphQL execution: app/tracing.py), and `DECLINED_SPAN` (the compiled try
    that gave way to the plain path, which records the operation's span itself)."""
    monkeypatch.delenv("OTEL_TRACES_EXPORTER")  # the world is built untraced
    async with services(database_url) as pair:
        world, rng = await _generated(pair, fleet, BITE)
        compiling = compiles(pair.fast)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")  # what an operator sets
    queries = Queries.generate(rng, world.seed)
    calls: list[Call] = []
    for reader in rng.sample(world.readers, k=6) + [r for r in world.readers if r.revoked][:1]:
        t = reader.tenant
        pool = rng.choice(world.pools).id
        calls += [
            _graphql("graphql pools", reader, queries.page, {"t": t, "first": 2}, "page"),
            _graphql("graphql pool", reader, queries.one, {"t": t, "p": pool}, "one"),
            _graphql("graphql pool", reader, queries.one, {"t": t, "p": MISSING_POOL}, "missing"),
            _get(reader, {"tenantId": t, "poolId": pool}, "one"),
            _get(reader, {"tenantId": t, "poolId": pool, "colour": "red"}, "an unknown field"),
            _capacity(reader, {"tenantId": t, "poolId": pool}, "one"),
            _graphql("graphql quotas", reader, queries.quotas, {"t": t}, "every pool"),
            _graphql("graphql capacity", reader, queries.capacity, {"t": t, "p": pool}, "one"),
            *_lending_reads(reader, queries, 2, "a few"),
            *_access_reads(reader, queries, pool, rng.choice(PERMISSIONS), "one"),
            _reservations(reader, {"tenantId": t}, "all"),
            _reservations(reader, {"tenantId": t, "poolId": pool}, "one"),
        ]
    fast = await _traces(database_url, True, calls, spans)
    plain = await _traces(database_url, False, calls, spans)
    problems = []
    for call, (f, answered), (p, _) in zip(calls, fast, plain, strict=True):
        if (f.http, f.graphql) != (p.http, p.graphql) or not f.sql or not p.sql:
            problems.append(f"- {call.describe()} (compiled: {answered})\n  plain {p}\n  fast  {f}")
    assert not problems, f"{replay(world.seed)}\n" + "\n".join(problems)
    for call, (f, _), (p, _) in zip(calls, fast, plain, strict=True):
        authenticated = call.reader.role is not None and not call.reader.revoked
        if call.kind.startswith("graphql") and authenticated:  # the operation ran
            assert len(p.graphql) == 1, (call.describe(), p, f)
    if compiling:
        assert any(answered for _, answered in fast), replay(world.seed)


# --- it bites ----------------------------------------------------------------------------


def _drop_archived_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled builder only: archived pools seen by every tenant that is granted
    them (the owner's subtree, by its includeDescendants offer)."""
    from sqlalchemy import true

    from app.capacity import json_reads

    monkeypatch.setattr(json_reads, "pool_seen_by", lambda *_: true())


def _reorder_quotas(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plain path only: a pool's quota rows in reverse resource order."""
    from app.capacity import reads
    from app.db.models import QuotaRow

    reordered = reads._QUOTAS_OF.order_by(None).order_by(QuotaRow.pool_id, QuotaRow.resource.desc())
    monkeypatch.setattr(reads, "_QUOTAS_OF", reordered)


def _drop_grant_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled builder only: a quota row's grant without its `priority`."""
    from app.capacity import json_reads
    from app.capacity.shapes import Read

    stock = json_reads._fields

    def without_priority(kind: str, fields: tuple[Any, ...], row: Any) -> Any:
        if kind == "grant":
            fields = tuple(f for f in fields if not (isinstance(f, Read) and f.value == "priority"))
        return stock(kind, fields, row)

    monkeypatch.setattr(json_reads, "_fields", without_priority)


def _lend_the_owners_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled builder only: the lender's sums count the owner's own quota rows as
    lent (every offer holder's but no one's)."""
    from sqlalchemy import String, literal

    from app.capacity import json_reads, read_rules

    def with_the_owner(_owner: Any, *where: Any) -> Any:
        return read_rules.capacity_lent(literal("", String), *where)

    monkeypatch.setattr(json_reads, "capacity_lent", with_the_owner)


def _archived_shown(d: Difference) -> bool:
    """REST `get` finds a pool the plain path does not (404), or a page lists more."""
    if d.aspect == "status":
        return (d.plain, d.fast) == (404, 200)
    return d.aspect == "body" and d.call.kind == "graphql pools" and d.compiled


def _quotas_reordered(d: Difference) -> bool:
    return d.aspect == "body" and _without_quota_order(d.plain) == _without_quota_order(d.fast)


def _grant_priority_dropped(d: Difference) -> bool:
    return d.aspect == "body" and b'"priority"' in d.plain and d.compiled


def _owners_rows_lent(d: Difference) -> bool:
    """A compiled answer's lender's values differ (`offered` more, say)."""
    return d.aspect == "body" and d.compiled and b'"offered":' in d.plain


def _without_quota_order(body: bytes) -> Any:
    """The body with every `quotas` list sorted: equal when only their order differs."""

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: sorted((walk(i) for i in v), key=repr)
                if k == "quotas" and isinstance(v, list)
                else walk(v)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [walk(i) for i in value]
        return value

    return walk(json.loads(body))


BITES: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], Callable[[Difference], bool]]] = {
    "compiled-drops-archived-filter": (_drop_archived_filter, _archived_shown),
    "plain-reorders-quotas": (_reorder_quotas, _quotas_reordered),
    "compiled-drops-grant-priority": (_drop_grant_priority, _grant_priority_dropped),
    "compiled-lends-the-owners-rows": (_lend_the_owners_rows, _owners_rows_lent),
}


@pytest.mark.parametrize("bite", list(BITES))
async def test_a_one_sided_change_is_reported(
    database_url: str, fleet: Fleet, bite: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same comparison over the same kind of generated data, with one side changed
    (patched into the real module before the services are built): it reports
    differences, and they are the change's."""
    patch, expected = BITES[bite]
    patch(monkeypatch)
    async with services(database_url) as pair:
        if not compiles(pair.fast):
            pytest.skip("the compiled reads do not run on this dialect: both sides are plain")
        world, rng = await _generated(pair, fleet, BITE)
        report = await run_differential(pair, world, rng, max_pages=2, until=expected)
    print(report.summary())
    assert report.differences, f"{bite} went unnoticed; {report.summary()}"
    of_the_change = [d for d in report.differences if expected(d)]
    assert of_the_change, f"{bite}: other differences only; {report.failure()}"
    print(f"{bite}: reported after {report.comparisons} comparisons:")
    print(of_the_change[0].describe())
