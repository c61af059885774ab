"""Errors over REST (CONTRACT section 3): every input rule of the seed's input tables is
INVALID_INPUT naming its field and writes nothing; the database being down is UNAVAILABLE;
an unexpected failure is INTERNAL and reveals nothing."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy import update

from app.catalog import METHODS
from app.config import Settings
from app.db.engine import Database
from app.db.errors import to_domain_error
from app.db.models import Pool
from app.http.status import http_status
from app.rest.errors import error_response
from app.server import create_app
from tests.rest.pool_calls import MISSING_POOL, create_pool, row_counts
from tests.support import Api, Fleet

ULID = "0" * 26
SITE = "site_" + ULID
ACCOUNT = "pacct_" + ULID
# A valid body per method: each case below breaks exactly one field of it.
VALID: dict[str, dict[str, Any]] = {
    "list": {"tenantId": "acme"},
    "get": {"tenantId": "acme", "poolId": MISSING_POOL},
    "create": {"tenantId": "acme", "siteId": SITE, "class": "metal-host"},
    "capacity": {"tenantId": "acme", "poolId": MISSING_POOL},
    "offer": {"tenantId": "acme", "poolId": MISSING_POOL, "toTenantId": "beta", "quota": {}},
    "unoffer": {"tenantId": "acme", "poolId": MISSING_POOL, "toTenantId": "beta"},
    "update": {"tenantId": "acme", "poolId": MISSING_POOL, "gpuModel": "H100"},
    "archive": {"tenantId": "acme", "poolId": MISSING_POOL},
}
MISSING = object()  # the field left out

# (field, bad value, the field path details.field must name). Each is a rule of the seed's
# input tables: required, type, "at most N characters", "matches ^...$", "one of", range,
# "keys match ^...$"; JSON types are strict (no bool for int, no "5" for 5).
TENANT_ID = [
    ("tenantId", MISSING, "tenantId"),
    ("tenantId", "", "tenantId"),
    ("tenantId", "acme corp", "tenantId"),
    ("tenantId", "acme/corp", "tenantId"),
    ("tenantId", "a" * 129, "tenantId"),
    ("tenantId", 7, "tenantId"),
    ("tenantId", None, "tenantId"),
    ("tenantId", ["acme"], "tenantId"),
]
POOL_ID = [
    ("poolId", MISSING, "poolId"),
    ("poolId", "pool_" + "0" * 25, "poolId"),  # too short
    ("poolId", "pool_" + "0" * 53, "poolId"),  # 58 characters: over 57
    ("poolId", "pool_" + "0" * 25 + "u", "poolId"),  # not Crockford base32 (i l o u)
    ("poolId", "pool_" + "0" * 25 + "A", "poolId"),  # lowercase only
    ("poolId", "site_" + ULID, "poolId"),
    ("poolId", "pool_" + ULID + "\n", "poolId"),  # `$` must not let a newline through
    ("poolId", 12, "poolId"),
]
TO_TENANT_ID = [
    ("toTenantId", MISSING, "toTenantId"),
    ("toTenantId", "beta!", "toTenantId"),
    ("toTenantId", "b" * 129, "toTenantId"),
    ("toTenantId", True, "toTenantId"),
]
GPU_MODEL = [
    ("gpuModel", "", "gpuModel"),
    ("gpuModel", "H100 SXM", "gpuModel"),
    ("gpuModel", "H100_SXM", "gpuModel"),
    ("gpuModel", "H" * 33, "gpuModel"),
    ("gpuModel", 100, "gpuModel"),
]
POLICY = [
    ("policy", "hugepages", "policy"),
    ("policy", ["hugepages"], "policy"),
    ("policy", 1, "policy"),
]
QUOTA_MAP = [
    ({"1gpu": 1}, "{f}.1gpu"),  # keys start with a letter
    ({"": 1}, "{f}."),
    ({"g" * 65: 1}, "{f}." + "g" * 65),  # 1 + 63 characters at most
    ({"gpu slot": 1}, "{f}.gpu slot"),
    ({"gpu": -1}, "{f}.gpu"),
    ({"gpu": 2**63}, "{f}.gpu"),
    ({"gpu": True}, "{f}.gpu"),
    ({"gpu": 1.5}, "{f}.gpu"),
    ({"gpu": "1"}, "{f}.gpu"),
    ({"gpu": None}, "{f}.gpu"),
    ([["gpu", 1]], "{f}"),
    ("gpu", "{f}"),
]
CASES: dict[str, list[tuple[str, Any, str]]] = {
    "list": TENANT_ID,
    "get": TENANT_ID + POOL_ID,
    "capacity": TENANT_ID + POOL_ID,
    "archive": TENANT_ID + POOL_ID,
    "unoffer": TENANT_ID + POOL_ID + TO_TENANT_ID,
    "update": TENANT_ID + POOL_ID + GPU_MODEL + POLICY,
    "offer": TENANT_ID
    + POOL_ID
    + TO_TENANT_ID
    + [("quota", MISSING, "quota")]
    + [("quota", value, path.format(f="quota")) for value, path in QUOTA_MAP]
    + [
        ("includeDescendants", "true", "includeDescendants"),
        ("includeDescendants", 1, "includeDescendants"),
        ("includeDescendants", None, "includeDescendants"),
        ("priority", 1001, "priority"),
        ("priority", -1001, "priority"),
        ("priority", True, "priority"),
        ("priority", "5", "priority"),
    ],
    "create": TENANT_ID
    + GPU_MODEL
    + POLICY
    + [
        ("siteId", MISSING, "siteId"),
        ("siteId", "site_" + "0" * 25, "siteId"),
        ("siteId", "site_" + "0" * 53, "siteId"),
        ("siteId", "site_" + "l" * 26, "siteId"),
        ("siteId", "pool_" + ULID, "siteId"),
        ("class", MISSING, "class"),
        ("class", "gpu-host", "class"),
        ("class", "Metal-Host", "class"),
        ("class", None, "class"),
        ("sharing", "shared", "sharing"),
        ("sharing", "", "sharing"),
        ("sharing", 0, "sharing"),
        ("agent", "bcd2", "agent"),
        ("agent", True, "agent"),
        ("providerAccountId", "pacct_" + "0" * 25, "providerAccountId"),
        ("providerAccountId", "pacct_" + "0" * 53, "providerAccountId"),
        ("providerAccountId", "site_" + ULID, "providerAccountId"),
        ("idempotencyKey", "", "idempotencyKey"),
        ("idempotencyKey", "two words", "idempotencyKey"),
        ("idempotencyKey", "k" * 129, "idempotencyKey"),
        ("idempotencyKey", "ключ", "idempotencyKey"),
        ("idempotencyKey", 42, "idempotencyKey"),
    ]
    + [("ownerQuota", value, path.format(f="ownerQuota")) for value, path in QUOTA_MAP],
}


def _with(body: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    changed = dict(body)
    if value is MISSING:
        changed.pop(field)
    else:
        changed[field] = value
    return changed


async def _acme(fleet: Fleet) -> str:
    await fleet.tenant("acme")
    await fleet.tenant("beta")
    return await fleet.caller("acme")


@pytest.mark.parametrize("method", list(CASES))
async def test_every_input_rule_is_invalid_input_naming_its_field(
    api: Api, fleet: Fleet, db: Database, method: str
) -> None:
    """INVALID_INPUT: schema, pattern, range or policy validation failed; unknown fields.
    details names the offending field for input errors; a refused call writes nothing."""
    token = await _acme(fleet)
    before = await row_counts(db)
    assert (await api.post(token, f"pools/{method}", VALID[method])).status_code != 400
    for field, value, path in CASES[method]:
        body = _with(VALID[method], field, value)
        response = await api.post(token, f"pools/{method}", body)
        case = f"{method} {field}={value!r}: {response.text}"
        assert response.status_code == 400, case
        error = response.json()["error"]
        assert (error["code"], error["details"]) == ("INVALID_INPUT", {"field": path}), case
        assert error["message"], case
    assert await row_counts(db) == before


@pytest.mark.parametrize("method", list(VALID))
async def test_unknown_fields_are_invalid_input(
    api: Api, fleet: Fleet, db: Database, method: str
) -> None:
    """JSON body = the seed's input table (unknown fields are INVALID_INPUT)."""
    token = await _acme(fleet)
    before = await row_counts(db)
    for unknown in ("tenantID", "pool_id", "extra", "version"):
        body = {**VALID[method], unknown: "x"}
        status, error = await api.fails(token, f"pools/{method}", body)
        assert (status, error["code"], error["details"]) == (
            400,
            "INVALID_INPUT",
            {"field": unknown},
        )
    assert await row_counts(db) == before


