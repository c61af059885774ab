"""`GET /api/compute/catalog` and `GET /api/openapi.json` (CONTRACT section 4): the seed's
method table and input tables, served as data."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from openapi_spec_validator import validate as validate_openapi
from starlette.applications import Starlette
from starlette.routing import Route

from tests.rest.scene import Scene, quotas
from tests.rest.test_errors import CASES, MISSING, VALID
from tests.support import Api, Fleet

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
# Names and labels: given on create, a selector on list (`label` is a method of its own).
SEED_INPUTS["create"]["displayName"] = ("string", False, {"maxLength": 128})
SEED_INPUTS["create"]["labels"] = ("object", False, {"maxProperties": 32})
SEED_INPUTS["list"]["labelSelector"] = ("string", False, {"maxLength": 4096})


def _value_schema(prop: dict[str, Any]) -> dict[str, Any]:
    """An optional field's schema without its `null` branch (`anyOf: [X, null]` -> X)."""
    branches = [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]
    assert len(branches) == 1, prop
    return branches[0]


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


async def test_an_integral_number_is_the_integer_the_schema_says(api: Api, fleet: Fleet) -> None:
    """JSON Schema's `integer` includes 2.0 (ADR 0001), so the server takes it as 2; 2.5 and
    "2" stay refused. Every integer field of the inputs: quota maps, resources, priority."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool = await s.pool(ownerQuota={"gpu": 8.0})
    await fleet.node(pool["id"], 8)
    assert quotas(pool) == {"gpu": (8, 0)}
    offered = await s.offer(pool["id"], "beta", {"gpu": 2.0}, priority=5.0)
    assert quotas(offered) == {"gpu": (2, 0)}
    priority = {o["tenantId"]: o["priority"] for o in (await s.get(pool["id"]))["offers"]}
    assert priority["beta"] == 5 and isinstance(priority["beta"], int)
    booked = await api.ok(
        s.token,
        "reservations/create",
        {"tenantId": "acme", "poolId": pool["id"], "resources": {"gpu": 3.0}},
    )
    assert booked["reservation"]["resources"] == {"gpu": 3}
    for bad in (2.5, "2", True):
        body = s.body(pool["id"], toTenantId="beta", quota={"gpu": bad})
        status, error = await api.fails(s.token, "pools/offer", body)
        assert (status, error["details"]["field"]) == (400, "quota.gpu"), bad


async def test_cross_field_rules_are_in_the_schema_and_the_server_agrees(
    api: Api, fleet: Fleet
) -> None:
    """The seed's rules across fields (a provider pool needs providerAccountId and agent
    'none', other classes refuse providerAccountId; update needs policy or gpuModel) are in
    the published input schema: a schema-driven client refuses exactly what the server
    refuses."""
    s = await Scene.start(api, fleet)
    account = await fleet.account("acme")
    pool_id = (await s.pool())["id"]
    documents = (await api.client.get("/api/openapi.json")).json()["components"]["schemas"]
    create = jsonschema.Draft202012Validator(documents["CreatePoolInput"])
    update = jsonschema.Draft202012Validator(documents["UpdatePoolInput"])
    base = {"tenantId": "acme", "siteId": s.site}
    creates: list[tuple[dict[str, Any], bool]] = [
        ({"class": "provider"}, False),
        ({"class": "provider", "providerAccountId": None}, False),
        ({"class": "provider", "providerAccountId": account, "agent": "bcd"}, False),
        ({"class": "provider", "providerAccountId": account}, True),
        ({"class": "provider", "providerAccountId": account, "agent": "none"}, True),
        ({"class": "provider", "providerAccountId": account, "agent": None}, True),
        ({"class": "metal-host", "providerAccountId": account}, False),
        ({"class": "vps-host", "providerAccountId": None}, True),
        ({"class": "metal-host", "agent": "none"}, True),
    ]
    for fields, valid in creates:
        body = base | fields
        assert create.is_valid(body) is valid, body
        response = await api.post(s.token, "pools/create", body)
        assert response.status_code == (200 if valid else 400), (body, response.text)
    updates: list[tuple[dict[str, Any], bool]] = [
        ({}, False),
        ({"policy": None, "gpuModel": None}, False),
        ({"gpuModel": "H100"}, True),
        ({"policy": {}}, True),
        ({"policy": {}, "gpuModel": None}, True),
        ({"policy": None, "gpuModel": "L4"}, True),
    ]
    for fields, valid in updates:
        body = {"tenantId": "acme", "poolId": pool_id} | fields
        assert update.is_valid(body) is valid, body
        response = await api.post(s.token, "pools/update", body)
        assert response.status_code == (200 if valid else 400), (body, response.text)


async def test_openapi_links_lead_from_a_pool_or_a_booking_to_the_calls_that_take_it(
    api: Api,
) -> None:
    """Stateful clients follow `links`: each names a served operation and fills only fields
    of that operation's input, from the answer (`$response.body`) or the call
    (`$request.body`)."""
    document = (await api.client.get("/api/openapi.json")).json()
    schemas = document["components"]["schemas"]
    operations = {
        op["operationId"]: op for path in document["paths"].values() for op in path.values()
    }
    linked = set()
    for source, operation in operations.items():
        for link in operation["responses"]["200"].get("links", {}).values():
            target = operations[link["operationId"]]
            ref = target["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            fields = schemas[ref.rsplit("/", 1)[1]]["properties"]
            assert set(link["requestBody"]) <= set(fields), (source, link)
            assert all(
                v.startswith(("$response.body#/", "$request.body#/"))
                for v in link["requestBody"].values()
            )
            linked.add((source, link["operationId"]))
    assert {
        ("pools.create", "pools.get"),
        ("pools.create", "pools.archive"),
        ("pools.offer", "reservations.create"),
        ("reservations.create", "reservations.release"),
    } <= linked
