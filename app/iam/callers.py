"""Callers and their API tokens: random, shown once, stored only as a hash, revocable.
Issuing them is app/iam/issuing.py's; here a unit of work wraps it."""

from __future__ import annotations

from sqlalchemy import select, update

from app.db.engine import Database
from app.db.models import ApiToken, Caller, RoleBinding, utcnow
from app.db.uow import UnitOfWork
from app.errors import NotFound, Unauthenticated
from app.iam.issuing import add_caller, add_token, check_binding
from app.iam.principal import Principal
from app.ids import token_hash


async def create_caller(
    db: Database, tenant_id: str, role: str, conditions: dict[str, str] | None = None
) -> tuple[str, str]:
    """Returns (caller id, its first token)."""
    async with UnitOfWork(db) as uow:
        return await add_caller(uow.rows, tenant_id, role, conditions)


async def rebind_caller(
    uow: UnitOfWork, caller_id: str, role: str, conditions: dict[str, str] | None = None
) -> None:
    """Give a caller another role or narrowing; its tokens stay valid."""
    caller = await uow.session.get(Caller, caller_id)
    if caller is None:
        raise NotFound(f"caller {caller_id} not found", field="caller")
    check_binding(caller.tenant_id, role, conditions)
    binding = await uow.session.get_one(RoleBinding, caller_id)
    binding.role = role
    binding.conditions = dict(conditions or {})
    binding.updated_at = utcnow()  # open subscriptions follow it (app/iam/bindings.py)
    await uow.session.flush()


async def create_token(db: Database, caller_id: str) -> str:
    async with UnitOfWork(db) as uow:
        return await add_token(uow.rows, caller_id)


async def revoke_token(db: Database, token: str) -> bool:
    async with UnitOfWork(db) as uow:
        result = await uow.session.execute(
            update(ApiToken)
            .where(ApiToken.token_hash == token_hash(token), ApiToken.revoked_at.is_(None))
            .values(revoked_at=utcnow())
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def bearer_token_hash(authorization: str | None) -> str:
    """The stored hash of the token in `Authorization: Bearer <token>`, or UNAUTHENTICATED
    when the header is missing or malformed."""
    if not authorization:
        raise Unauthenticated("missing bearer token")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("expected 'Authorization: Bearer <token>'")
    return token_hash(token.strip())


async def authenticate(db: Database, authorization: str | None) -> Principal:
    """`Authorization: Bearer <token>` to a principal, or UNAUTHENTICATED."""
    hashed = bearer_token_hash(authorization)
    query = (
        select(Caller.id, Caller.tenant_id, RoleBinding.role, RoleBinding.conditions)
        .join(ApiToken, ApiToken.caller_id == Caller.id)
        .join(RoleBinding, RoleBinding.caller_id == Caller.id)
        .where(ApiToken.token_hash == hashed, ApiToken.revoked_at.is_(None))
    )
    async with db.reader.connect() as conn:
        row = (await conn.execute(query)).first()
    if row is None:
        raise Unauthenticated("unknown or revoked token")
    return Principal(
        caller_id=row.id, tenant_id=row.tenant_id, role=row.role, conditions=dict(row.conditions)
    )
