"""GraphQL documents for the tests, and the translations between REST's JSON shapes and
GraphQL's (enum names, quota lists), so one scenario can run through both."""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]

QUOTA = "resource max used"
# The rows the tenant books against carry their provenance (CONTRACT section 10).
OWN_QUOTA = QUOTA + " grant { tenantId includeDescendants priority offeredAt }"
POOL_FIELDS = f"""
fragment PoolFields on Pool {{
  id tenantId siteId class gpuModel sharing agent policy providerAccountId region
  displayName labels
  owned archived version createdAt updatedAt
  quotas {{ {OWN_QUOTA} }}
  offers {{ tenantId includeDescendants priority quotas {{ {QUOTA} }} }}
}}
"""
# offerPool answers an OfferedPool (its own cache identity); `poolId` is the REST id.
OFFERED_POOL_FIELDS = POOL_FIELDS.replace(
    "PoolFields on Pool", "OfferedFields on OfferedPool"
).replace("  id tenantId", "  id: poolId tenantId")
CAPACITY = "resource total allocatable booked available"

DASHBOARD = f"""
query Dashboard($tenantId: String!, $first: Int, $after: String) {{
  pools(tenantId: $tenantId, first: $first, after: $after) {{
    pageInfo {{ hasNextPage endCursor }}
    nodes {{
      id class gpuModel sharing region owned archived version
      quotas {{ {QUOTA} }}
      capacity {{ resource available }}
    }}
  }}
}}
"""

LIST = (
    "query List($tenantId: String!) { pools(tenantId: $tenantId, first: 100) "
    "{ nodes { ...PoolFields } } }" + POOL_FIELDS
)
GET = (
    "query Get($tenantId: String!, $poolId: ID!) "
    "{ pool(tenantId: $tenantId, poolId: $poolId) { ...PoolFields } }" + POOL_FIELDS
)
CAPACITY_QUERY = (
    "query Capacity($tenantId: String!, $poolId: ID!) "
    f"{{ capacity(tenantId: $tenantId, poolId: $poolId) {{ {CAPACITY} }} }}"
)


def pool_mutation(name: str, input_type: str) -> str:
    if name == "offerPool":
        return (
            f"mutation M($input: {input_type}!) {{ {name}(input: $input) "
            "{ pool { ...OfferedFields } } }" + OFFERED_POOL_FIELDS
        )
    return (
        f"mutation M($input: {input_type}!) {{ {name}(input: $input) "
        "{ pool { ...PoolFields } } }" + POOL_FIELDS
    )


UNOFFER = "mutation M($input: UnofferPoolInput!) { unofferPool(input: $input) { removed } }"
CREATE_RESERVATION = (
    "mutation M($input: CreateReservationInput!) { createReservation(input: $input) "
    "{ reservation { id poolId tenantId state resources { resource amount } createdAt endedAt } } }"
)
RELEASE_RESERVATION = (
    "mutation M($input: ReleaseReservationInput!) { releaseReservation(input: $input) "
    "{ reservation { id state endedAt } } }"
)

# REST method -> (document, GraphQL root field, REST result key, takes `input`)
METHODS: dict[str, tuple[str, str, str, bool]] = {
    "list": (LIST, "pools", "pools", False),
    "get": (GET, "pool", "pool", False),
    "capacity": (CAPACITY_QUERY, "capacity", "capacity", False),
    "create": (pool_mutation("createPool", "CreatePoolInput"), "createPool", "pool", True),
    "offer": (pool_mutation("offerPool", "OfferPoolInput"), "offerPool", "pool", True),
    "unoffer": (UNOFFER, "unofferPool", "removed", True),
    "update": (pool_mutation("updatePool", "UpdatePoolInput"), "updatePool", "pool", True),
    "archive": (pool_mutation("archivePool", "ArchivePoolInput"), "archivePool", "pool", True),
}

_ENUM_FIELDS = ("class", "sharing", "agent")
_QUOTA_MAPS = ("ownerQuota", "quota")


def enum_name(rest: str) -> str:
    return rest.upper().replace("-", "_")


def to_variables(method: str, body: Json) -> Json:
    """A REST body as the GraphQL call's variables: enums by name, quota maps as lists."""
    if not METHODS[method][3]:
        return dict(body)
    converted: Json = {}
    for key, value in body.items():
        if key in _ENUM_FIELDS and isinstance(value, str):
            converted[key] = enum_name(value)
        elif key in _QUOTA_MAPS and isinstance(value, dict):
            converted[key] = [{"resource": r, "max": m} for r, m in value.items()]
        else:
            converted[key] = value
    return {"input": converted}


def rest_pool(pool: Json) -> Json:
    """A GraphQL Pool in REST's shape."""
    shaped = dict(pool)
    for key in _ENUM_FIELDS:
        shaped[key] = pool[key].lower().replace("_", "-")
    return shaped


def to_rest(method: str, data: Any) -> Json:
    """A GraphQL answer's data in the REST response's shape."""
    _, field, key, _ = METHODS[method]
    value = data[field]
    if method == "list":
        return {key: [rest_pool(p) for p in value["nodes"]]}
    if key == "pool":
        return {key: rest_pool(value.get("pool", value))}
    if method == "unoffer":
        return {key: value["removed"]}
    return {key: value}
