"""The method table: the one list of what the API serves.

REST routes, the domain's IAM checks (each method's permission, and whether its tenant
decision is made on the tenant or, for a method on compute-pool, on the pool once it is
visible: app/capacity/access.py), `GET /api/compute/catalog`, the `catalog` GraphQL query
and the OpenAPI document are all read from these rows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from app.capacity import inputs
from app.iam import roles
from app.iam.principal import Principal

if TYPE_CHECKING:  # the domain reads these rows, so the table does not import its entry point
    from app.capacity.service import Capacity

Call: TypeAlias = "Callable[[Capacity, Principal, Any], Awaitable[Any]]"
ResourceType = Literal["compute-tenant", "compute-pool"]


@dataclass(frozen=True)
class Method:
    group: str
    name: str
    kind: str  # "read" or "mutation"
    authorization: str  # as the seed's Authorization column prints it
    permission: str
    resource_type: ResourceType  # where the tenant decision is made (CONTRACT section 2)
    phase: str
    summary: str
    input: type[inputs.MethodInput]
    call: Call
    result_key: str  # the REST response's one top-level key
    module: str = "capacity"
    status: str = "registered"

    @property
    def path(self) -> str:
        return f"/api/compute/{self.group}/{self.name}"

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "authorization": self.authorization,
            "module": self.module,
            "phase": self.phase,
            "status": self.status,
            "path": self.path,
            "summary": self.summary,
            "input": self.input.model_json_schema(by_alias=True),
        }


def _row(
    group: str,
    name: str,
    kind: str,
    permission: str,
    on: ResourceType,
    phase: str,
    summary: str,
    model: type[inputs.MethodInput],
    call: Call,
    result_key: str,
    authorization: str | None = None,
) -> Method:
    return Method(
        group=group,
        name=name,
        kind=kind,
        authorization=authorization or f"{permission} @ {on}",
        permission=permission,
        resource_type=on,
        phase=phase,
        summary=summary,
        input=model,
        call=call,
        result_key=result_key,
    )


LIST_POOLS = _row(
    "pools",
    "list",
    "read",
    roles.POOLS_READ,
    "compute-tenant",
    "v0.1",
    "Returns the pools the tenant owns or is offered, each with owned, archived and the "
    "tenant's own quota rows.",
    inputs.ListPoolsInput,
    lambda c, p, i: c.list_pools(p, i),
    "pools",
    authorization=f"{roles.POOLS_READ} @ compute-tenant + items",
)
GET_POOL = _row(
    "pools",
    "get",
    "read",
    roles.POOLS_READ,
    "compute-pool",
    "v0.1",
    "Returns one pool as the tenant sees it, with owned, archived and the tenant's own quota rows.",
    inputs.GetPoolInput,
    lambda c, p, i: c.get_pool(p, i),
    "pool",
)
CREATE_POOL = _row(
    "pools",
    "create",
    "mutation",
    roles.POOLS_CREATE,
    "compute-tenant",
    "v0.1",
    "Creates a pool on a site the tenant owns, with the owner's quota rows and an empty "
    "rollup; returns the pool at version 1.",
    inputs.CreatePoolInput,
    lambda c, p, i: c.create_pool(p, i),
    "pool",
    authorization=f"{roles.POOLS_CREATE} @ compute-fleet or {roles.POOLS_CREATE} @ compute-tenant",
)
POOL_CAPACITY = _row(
    "pools",
    "capacity",
    "read",
    roles.CAPACITY_READ,
    "compute-pool",
    "v0.1",
    "Returns one pool's rollup rows, one per resource.",
    inputs.CapacityInput,
    lambda c, p, i: c.capacity(p, i),
    "capacity",
)
OFFER_POOL = _row(
    "pools",
    "offer",
    "mutation",
    roles.POOLS_SHARE,
    "compute-pool",
    "v0.1",
    "Offers a pool the tenant owns to another tenant with a quota, or updates an "
    "existing offer and its quota; returns the pool as that tenant sees it.",
    inputs.OfferPoolInput,
    lambda c, p, i: c.offer_pool(p, i),
    "pool",
)
UNOFFER_POOL = _row(
    "pools",
    "unoffer",
    "mutation",
    roles.POOLS_SHARE,
    "compute-pool",
    "v0.1",
    "Withdraws a pool's offer from a tenant and returns whether an offer was removed.",
    inputs.UnofferPoolInput,
    lambda c, p, i: c.unoffer_pool(p, i),
    "removed",
)
UPDATE_POOL = _row(
    "pools",
    "update",
    "mutation",
    roles.POOLS_MANAGE,
    "compute-pool",
    "v0.2",
    "Replaces the policy, the GPU model, or both, of a pool the tenant owns, and returns "
    "the pool with its version incremented.",
    inputs.UpdatePoolInput,
    lambda c, p, i: c.update_pool(p, i),
    "pool",
)
ARCHIVE_POOL = _row(
    "pools",
    "archive",
    "mutation",
    roles.POOLS_MANAGE,
    "compute-pool",
    "v0.2",
    "Retires a pool the tenant owns: it removes every offer and stops new work, while "
    "live reservations keep their bookings until they end.",
    inputs.ArchivePoolInput,
    lambda c, p, i: c.archive_pool(p, i),
    "pool",
)
POOL_METHODS: tuple[Method, ...] = (
    LIST_POOLS,
    GET_POOL,
    CREATE_POOL,
    POOL_CAPACITY,
    OFFER_POOL,
    UNOFFER_POOL,
    UPDATE_POOL,
    ARCHIVE_POOL,
)

# An extension beyond the seed page that makes quota use real (CONTRACT section 4).
CREATE_RESERVATION = _row(
    "reservations",
    "create",
    "mutation",
    roles.RESERVATIONS_WRITE,
    "compute-pool",
    "extension",
    "Books resources in a visible pool against the tenant's quota and the "
    "pool's available capacity.",
    inputs.CreateReservationInput,
    lambda c, p, i: c.create_reservation(p, i),
    "reservation",
)
RELEASE_RESERVATION = _row(
    "reservations",
    "release",
    "mutation",
    roles.RESERVATIONS_WRITE,
    # Decided on the tenant (a reservation is looked up in its tenant), then on its pool.
    "compute-tenant",
    "extension",
    "Ends a reservation and returns its bookings; releasing twice is a no-op.",
    inputs.ReleaseReservationInput,
    lambda c, p, i: c.release_reservation(p, i),
    "reservation",
    authorization=f"{roles.RESERVATIONS_WRITE} @ compute-pool",
)
LIST_RESERVATIONS = _row(
    "reservations",
    "list",
    "read",
    roles.RESERVATIONS_READ,
    "compute-tenant",
    "extension",
    "Lists the tenant's reservations, in every visible pool or in one.",
    inputs.ListReservationsInput,
    lambda c, p, i: c.list_reservations(p, i),
    "reservations",
)
RESERVATION_METHODS: tuple[Method, ...] = (
    CREATE_RESERVATION,
    RELEASE_RESERVATION,
    LIST_RESERVATIONS,
)

# CONTRACT section 10's extensions that are methods of their own.
EXPLAIN_ACCESS = _row(
    "pools",
    "explain",
    "read",
    roles.POOLS_READ,
    "compute-pool",
    "extension",
    "Explains whether the calling principal holds a permission on a pool as the tenant, "
    "and why: its binding, the offer that grants the pool, or the first check that fails. "
    "A pool the tenant cannot see is answered as `get` answers it.",
    inputs.ExplainAccessInput,
    lambda c, p, i: c.explain_access(p, i),
    "access",
    authorization="any caller acting for the tenant @ compute-pool (visibility)",
)
LENDING = _row(
    "pools",
    "lending",
    "read",
    roles.POOLS_SHARE,
    "compute-tenant",
    "extension",
    "The lender's view of the tenant's fleet: every capacity row of the live pools it "
    "owns (and may share), with what it offered to guests, their use and the "
    "overcommit, the most overcommitted first; at most `first` rows.",
    inputs.LendingInput,
    lambda c, p, i: c.lending(p, i),
    "lending",
    authorization=f"{roles.POOLS_SHARE} @ compute-tenant + items",
)
# Names and labels (CONTRACT section 10), GCE's setLabels.
LABEL_POOL = _row(
    "pools",
    "label",
    "mutation",
    roles.POOLS_MANAGE,
    "compute-pool",
    "extension",
    "Sets the display name, the labels (the whole map), or both, of a pool the tenant "
    "owns, and returns the pool; a change increments its version.",
    inputs.LabelPoolInput,
    lambda c, p, i: c.label_pool(p, i),
    "pool",
)
EXTENSION_METHODS: tuple[Method, ...] = (EXPLAIN_ACCESS, LENDING, LABEL_POOL)

METHODS: tuple[Method, ...] = POOL_METHODS + RESERVATION_METHODS + EXTENSION_METHODS
_BY_PATH = {m.path: m for m in METHODS}


def method(group: str, name: str) -> Method:
    """The catalog row of `group/name`; a KeyError is a bug in the caller."""
    return _BY_PATH[f"/api/compute/{group}/{name}"]
