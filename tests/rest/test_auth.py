"""Authentication over REST (CONTRACT section 2): every call carries
`Authorization: Bearer <token>`; no or a bad token is UNAUTHENTICATED on every route."""

from __future__ import annotations

import httpx
import pytest

from app.catalog import METHODS
from app.db.engine import Database
from app.iam.callers import create_caller, create_token, revoke_token
from tests.support import Api, Fleet

ROUTES = [m.path for m in METHODS]


async def _call(api: Api, path: str, authorization: str | None, body: bytes) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if authorization is not None:
        headers["authorization"] = authorization
    return await api.client.post(path, content=body, headers=headers)


def _assert_unauthenticated(response: httpx.Response, secret: str = "") -> None:
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert error["code"] == "UNAUTHENTICATED" and error["details"] == {}
    if secret:
        assert secret not in response.text  # a presented token is never echoed


async def test_no_authorization_header_is_unauthenticated_on_every_route(api: Api) -> None:
    """Every REST call ... carries Authorization: Bearer <token>. No or a bad token:
    UNAUTHENTICATED. (Checked first: the body here is not even JSON.)"""
    for path in ROUTES:
        _assert_unauthenticated(await _call(api, path, None, b"{not json"))


@pytest.mark.parametrize(
    "authorization",
    [
        "",
        "Bearer",
        "Bearer    ",
        "Basic YWNtZTpzZWNyZXQ=",
        "Token {token}",
        "{token}",
        "Bearer: {token}",
    ],
    ids=["empty", "no-token", "blank-token", "basic", "other-scheme", "no-scheme", "colon"],
)
async def test_a_malformed_authorization_header_is_unauthenticated(
    api: Api, fleet: Fleet, authorization: str
) -> None:
    """No or a bad token: UNAUTHENTICATED (anything but `Bearer <token>`)."""
    await fleet.tenant("acme")
    token = await fleet.caller("acme")
    header = authorization.format(token=token)
    for path in ROUTES:
        response = await _call(api, path, header, b'{"tenantId": "acme"}')
        _assert_unauthenticated(response, token)


async def test_the_scheme_is_case_insensitive(api: Api, fleet: Fleet) -> None:
    """Authorization: Bearer <token> (auth schemes are case-insensitive, RFC 9110 11.1)."""
    await fleet.tenant("acme")
    token = await fleet.caller("acme")
    response = await _call(
        api, "/api/compute/pools/list", f"bearer {token}", b'{"tenantId":"acme"}'
    )
    assert response.status_code == 200, response.text


async def test_an_unknown_token_is_unauthenticated(api: Api, fleet: Fleet) -> None:
    """No or a bad token: UNAUTHENTICATED (an unknown token)."""
    await fleet.tenant("acme")
    real = await fleet.caller("acme")
    for token in ("bct_" + "x" * 43, real + "x", real[:-1]):
        for path in ROUTES:
            response = await _call(api, path, f"Bearer {token}", b'{"tenantId": "acme"}')
            _assert_unauthenticated(response, token)


async def test_a_revoked_token_is_unauthenticated_and_other_tokens_still_work(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """Tokens are random, shown once at creation, stored only as a hash, revocable;
    UNAUTHENTICATED: ... revoked token."""
    await fleet.tenant("acme")
    caller_id, token = await create_caller(db, "acme", "admin")
    second = await create_token(db, caller_id)
    body = {"tenantId": "acme"}
    await api.ok(token, "pools/list", body)

    assert await revoke_token(db, token) is True
    for path in ROUTES:
        _assert_unauthenticated(await _call(api, path, f"Bearer {token}", b'{"tenantId":"acme"}'))
    await api.ok(second, "pools/list", body)
    assert await revoke_token(db, token) is False  # revoking twice changes nothing


async def test_tokens_are_stored_only_as_a_hash(fleet: Fleet, db: Database) -> None:
    """Tokens are random, shown once at creation, stored only as a hash."""
    await fleet.tenant("acme")
    tokens = [await fleet.caller("acme") for _ in range(2)]
    assert tokens[0] != tokens[1]
    async with db.reader.connect() as conn:
        stored = " ".join(
            str(value)
            for row in await conn.exec_driver_sql("SELECT * FROM api_tokens")
            for value in row
        )
    assert all(token not in stored for token in tokens)
