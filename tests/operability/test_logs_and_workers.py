"""`bettercompute serve --workers 2` as an operator runs it: JSON log lines (stderr is not
a terminal) with the request id from or put in `X-Request-Id`, the caller, tenant,
method or operation, status and duration; no bearer token or policy secret in any line
(with debug logging on); `/metrics` on either worker counts the requests of both."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
from graphql import get_operation_ast, parse

from tests.events.processes import bettercompute_serve
from tests.events.support import wait_until
from tests.graphql.documents import METHODS, to_variables
from tests.operability.scrape import scrape, value
from tests.rest.test_policy_secrets import JOIN_SET
from tests.rest.test_policy_secrets import TOKEN as POLICY_SECRET
from tests.support import Fleet

CREATE = METHODS["create"][0]
REQUESTS = "bettercompute_request_duration_seconds_count"
OPERATION = get_operation_ast(parse(CREATE)).name.value  # type: ignore[union-attr]


def _records(output: str) -> list[dict[str, Any]]:
    """Every line is one JSON object (a partial last line is still being written)."""
    lines = output.splitlines()
    if lines and not output.endswith("\n"):
        lines.pop()
    return [json.loads(line) for line in lines if line.strip()]


def _access(output: str) -> list[dict[str, Any]]:
    return [r for r in _records(output) if r["logger"] == "app.access"]


async def test_json_logs_with_request_ids_and_no_secrets(database_url: str, fleet: Fleet) -> None:
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    token = await fleet.caller("acme", "admin")
    auth = {"authorization": f"Bearer {token}"}
    pool = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
    secret_pool = {**pool, "policy": {"kubernetes": JOIN_SET}}
    async with bettercompute_serve(
        "--workers",
        "2",
        BETTERCOMPUTE_DATABASE_URL=database_url,
        BETTERCOMPUTE_LOG_LEVEL="DEBUG",  # as an operator debugging would, SQL included
    ) as served:
        client = httpx.AsyncClient(base_url=f"http://{served.address}", timeout=60)
        async with client:
            named = await client.post(
                "/api/compute/pools/create",
                json=secret_pool,
                headers={**auth, "x-request-id": "req-operator-1"},
            )
            assert named.status_code == 200, named.text
            assert named.headers["x-request-id"] == "req-operator-1"
            made = await client.post("/api/compute/pools/create", json=pool, headers=auth)
            made_id = made.headers["x-request-id"]
            assert len(made_id) == 32
            for _ in range(6):
                answer = await client.post(
                    "/graphql",
                    json={"query": CREATE, "variables": to_variables("create", secret_pool)},
                    headers=auth,
                )
                assert "errors" not in answer.json(), answer.text
            refused = await client.post("/api/compute/pools/list", json={"tenantId": "acme"})
            assert refused.status_code == 401
            # Every worker connected to its broker (the other one may still be starting);
            # the supervisor is no metrics process, or this would stay 0.
            samples = await scrape(client)
            deadline = time.monotonic() + 60
            while value(samples, "bettercompute_broker_connected") != 1:
                assert time.monotonic() < deadline, "a process never reported its broker"
                await asyncio.sleep(0.1)
                samples = await scrape(client)
        # Each access line is written as its answer goes out: wait for the last ones.
        await wait_until(lambda: len(_access(served.output())) >= 9)
        output = served.output()
    records = _records(output)

    access = _access(output)
    (first,) = [r for r in access if r.get("request_id") == "req-operator-1"]
    assert first["caller_id"].startswith("caller_")
    assert (first["tenant_id"], first["transport"], first["operation"]) == (
        "acme",
        "rest",
        "pools/create",
    )
    assert first["status"] == 200 and first["duration_ms"] > 0
    assert [r["request_id"] for r in access if r.get("request_id") == made_id]
    graphql = [r for r in access if r["operation"] == OPERATION]
    assert len(graphql) == 6 and all(r["cost"] > 0 and r["caller_id"] for r in graphql)
    # Other records of a request carry its id too (SQL statements at debug level).
    assert any(r["logger"].startswith("sqlalchemy") and r.get("request_id") for r in records)
    assert token not in output and POLICY_SECRET not in output

    # Both workers' requests in one scrape (prometheus-client's multiprocess mode).
    assert value(samples, REQUESTS, transport="rest", operation="pools/create") == 2
    assert value(samples, REQUESTS, transport="graphql", operation=OPERATION) == 6
    assert (
        value(samples, "bettercompute_errors_total", transport="rest", code="UNAUTHENTICATED") == 1
    )
