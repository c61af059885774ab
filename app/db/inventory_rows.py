"""The rows the operator's inventory writes check and add, as a port with two stores.

The domain's rules for tenants, sites, provider accounts, callers and tokens
(app/capacity/inventory.py, app/iam/issuing.py) run against this protocol, so they are
the same whichever store holds the rows: the unit of work's session (`SessionRows`, every
dialect, what REST, GraphQL and fleet files use) or the embedded SQLite file written with
the stdlib (`EmbeddedRows`), which lets `bettercompute tenant create` answer without
importing SQLAlchemy. Writes that emit events or touch pools go through the unit of work.
"""

from __future__ import annotations

from typing import Protocol


class InventoryRows(Protocol):
    async def has_tenant(self, tenant_id: str) -> bool: ...

    async def has_caller(self, caller_id: str) -> bool: ...

    async def add_tenant(self, tenant_id: str, parent_id: str | None) -> None: ...

    async def add_site(self, site_id: str, tenant_id: str, kind: str, region: str) -> None: ...

    async def add_provider_account(self, account_id: str, tenant_id: str) -> None: ...

    async def add_caller(
        self, caller_id: str, tenant_id: str, role: str, conditions: dict[str, str]
    ) -> None:
        """The caller and its role binding."""
        ...

    async def add_token(self, token_hash: str, caller_id: str) -> None: ...
