"""The compiled read path answers exactly as the plain path (stock Strawberry over the
domain): same status, same headers, same bytes, for a corpus of queries (hand-written
and generated: aliases, fragments, @skip/@include, variables, nulls, per-field denials,
paging, every root field) and callers (owner, guest, descendant, fleet admin, narrowed,
without share, revoked, rebound), on both dialects.

Two apps serve one database: `fast` (the default settings) and `plain`
(BETTERCOMPUTE_FAST_PATH=false). Each request goes to `fast` twice (the first teaches it
the query text, the second may be compiled) and to `plain` once.
"""

from __future__ import annotations

import random
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from app.iam.callers import revoke_token
from tests.compiled_world import CALLERS, Pair, World, pair, world
from tests.support import Fleet, by_size

__all__ = ["pair", "world"]  # fixtures
# The compiled path against the plain one: nothing to compare on the plain path.
pytestmark = pytest.mark.fast_path

# --- the corpus ------------------------------------------------------------------------

POOL_VALUES = [
    "id",
    "tenantId",
    "siteId",
    "class",
    "gpuModel",
    "sharing",
    "agent",
    "providerAccountId",
    "region",
    "displayName",
    "labels",
    "owned",
    "archived",
    "version",
    "createdAt",
    "updatedAt",
    "policy",
    "__typename",
]
QUOTA = (
    "poolId resource max used __typename "
    "grant { via tenantId includeDescendants priority offeredAt __typename }"
)
CAPACITY = "resource total allocatable booked available __typename"
OFFERS = (
    "tenantId includeDescendants priority __typename "
    "quotas { resource max used grant { tenantId } }"
)

DASHBOARD = """query Dashboard($tenantId: String!, $first: Int, $after: String) {
  pools(tenantId: $tenantId, first: $first, after: $after) {
    pageInfo { hasNextPage endCursor }
    nodes { id class gpuModel sharing region owned archived version
            quotas { resource max used } capacity { resource available } } } }"""
ONE = """query One($tenantId: String!, $poolId: ID!) {
  pool(tenantId: $tenantId, poolId: $poolId) { id quotas { resource max used } } }"""

# (query, variables by the callers' tenant; `$POOL` is replaced by a pool id)
SELECTED = """query Selected($tenantId: String!, $selector: String, $first: Int) {
  pools(tenantId: $tenantId, labelSelector: $selector, first: $first) {
    pageInfo { hasNextPage endCursor } nodes { id displayName labels } } }"""

HAND_WRITTEN: list[tuple[str, dict[str, Any]]] = [
    # A label selector: the compiled page declines it, the plain path answers.
    (SELECTED, {"selector": "team=ml"}),
    (SELECTED, {"selector": "team in (ml, web), example.com/tier!=silver", "first": 1}),
    (SELECTED, {"selector": "!team"}),
    (SELECTED, {"selector": None}),
    (SELECTED, {}),
    (SELECTED, {"selector": "team in (ml"}),  # INVALID_INPUT
    (
        """query($t: String!) { pools(tenantId: $t, labelSelector: "env") {
             nodes { id labels } } }""",
        {},
    ),
    (DASHBOARD, {"first": 100}),
    (DASHBOARD, {"first": 2}),
    (DASHBOARD, {"first": 0}),
    (DASHBOARD, {"first": 101}),  # INVALID_INPUT
    (DASHBOARD, {"first": 2, "after": "bm90LWEtY3Vyc29y"}),  # not a cursor
    (DASHBOARD, {"first": None, "after": None}),  # nulls: the default page
    (DASHBOARD, {}),
    (ONE, {"poolId": "$POOL"}),
    (ONE, {"poolId": "pool_01j00000000000000000000000"}),  # no such pool
    (ONE, {"poolId": "nope"}),  # INVALID_INPUT
    (
        """query($t: String!) { __typename a: pools(tenantId: $t, first: 3) {
             __typename items: nodes { key: id, id, quotas { max } quotas { used resource } }
             edges { cursor __typename node { id version } }
             pageInfo { hasPreviousPage startCursor endCursor hasNextPage __typename } } }""",
        {},
    ),
    (
        """fragment Q on Quota { resource max }
           fragment P on Pool { id ...on Pool { owned quotas { ...Q used } } }
           query($t: String!, $all: Boolean!, $few: Boolean = false) {
             pools(tenantId: $t) { nodes { ...P capacity @include(if: $all) { total }
                                           policy @skip(if: $few) gpuModel @skip(if: true)
                                           region @include(if: false) } } }""",
        {"all": True},
    ),
    (
        """query($t: String!, $all: Boolean!) { pools(tenantId: $t) {
             nodes @include(if: $all) { id } pageInfo @skip(if: $all) { endCursor } } }""",
        {"all": False},
    ),
    (
        """query($t: String!) { pools(tenantId: $t) { nodes { id offers { OFFERS }
             quotas { QUOTA } capacity { CAPACITY } } } }""",
        {},
    ),
    (
        """query($t: String!) { pools(tenantId: $t) { nodes { POOL_VALUES
             capacity { offered guestUsed overcommit resource } } } }""",
        {},
    ),
    (
        """query($t: String!) { pools(tenantId: $t) { nodes { id lending { tenantId }
             reservations(first: 1) { nodes { id } } } } }""",
        {},
    ),
    (
        """query($t: String!, $p: ID!) { capacity(tenantId: $t, poolId: $p) { resource total } }""",
        {"p": "$POOL"},
    ),
    ("""query($t: String!) { quotas(tenantId: $t) { poolId resource max used } }""", {}),
    (
        """query($t: String!, $p: ID!) { access(tenantId: $t, poolId: $p,
          permission: "compute:pools:share") { allowed } }""",
        {"p": "$POOL"},
    ),
    ("""query($t: String!) { lending(tenantId: $t) { poolId resource offered } }""", {}),
    ("""{ catalog { name } __typename }""", {}),
    (
        """query($t: String!, $p: ID!) { pool(tenantId: $t, poolId: $p) {
             POOL_VALUES quotas { QUOTA } capacity { CAPACITY } offers { OFFERS } } }""",
        {"p": "$POOL"},
    ),
    (
        """query A($t: String!) { pools(tenantId: $t) { nodes { id } } }
           query B($t: String!) { pools(tenantId: $t) { pageInfo { endCursor } } }""",
        {"@operationName": "B"},
    ),
    ("""query($t: String!) { pools(tenantId: $t, first: "x") { nodes { id } } }""", {}),
    ("""query($t: Int!) { pools(tenantId: $t) { nodes { id } } }""", {}),  # t is a string
    ("""query($t: String!) { pools(tenantId: $t) { nodes { id } } }""", {"t": None}),
]


