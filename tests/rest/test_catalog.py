"""`GET /api/compute/catalog` and `GET /api/openapi.json` (CONTRACT section 4): the seed's
method table and input tables, served as data."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from openapi_spec_validator import validate as validate_openapi
from starlette.applications import Starlette
from starlette.routing import Route

from tests.rest.test_errors import CASES, MISSING, VALID
from tests.support import Api

TENANT = ("string", True, {"maxLength": 128, "pattern": r"^[A-Za-z0-9._:-]{1,128}$"})
POOL = ("string", True, {"maxLength": 57, "pattern": r"^pool_[0-9a-hjkmnp-tv-z]{26,52}$"})
GPU_MODEL = ("string", False, {"maxLength": 32, "pattern": r"^[A-Za-z0-9-]{1,32}$"})
QUOTA_KEYS = r"^[A-Za-z][A-Za-z0-9._-]{0,63}$"

# The seed's method table: Method, Kind, Authorization, Phase, Status (and Module).
SEED_METHODS = [
    ("list", "read", "compute:pools:read @ compute-tenant + items", "v0.1"),
    ("get", "read", "compute:pools:read @ compute-pool", "v0.1"),
    (
        "create",
        "mutation",
        "compute:pools:create @ compute-fleet or compute:pools:create @ compute-tenant",
        "v0.1",
    ),
    ("capacity", "read", "compute:capacity:read @ compute-pool", "v0.1"),
    ("offer", "mutation", "compute:pools:share @ compute-pool", "v0.1"),
    ("unoffer", "mutation", "compute:pools:share @ compute-pool", "v0.1"),
    ("update", "mutation", "compute:pools:manage @ compute-pool", "v0.2"),
    ("archive", "mutation", "compute:pools:manage @ compute-pool", "v0.2"),
]
SITE = ("string", True, {"maxLength": 57, "pattern": r"^site_[0-9a-hjkmnp-tv-z]{26,52}$"})
CLASS = ("string", True, {"enum": ["metal-host", "metal-dedicated", "vps-host", "provider"]})
SHARING = (
    "string",
    False,
    {"enum": ["exclusive", "mig", "timeslice", "mps"], "default": "exclusive"},
)
ACCOUNT = ("string", False, {"maxLength": 58, "pattern": r"^pacct_[0-9a-hjkmnp-tv-z]{26,52}$"})
IDEMPOTENCY_KEY = ("string", False, {"maxLength": 128, "pattern": r"^[A-Za-z0-9._~:/+=-]{1,128}$"})
POLICY = ("object", False, {})
# The seed's input tables: field -> (JSON type, required, constraints).
SEED_INPUTS: dict[str, dict[str, tuple[str, bool, dict[str, Any]]]] = {
    "list": {"tenantId": TENANT},
    "get": {"tenantId": TENANT, "poolId": POOL},
    "create": {
        "tenantId": TENANT,
        "siteId": SITE,
        "class": CLASS,
        "gpuModel": GPU_MODEL,
        "sharing": SHARING,
        "agent": ("string", False, {"enum": ["bcd", "none"]}),
        "policy": POLICY,
        "ownerQuota": ("object", False, {"patternProperties": QUOTA_KEYS}),
        "providerAccountId": ACCOUNT,
        "idempotencyKey": IDEMPOTENCY_KEY,
    },
    "capacity": {"tenantId": TENANT, "poolId": POOL},
    "offer": {
        "tenantId": TENANT,
        "poolId": POOL,
        "toTenantId": TENANT,
        "quota": ("object", True, {"patternProperties": QUOTA_KEYS}),
        "includeDescendants": ("boolean", False, {"default": False}),
        "priority": ("integer", False, {"minimum": -1000, "maximum": 1000, "default": 0}),
    },
    "unoffer": {"tenantId": TENANT, "poolId": POOL, "toTenantId": TENANT},
    "update": {"tenantId": TENANT, "poolId": POOL, "policy": POLICY, "gpuModel": GPU_MODEL},
    "archive": {"tenantId": TENANT, "poolId": POOL},
}  # fmt: skip
# CONTRACT section 10's extensions: optional fields beyond the seed's tables.
VERSION = ("integer", False, {"minimum": 1})
for _write in ("offer", "unoffer", "update", "archive"):
    SEED_INPUTS[_write]["version"] = VERSION
for _write in ("unoffer", "archive"):
    SEED_INPUTS[_write]["dryRun"] = ("boolean", False, {"default": False})


def _value_schema(prop: dict[str, Any]) -> dict[str, Any]:
    """An optional field's schema without its `null` branch (`anyOf: [X, null]` -> X)."""
    branches = [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]
    assert len(branches) == 1, prop
    return branches[0]