async def test_a_body_that_is_not_a_json_object_is_invalid_input(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """JSON body = the seed's input table: a body that is not a JSON object, or not JSON at
    all, is INVALID_INPUT (never a 500)."""
    token = await _acme(fleet)
    before = await row_counts(db)
    bodies = [b"[]", b'"acme"', b"1", b"null", b"true", b"", b"{", b'{"tenantId": NaN}',
              b"\xff\xfe", b'{"tenantId": "acme"} trailing']  # fmt: skip
    for method in METHODS:
        for raw in bodies:
            response = await api.client.post(
                method.path, content=raw, headers={"authorization": f"Bearer {token}"}
            )
            assert response.status_code == 400, (method.path, raw, response.text)
            error = response.json()["error"]
            assert error["code"] == "INVALID_INPUT" and "field" not in error["details"]
    assert await row_counts(db) == before


async def test_validation_errors_write_nothing_even_on_a_real_pool(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """A refused call writes nothing: INVALID_INPUT on a pool that exists leaves it as it
    was (no version bump, no event, no offer)."""
    token = await _acme(fleet)
    site = await fleet.site("acme")
    pool = await create_pool(api, token, "acme", site)
    before = await row_counts(db)
    bad = [
        ("offer", {"toTenantId": "beta", "quota": {"gpu": 1}, "priority": 5000}),
        ("update", {"gpuModel": "A100", "policy": {"hugepages": {"2Mi": -1}}}),
        ("update", {"gpuModel": "A100 PCIe"}),
        ("archive", {"force": True}),
        ("unoffer", {"toTenantId": "beta gamma"}),
    ]
    for method, fields in bad:
        body = {"tenantId": "acme", "poolId": pool["id"], **fields}
        status, error = await api.fails(token, f"pools/{method}", body)
        assert (status, error["code"]) == (400, "INVALID_INPUT"), (method, error)
    assert await row_counts(db) == before
    got = await api.ok(token, "pools/get", {"tenantId": "acme", "poolId": pool["id"]})
    assert got["pool"] == pool


# -- infrastructure failures -------------------------------------------------------------


async def test_the_database_being_down_is_unavailable(
    dialect: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """UNAVAILABLE (503): the database or broker is unreachable; safe to retry. Not a
    traceback: the app starts, answers every route in the error shape, and the catalog
    (which needs no database) still answers."""
    url = {
        "postgresql": "postgresql+asyncpg://postgres@127.0.0.1:1/nowhere",  # a closed port
        "sqlite": f"sqlite+aiosqlite:///{tmp_path}/no/such/dir/bettercompute.db",
    }[dialect]
    app = create_app(Settings(database_url=url))
    caplog.set_level(logging.WARNING)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client,
    ):
        for method in METHODS:
            response = await client.post(
                method.path, json={"tenantId": "acme"}, headers={"authorization": "Bearer t"}
            )
            assert response.status_code == 503, response.text
            assert response.json() == {
                "error": {
                    "code": "UNAVAILABLE",
                    "message": "the service is temporarily unavailable; retry",
                    "details": {},
                }
            }
        assert (await client.get("/api/compute/catalog")).status_code == 200
    assert any(r.name == "app.errors" and "unavailable" in r.message for r in caplog.records)


async def test_an_unexpected_failure_is_internal_and_reveals_nothing(
    api: Api, fleet: Fleet, db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """INTERNAL (500): a bug; the message reveals nothing internal. Driven through the real
    path: a stored policy that is not a JSON object (corrupt data) makes reading the pool
    fail deep in the domain; the failure is logged with its traceback."""
    token = await _acme(fleet)
    pool = await create_pool(api, token, "acme", await fleet.site("acme"))
    async with db.writer.begin() as conn:
        await conn.execute(update(Pool).where(Pool.id == pool["id"]).values(policy="s3cret"))
    caplog.set_level(logging.ERROR, logger="app.errors")

    for method in ("get", "list"):
        body = (
            {"tenantId": "acme", "poolId": pool["id"]} if method == "get" else {"tenantId": "acme"}
        )
        response = await api.post(token, f"pools/{method}", body)
        assert response.status_code == 500
        assert response.json() == {
            "error": {"code": "INTERNAL", "message": "internal error", "details": {}}
        }
    logged = [r for r in caplog.records if r.name == "app.errors" and r.exc_info]
    assert len(logged) == 2 and all(r.exc_info and r.exc_info[0] is ValueError for r in logged)


def test_internal_errors_map_to_500_without_their_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """INTERNAL (500): a bug; the message reveals nothing internal (the REST mapping)."""
    caplog.set_level(logging.ERROR, logger="app.errors")
    secret = RuntimeError("password=hunter2 at /srv/app/secret.py")
    error = to_domain_error(secret)
    assert (error.code, http_status(error), error.message) == ("INTERNAL", 500, "internal error")
    response = error_response(secret)
    assert response.status_code == 500
    assert orjson.loads(bytes(response.body)) == {
        "error": {"code": "INTERNAL", "message": "internal error", "details": {}}
    }
    assert "hunter2" not in bytes(response.body).decode()
    assert any(r.exc_info and r.exc_info[1] is secret for r in caplog.records)