def generated(count: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    """Random selections over the Pool type: random fields and nesting, aliases,
    fragments (named and inline), @skip/@include on literals and variables."""
    rng = random.Random(seed)

    def alias(name: str) -> str:
        return f"{rng.choice('abcxyz')}{rng.randint(0, 9)}: {name}" if rng.random() < 0.2 else name

    def directive() -> str:
        roll = rng.random()
        if roll < 0.1:
            return " @include(if: $flag)"
        if roll < 0.15:
            return " @skip(if: $flag)"
        if roll < 0.2:
            return f" @skip(if: {rng.choice(['true', 'false'])})"
        return ""

    def pick(fields: str, most: int) -> str:
        chosen = rng.sample(fields.split(), rng.randint(1, min(most, len(fields.split()))))
        return " ".join(alias(f) + directive() for f in chosen)

    def pool_selection() -> str:
        parts = [pick(" ".join(v for v in POOL_VALUES), 6)]
        if rng.random() < 0.7:
            parts.append(
                alias("quotas")
                + directive()
                + " { "
                + pick("resource max used poolId __typename", 4)
                + (" grant { tenantId priority offeredAt }" if rng.random() < 0.3 else "")
                + " }"
            )
        if rng.random() < 0.5:
            parts.append(alias("capacity") + " { " + pick(CAPACITY, 3) + " }")
        if rng.random() < 0.2:
            parts.append("offers { tenantId quotas { max } }")
        if rng.random() < 0.05:
            parts.append("reservations { nodes { id } }")
        rng.shuffle(parts)
        body = " ".join(parts)
        if rng.random() < 0.3:
            body = f"... on Pool {{ {body} }} id"
        return body

    corpus: list[tuple[str, dict[str, Any]]] = []
    for i in range(count):
        flag = rng.choice([True, False])
        uses_fragment = rng.random() < 0.3
        selection = "...F" if uses_fragment else pool_selection()
        fragment = f"fragment F on Pool {{ {pool_selection()} }}" if uses_fragment else ""
        if rng.random() < 0.7:
            first = rng.choice([1, 2, 3, 50, 100])
            inner = rng.choice(
                [
                    f"nodes {{ {selection} }}",
                    f"edges {{ cursor node {{ {selection} }} }} "
                    "pageInfo { hasNextPage endCursor }",
                    f"pageInfo {{ startCursor }} nodes {{ {selection} }} nodes {{ id }}",
                ]
            )
            query = (
                f"query Q{i}($t: String!, $flag: Boolean!, $first: Int) "
                f"{{ {alias('pools')}(tenantId: $t, first: $first) {{ {inner} }} }} {fragment}"
            )
            corpus.append((query, {"flag": flag, "first": first}))
        else:
            query = (
                f"query Q{i}($t: String!, $p: ID!, $flag: Boolean!) "
                f"{{ {alias('pool')}(tenantId: $t, poolId: $p) {{ {selection} }} }} {fragment}"
            )
            corpus.append((query, {"flag": flag, "p": "$POOL"}))
    return corpus


def _answered() -> float:
    return (
        REGISTRY.get_sample_value("bettercompute_compiled_reads_total", {"outcome": "answered"})
        or 0.0
    )


async def _post(client: httpx.AsyncClient, token: str, body: dict[str, Any]) -> tuple[Any, ...]:
    response = await client.post(
        "/graphql", json=body, headers={"authorization": f"Bearer {token}"}
    )
    headers = {k: v for k, v in response.headers.items() if k != "x-request-id"}
    return response.status_code, headers, response.content


async def _compare(
    pair: Pair, world: World, query: str, variables: dict[str, Any], caller: str, pool: str
) -> None:
    variables = dict(variables)
    name = variables.pop("@operationName", None)
    variables.setdefault("t", CALLERS[caller])
    variables.setdefault("tenantId", CALLERS[caller])
    for key, value in variables.items():
        if value == "$POOL":
            variables[key] = world.pools[pool]
    for marker, text in (
        ("POOL_VALUES", " ".join(POOL_VALUES)),
        ("OFFERS", OFFERS),
        ("QUOTA", QUOTA),
        ("CAPACITY", CAPACITY),
    ):
        query = query.replace(marker, text)
    body = {"query": query, "variables": variables, "operationName": name}
    token = world.tokens[caller]
    plain = await _post(pair.plain, token, body)
    first = await _post(pair.fast, token, body)
    second = await _post(pair.fast, token, body)
    context = f"caller={caller} pool={pool}\n{query}\n{variables}"
    assert first == plain, context
    assert second == plain, context


@by_size("size", "default", "full")
async def test_hand_written_queries_answer_alike(
    pair: Pair, world: World, dialect: str, size: str
) -> None:
    """Every query for every caller and pool (`full`, the soak set: 340 comparisons; it
    took 3 minutes at load 10); the default run takes each query for half the callers,
    each caller for half the queries, the pools in turn (130)."""
    before = _answered()
    callers = list(CALLERS)
    for q, (query, variables) in enumerate(HAND_WRITTEN):
        for c, caller in enumerate(callers):
            pools = ("p0", "p2", "p4") if "$POOL" in variables.values() else ("p0",)
            if size == "default":
                if (q + c) % 2:
                    continue
                pools = (pools[(q + c) // 2 % len(pools)],)
            for pool in pools:
                await _compare(pair, world, query, variables, caller, pool)
    answered = _answered() - before
    print(f"compiled answers: {answered}")
    # the compiled path did answer (not only decline), on both dialects
    assert answered >= (60 if size == "full" else 25), (dialect, answered)


async def test_generated_queries_answer_alike(pair: Pair, world: World, dialect: str) -> None:
    before = _answered()
    callers = [
        "acme-admin",
        "acme-viewer",
        "globex-viewer",
        "dev-viewer",
        "fleet-admin",
        "acme-narrowed",
    ]
    for i, (query, variables) in enumerate(generated(80, seed=8)):
        caller = callers[i % len(callers)]
        await _compare(pair, world, query, variables, caller, ("p0", "p1", "p2", "p4")[i % 4])
    answered = _answered() - before
    print(f"compiled answers: {answered}")
    assert answered >= 20, (dialect, answered)


async def test_a_long_query_text_is_never_planned(pair: Pair, world: World, dialect: str) -> None:
    """Plans are kept by query text: one longer than MAX_PLANNED_QUERY_CHARS (here a
    long comment) answers alike on the plain path, and is not kept."""
    from schema.compiled_reads import MAX_PLANNED_QUERY_CHARS

    token = world.tokens["acme-admin"]
    padding = "# " + "x" * MAX_PLANNED_QUERY_CHARS + "\n"
    body = {"query": padding + 'query { pools(tenantId: "acme") { nodes { id } } }'}
    before = _answered()
    answers = [await _post(pair.fast, token, body) for _ in range(3)]
    assert answers[0][0] == 200
    assert answers == [await _post(pair.plain, token, body)] * 3
    assert _answered() == before
    # The same query, short, is planned and answered (on both dialects).
    short = {"query": 'query { pools(tenantId: "acme") { nodes { id } } }'}
    for _ in range(2):
        await _post(pair.fast, token, short)
    assert _answered() == before + 1, dialect


async def test_malformed_requests_answer_alike(pair: Pair, world: World) -> None:
    """Fields of the wrong JSON type are refused as the plain path refuses them, for a
    caller the compiled path remembers too."""
    token = world.tokens["acme-admin"]
    query = 'query { pools(tenantId: "acme") { nodes { id } } }'
    for _ in range(2):  # learnt and remembered
        assert (await _post(pair.fast, token, {"query": query}))[0] == 200
    for bad in (
        {"query": query, "extensions": "x"},
        {"query": query, "extensions": []},
        {"query": query, "variables": "x"},
        {"query": query, "variables": []},
        {"query": query, "operationName": 5},
        {"query": 5},
        {"query": query, "extensions": {"persistedQuery": "x"}},
    ):
        assert await _post(pair.fast, token, bad) == await _post(pair.plain, token, bad), bad


async def test_a_rebound_or_revoked_caller_is_answered_as_now(
    pair: Pair, world: World, fleet: Fleet
) -> None:
    """The compiled statement checks the token and role binding it was planned for: a
    caller remembered as admin and since narrowed, or revoked, gets today's answer."""
    from app.capacity.service import Capacity
    from app.iam.callers import rebind_caller
    from app.iam.principal import Principal  # noqa: F401

    token = await fleet.caller("acme", "admin")
    body = {"query": DASHBOARD, "variables": {"tenantId": "acme", "first": 10}}
    for _ in range(2):  # learnt and remembered
        assert (await _post(pair.fast, token, body))[0] == 200
    app = pair.fast._transport.app  # type: ignore[attr-defined]
    capacity: Capacity = app.state.capacity
    from app.iam.callers import authenticate

    principal = await authenticate(capacity.db, f"Bearer {token}")
    async with capacity.unit_of_work() as uow:
        await rebind_caller(uow, principal.caller_id, "admin", {"gpuModel": "H100"})
    assert await _post(pair.fast, token, body) == await _post(pair.plain, token, body)
    async with capacity.unit_of_work() as uow:
        await rebind_caller(uow, principal.caller_id, "viewer")
    assert await _post(pair.fast, token, body) == await _post(pair.plain, token, body)
    await revoke_token(fleet.db, token)
    revoked = await _post(pair.fast, token, body)
    assert revoked == await _post(pair.plain, token, body)
    assert b"UNAUTHENTICATED" in revoked[2]
    # Whatever else is wrong with the request, a revoked token is what it is told.
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    for bad in (b"{not json", b'{"query": 5}', b'{"extensions": {"persistedQuery": 1}}'):
        answers = [
            await client.post("/graphql", content=bad, headers=headers)
            for client in (pair.fast, pair.plain)
        ]
        assert answers[0].content == answers[1].content, bad
        assert b"UNAUTHENTICATED" in answers[0].content, answers[0].content


async def test_unknown_or_misspelled_input_answers_alike(
    pair: Pair, world: World, dialect: str
) -> None:
    """REST's unknown-field drift (issue 19, item 6) on GraphQL: variables the operation
    does not declare, misspelled ones, and unknown keys of the request object answer as
    the plain path answers them, for a caller and query text the compiled path knows."""
    token = world.tokens["acme-admin"]
    pool = world.pools["p0"]
    one = {"tenantId": "acme", "poolId": pool}
    page = {"tenantId": "acme", "first": 2}
    bodies: list[dict[str, Any]] = [
        {"query": ONE, "variables": {**one, "colour": "red"}},
        {"query": ONE, "variables": {**one, "version": 1, "dryRun": True}},
        {"query": ONE, "variables": {"tenantid": "acme", "poolId": pool}},
        {"query": ONE, "variables": {"tenantId": "acme", "poolid": pool}},
        {"query": ONE, "variables": one, "colour": "red"},
        {"query": ONE, "variabels": one},
        {"query": DASHBOARD, "variables": {**page, "frist": 1}},
        {"query": DASHBOARD, "variables": {**page, "tenant_id": "globex"}},
        {"query": DASHBOARD, "variables": page, "dryRun": True},
    ]
    for body in ({"query": ONE, "variables": one}, {"query": DASHBOARD, "variables": page}):
        for _ in range(2):  # learnt and remembered
            assert (await _post(pair.fast, token, body))[0] == 200
    before = _answered()
    for body in bodies:
        plain = await _post(pair.plain, token, body)
        for _ in range(2):
            assert await _post(pair.fast, token, body) == plain, body
    assert _answered() > before, dialect  # answered where the plain path answers data
