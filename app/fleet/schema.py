"""The fleet file (`bettercompute apply -f FILE`): its shape, read from YAML or JSON.

Strict like the API's inputs ("5" is not 5, unknown keys are refused); every error names
its place in the file, e.g. `pools[3].quota.gpu: must be a non-negative integer`.
Sites, provider accounts, callers and pools carry a `name`, unique per tenant and kind,
that stands for their generated id (ADR 0005).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from app.capacity.inputs import (
    MAX_AMOUNT,
    Agent,
    DisplayName,
    GpuModel,
    Labels,
    PoolClass,
    ResourceName,
    Sharing,
    TenantId,
)
from app.capacity.nodes import MAX_NODE_GPUS
from app.errors import InvalidInput

if TYPE_CHECKING:
    from app.fleet.document import FileBounds

# Letters, digits and ._:- like a tenant id, plus `_` so an id (`site_…`) is a valid name.
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")]
Role = Literal["viewer", "operator", "admin", "fleet-admin"]
BindingAttribute = Literal["gpuModel", "class", "sharing", "region", "owned"]


def _amount(value: object) -> int:
    if type(value) is not int or not 0 <= value <= MAX_AMOUNT:
        raise PydanticCustomError("amount", "must be a non-negative integer")
    return value


Amount = Annotated[int, PlainValidator(_amount)]
Quota = dict[ResourceName, Amount]


class Entry(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, populate_by_name=False)


class TenantEntry(Entry):
    id: TenantId
    parent: TenantId | None = None


class SiteEntry(Entry):
    tenant: TenantId
    name: Name
    kind: Literal["platform", "custom"]
    region: Annotated[str, StringConstraints(min_length=1, max_length=64)]


class ProviderAccountEntry(Entry):
    tenant: TenantId
    name: Name


class CallerEntry(Entry):
    tenant: TenantId
    name: Name
    role: Role
    where: dict[BindingAttribute, str] = Field(default_factory=dict)


class OfferEntry(Entry):
    tenant: TenantId
    quota: Quota
    include_descendants: bool = Field(default=False, alias="includeDescendants")
    priority: Annotated[int, Field(ge=-1000, le=1000)] = 0


class NodeEntry(Entry):
    """A node of GPUs in the pool, by a name unique per tenant (export writes its id)."""

    name: Name
    gpus: Annotated[int, Field(ge=1, le=MAX_NODE_GPUS)]
    owner_tenant: TenantId | None = Field(default=None, alias="ownerTenant")


class PoolEntry(Entry):
    tenant: TenantId
    name: Name
    site: Name
    pool_class: PoolClass = Field(alias="class")
    gpu_model: GpuModel | None = Field(default=None, alias="gpuModel")
    sharing: Sharing = "exclusive"
    agent: Agent | None = None
    provider_account: Name | None = Field(default=None, alias="providerAccount")
    policy: dict[str, Any] = Field(default_factory=dict)
    # Left out: left alone (a name or labels set through the API stay); given: exact.
    display_name: DisplayName | None = Field(default=None, alias="displayName")
    labels: Labels | None = None
    quota: Quota | None = None  # the owner's rows; when left out, a new pool gets the default
    offers: list[OfferEntry] = Field(default_factory=list)
    nodes: list[NodeEntry] = Field(default_factory=list)  # one left out is left alone
    archived: bool = False


class FleetFile(Entry):
    tenants: list[TenantEntry] = Field(default_factory=list)
    sites: list[SiteEntry] = Field(default_factory=list)
    provider_accounts: list[ProviderAccountEntry] = Field(
        default_factory=list, alias="providerAccounts"
    )
    callers: list[CallerEntry] = Field(default_factory=list)
    pools: list[PoolEntry] = Field(default_factory=list)


def _path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


def _message(error: Any) -> str:
    kind = error["type"]
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        return "unknown field"
    return str(error["msg"])


def _check_unique(fleet: FleetFile) -> None:
    """Each tenant once; each name once per tenant and kind; one offer per tenant."""

    def once(seen: set[Any], key: Any, where: str, what: str) -> None:
        if key in seen:
            raise InvalidInput(f"{where}: {what} appears twice in the file", field=where)
        seen.add(key)

    tenants: set[Any] = set()
    for i, tenant in enumerate(fleet.tenants):
        once(tenants, tenant.id, f"tenants[{i}].id", f"tenant {tenant.id}")
    named: list[tuple[str, list[Any]]] = [
        ("sites", fleet.sites),
        ("providerAccounts", fleet.provider_accounts),
        ("callers", fleet.callers),
        ("pools", fleet.pools),
    ]
    for kind, entries in named:
        names: set[Any] = set()
        for i, entry in enumerate(entries):
            once(
                names,
                (entry.tenant, entry.name),
                f"{kind}[{i}].name",
                f"name {entry.name} of tenant {entry.tenant}",
            )
    nodes: dict[str, set[Any]] = {}
    for i, pool in enumerate(fleet.pools):
        for j, node in enumerate(pool.nodes):
            where = f"pools[{i}].nodes[{j}].name"
            once(nodes.setdefault(pool.tenant, set()), node.name, where, f"node {node.name}")
    for i, pool in enumerate(fleet.pools):
        if pool.archived and pool.offers:
            where = f"pools[{i}].offers"
            raise InvalidInput(f"{where}: an archived pool is offered to no one", field=where)
        offered: set[Any] = set()
        for j, offer in enumerate(pool.offers):
            where = f"pools[{i}].offers[{j}].tenant"
            if offer.tenant == pool.tenant:
                raise InvalidInput(
                    f"{where}: the owner's own rows are the pool's quota, not an offer",
                    field=where,
                )
            once(offered, offer.tenant, where, f"an offer to {offer.tenant}")


def parse_fleet(document: object) -> FleetFile:
    """A decoded document to a fleet, or INVALID_INPUT naming the path inside the file."""
    if document is None:
        document = {}  # an empty file declares nothing
    if not isinstance(document, dict):
        raise InvalidInput("a fleet file is a mapping with tenants, sites, … pools")
    try:
        fleet = FleetFile.model_validate(document)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        path = _path(tuple(error["loc"]))
        raise InvalidInput(f"{path}: {_message(error)}", field=path) from None
    _check_unique(fleet)
    return fleet


def read_fleet(data: bytes | str, source: str, bounds: FileBounds | None = None) -> FleetFile:
    """Decode YAML (JSON is YAML too; `.json` files take the faster JSON parser), within
    the file bounds (app/fleet/document.py) before and while it is parsed."""
    from app.fleet import document  # only apply and export need YAML

    bounds = bounds or document.FileBounds()
    text = document.decode_text(data, source, bounds)
    if Path(source).suffix == ".json":
        import orjson

        document.check_json_depth(text, source, bounds)
        try:
            decoded: object = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            message = f"not valid JSON: {exc.msg}"
            raise document.refused(source, exc.lineno, exc.colno, message) from None
    else:
        import yaml

        try:
            decoded = document.load_yaml(text, source, bounds)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            problem = " ".join(p for p in (exc.context, exc.problem) if p)
            if mark is None:
                raise InvalidInput(f"{source}: not valid YAML: {problem}") from None
            raise document.refused(
                source, mark.line + 1, mark.column + 1, f"not valid YAML: {problem}"
            ) from None
        except yaml.YAMLError as exc:
            raise InvalidInput(f"{source}: not valid YAML: {exc}".replace("\n", " ")) from None
    return parse_fleet(decoded)
