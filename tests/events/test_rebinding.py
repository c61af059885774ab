"""An open subscription follows its caller's current binding (CONTRACT section 7: an
event shows nothing a query by the same caller would not at that moment). A caller
subscribed as admin is rebound with `apply -f` to a viewer narrowed to gpuModel=H100;
the next update of its tenant's A100 pool (with a guest's offer: quota, priority) is
not delivered, the H100 pool's is, with `pool` as the viewer reads it (`offers: null`),
and the socket stays open: the subscription is re-scoped, not closed (docs/events.md).

Real websockets through a real uvicorn server (both dialects), and two `bettercompute
serve` processes over PostgreSQL with a broker, rebound by the CLI."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sys
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml
from websockets.asyncio.client import ClientConnection

from app.config import Settings
from app.db.engine import Database, create_database
from app.events.cursor import encode_cursor
from app.events.reader import outbox_bounds
from app.fleet.apply import apply_fleet
from app.fleet.schema import parse_fleet
from tests.events.conftest import served
from tests.events.processes import bettercompute_serve
from tests.events.support import visible_outbox
from tests.events.test_token_revocation import (
    BOTH,
    TRANSPORT_WS,
    initialised,
    operation,
    receive,
    send,
)

FLEET = """
tenants:
  - {id: acme}
  - {id: globex}
sites:
  - {tenant: acme, name: eu, kind: platform, region: eu-west}
callers:
  - {tenant: acme, name: ops, role: admin}
pools:
  - tenant: acme
    name: a100
    site: eu
    class: metal-host
    gpuModel: A100
    policy: {hugepages: {1Gi: 64}}
    quota: {gpu: 8}
    offers:
      - {tenant: globex, quota: {gpu: 4}, priority: 7}
  - tenant: acme
    name: h100
    site: eu
    class: metal-host
    gpuModel: H100
    policy: {hugepages: {1Gi: 64}}
    quota: {gpu: 8}
    offers:
      - {tenant: globex, quota: {gpu: 4}, priority: 7}
"""
EVENTS = """subscription($after: String) {
  poolEvents(tenantId: "acme", after: $after) {
    type poolId data pool { id gpuModel offers { tenantId } }
  }
}"""


def fleet_file() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(FLEET)
    return loaded


def rebound(doc: dict[str, Any]) -> dict[str, Any]:
    """The same fleet with `ops` a viewer narrowed to H100 pools."""
    changed = copy.deepcopy(doc)
    changed["callers"][0] |= {"role": "viewer", "where": {"gpuModel": "H100"}}
    return changed


def both_pools_updated(doc: dict[str, Any]) -> dict[str, Any]:
    """Each pool's policy changed: a pool.updated for the A100 pool, then the H100 pool's."""
    changed = copy.deepcopy(doc)
    for pool in changed["pools"]:
        pool["policy"] = {"hugepages": {"1Gi": 32}}
    return changed


async def apply_in_process(database_url: str, doc: dict[str, Any]) -> dict[str, Any]:
    """`apply -f` through a database engine of its own, as the CLI's process would."""
    db = create_database(database_url)
    try:
        return await apply_fleet(db, parse_fleet(copy.deepcopy(doc)))
    finally:
        await db.dispose()


