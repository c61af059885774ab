"""The seed's input tables, defined once. REST, GraphQL, the catalog and OpenAPI read these."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)

from app.capacity.bounds import MAX_RESOURCES
from app.capacity.labels import (
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    MAX_DISPLAY_NAME,
    MAX_KEY_LENGTH,
    MAX_LABELS,
    MAX_SELECTOR_LENGTH,
    check_label_key,
)
from app.errors import InvalidInput
from app.events.cursor import MAX_CURSOR_LENGTH

ULID_TAIL = "[0-9a-hjkmnp-tv-z]{26,52}"
POOL_ID_PATTERN = rf"pool_{ULID_TAIL}"
RESERVATION_ID_PATTERN = rf"rsv_{ULID_TAIL}"
MAX_AMOUNT = 2**63 - 1

TenantId = Annotated[str, StringConstraints(max_length=128, pattern=r"^[A-Za-z0-9._:-]{1,128}$")]
PoolId = Annotated[str, StringConstraints(max_length=57, pattern=rf"^pool_{ULID_TAIL}$")]
SiteId = Annotated[str, StringConstraints(max_length=57, pattern=rf"^site_{ULID_TAIL}$")]
ProviderAccountId = Annotated[
    str, StringConstraints(max_length=58, pattern=rf"^pacct_{ULID_TAIL}$")
]
ReservationId = Annotated[str, StringConstraints(max_length=56, pattern=rf"^rsv_{ULID_TAIL}$")]
GpuModel = Annotated[str, StringConstraints(max_length=32, pattern=r"^[A-Za-z0-9-]{1,32}$")]
ResourceName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9._-]{0,63}$")]
IdempotencyKey = Annotated[
    str, StringConstraints(max_length=128, pattern=r"^[A-Za-z0-9._~:/+=-]{1,128}$")
]


def _integral(value: object) -> object:
    """JSON has one number type and JSON Schema's `integer` includes 2.0 (ADR 0001): an
    integral float is that integer; 2.5, "2" and true stay refused (strict)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


INTEGRAL = BeforeValidator(_integral)
Amount = Annotated[int, Field(ge=0, le=MAX_AMOUNT), INTEGRAL]
PositiveAmount = Annotated[int, Field(ge=1, le=MAX_AMOUNT), INTEGRAL]
# The JSON schema of a resource map says what validation does: keys that do not match the
# pattern are refused (patternProperties alone would let them through unchecked), and so
# are more than MAX_RESOURCES of them (maxProperties).
_ONLY_RESOURCE_KEYS = Field(json_schema_extra={"additionalProperties": False})
QuotaMap = Annotated[
    dict[ResourceName, Amount], Field(max_length=MAX_RESOURCES), _ONLY_RESOURCE_KEYS
]

# Names and labels (CONTRACT section 10): Kubernetes' syntax, app/capacity/labels.py.
DisplayName = Annotated[str, StringConstraints(max_length=MAX_DISPLAY_NAME)]
LabelKey = Annotated[
    str,
    StringConstraints(max_length=MAX_KEY_LENGTH, pattern=LABEL_KEY_PATTERN),
    AfterValidator(check_label_key),
]
LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE_PATTERN)]
Labels = Annotated[
    dict[LabelKey, LabelValue],
    Field(max_length=MAX_LABELS, json_schema_extra={"additionalProperties": False}),
]
LabelSelector = Annotated[str, StringConstraints(max_length=MAX_SELECTOR_LENGTH)]

PoolClass = Literal["metal-host", "metal-dedicated", "vps-host", "provider"]
Sharing = Literal["exclusive", "mig", "timeslice", "mps"]
Agent = Literal["bcd", "none"]


# The pool version a write expects (CONTRACT section 10); when the pool has moved past it
# the write is CONFLICT with details.currentVersion.
ExpectedVersion = Annotated[int, Field(ge=1, le=2**31 - 1), INTEGRAL]


class MethodInput(BaseModel):
    # Strict: "5" is not 5 and true is not 1; unknown fields are refused.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, populate_by_name=False)


class ListPoolsInput(MethodInput):
    tenant_id: TenantId = Field(alias="tenantId")
    # Kubernetes' selector syntax, parsed by the domain (app/capacity/labels.py).
    label_selector: LabelSelector | None = Field(default=None, alias="labelSelector")


class GetPoolInput(MethodInput):
    tenant_id: TenantId = Field(alias="tenantId")
    pool_id: PoolId = Field(alias="poolId")


class CapacityInput(GetPoolInput):
    pass


class CreatePoolInput(MethodInput):
    # The seed's cross-field rule, in the JSON schema so that schema-driven clients know it
    # (the domain enforces it: app/capacity/pools.py `_effective_agent`).
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"required": ["class"], "properties": {"class": {"const": "provider"}}},
            "then": {
                "required": ["providerAccountId"],
                "properties": {
                    "providerAccountId": {"type": "string"},
                    "agent": {"enum": ["none", None]},
                },
            },
            "else": {"properties": {"providerAccountId": {"type": "null"}}},
        }
    )

    tenant_id: TenantId = Field(alias="tenantId")
    site_id: SiteId = Field(alias="siteId")
    pool_class: PoolClass = Field(alias="class")
    gpu_model: GpuModel | None = Field(default=None, alias="gpuModel")
    sharing: Sharing = "exclusive"
    agent: Agent | None = None
    policy: dict[str, Any] | None = None
    owner_quota: QuotaMap | None = Field(default=None, alias="ownerQuota")
    provider_account_id: ProviderAccountId | None = Field(default=None, alias="providerAccountId")
    idempotency_key: IdempotencyKey | None = Field(default=None, alias="idempotencyKey")
    display_name: DisplayName | None = Field(default=None, alias="displayName")
    labels: Labels | None = None


