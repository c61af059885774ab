"""The OpenAPI document, generated from the catalog's input definitions."""

from __future__ import annotations

from functools import cache
from typing import Any

from app.capacity.fields import (
    CAPACITY,
    GRANT,
    OFFER,
    POOL,
    QUOTA,
    RESERVATION,
    TABLES,
    Entry,
    Relation,
    Table,
)
from app.catalog import METHODS
from app.errors import CODES

_KINDS: dict[str, dict[str, Any]] = {
    "id": {"type": "string"},
    "string": {"type": "string"},
    "int": {"type": "integer"},
    "long": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "timestamp": {"type": "string", "format": "date-time"},
    "json": {"type": "object"},
    "amounts": {"type": "object", "additionalProperties": {"type": "integer"}},
    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
}


def _nullable(schema: dict[str, Any], nullable: bool) -> dict[str, Any]:
    if not nullable:
        return schema
    if "type" in schema:
        return {**schema, "type": [schema["type"], "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def _property(entry: Entry) -> dict[str, Any]:
    if isinstance(entry, Relation):
        ref = {"$ref": f"#/components/schemas/{TABLES[entry.of].rest}"}
        if entry.many:
            return _nullable({"type": "array", "items": ref}, entry.nullable)
        return _nullable(ref, entry.nullable)
    schema = {"enum": list(entry.values)} if entry.values else dict(_KINDS[entry.kind])
    return _nullable(schema, entry.json_nullable)


def _component(table: Table) -> dict[str, Any]:
    """A REST object's schema from its table of fields (app/capacity/fields.py): every key
    REST shows, the ones it always shows required."""
    entries = [e for e in table.rest_entries if e.rest is not None]
    return {
        "type": "object",
        "required": [e.rest for e in entries if e.optional is None],
        "properties": {e.rest: _property(e) for e in entries if e.rest is not None},
    }


_COMPONENTS: dict[str, Any] = {
    **{t.rest: _component(t) for t in (QUOTA, CAPACITY) if t.rest is not None},
    "LendingRow": {
        "allOf": [
            {"$ref": "#/components/schemas/CapacityRow"},
            {
                "type": "object",
                "required": ["poolId", "offered", "guestUsed", "overcommit"],
                "properties": {"poolId": {"type": "string"}},
            },
        ]
    },
    **{t.rest: _component(t) for t in (OFFER, POOL, RESERVATION, GRANT) if t.rest is not None},
    "Access": {
        "type": "object",
        "required": ["allowed", "permission", "binding", "grant", "deniedBy"],
        "properties": {
            "allowed": {"type": "boolean"},
            "permission": {"type": "string"},
            "binding": {
                "type": "object",
                "properties": {
                    "callerId": {"type": "string"},
                    "tenantId": {"type": "string"},
                    "role": {"type": "string"},
                    "where": {"type": "object", "additionalProperties": {"type": "string"}},
                    "actingFor": {"type": "string"},
                    "fleetAdmin": {"type": "boolean"},
                },
            },
            "grant": {"anyOf": [{"$ref": "#/components/schemas/Grant"}, {"type": "null"}]},
            "deniedBy": {
                "type": ["object", "null"],
                "properties": {
                    "check": {"enum": ["owner", "role", "where"]},
                    "message": {"type": "string"},
                    "key": {"type": "string"},
                },
            },
        },
    },
    "Impact": {
        "type": "object",
        "required": [
            "tenantsLosingAccess",
            "quotaKept",
            "reservations",
            "offersEnded",
            "truncated",
        ],
        "properties": {
            "tenantsLosingAccess": {"type": "array", "items": {"type": "string"}},
            "quotaKept": {
                "type": "object",
                "additionalProperties": {
                    "type": "object",
                    "additionalProperties": {"type": "integer"},
                },
            },
            "reservations": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/Reservation"},
            },
            "offersEnded": {"type": "array", "items": {"type": "string"}},
            "truncated": {"type": "boolean"},
        },
    },
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "details"],
                "properties": {
                    "code": {"enum": list(CODES)},
                    "message": {"type": "string"},
                    "details": {"type": "object"},
                },
            }
        },
    },
}

_RESULTS: dict[str, dict[str, Any]] = {
    "pools": {"type": "array", "items": {"$ref": "#/components/schemas/Pool"}},
    "pool": {"$ref": "#/components/schemas/Pool"},
    "capacity": {"type": "array", "items": {"$ref": "#/components/schemas/CapacityRow"}},
    "removed": {"type": "boolean"},
    "access": {"$ref": "#/components/schemas/Access"},
    "lending": {"type": "array", "items": {"$ref": "#/components/schemas/LendingRow"}},
    "reservation": {"$ref": "#/components/schemas/Reservation"},
    "reservations": {"type": "array", "items": {"$ref": "#/components/schemas/Reservation"}},
}

