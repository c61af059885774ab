"""graphql-http's GraphQL-over-HTTP audit (web/audit.mjs) against a running server:
every MUST and every SHOULD ok."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from app.config import Settings
from tests.databases import service_unavailable
from tests.events.conftest import served
from tests.support import Fleet

WEB = Path(__file__).resolve().parents[2] / "web"


@pytest.mark.parametrize("dialect", ["sqlite"])
async def test_graphql_over_http_audit(database_url: str, fleet: Fleet) -> None:
    node = shutil.which("node")
    if node is None or not (WEB / "node_modules" / "graphql-http").is_dir():
        service_unavailable("node and web/node_modules (scripts/web-assets) are needed")
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "admin")
    async with served(Settings(database_url=database_url)) as (_, address):
        # Not subprocess.run: the server answers from this event loop.
        audit = await asyncio.create_subprocess_exec(
            str(node),
            str(WEB / "audit.mjs"),
            f"http://{address}/graphql",
            token,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(audit.communicate(), timeout=120)
    assert audit.returncode == 0, stderr.decode()
    lines = [json.loads(line) for line in stdout.decode().splitlines()]
    summary = lines[-1]["summary"]
    print("graphql-http audit:", json.dumps(summary))
    failed = [line for line in lines[:-1] if line["status"] != "ok"]
    assert not failed, failed
    assert summary["MUST"]["ok"] > 0 and summary["SHOULD"]["ok"] > 0
