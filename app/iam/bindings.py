"""Open subscriptions follow a rebinding, in every process.

A subscription is authorised at subscribe time, but an event must show nothing a query by
the same caller would not at that moment (CONTRACT section 7), so a rebinding (another
role, another `--where` narrowing) must reach the streams already open. Each serve process
keeps one `LiveBinding` per caller with an open subscription, shared by all of them; each
event's delivery decides with the principal it holds (app/capacity/event_visibility.py).

`refresh` reads the bindings changed lately (an indexed read of `role_bindings.updated_at`,
skipped while no caller has a stream open) and replaces the principal of every live
binding whose role or conditions differ. The relay calls it on the connection of each
batch it reads, after reading the batch's events (PoolEventVisibility.load): a rebinding
that committed before an event was read decides that event, live or replayed. So the
socket stays open and its subscriptions are re-scoped, never closed: a caller narrowed
to H100 pools simply stops receiving the others' events, as a query of it stops showing
them. The window is the revocation watcher's (app/iam/revocations.py): `updated_at` is
written with the rebinding process's clock, compared only with other `updated_at` values.
"""

from __future__ import annotations

import weakref
from datetime import datetime, timedelta
from typing import Final

from sqlalchemy import func, select

from app.db.engine import Executor
from app.db.models import RoleBinding
from app.iam.principal import Principal

WINDOW: Final = timedelta(seconds=60)
# Up to this many callers with open streams, the read names them (an IN list).
MAX_LISTED: Final = 500


class LiveBinding:
    """A caller's role binding as its open streams use it: replaced in place on a rebinding."""

    __slots__ = ("__weakref__", "principal")

    def __init__(self, principal: Principal) -> None:
        self.principal = principal


class LiveBindings:
    def __init__(self) -> None:
        # Held only by the streams that use them: a caller's entry goes with its last one.
        self._live: weakref.WeakValueDictionary[str, LiveBinding] = weakref.WeakValueDictionary()
        self._newest: datetime | None = None  # the newest updated_at read so far
        self.rebindings = 0  # live bindings replaced so far (for tests and logs)

    def __len__(self) -> int:
        return len(self._live)

    def live(self, principal: Principal) -> LiveBinding:
        """The caller's live binding, shared by its streams in this process. A principal
        authenticated just now is at least as new as the one held: it replaces it."""
        binding = self._live.get(principal.caller_id)
        if binding is None:
            binding = LiveBinding(principal)
            self._live[principal.caller_id] = binding
        elif _differs(binding.principal, principal.role, principal.conditions):
            binding.principal = principal
        return binding

    async def refresh(self, executor: Executor) -> int:
        """Read the bindings changed lately and re-scope the live ones; returns how many
        changed. Nothing is read while no caller has a stream open."""
        if not self._live:
            return 0
        if self._newest is None:  # first look: from the newest change, less the window
            self._newest = await executor.scalar(select(func.max(RoleBinding.updated_at)))
            if self._newest is None:
                return 0  # no binding was ever written with a time
        query = select(
            RoleBinding.caller_id,
            RoleBinding.role,
            RoleBinding.conditions,
            RoleBinding.updated_at,
        ).where(RoleBinding.updated_at > self._newest - WINDOW)
        if len(self._live) <= MAX_LISTED:  # a large apply's new callers are not read
            query = query.where(RoleBinding.caller_id.in_(list(self._live.keys())))
        changed = 0
        for caller_id, role, conditions, updated_at in (await executor.execute(query)).all():
            if updated_at is not None and (self._newest is None or updated_at > self._newest):
                self._newest = updated_at
            binding = self._live.get(caller_id)
            if binding is not None and _differs(binding.principal, role, conditions):
                old = binding.principal
                binding.principal = Principal(
                    caller_id=old.caller_id,
                    tenant_id=old.tenant_id,
                    role=role,
                    conditions=dict(conditions),
                )
                changed += 1
        self.rebindings += changed
        return changed


def _differs(principal: Principal, role: str, conditions: dict[str, str]) -> bool:
    return principal.role != role or principal.conditions != dict(conditions)
