"""REST `pools/get` answered by its compiled statement (app/rest/render.py GET_SHAPE)
gives the plain path's bytes: every caller of the compiled world, every pool (owned,
offered, offered to an ancestor, archived, with a join secret, not visible), bad input,
revoked and rebound tokens, on both dialects."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from app.capacity.json_reads import compile_read
from app.capacity.json_sql import DIALECTS
from app.capacity.service import Capacity
from app.iam.callers import authenticate, rebind_caller, revoke_token
from tests.compiled_world import CALLERS, Pair, World, pair, world
from tests.support import Fleet

__all__ = ["pair", "world"]  # fixtures
# The compiled path against the plain one: nothing to compare on the plain path.
pytestmark = pytest.mark.fast_path


def _answered() -> float:
    found = REGISTRY.get_sample_value("bettercompute_compiled_reads_total", {"outcome": "answered"})
    return found or 0.0


async def _get(client: httpx.AsyncClient, token: str, body: Any) -> tuple[Any, ...]:
    response = await client.post(
        "/api/compute/pools/get",
        json=body,
        headers={"authorization": f"Bearer {token}"},
    )
    headers = {k: v for k, v in response.headers.items() if k != "x-request-id"}
    return response.status_code, headers, response.content


async def test_get_answers_alike(pair: Pair, world: World, dialect: str) -> None:
    before = _answered()
    bodies: list[Any] = [
        {"tenantId": tenant, "poolId": pool}
        for tenant in ("acme", "globex", "globex-dev", "initech")
        for pool in [*world.pools.values(), "pool_01j00000000000000000000000"]
    ]
    bodies += [{"tenantId": "acme"}, {"tenantId": "acme", "poolId": "x"}, [], "x", None]
    for caller in CALLERS:
        for body in bodies:
            token = world.tokens[caller]
            plain = await _get(pair.plain, token, body)
            assert await _get(pair.fast, token, body) == plain, (caller, body)
            assert await _get(pair.fast, token, body) == plain, (caller, body)
    answered = _answered() - before
    assert answered >= 40, (dialect, answered)  # the compiled path answers on both


async def test_a_secret_is_never_read_back(pair: Pair, world: World, dialect: str) -> None:
    token = world.tokens["acme-admin"]
    body = {"tenantId": "acme", "poolId": world.pools["p2"]}
    for _ in range(2):
        status, _, content = await _get(pair.fast, token, body)
        assert status == 200
        assert b"tokenSet" in content
        assert b"abcdef.0123456789abcdef" not in content


async def test_a_rebound_or_revoked_caller_is_answered_as_now(
    pair: Pair, world: World, fleet: Fleet
) -> None:
    token = await fleet.caller("acme", "admin")
    body = {"tenantId": "acme", "poolId": world.pools["p0"]}
    for _ in range(2):
        assert (await _get(pair.fast, token, body))[0] == 200
    capacity: Capacity = pair.fast._transport.app.state.capacity  # type: ignore[attr-defined]
    principal = await authenticate(capacity.db, f"Bearer {token}")
    async with capacity.unit_of_work() as uow:  # may no longer share: offers are null
        await rebind_caller(uow, principal.caller_id, "viewer")
    assert await _get(pair.fast, token, body) == await _get(pair.plain, token, body)
    await revoke_token(fleet.db, token)
    for sent in (body, {"tenantId": "acme"}, "not an object"):
        revoked = await _get(pair.fast, token, sent)
        assert revoked == await _get(pair.plain, token, sent)
        assert revoked[0] == 401, revoked


def _declined() -> float:
    found = REGISTRY.get_sample_value("bettercompute_compiled_reads_total", {"outcome": "declined"})
    return found or 0.0


# Fields `get` does not take (misspelled, or another method's): CONTRACT section 4.
_UNKNOWN: list[dict[str, Any]] = [
    {"colour": "red"},
    {"tenantid": "acme"},
    {"poolid": "x"},
    {"version": 1},
    {"dryRun": False},
    {"first": 1},
    {"tenant_id": "acme"},
    {"": None},
]


async def test_unknown_fields_are_refused_alike(pair: Pair, world: World, dialect: str) -> None:
    """Every unknown field answers the plain path's 400 INVALID_INPUT on both paths, for
    every caller that could be answered by the compiled statement, on a pool it sees, one
    it does not and an unknown one; the compiled path saw each and declined it."""
    before = _declined()
    tried = 0
    for caller, tenant in CALLERS.items():
        if caller in ("revoked", "nonsense"):
            continue
        token = world.tokens[caller]
        for pool in (world.pools["p0"], world.pools["p3"], "pool_01j00000000000000000000000"):
            for extra in _UNKNOWN:
                body = {"tenantId": tenant, "poolId": pool, **extra}
                plain = await _get(pair.plain, token, body)
                assert plain[0] == 400, (caller, body, plain)
                assert b'"INVALID_INPUT"' in plain[2], plain
                for _ in range(2):  # the second with the caller remembered
                    assert await _get(pair.fast, token, body) == plain, (caller, body)
                tried += 2
    declined = _declined() - before
    assert declined == tried, (dialect, declined, tried)


def test_the_compiled_read_validates_with_the_catalog_input() -> None:
    """One rule for `get`'s input: the compiled statement's model is the catalog's."""
    from app.catalog import METHODS
    from app.rest.render import GET_SHAPE

    (method,) = [m for m in METHODS if m.path == "/api/compute/pools/get"]
    for dialect in DIALECTS:
        read = compile_read(GET_SHAPE, dialect=dialect)
        assert read is not None
        assert read.input is method.input
