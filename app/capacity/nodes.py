"""Nodes: a node joins a pool, and the pool's rollup follows."""

from __future__ import annotations

from sqlalchemy import select, update

from app.capacity.inventory import require_tenant
from app.capacity.rollup import refresh_rollup
from app.db.engine import Database
from app.db.models import Node, Pool
from app.db.uow import UnitOfWork
from app.errors import InvalidInput, InvalidState, NotFound
from app.ids import new_id

MAX_NODE_GPUS = 1024


async def add_node(
    db: Database, pool_id: str, gpus: int, owner_tenant_id: str | None = None
) -> str:
    """A node joins a pool in a unit of work of its own (`bettercompute node add`)."""
    async with UnitOfWork(db) as uow:
        return await join_node(uow, pool_id, gpus, owner_tenant_id)


async def join_node(
    uow: UnitOfWork, pool_id: str, gpus: int, owner_tenant_id: str | None = None
) -> str:
    """A node joins a pool; the rollup follows. A tenant-owned node pins the pool to its owner."""
    if gpus < 1 or gpus > MAX_NODE_GPUS:
        raise InvalidInput(f"gpus must be 1 to {MAX_NODE_GPUS}", field="gpus")
    pool = (
        # As owner writes lock it (access.lock_owned_pool): no wait on bookings' FK locks.
        await uow.session.execute(
            select(Pool).where(Pool.id == pool_id).with_for_update(key_share=True)
        )
    ).scalar_one_or_none()
    if pool is None:
        raise NotFound(f"pool {pool_id} not found", field="pool")
    if pool.archived:
        raise InvalidState(f"pool {pool_id} is archived", field="pool")
    if owner_tenant_id is not None:
        await require_tenant(uow.rows, owner_tenant_id, "ownerTenant")
        # A new version of the pool's row (nothing in it changes): an offer that read its
        # facts in the snapshot of its lock's statement, taken before this commits, sees
        # that the row moved and reads them again, this node included
        # (access.locking_first; a tenant-owned node pins the pool to its owner).
        await uow.session.execute(
            update(Pool).where(Pool.id == pool_id).values(version=Pool.version),
            execution_options={"synchronize_session": False},
        )
    node_id = new_id("node")
    uow.session.add(Node(id=node_id, pool_id=pool_id, gpus=gpus, owner_tenant_id=owner_tenant_id))
    await uow.session.flush()
    await refresh_rollup(uow.statements, pool)
    return node_id
