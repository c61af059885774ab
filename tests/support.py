"""Helpers for tests that drive the real HTTP app: a fleet builder and an API client."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.capacity import inventory, nodes
from app.db.engine import Database
from app.iam.callers import create_caller
from app.iam.roles import FLEET_TENANT


@dataclass
class Fleet:
    """Builds tenants, sites, callers and nodes through the same code the CLI uses."""

    db: Database
    tokens: dict[str, str] = field(default_factory=dict)

    async def tenant(self, tenant_id: str, parent: str | None = None) -> str:
        if tenant_id == FLEET_TENANT and parent is None:
            return tenant_id  # built in: every migrated database has it
        return await inventory.create_tenant(self.db, tenant_id, parent)

    async def site(self, tenant_id: str, kind: str = "custom", region: str = "eu-west") -> str:
        return await inventory.create_site(self.db, tenant_id, kind, region)

    async def account(self, tenant_id: str) -> str:
        return await inventory.create_provider_account(self.db, tenant_id)

    async def caller(self, tenant_id: str, role: str = "admin", **where: str) -> str:
        """A caller's bearer token."""
        _, token = await create_caller(self.db, tenant_id, role, where or None)
        return token

    async def node(self, pool_id: str, gpus: int, owner: str | None = None) -> str:
        return await nodes.add_node(self.db, pool_id, gpus, owner)


@dataclass
class Api:
    """REST and GraphQL calls against the ASGI app, as a client would make them."""

    client: httpx.AsyncClient

    async def post(self, token: str | None, path: str, body: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return await self.client.post(f"/api/compute/{path}", json=body, headers=headers)

    async def ok(self, token: str, path: str, body: Any) -> Any:
        response = await self.post(token, path, body)
        assert response.status_code == 200, response.text
        return response.json()

    async def fails(self, token: str | None, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        """(HTTP status, the error object) of a call that must fail."""
        response = await self.post(token, path, body)
        assert response.status_code != 200, response.text
        error = response.json()["error"]
        assert set(error) == {"code", "message", "details"}
        return response.status_code, error

    async def graphql(
        self, token: str | None, query: str, variables: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        response = await self.client.post(
            "/graphql", json={"query": query, "variables": variables or {}}, headers=headers
        )
        result: dict[str, Any] = response.json()
        return result


def by_size(name: str, default: Any, full: Any, ids: tuple[str, str] | None = None) -> Any:
    """A scenario's two sizes as a parametrize over `name`: `default` in the default run,
    marked `scaled_down` (CI runs the `full` one and leaves it out), and `full` marked
    `soak`."""
    first, second = ids or (None, None)
    return pytest.mark.parametrize(
        name,
        [
            pytest.param(default, id=first, marks=pytest.mark.scaled_down),
            pytest.param(full, id=second, marks=pytest.mark.soak),
        ],
    )


_ROOT = Path(__file__).resolve().parents[1]


async def bench_output(*arguments: str, within_s: float = 600, **env: str) -> str:
    """What `python -m <arguments>` (a benchmark) prints, run from the checkout's root with
    `env` added to this environment; it must end with exit status 0. `within_s` bounds a
    hang, not the speed."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        *arguments,
        cwd=_ROOT,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), within_s)
    printed = output.decode()
    assert process.returncode == 0, printed
    return printed