def _has_integral_float(value: object) -> bool:
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, dict):
        return any(_has_integral_float(v) for v in value.values())
    return False


@pytest.fixture
async def catalog(api: Api) -> list[dict[str, Any]]:
    response = await api.client.get("/api/compute/catalog")
    assert response.status_code == 200
    methods: list[dict[str, Any]] = response.json()["methods"]
    return methods


async def test_catalog_lists_exactly_the_seed_method_table(catalog: list[dict[str, Any]]) -> None:
    """All 8 methods are served by this release. (Method, Kind, Authorization, Phase, Status;
    Module: capacity), as the seed's table prints them."""
    served = [
        (m["name"], m["kind"], m["authorization"], m["phase"], m["module"], m["status"])
        for m in catalog
    ]
    expected = [(*row, "capacity", "registered") for row in SEED_METHODS]
    assert served == expected
    assert [m["path"] for m in catalog] == [f"/api/compute/pools/{m[0]}" for m in SEED_METHODS]


async def test_catalog_input_schemas_match_the_seed_input_tables(
    catalog: list[dict[str, Any]],
) -> None:
    """Input: Field, Type, Required, Constraints (at most N characters; matches ^...$; one
    of; defaults; integer range; keys match ^...$), for every method; unknown fields are
    refused (CONTRACT 4)."""
    for method in catalog:
        schema, seed = method["input"], SEED_INPUTS[method["name"]]
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert set(schema["properties"]) == set(seed), method["name"]
        assert set(schema.get("required", [])) == {f for f, (_, req, _) in seed.items() if req}
        for field, (json_type, _, constraints) in seed.items():
            prop = schema["properties"][field]
            value = _value_schema(prop)
            where = f"{method['name']}.{field}"
            assert value["type"] == json_type, where
            for key, want in constraints.items():
                if key == "default":
                    assert prop["default"] == want, where
                elif key == "patternProperties":
                    # A quota map: keys must match, values are non-negative integers.
                    assert list(value["patternProperties"]) == [want], where
                    assert value["additionalProperties"] is False, where
                    (amount,) = value["patternProperties"].values()
                    assert (amount["type"], amount["minimum"]) == ("integer", 0), where
                else:
                    assert value[key] == want, (where, key)


async def test_catalog_schemas_refuse_what_the_server_refuses(
    catalog: list[dict[str, Any]],
) -> None:
    """The catalog's input schema is the seed's input table: a client validating with it
    accepts the valid bodies and refuses every bad one the server refuses (test_errors)."""
    by_name = {m["name"]: m["input"] for m in catalog}
    for name, cases in CASES.items():
        validator = jsonschema.Draft202012Validator(by_name[name])
        assert validator.is_valid(VALID[name]), name
        for field, value, _ in cases:
            if isinstance(value, str) and value.endswith("\n"):
                continue  # Python's re (jsonschema's engine) lets `$` match before a newline
            if _has_integral_float(value):
                continue  # JSON Schema counts 2.0 as an integer; the server is stricter
            body = dict(VALID[name])
            if value is MISSING:
                body.pop(field)
            else:
                body[field] = value
            assert not validator.is_valid(body), (name, field, value)


async def test_openapi_is_a_valid_3_1_document_with_a_path_per_rest_route(
    api: Api, app: Starlette
) -> None:
    """An OpenAPI document at GET /api/openapi.json generated from the same input
    definitions."""
    response = await api.client.get("/api/openapi.json")
    assert response.status_code == 200
    document = response.json()
    validate_openapi(document)  # raises on anything invalid
    assert document["openapi"].startswith("3.1")

    posts = {r.path for r in app.routes if isinstance(r, Route) and "POST" in (r.methods or ())}
    rest_routes = {p for p in posts if p.startswith("/api/compute/")}
    assert set(document["paths"]) == rest_routes
    assert {f"/api/compute/pools/{m[0]}" for m in SEED_METHODS} <= rest_routes

    schemas = document["components"]["schemas"]
    catalog = (await api.client.get("/api/compute/catalog")).json()["methods"]
    for method in catalog:
        operation = document["paths"][method["path"]]["post"]
        ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert schemas[ref.rsplit("/", 1)[1]] == method["input"], method["name"]
        assert operation["security"] == [{"bearer": []}]
