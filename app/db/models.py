"""The tables. One metadata for both dialects; Alembic migrations mirror it exactly."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    TypeDecorator,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from app.db.defaults import FIRST_AGENT_REVISION, utcnow

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JSONType = JSON().with_variant(JSONB(), "postgresql")
# SQLite only autoincrements an INTEGER PRIMARY KEY.
SeqType = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on both dialects (SQLite stores naive text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime")
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSONType, datetime: UTCDateTime}


class Tenant(Base):
    """The built-in `fleet` tenant (app.iam.roles.FLEET_TENANT) is created by migration
    0002, whose triggers refuse to delete or rename it; this CHECK keeps it a root."""

    __tablename__ = "tenants"
    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    parent_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    __table_args__ = (
        CheckConstraint("id <> 'fleet' OR parent_id IS NULL", name="fleet_has_no_parent"),
    )


class Caller(Base):
    __tablename__ = "callers"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class RoleBinding(Base):
    """A caller's one role, optionally narrowed to pools with matching attributes."""

    __tablename__ = "role_bindings"
    caller_id: Mapped[str] = mapped_column(ForeignKey("callers.id"), primary_key=True)
    role: Mapped[str] = mapped_column(String(32))
    conditions: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # Written by every change (onupdate) and indexed: each serve process looks for the
    # bindings changed lately, so open subscriptions follow a rebinding (app/iam/bindings.py).
    updated_at: Mapped[datetime | None] = mapped_column(default=utcnow, onupdate=utcnow, index=True)