_ERRORS = {
    "400": "INVALID_INPUT",
    "401": "UNAUTHENTICATED",
    "403": "PERMISSION_DENIED",
    "404": "NOT_FOUND",
    "409": "CONFLICT or INVALID_STATE",
    "429": "RESOURCE_EXHAUSTED",
    "503": "UNAVAILABLE",
}

# Input rules no JSON schema can carry (they compare two fields, or depend on the pool and
# its site): a body valid by the schema may still be INVALID_INPUT for these.
_RULES_BEYOND_THE_SCHEMA = {
    "pools.create": "the policy is checked against the pool's class and sharing and the "
    "site's kind (provision, sharing and tenancy validators)",
    "pools.update": "the policy is checked against the pool's class and sharing and the "
    "site's kind (provision, sharing and tenancy validators)",
    "pools.unoffer": "toTenantId must not be the pool's owner",
    "pools.list": "labelSelector is Kubernetes' selector syntax, at most 32 requirements of "
    "keys and values in label syntax, at most 32 values in a set (app/capacity/labels.py)",
}


# OpenAPI links, for stateful clients (and schemathesis' stateful phase): a pool's id from
# any answer that returns one, to the calls that take it; a booking's id to its release.
_ACT_FOR = {"tenantId": "$request.body#/tenantId"}
_POOL_CALLS = (
    "pools.get",
    "pools.capacity",
    "pools.offer",
    "pools.unoffer",
    "pools.update",
    "pools.archive",
    "reservations.create",
    "reservations.list",
)


def _links(operation_id: str, result_key: str) -> dict[str, Any]:
    if result_key == "pool":
        body = _ACT_FOR | {"poolId": "$response.body#/pool/id"}
        return {
            f"{target.replace('.', '-')}": {"operationId": target, "requestBody": body}
            for target in _POOL_CALLS
            if target != operation_id
        }
    if result_key == "reservation" and operation_id == "reservations.create":
        body = _ACT_FOR | {"reservationId": "$response.body#/reservation/id"}
        return {
            "reservations-release": {"operationId": "reservations.release", "requestBody": body}
        }
    return {}


def _responses_400(operation_id: str) -> str:
    rule = _RULES_BEYOND_THE_SCHEMA.get(operation_id)
    return _ERRORS["400"] + (f"; beyond the schema: {rule}" if rule else "")


# Writes that take `dryRun: true` answer {"impact": Impact} instead (CONTRACT section 10).
_DRY_RUNS = ("unoffer", "archive")


def _result_schema(name: str, key: str) -> dict[str, Any]:
    result = {"type": "object", "required": [key], "properties": {key: _RESULTS[key]}}
    if name not in _DRY_RUNS:
        return result
    impact = {"$ref": "#/components/schemas/Impact"}
    dry = {"type": "object", "required": ["impact"], "properties": {"impact": impact}}
    return {"oneOf": [result, dry]}


@cache
def openapi_document() -> dict[str, Any]:
    schemas = dict(_COMPONENTS)
    paths: dict[str, Any] = {}
    for m in METHODS:
        input_name = m.input.__name__
        schemas[input_name] = m.input.model_json_schema(
            by_alias=True, ref_template="#/components/schemas/{model}"
        )
        error_ref = {"$ref": "#/components/schemas/Error"}
        found = _links(f"{m.group}.{m.name}", m.result_key)
        links = {"links": found} if found else {}
        paths[m.path] = {
            "post": {
                "operationId": f"{m.group}.{m.name}",
                "summary": m.summary,
                "description": f"Authorization: {m.authorization}. Phase {m.phase}.",
                "tags": [m.group],
                "security": [{"bearer": []}],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {"$ref": f"#/components/schemas/{input_name}"}
                        }
                    },
                },
                "responses": {
                    "200": {
                        "description": "OK",
                        **links,
                        "content": {
                            "application/json": {"schema": _result_schema(m.name, m.result_key)}
                        },
                    },
                    **{
                        status: {
                            "description": _responses_400(f"{m.group}.{m.name}")
                            if status == "400"
                            else text,
                            "content": {"application/json": {"schema": error_ref}},
                        }
                        for status, text in _ERRORS.items()
                    },
                },
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Better Compute pools API", "version": "0.2.0"},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
