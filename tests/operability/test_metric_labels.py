"""`/metrics` labels come from closed sets, whatever requests send (issue 19, item 1):
random paths under `/api/compute/` with no token are one `unknown` operation, GraphQL
operation names are kept up to METRICS_MAX_OPERATIONS and then counted as `other`, and
every other label of every metric takes one of the values listed here."""

from __future__ import annotations

import asyncio
import secrets

import httpx

from app.catalog import METHODS
from app.metrics import ERROR_CODES
from tests.events.processes import bettercompute_serve
from tests.operability.scrape import parse
from tests.support import Fleet

MAX_OPERATIONS = 5
RANDOM_PATHS = 400
OPERATION_NAMES = 40
REST_OPERATIONS = {m.path.removeprefix("/api/compute/") for m in METHODS} | {"catalog", "unknown"}
# Every label of every metric and the values it may take (`le` is a histogram's bucket).
ALLOWED: dict[str, set[str]] = {
    "transport": {"rest", "graphql", "http", "none", "other"},
    # CONTRACT section 3, and the persisted-query refusals.
    "code": set(ERROR_CODES) | {"other"},
    "outcome": {"answered", "declined", "commit", "rollback"},
    "role": {"writer", "reader"},
    "budget": {"requests", "cost"},
    "how": {"executed", "shared", "frame"},  # bettercompute_event_renderings_total
}


def _random_path(i: int) -> str:
    junk = secrets.token_hex(8)
    return ("/api/compute/x/", "/api/compute/", "/api/compute/pools/list/")[i % 3] + junk


async def test_labels_stay_in_closed_sets(database_url: str, fleet: Fleet) -> None:
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "admin")
    auth = {"authorization": f"Bearer {token}"}
    names = [f"Made{i}_{secrets.token_hex(4)}" for i in range(OPERATION_NAMES)]
    async with bettercompute_serve(
        BETTERCOMPUTE_DATABASE_URL=database_url,
        BETTERCOMPUTE_METRICS_MAX_OPERATIONS=str(MAX_OPERATIONS),
    ) as served:
        limits = httpx.Limits(max_connections=8)
        async with httpx.AsyncClient(
            base_url=f"http://{served.address}", timeout=60, limits=limits
        ) as client:
            paths = [_random_path(i) for i in range(RANDOM_PATHS)]
            answers = await asyncio.gather(*(client.post(p, json={}) for p in paths))
            assert {a.status_code for a in answers} == {404}
            body = {"tenantId": "acme"}
            listed = await client.post("/api/compute/pools/list", json=body, headers=auth)
            assert listed.status_code == 200, listed.text
            refused = await client.post("/api/compute/pools/list", json=body)
            assert refused.status_code == 401
            # Distinct operation names, one after another (the first ones are kept).
            for name in names:
                answer = await client.post(
                    "/graphql", json={"query": f"query {name} {{ __typename }}"}, headers=auth
                )
                assert answer.json()["data"] == {"__typename": "Query"}, answer.text
            for name in names[:2]:  # a kept name stays kept once the bound is reached
                await client.post(
                    "/graphql", json={"query": f"query {name} {{ __typename }}"}, headers=auth
                )
            anonymous = await client.post(
                "/graphql", json={"query": "{ __typename }"}, headers=auth
            )
            assert anonymous.status_code == 200
            scraped = (await client.get("/metrics")).text
    samples = parse(scraped)

    values: dict[str, set[str]] = {}  # prometheus-client's own (python_info...) left out
    for metric, labels in samples:
        if not metric.startswith("bettercompute_"):
            continue
        for label, value in labels:
            values.setdefault(label, set()).add(value)
    operations = {
        dict(labels)["operation"]: (dict(labels)["transport"], count)
        for (metric, labels), count in samples.items()
        if metric == "bettercompute_request_duration_seconds_count"
    }
    rest = {op for op, (transport, _) in operations.items() if transport == "rest"}
    graphql = {op: count for op, (transport, count) in operations.items() if transport == "graphql"}

    assert rest == {"unknown", "pools/list"}
    assert operations["unknown"][1] == RANDOM_PATHS
    assert set(graphql) == {*names[:MAX_OPERATIONS], "other", "anonymous"}
    assert graphql["other"] == OPERATION_NAMES - MAX_OPERATIONS
    assert graphql[names[0]] == graphql[names[1]] == 2
    assert values["operation"] <= REST_OPERATIONS | set(graphql)
    for label, allowed in ALLOWED.items():
        assert values.get(label, set()) <= allowed, label
    assert set(values) <= {*ALLOWED, "operation", "le"}
    # Nothing a request made up reaches the scrape.
    assert not any(p.rsplit("/", 1)[-1] in scraped for p in paths)
    assert not any(name in scraped for name in names[MAX_OPERATIONS:])
    assert len(samples) < 1000