class OfferPoolInput(MethodInput):
    tenant_id: TenantId = Field(alias="tenantId")
    pool_id: PoolId = Field(alias="poolId")
    to_tenant_id: TenantId = Field(alias="toTenantId")
    quota: QuotaMap
    include_descendants: bool = Field(default=False, alias="includeDescendants")
    priority: Annotated[int, Field(ge=-1000, le=1000), INTEGRAL] = 0
    version: ExpectedVersion | None = None


class UnofferPoolInput(MethodInput):
    tenant_id: TenantId = Field(alias="tenantId")
    pool_id: PoolId = Field(alias="poolId")
    to_tenant_id: TenantId = Field(alias="toTenantId")
    version: ExpectedVersion | None = None
    # Answer the impact instead of acting: nothing written, no event (CONTRACT section 10).
    dry_run: bool = Field(default=False, alias="dryRun")


class UpdatePoolInput(MethodInput):
    # At least one change (the domain's rule in app/capacity/pools.py `update_pool`).
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["policy"], "properties": {"policy": {"type": "object"}}},
                {"required": ["gpuModel"], "properties": {"gpuModel": {"type": "string"}}},
            ]
        }
    )

    tenant_id: TenantId = Field(alias="tenantId")
    pool_id: PoolId = Field(alias="poolId")
    policy: dict[str, Any] | None = None
    gpu_model: GpuModel | None = Field(default=None, alias="gpuModel")
    version: ExpectedVersion | None = None


class LabelPoolInput(MethodInput):
    """Names and labels (CONTRACT section 10): `labels` replaces the map; `displayName` ""
    removes the name. At least one of the two (the domain's rule: pools.label_pool)."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["displayName"], "properties": {"displayName": {"type": "string"}}},
                {"required": ["labels"], "properties": {"labels": {"type": "object"}}},
            ]
        }
    )

    tenant_id: TenantId = Field(alias="tenantId")
    pool_id: PoolId = Field(alias="poolId")
    display_name: DisplayName | None = Field(default=None, alias="displayName")
    labels: Labels | None = None
    version: ExpectedVersion | None = None


class ArchivePoolInput(GetPoolInput):
    version: ExpectedVersion | None = None
    dry_run: bool = Field(default=False, alias="dryRun")


# Permissions decided on a pool (compute-pool), the ones `explain` can answer for.
PoolPermission = Literal[
    "compute:pools:read",
    "compute:capacity:read",
    "compute:pools:manage",
    "compute:pools:share",
    "compute:reservations:read",
    "compute:reservations:write",
]


class ExplainAccessInput(MethodInput):
    """Why the calling principal may or may not use `permission` on a pool as `tenantId`."""

    tenant_id: TenantId = Field(alias="tenantId")
    pool_id: PoolId = Field(alias="poolId")
    permission: PoolPermission


class LendingInput(MethodInput):
    """The owner's capacity rows with what it lent, the most overcommitted first."""

    tenant_id: TenantId = Field(alias="tenantId")
    first: Annotated[int, Field(ge=0, le=100), INTEGRAL] = 50


class CreateReservationInput(MethodInput):
    tenant_id: TenantId = Field(alias="tenantId")
    pool_id: PoolId = Field(alias="poolId")
    resources: Annotated[
        dict[ResourceName, PositiveAmount],
        Field(min_length=1, max_length=MAX_RESOURCES),
        _ONLY_RESOURCE_KEYS,
    ]
    idempotency_key: IdempotencyKey | None = Field(default=None, alias="idempotencyKey")


class ReleaseReservationInput(MethodInput):
    tenant_id: TenantId = Field(alias="tenantId")
    reservation_id: ReservationId = Field(alias="reservationId")


class ListReservationsInput(MethodInput):
    tenant_id: TenantId = Field(alias="tenantId")
    pool_id: PoolId | None = Field(default=None, alias="poolId")


class ListQuotasInput(MethodInput):
    """The acting tenant's own quota rows, in every visible pool or in one."""

    tenant_id: TenantId = Field(alias="tenantId")
    pool_id: PoolId | None = Field(default=None, alias="poolId")


EventType = Literal[
    "pool.created",
    "pool.offered",
    "pool.unoffered",
    "pool.updated",
    "pool.archived",
    "pool.usage",
]


class PoolEventsInput(MethodInput):
    """The `poolEvents` subscription; `after` is a cursor the domain decodes."""

    tenant_id: TenantId = Field(alias="tenantId")
    pool_id: PoolId | None = Field(default=None, alias="poolId")
    types: Annotated[list[EventType], Field(max_length=6)] | None = None
    after: Annotated[str, StringConstraints(max_length=MAX_CURSOR_LENGTH)] | None = None


InputT = TypeVar("InputT", bound=MethodInput)


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


def parse_input(model: type[InputT], payload: object) -> InputT:
    """Validate a JSON-shaped payload; the first problem becomes INVALID_INPUT naming its field."""
    if not isinstance(payload, dict):
        raise InvalidInput("the request body must be a JSON object")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        loc = tuple(p for p in error["loc"] if p not in ("[key]",))
        field = _field_path(loc) or None
        if error["type"] == "extra_forbidden":
            raise InvalidInput(f"unknown field {field}", field=field) from None
        if error["type"] == "missing":
            raise InvalidInput(f"{field} is required", field=field) from None
        raise InvalidInput(f"{field}: {error['msg']}", field=field) from None
