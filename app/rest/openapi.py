"""The OpenAPI document, generated from the catalog's input definitions."""

from __future__ import annotations

from functools import cache
from typing import Any

from app.catalog import METHODS
from app.errors import CODES

_QUOTA = {
    "type": "object",
    "required": ["resource", "max", "used"],
    "properties": {
        "resource": {"type": "string"},
        "max": {"type": "integer"},
        "used": {"type": "integer"},
        # On the rows the tenant books against; absent on an offer's rows (owner's view).
        "grant": {"anyOf": [{"$ref": "#/components/schemas/Grant"}, {"type": "null"}]},
    },
}
_COMPONENTS: dict[str, Any] = {
    "Quota": _QUOTA,
    "CapacityRow": {
        "type": "object",
        "required": ["resource", "total", "allocatable", "booked", "available"],
        "properties": {
            **{
                k: {"type": "string" if k == "resource" else "integer"}
                for k in ("resource", "total", "allocatable", "booked", "available")
            },
            # The lender's view: present for the owner with compute:pools:share only.
            "offered": {"type": "integer"},
            "guestUsed": {"type": "integer"},
            "overcommit": {"type": ["number", "null"]},
        },
    },
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
    "Offer": {
        "type": "object",
        "properties": {
            "tenantId": {"type": "string"},
            "includeDescendants": {"type": "boolean"},
            "priority": {"type": "integer"},
            "quotas": {"type": "array", "items": {"$ref": "#/components/schemas/Quota"}},
        },
    },
    "Pool": {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "tenantId": {"type": "string"},
            "siteId": {"type": "string"},
            "class": {"enum": ["metal-host", "metal-dedicated", "vps-host", "provider"]},
            "gpuModel": {"type": ["string", "null"]},
            "sharing": {"enum": ["exclusive", "mig", "timeslice", "mps"]},
            "agent": {"enum": ["bcd", "none"]},
            "policy": {"type": "object"},
            "providerAccountId": {"type": ["string", "null"]},
            "region": {"type": "string"},
            "owned": {"type": "boolean"},
            "archived": {"type": "boolean"},
            "version": {"type": "integer"},
            "quotas": {"type": "array", "items": {"$ref": "#/components/schemas/Quota"}},
            "offers": {
                "type": ["array", "null"],
                "items": {"$ref": "#/components/schemas/Offer"},
            },
            "createdAt": {"type": "string", "format": "date-time"},
            "updatedAt": {"type": "string", "format": "date-time"},
        },
    },
    "Reservation": {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "poolId": {"type": "string"},
            "tenantId": {"type": "string"},
            "resources": {"type": "object", "additionalProperties": {"type": "integer"}},
            "state": {"enum": ["active", "ended"]},
            "createdAt": {"type": "string", "format": "date-time"},
            "endedAt": {"type": ["string", "null"], "format": "date-time"},
        },
    },
    "Grant": {
        "type": "object",
        "required": ["tenantId", "includeDescendants", "priority", "offeredAt"],
        "properties": {
            "via": {"enum": ["owner", "offer", "ancestorOffer"]},
            "tenantId": {"type": "string"},
            "includeDescendants": {"type": "boolean"},
            "priority": {"type": "integer"},
            "offeredAt": {"type": ["string", "null"], "format": "date-time"},
        },
    },
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