class ApiToken(Base):
    __tablename__ = "api_tokens"
    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    caller_id: Mapped[str] = mapped_column(ForeignKey("callers.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Indexed: each serve process looks for recent revocations every few seconds.
    revoked_at: Mapped[datetime | None] = mapped_column(index=True)


class Site(Base):
    __tablename__ = "sites"
    id: Mapped[str] = mapped_column(String(57), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    region: Mapped[str] = mapped_column(String(64))
    # Desired-state revision of the site's agents; bumped when a pool's prewarmImages change.
    agent_revision: Mapped[int] = mapped_column(default=FIRST_AGENT_REVISION)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ProviderAccount(Base):
    __tablename__ = "provider_accounts"
    id: Mapped[str] = mapped_column(String(58), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Pool(Base):
    __tablename__ = "pools"
    id: Mapped[str] = mapped_column(String(57), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    site_id: Mapped[str] = mapped_column(ForeignKey("sites.id"), index=True)
    pool_class: Mapped[str] = mapped_column("class", String(16), key="pool_class")
    gpu_model: Mapped[str | None] = mapped_column(String(32))
    sharing: Mapped[str] = mapped_column(String(16))
    agent: Mapped[str] = mapped_column(String(8))
    policy: Mapped[dict[str, Any]] = mapped_column(default=dict)
    provider_account_id: Mapped[str | None] = mapped_column(ForeignKey("provider_accounts.id"))
    region: Mapped[str] = mapped_column(String(64))
    # For people (CONTRACT section 10 "Names and labels"); a fleet file's `name` stays its
    # handle (fleet_names). `labels`: {key: value}, Kubernetes' syntax (app/capacity/labels.py).
    display_name: Mapped[str | None] = mapped_column(String(128))
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    archived: Mapped[bool] = mapped_column(Boolean, default=False)
    version: Mapped[int] = mapped_column(default=1)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Offer(Base):
    """`tenant_id` names a tenant id with no foreign key (migration 0006): an offer to an id
    no tenant holds is stored like any other, so the answer tells no tenant's admin which
    ids exist; it stays inert until a tenant of that id exists (docs/decisions/0001)."""

    __tablename__ = "offers"
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id"), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True, index=True)
    include_descendants: Mapped[bool] = mapped_column(Boolean, default=False)
    priority: Mapped[int] = mapped_column(default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class QuotaRow(Base):
    """Outlives its offer: after an unoffer `max` drops to `used` so live bookings stay."""

    __tablename__ = "quota_rows"
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id"), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)  # as Offer's
    resource: Mapped[str] = mapped_column(String(64), primary_key=True)
    max: Mapped[int] = mapped_column(BigInteger)
    used: Mapped[int] = mapped_column(BigInteger, default=0)
    # Stamped by every booking and release (app/capacity/usage.py): `pool.usage` events.
    usage_tx: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    __table_args__ = (
        Index("ix_quota_rows_tenant_pool", "tenant_id", "pool_id"),
        Index("ix_quota_rows_usage_tx", "usage_tx"),
    )


class Node(Base):
    __tablename__ = "nodes"
    id: Mapped[str] = mapped_column(String(57), primary_key=True)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id"), index=True)
    gpus: Mapped[int]
    owner_tenant_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class CapacityRow(Base):
    """The rollup: `available` is derived as `allocatable - booked`."""

    __tablename__ = "capacity_rows"
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id"), primary_key=True)
    resource: Mapped[str] = mapped_column(String(64), primary_key=True)
    total: Mapped[int] = mapped_column(BigInteger, default=0)
    allocatable: Mapped[int] = mapped_column(BigInteger, default=0)
    booked: Mapped[int] = mapped_column(BigInteger, default=0)
    # Stamped by every booking and release (app/capacity/usage.py): `pool.usage` events.
    usage_tx: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    __table_args__ = (Index("ix_capacity_rows_usage_tx", "usage_tx"),)


class Reservation(Base):
    __tablename__ = "reservations"
    id: Mapped[str] = mapped_column(String(57), primary_key=True)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    # The tenant whose quota rows carry the booking (an ancestor for includeDescendants).
    quota_tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    resources: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(8), default="active")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[datetime | None]
    __table_args__ = (
        Index("ix_reservations_tenant_pool", "tenant_id", "pool_id", "id"),
        Index("ix_reservations_pool", "pool_id", "id"),
    )


class AuthzRow(Base):
    """The IAM projection: one row per (tenant, pool) for every tenant holding an offer."""

    __tablename__ = "authz_rows"
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)  # as Offer's
    # Indexed: every pool read asks which tenants hold an offer of a pool (migration 0005).
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id"), primary_key=True, index=True)
    gpu_model: Mapped[str | None] = mapped_column(String(32))
    pool_class: Mapped[str] = mapped_column("class", String(16), key="pool_class")
    sharing: Mapped[str] = mapped_column(String(16))
    region: Mapped[str] = mapped_column(String(64))
    owned: Mapped[bool] = mapped_column(Boolean)
    include_descendants: Mapped[bool] = mapped_column(Boolean, default=False)


class IdempotencyRecord(Base):
    __tablename__ = "idempotency_records"
    # The id derived from (tenant, caller, key): the same value as the created resource's id.
    resource_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    method: Mapped[str] = mapped_column(String(64))
    tenant_id: Mapped[str] = mapped_column(String(128))
    caller_id: Mapped[str] = mapped_column(String(40))
    key: Mapped[str] = mapped_column(String(128))
    fingerprint: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class FleetName(Base):
    """The stable name a fleet file (`bettercompute apply`) gives a site, provider account,
    caller or pool of a tenant, and the generated id it stands for (ADR 0005)."""

    __tablename__ = "fleet_names"
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    resource_id: Mapped[str] = mapped_column(String(64), unique=True)


class FleetOffer(Base):
    """An offer a fleet file declared when it was last applied (kubectl's last-applied
    set): `apply` withdraws it once the file no longer lists it, and leaves alone offers
    no file declared (made through the API) unless `--prune`. Withdrawn by any surface,
    the offer takes this row with it."""

    __tablename__ = "fleet_offers"
    pool_id: Mapped[str] = mapped_column(String(57), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    __table_args__ = (
        ForeignKeyConstraint(
            ["pool_id", "tenant_id"], ["offers.pool_id", "offers.tenant_id"], ondelete="CASCADE"
        ),
    )


class Event(Base):
    """The outbox: the source of truth for pool events, written in the change's transaction.

    An event's position is (tx, seq): `tx` is the writing transaction's id on PostgreSQL
    (0 on SQLite, and for rows written before migration 0009), and readers only read
    positions below the transaction-id horizon (docs/decisions/0012)."""

    __tablename__ = "events"
    seq: Mapped[int] = mapped_column(SeqType, primary_key=True, autoincrement=True)
    tx: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    type: Mapped[str] = mapped_column(String(32))
    pool_id: Mapped[str] = mapped_column(String(57))
    tenant_id: Mapped[str] = mapped_column(String(128))
    occurred_at: Mapped[datetime] = mapped_column(default=utcnow)
    data: Mapped[dict[str, Any]]
    __table_args__ = (
        Index("ix_events_tx_seq", "tx", "seq"),  # position order
        Index("ix_events_pool_id_tx", "pool_id", "tx"),  # a pool's newest tx, its events
    )


class EventsPruned(Base):
    """One row: the newest position retention has deleted through, (0, 0) when nothing was.
    A cursor is expired exactly when it is below it (app/events/reader.py)."""

    __tablename__ = "events_pruned"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    tx: Mapped[int] = mapped_column(BigInteger)
    seq: Mapped[int] = mapped_column(BigInteger)


class EventAudience(Base):
    """Which tenants may receive an event (CONTRACT section 7)."""

    __tablename__ = "event_audience"
    seq: Mapped[int] = mapped_column(
        SeqType, ForeignKey("events.seq", ondelete="CASCADE"), primary_key=True
    )
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    __table_args__ = (Index("ix_event_audience_tenant_seq", "tenant_id", "seq"),)


__all__ = [
    "ApiToken",
    "AuthzRow",
    "Base",
    "Caller",
    "CapacityRow",
    "Event",
    "EventAudience",
    "EventsPruned",
    "FleetName",
    "IdempotencyRecord",
    "Node",
    "Offer",
    "Pool",
    "ProviderAccount",
    "QuotaRow",
    "Reservation",
    "RoleBinding",
    "Site",
    "Tenant",
    "utcnow",
]
