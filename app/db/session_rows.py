"""The inventory rows (app/db/inventory_rows.py) in a unit of work's session: the ORM
applies the models' defaults, and each write is flushed so the next check sees it."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import ApiToken, Caller, ProviderAccount, RoleBinding, Site, Tenant


class SessionRows:
    def __init__(self, session: AsyncSession) -> None:
        self._session = session

    async def has_tenant(self, tenant_id: str) -> bool:
        return await self._session.get(Tenant, tenant_id) is not None

    async def has_caller(self, caller_id: str) -> bool:
        return await self._session.get(Caller, caller_id) is not None

    async def add_tenant(self, tenant_id: str, parent_id: str | None) -> None:
        self._session.add(Tenant(id=tenant_id, parent_id=parent_id))
        await self._session.flush()

    async def add_site(self, site_id: str, tenant_id: str, kind: str, region: str) -> None:
        self._session.add(Site(id=site_id, tenant_id=tenant_id, kind=kind, region=region))
        await self._session.flush()

    async def add_provider_account(self, account_id: str, tenant_id: str) -> None:
        self._session.add(ProviderAccount(id=account_id, tenant_id=tenant_id))
        await self._session.flush()

    async def add_caller(
        self, caller_id: str, tenant_id: str, role: str, conditions: dict[str, str]
    ) -> None:
        self._session.add(Caller(id=caller_id, tenant_id=tenant_id))
        self._session.add(RoleBinding(caller_id=caller_id, role=role, conditions=conditions))
        await self._session.flush()

    async def add_token(self, token_hash: str, caller_id: str) -> None:
        self._session.add(ApiToken(token_hash=token_hash, caller_id=caller_id))
        await self._session.flush()
