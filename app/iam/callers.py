"""Callers and their API tokens: random, shown once, stored only as a hash, revocable."""

from __future__ import annotations

from sqlalchemy import select, update

from app.db.engine import Database
from app.db.models import ApiToken, Caller, RoleBinding, Tenant, utcnow
from app.db.uow import UnitOfWork
from app.errors import InvalidInput, NotFound, Unauthenticated
from app.iam.principal import Principal
from app.iam.roles import BINDING_ATTRIBUTES, FLEET_ADMIN, FLEET_TENANT, ROLE_PERMISSIONS
from app.ids import new_id, new_token, token_hash


async def create_caller(
    db: Database, tenant_id: str, role: str, conditions: dict[str, str] | None = None
) -> tuple[str, str]:
    """Returns (caller id, its first token)."""
    async with UnitOfWork(db) as uow:
        return await add_caller(uow, tenant_id, role, conditions)


def _check_binding(tenant_id: str, role: str, conditions: dict[str, str] | None) -> None:
    if role not in ROLE_PERMISSIONS:
        raise InvalidInput(f"unknown role {role}; one of {sorted(ROLE_PERMISSIONS)}", field="role")
    if role == FLEET_ADMIN and tenant_id != FLEET_TENANT:
        raise InvalidInput(f"{FLEET_ADMIN} is only held in tenant {FLEET_TENANT}", field="role")
    for key in conditions or {}:
        if key not in BINDING_ATTRIBUTES:
            raise InvalidInput(
                f"cannot narrow by {key}; one of {BINDING_ATTRIBUTES}", field="where"
            )


async def add_caller(
    uow: UnitOfWork, tenant_id: str, role: str, conditions: dict[str, str] | None = None
) -> tuple[str, str]:
    """`create_caller` inside a caller's unit of work (fleet files apply many at once)."""
    _check_binding(tenant_id, role, conditions)
    if await uow.session.get(Tenant, tenant_id) is None:
        raise NotFound(f"tenant {tenant_id} not found", field="tenant")
    caller_id = new_id("caller")
    uow.session.add(Caller(id=caller_id, tenant_id=tenant_id))
    uow.session.add(RoleBinding(caller_id=caller_id, role=role, conditions=conditions or {}))
    await uow.session.flush()
    token = new_token()
    uow.session.add(ApiToken(token_hash=token_hash(token), caller_id=caller_id))
    await uow.session.flush()
    return caller_id, token


async def rebind_caller(
    uow: UnitOfWork, caller_id: str, role: str, conditions: dict[str, str] | None = None
) -> None:
    """Give a caller another role or narrowing; its tokens stay valid."""
    caller = await uow.session.get(Caller, caller_id)
    if caller is None:
        raise NotFound(f"caller {caller_id} not found", field="caller")
    _check_binding(caller.tenant_id, role, conditions)
    binding = await uow.session.get_one(RoleBinding, caller_id)
    binding.role = role
    binding.conditions = dict(conditions or {})
    await uow.session.flush()


async def create_token(db: Database, caller_id: str) -> str:
    async with UnitOfWork(db) as uow:
        if await uow.session.get(Caller, caller_id) is None:
            raise NotFound(f"caller {caller_id} not found", field="caller")
        token = new_token()
        uow.session.add(ApiToken(token_hash=token_hash(token), caller_id=caller_id))
    return token


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
