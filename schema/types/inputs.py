"""Mutation inputs: the seed's input tables under the seed's names. Quota maps become
lists of {resource, max}; enums are GraphQL enums. `to_seed()` gives back the seed's
JSON shape, which the domain validates exactly as it validates a REST body."""

from __future__ import annotations

from enum import Enum
from typing import Any

import strawberry
from strawberry.scalars import JSON
from strawberry.utils.str_converters import to_camel_case

from app.errors import InvalidInput
from schema.scalars import Long
from schema.types.enums import Agent, PoolClass, Sharing

_NAME = "A name for people, at most 128 characters."
_LABELS = (
    "{key: value}, at most 32, in Kubernetes' label syntax: key [prefix/]name (name at "
    "most 63 characters), value at most 63 characters."
)
_TENANT = "The tenant the caller acts for; at most 128 characters of [A-Za-z0-9._:-]."
_POOL = "The pool, `pool_<ulid>`."
_KEY = "Makes the call idempotent: a retry with the same key returns the first result."
_DRY_RUN = (
    "true: nothing is written and no event is emitted; the payload's `impact` says what the "
    "call would change. The same checks run as for the real call. false when omitted."
)
_VERSION = (
    "The pool version this write expects; when the pool has moved past it the call is "
    "CONFLICT (extensions.currentVersion) and nothing changes. Any version when omitted."
)


@strawberry.input(description="One quota row to set: the most a tenant may book of a resource.")
class QuotaInput:
    resource: str = strawberry.field(
        description="The resource key, matching ^[A-Za-z][A-Za-z0-9._-]{0,63}$."
    )
    max: Long = strawberry.field(description="The maximum, 0 or more.")


@strawberry.input(description="An amount of one resource to book.")
class ResourceAmountInput:
    resource: str = strawberry.field(description="The resource key, e.g. `gpu`.")
    amount: Long = strawberry.field(description="How much, 1 or more.")


