"""What a transport asks to read, as data: which values of a pool page, a pool and their
rows, under which keys, in which order (a GraphQL selection with its aliases, or REST's
fixed shape). The domain compiles a shape once into one statement (app/capacity/json_reads.py)
that applies CONTRACT section 2's rules and returns the answer as JSON.

Which values exist is not listed here: a Read names a row of the table of fields
(app/capacity/fields.py), from which transports derive their shapes.

Shapes are frozen and hashable: a transport makes one per query text, the domain caches
the statement per shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The value a Read names: a field's `name` in its table (app/capacity/fields.py: the
# compiled builder selects that row's column for it), a pageInfo value, or an edge's
# "cursor". The tables are the one list of names; a name they lack compiles to nothing.
Value = str

# The kinds of rows the compiled builder reads (json_reads: which rows, in which order,
# under which rule), and the object a quota row nests.
RowsKind = Literal["quotas", "capacity", "offers", "offer_quotas", "reservations"]
NestedKind = Literal["page_info", "nodes", "edges", "node", "grant", "binding", "denial", "amounts"]

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
    kind: RowsKind
    fields: tuple[Field, ...]
    if_denied: Literal["null", "decline"] = "decline"


@dataclass(frozen=True, slots=True)
class Nested:
    """An object: the page's `page_info`, `nodes` or `edges`, an edge's `node`, a
    quota row's `grant` (the offer that gives the row; null if it has ended), an
    access explanation's `binding`, `grant` or `denial`, or a reservation's
    `amounts` (GraphQL's list of ResourceAmount: `resource`, `amount`)."""

    key: str
    kind: NestedKind
    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class Paged:
    """A pool's page of the acting tenant's own reservations (GraphQL's
    `Pool.reservations`): a connection whose `fields` are `nodes`, `edges` and
    `page_info` as a page of pools has them, paged by its own arguments, bound per
    request as the statement's parameters `<param>_first` and `<param>_after`."""

    key: str
    kind: Literal["reservations"]
    fields: tuple[Field, ...]
    param: str


Field = Constant | Read | Rows | Nested | Paged


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


@dataclass(frozen=True, slots=True)
class ListShape:
    """Every pool the tenant sees, in id order, as one list under `key` (REST's `list`)."""

    key: str
    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class QuotasShape:
    """The quota rows the tenant books against, in every pool it may read or in one (the
    `quotas` read), in pool and resource order, as one list under `key`."""

    key: str
    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class CapacityShape:
    """One pool's rollup rows (the seed's `capacity`), in resource order, as one list
    under `key`; for the pool's owner with compute:pools:share, the lender's values too.
    Anyone else sees them null, or, with `lender_keys_absent` (REST), not at all."""

    key: str
    fields: tuple[Field, ...]
    lender_keys_absent: bool = False


@dataclass(frozen=True, slots=True)
class LendingShape:
    """The capacity rows of the tenant's live pools, with the lender's values, the most
    overcommitted first (the `lending` read), at most `first` of them, under `key`."""

    key: str
    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class AccessShape:
    """Why the caller holds a permission on one pool (the `access` read, REST's
    `pools/explain`), under `key`: the facts read by one statement, decided in Python by
    the plain read's rule (explain.explanation). With `optional_keys_absent` (REST), an
    optional value that is null is left out (a denial's `key`)."""

    key: str
    fields: tuple[Field, ...]
    optional_keys_absent: bool = False


@dataclass(frozen=True, slots=True)
class ReservationsShape:
    """The tenant's own reservations, in every pool or in one it sees (REST's
    `reservations/list`), in id order, as one list under `key`."""

    key: str
    fields: tuple[Field, ...]


Shape = (
    PageShape
    | PoolShape
    | ListShape
    | QuotasShape
    | CapacityShape
    | LendingShape
    | AccessShape
    | ReservationsShape
)
