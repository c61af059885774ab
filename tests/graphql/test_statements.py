"""No N+1: the statements behind a nested page do not grow with the page."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from prometheus_client import REGISTRY
from starlette.applications import Starlette

from app.capacity import pools
from app.capacity.inputs import CreatePoolInput, parse_input
from app.capacity.service import Capacity
from app.config import Settings
from app.iam.callers import authenticate
from app.server import create_app
from tests.events.support import settle
from tests.support import Api, Fleet

NESTED = """query($first: Int!) { pools(tenantId: "acme", first: $first) {
  nodes { id quotas { resource max used } capacity { resource total available }
          offers { tenantId quotas { resource max } } } } }"""


@pytest_asyncio.fixture(loop_scope="session")
async def app(database_url: str) -> AsyncIterator[Starlette]:
    """The app with its outbox and revocation pollers quiet: a poll during a request would
    be counted with it (a slow request, on a busy machine or the plain path, meets one)."""
    quiet = Settings(
        database_url=database_url, event_poll_interval_s=3600, revocation_poll_interval_s=3600
    )
    application = create_app(quiet)
    async with application.router.lifespan_context(application):
        yield application


def _graphql_statements() -> float:
    """Every statement a GraphQL request sent, the compiled reads' direct pool's too."""
    found = REGISTRY.get_sample_value("bettercompute_db_statements_total", {"transport": "graphql"})
    return found or 0.0


def _compiled_answers() -> float:
    labels = {"outcome": "answered"}
    return REGISTRY.get_sample_value("bettercompute_compiled_reads_total", labels) or 0.0


async def test_statements_do_not_grow_with_the_page(app: Starlette, api: Api, fleet: Fleet) -> None:
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    token = await fleet.caller("acme", "admin")
    capacity: Capacity = app.state.capacity
    # 100 pools made by the domain's create in one unit of work: the same rows as 100 REST
    # calls, without 100 transactions.
    principal = await authenticate(capacity.db, f"Bearer {token}")
    body = {"tenantId": "acme", "siteId": site, "class": "metal-host", "ownerQuota": {"gpu": 4}}
    async with capacity.unit_of_work() as uow:
        made = [
            await pools.create_pool(uow, principal, parse_input(CreatePoolInput, body))
            for _ in range(100)
        ]
    for pool in made[:3]:
        await fleet.node(pool.pool.id, 2)

    await settle(app)  # the relay has read the seeding's events: nothing else reads now
    counts = {}
    # Once first: the compiled path (on by default) plans a query text after it has run
    # once, and remembers the caller.
    await api.graphql(token, NESTED, {"first": 1})
    answered = _compiled_answers()
    for first in (1, 10, 100):
        before = _graphql_statements()
        answer = await api.graphql(token, NESTED, {"first": first})
        assert "errors" not in answer, answer
        nodes = answer["data"]["pools"]["nodes"]
        assert len(nodes) == first
        assert all(n["offers"][0]["tenantId"] == "acme" for n in nodes)
        counts[first] = int(_graphql_statements() - before)
    print(f"statements for pools(first: N) with quotas, capacity, offers: {counts}")
    assert counts[1] == counts[10] == counts[100], counts
    if app.state.settings.compiled_reads:
        # The compiled statement alone, on both dialects: on PostgreSQL's direct pool (or
        # its engine's connection), or behind PgBouncer in a transaction that begins with
        # its transaction-local settings (app/db/engine.py); on SQLite on its own
        # connections (or the read pool's), outside a transaction.
        pooled = capacity.db.pooled_by_transaction
        assert counts[1] == (2 if pooled else 1), counts
        # ... and it is the compiled statement that answered each page.
        assert _compiled_answers() - answered == 3, capacity.db.dialect