def _seed_value(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    return value


def _as_map(name: str, rows: list[Any] | None, amount: str) -> dict[str, int] | None:
    """A list of {resource, max|amount} back to the seed's map; a resource given twice is
    INVALID_INPUT rather than a silent overwrite."""
    if rows is None:
        return None
    found: dict[str, int] = {}
    for row in rows:
        if row.resource in found:
            raise InvalidInput(
                f"{name} names {row.resource} more than once", field=f"{name}.{row.resource}"
            )
        found[row.resource] = getattr(row, amount)
    return found


def _seed(input_object: object, maps: dict[str, str] | None = None) -> dict[str, Any]:
    """The fields the client gave (an explicit null included), under their seed names."""
    definition = input_object.__strawberry_definition__  # type: ignore[attr-defined]
    payload: dict[str, Any] = {}
    for field in definition.fields:
        value = getattr(input_object, field.python_name)
        if value is strawberry.UNSET:
            continue
        name = field.graphql_name or to_camel_case(field.python_name)
        if maps and name in maps:
            payload[name] = _as_map(name, value, maps[name])
        else:
            payload[name] = _seed_value(value)
    return payload


@strawberry.input(description="The seed's `create` input.")
class CreatePoolInput:
    tenant_id: str = strawberry.field(description=_TENANT)
    site_id: strawberry.ID = strawberry.field(
        description="A site the tenant owns, `site_<ulid>`; another tenant's is NOT_FOUND."
    )
    pool_class: PoolClass = strawberry.field(name="class", description="The pool's class.")
    gpu_model: str | None = strawberry.field(
        default=strawberry.UNSET, description="At most 32 characters of [A-Za-z0-9-]."
    )
    sharing: Sharing | None = strawberry.field(
        default=strawberry.UNSET, description="How GPUs are shared; EXCLUSIVE when omitted."
    )
    agent: Agent | None = strawberry.field(
        default=strawberry.UNSET,
        description="BCD when omitted, NONE for PROVIDER pools (which need NONE).",
    )
    policy: JSON | None = strawberry.field(
        default=strawberry.UNSET,
        description="The pool policy, checked as nodes will get it (v1.1).",
    )
    owner_quota: list[QuotaInput] | None = strawberry.field(
        default=strawberry.UNSET,
        description="The owner's quota rows; gpu at 2,147,483,647 when omitted.",
    )
    provider_account_id: strawberry.ID | None = strawberry.field(
        default=strawberry.UNSET,
        description="Required for PROVIDER pools (an account the tenant owns), refused otherwise.",
    )
    idempotency_key: str | None = strawberry.field(default=strawberry.UNSET, description=_KEY)
    display_name: str | None = strawberry.field(default=strawberry.UNSET, description=_NAME)
    labels: JSON | None = strawberry.field(default=strawberry.UNSET, description=_LABELS)

    def to_seed(self) -> dict[str, Any]:
        return _seed(self, {"ownerQuota": "max"})


@strawberry.input(description="The seed's `offer` input.")
class OfferPoolInput:
    tenant_id: str = strawberry.field(description=_TENANT + " It must own the pool.")
    pool_id: strawberry.ID = strawberry.field(description=_POOL)
    to_tenant_id: str = strawberry.field(description="The tenant to offer the pool to.")
    quota: list[QuotaInput] = strawberry.field(
        description="Creates or resizes that tenant's rows; a max below what is in use is "
        "raised to it; rows not named keep their value."
    )
    include_descendants: bool | None = strawberry.field(
        default=strawberry.UNSET,
        description="Whether the offer reaches the tenant's descendants; false when omitted.",
    )
    priority: int | None = strawberry.field(
        default=strawberry.UNSET, description="-1000 to 1000; 0 when omitted."
    )
    version: int | None = strawberry.field(default=strawberry.UNSET, description=_VERSION)

    def to_seed(self) -> dict[str, Any]:
        return _seed(self, {"quota": "max"})


@strawberry.input(description="The seed's `unoffer` input.")
class UnofferPoolInput:
    tenant_id: str = strawberry.field(description=_TENANT + " It must own the pool.")
    pool_id: strawberry.ID = strawberry.field(description=_POOL)
    to_tenant_id: str = strawberry.field(
        description="The tenant to withdraw the offer from; never the owner."
    )
    version: int | None = strawberry.field(default=strawberry.UNSET, description=_VERSION)
    dry_run: bool | None = strawberry.field(default=strawberry.UNSET, description=_DRY_RUN)

    def to_seed(self) -> dict[str, Any]:
        return _seed(self)


@strawberry.input(description="The seed's `update` input: policy, gpuModel or both.")
class UpdatePoolInput:
    tenant_id: str = strawberry.field(description=_TENANT + " It must own the pool.")
    pool_id: strawberry.ID = strawberry.field(description=_POOL)
    policy: JSON | None = strawberry.field(
        default=strawberry.UNSET, description="Replaces the policy as a whole."
    )
    gpu_model: str | None = strawberry.field(
        default=strawberry.UNSET, description="The new GPU model."
    )
    version: int | None = strawberry.field(default=strawberry.UNSET, description=_VERSION)

    def to_seed(self) -> dict[str, Any]:
        return _seed(self)


@strawberry.input(
    description="Names and labels (CONTRACT section 10): displayName, labels or both."
)
class LabelPoolInput:
    tenant_id: str = strawberry.field(description=_TENANT + " It must own the pool.")
    pool_id: strawberry.ID = strawberry.field(description=_POOL)
    display_name: str | None = strawberry.field(
        default=strawberry.UNSET, description=_NAME + ' "" removes the name.'
    )
    labels: JSON | None = strawberry.field(
        default=strawberry.UNSET, description=_LABELS + " Replaces the whole map."
    )
    version: int | None = strawberry.field(default=strawberry.UNSET, description=_VERSION)

    def to_seed(self) -> dict[str, Any]:
        return _seed(self)


@strawberry.input(description="The seed's `archive` input.")
class ArchivePoolInput:
    tenant_id: str = strawberry.field(description=_TENANT + " It must own the pool.")
    pool_id: strawberry.ID = strawberry.field(description=_POOL)
    version: int | None = strawberry.field(default=strawberry.UNSET, description=_VERSION)
    dry_run: bool | None = strawberry.field(default=strawberry.UNSET, description=_DRY_RUN)

    def to_seed(self) -> dict[str, Any]:
        return _seed(self)


@strawberry.input(description="Books resources in a visible pool (CONTRACT section 4).")
class CreateReservationInput:
    tenant_id: str = strawberry.field(description=_TENANT)
    pool_id: strawberry.ID = strawberry.field(description=_POOL)
    resources: list[ResourceAmountInput] = strawberry.field(
        description="What to book, 1 to 16 resources; each must fit the tenant's quota row "
        "and the pool's available capacity, or the call is RESOURCE_EXHAUSTED."
    )
    idempotency_key: str | None = strawberry.field(default=strawberry.UNSET, description=_KEY)

    def to_seed(self) -> dict[str, Any]:
        return _seed(self, {"resources": "amount"})


@strawberry.input(description="Ends a reservation; releasing twice is a no-op.")
class ReleaseReservationInput:
    tenant_id: str = strawberry.field(description=_TENANT)
    reservation_id: strawberry.ID = strawberry.field(description="`rsv_<ulid>`.")

    def to_seed(self) -> dict[str, Any]:
        return _seed(self)
