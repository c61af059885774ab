"""No N+1: the statements behind a nested page do not grow with the page."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY
from sqlalchemy import event
from starlette.applications import Starlette

from app.capacity import pools
from app.capacity.inputs import CreatePoolInput, parse_input
from app.capacity.service import Capacity
from app.iam.callers import authenticate
from tests.support import Api, Fleet

NESTED = """query($first: Int!) { pools(tenantId: "acme", first: $first) {
  nodes { id quotas { resource max used } capacity { resource total available }
          offers { tenantId quotas { resource max } } } } }"""


def _direct_statements() -> float:
    found = REGISTRY.get_sample_value("bettercompute_db_statements_total", {"pool": "direct"})
    return found or 0.0


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

    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    engines = {capacity.db.reader.sync_engine, capacity.db.writer.sync_engine}
    for engine in engines:
        event.listen(engine, "before_cursor_execute", count)
    try:
        counts = {}
        # Once first: the compiled path (on by default) plans a query text after it has
        # run once, and remembers the caller.
        await api.graphql(token, NESTED, {"first": 1})
        for first in (1, 10, 100):
            statements.clear()
            direct = _direct_statements()
            answer = await api.graphql(token, NESTED, {"first": first})
            assert "errors" not in answer, answer
            nodes = answer["data"]["pools"]["nodes"]
            assert len(nodes) == first
            assert all(n["offers"][0]["tenantId"] == "acme" for n in nodes)
            # The compiled read's statement goes through its own pool (app/db/direct.py).
            counts[first] = len(statements) + int(_direct_statements() - direct)
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", count)
    print(f"statements for pools(first: N) with quotas, capacity, offers: {counts}")
    assert counts[1] == counts[10] == counts[100], counts
    if capacity.db.dialect == "postgresql" and app.state.settings.fast_path:
        assert counts[1] == 1, counts  # one round trip: the compiled statement
