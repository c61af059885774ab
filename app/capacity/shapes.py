"""What a transport asks to read, as data: which values of a pool page, a pool and their
rows, under which keys, in which order (a GraphQL selection with its aliases, or REST's
fixed shape). The domain compiles a shape once into one statement (app/capacity/json_reads.py)
that applies CONTRACT section 2's rules and returns the answer as JSON.

Shapes are frozen and hashable: a transport makes one per query text, the domain caches
the statement per shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PoolValue = Literal[
    "id",
    "tenant_id",
    "site_id",
    "class",
    "gpu_model",
    "sharing",
    "agent",
    "provider_account_id",
    "region",
    "owned",
    "archived",
    "version",
    "created_at",
    "updated_at",
    "policy",  # as every surface shows it: secrets replaced by `<name>Set: true`
]
QuotaValue = Literal["pool_id", "resource", "max", "used"]
GrantValue = Literal["via", "tenant_id", "include_descendants", "priority", "offered_at"]
OfferValue = Literal["tenant_id", "include_descendants", "priority"]
CapacityValue = Literal["resource", "total", "allocatable", "booked", "available"]
PageInfoValue = Literal["has_next_page", "has_previous_page", "start_cursor", "end_cursor"]
Value = (
    PoolValue
    | QuotaValue
    | GrantValue
    | OfferValue
    | CapacityValue
    | PageInfoValue
    | Literal["cursor"]
)

# A stored value and what the transport shows for it (an enum's names, say).
Mapping = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Constant:
    """A fixed string under `key` (GraphQL's `__typename`)."""

    key: str
    value: str


@dataclass(frozen=True, slots=True)
class Read:
    """One value under `key`; `mapping` translates stored strings (enums)."""

    key: str
    value: Value
    mapping: Mapping | None = None


@dataclass(frozen=True, slots=True)
class Rows:
    """A list: a pool's `quotas` (those the acting tenant books against), `capacity` or
    `offers` (the owner's, with compute:pools:share), or an offer's `offer_quotas`.

    `offers` of an owned pool the caller may not share: `null` shows null (REST), and
    `decline` leaves the answer to the plain read, which reports the field's
    PERMISSION_DENIED (GraphQL). A pool the tenant does not own shows null either way."""

    key: str
    kind: Literal["quotas", "capacity", "offers", "offer_quotas"]
    fields: tuple[Field, ...]
    if_denied: Literal["null", "decline"] = "decline"


@dataclass(frozen=True, slots=True)
class Nested:
    """An object: the page's `page_info`, `nodes` or `edges`, an edge's `node`, or a
    quota row's `grant` (the offer that gives the row; null if it has ended)."""

    key: str
    kind: Literal["page_info", "nodes", "edges", "node", "grant"]
    fields: tuple[Field, ...]


Field = Constant | Read | Rows | Nested


@dataclass(frozen=True, slots=True)
class PageShape:
    """A page of the pools a tenant sees (the seed's `list`), under `key`."""

    key: str
    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class PoolShape:
    """One pool as the tenant sees it (the seed's `get`), under `key`."""

    key: str
    fields: tuple[Field, ...]


Shape = PageShape | PoolShape