async def apply_cli(doc: dict[str, Any], **env: str) -> dict[str, Any]:
    """`bettercompute apply -f FILE`, a process of its own."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        yaml.safe_dump(doc, handle)
    try:
        binary = Path(sys.executable).with_name("bettercompute")
        process = await asyncio.create_subprocess_exec(
            str(binary),
            *("apply", "-f", handle.name),
            env={**os.environ, **env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        report: dict[str, Any] = json.loads(out)
        return report
    finally:
        os.unlink(handle.name)


async def newest(db: Database) -> str:
    # Else "newest" may be short of the last commit.
    async with visible_outbox(db) as conn:
        return encode_cursor((await outbox_bounds(conn)).newest)


def token_of(report: dict[str, Any]) -> str:
    token: str = next(e["token"] for e in report["created"] if e["kind"] == "caller")
    return token


def pool_ids(report: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["id"] for e in report["created"] if e["kind"] == "pool"}


async def next_event(ws: ClientConnection, protocol: str) -> dict[str, Any]:
    message = await receive(ws, within_s=60)
    assert message["type"] == ("next" if protocol == TRANSPORT_WS else "data"), message
    event: dict[str, Any] = message["payload"]["data"]["poolEvents"]
    return event


def assert_rescoped(event: dict[str, Any], h100: str) -> None:
    """The first event after the rebinding: the H100 pool's, as a narrowed viewer sees it."""
    assert (event["type"], event["poolId"]) == ("pool.updated", h100), event
    assert event["pool"] == {"id": h100, "gpuModel": "H100", "offers": None}


async def test_an_open_subscription_follows_a_rebinding(database_url: str) -> None:
    doc = fleet_file()
    settings = Settings(database_url=database_url, event_poll_interval_s=0.2)
    async with served(settings) as (app, address):
        created = await apply_in_process(database_url, doc)
        token, pools = token_of(created), pool_ids(created)
        async with initialised(address, TRANSPORT_WS, token) as ws:
            await send(ws, operation(TRANSPORT_WS, "1", EVENTS, after=await newest(app.state.db)))
            # As admin, the stream shows the A100 pool whole, its guest's offer included.
            await apply_in_process(database_url, both_pools_updated(doc))
            first = await next_event(ws, TRANSPORT_WS)
            assert first["poolId"] == pools["a100"]
            assert {"tenantId": "globex"} in first["pool"]["offers"], first
            assert (await next_event(ws, TRANSPORT_WS))["poolId"] == pools["h100"]

            # The rebinding alone, then both pools changed back: one event each.
            await apply_in_process(database_url, rebound(both_pools_updated(doc)))
            await apply_in_process(database_url, rebound(doc))
            assert_rescoped(await next_event(ws, TRANSPORT_WS), pools["h100"])


@pytest.mark.slow
@pytest.mark.parametrize("dialect", ["postgresql"])  # several processes share PostgreSQL
async def test_a_rebinding_reaches_open_subscriptions_on_every_process(
    database_url: str, redis_url: str
) -> None:
    doc = fleet_file()
    env = {
        "BETTERCOMPUTE_DATABASE_URL": database_url,
        "BETTERCOMPUTE_BROADCAST_URL": redis_url,
        "BETTERCOMPUTE_EVENT_POLL_SECONDS": "0.5",  # apply publishes no wake-up
    }
    created = await apply_cli(doc, **env)
    token, pools = token_of(created), pool_ids(created)
    db = create_database(database_url)
    try:
        after = await newest(db)  # every socket starts there, however late it subscribes
    finally:
        await db.dispose()
    async with AsyncExitStack() as stack:
        servers = await asyncio.gather(
            stack.enter_async_context(bettercompute_serve(**env)),
            stack.enter_async_context(bettercompute_serve(**env)),
        )
        sockets: list[tuple[ClientConnection, str]] = []
        for server in servers:
            for protocol in BOTH:
                ws = await stack.enter_async_context(initialised(server.address, protocol, token))
                await send(ws, operation(protocol, "1", EVENTS, after=after))
                sockets.append((ws, protocol))
        # As admin, every socket is shown both pools.
        await apply_cli(both_pools_updated(doc), **env)
        for ws, protocol in sockets:
            seen = [await next_event(ws, protocol) for _ in range(2)]
            assert [e["poolId"] for e in seen] == [pools["a100"], pools["h100"]]

        await apply_cli(rebound(both_pools_updated(doc)), **env)
        await apply_cli(rebound(doc), **env)
        for ws, protocol in sockets:
            assert_rescoped(await next_event(ws, protocol), pools["h100"])
