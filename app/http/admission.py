"""Admission: what a request goes through before its work, written once for REST,
GraphQL over HTTP and both websocket protocols (schema/websockets.py).

In this order:

1. Without a valid token (none, malformed, unknown, revoked), the request spends its
   client address's allowance (app/http/address_budget.py); an address that has spent
   it is refused RESOURCE_EXHAUSTED before its token is looked up.
2. The token is looked up (app/iam/callers.py) and the caller noted on the request's
   report (app/observe.py). A request that may be answered by a compiled read, from a
   caller this process remembers (the principal cache, app/iam/principal_cache.py),
   is not looked up: the compiled read's one statement checks the token itself, and a
   request it does not answer is looked up then (`Admitted.confirm`).
3. The caller's request budget is charged (app/rate_limit.py). When it is spent, a
   remembered caller is looked up first: a bad token is told UNAUTHENTICATED before
   any other refusal.
4. For a compiled read, the body is read (`read_body`); its failure (the body limit,
   413) waits until the token is checked.

A refusal is raised as a DomainError; each transport answers it in its own shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from starlette.requests import HTTPConnection, Request

from app.config import Settings
from app.errors import DomainError, Unauthenticated
from app.http.address_budget import AddressBudget, trusted_networks
from app.iam.callers import bearer_token_hash
from app.iam.principal import Principal
from app.iam.principal_cache import PrincipalCache
from app.observe import request_info
from app.rate_limit import RateLimiter

# Looks the request's token up (and may keep the answer: GraphQL's context does).
Authenticate = Callable[[], Awaitable[Principal]]


@dataclass
class Admitted:
    """What admission let in."""

    principal: Principal
    # The token's hash when the request may take a compiled read (None: the plain path).
    token_hash: str | None = None
    # The principal came from the cache: its token is checked by the compiled read's
    # statement, or by `confirm` when that does not answer.
    remembered: bool = False
    body: bytes | None = None  # read by `read_body`
    body_error: Exception | None = None  # why it could not be, told after the token
    _confirm: Authenticate | None = field(default=None, repr=False)

    async def confirm(self) -> Principal:
        """Not answered by the compiled read: a remembered caller's token is looked up
        now, as any other request's (UNAUTHENTICATED when it is no longer good)."""
        if self.remembered and self._confirm is not None:
            self.principal = await self._confirm()
            self.remembered = False
        return self.principal


class Admission:
    """One per process (app.state.admission): the principal cache, the per-address
    allowance, and the rate limiter they share with the cost budget."""

    def __init__(self, settings: Settings, limiter: RateLimiter) -> None:
        self.limiter = limiter
        self.principals = PrincipalCache()
        self.addresses = AddressBudget(
            settings.unauthenticated_burst,
            settings.unauthenticated_per_s,
            settings.unauthenticated_max_addresses,
            trusted_networks(settings.trusted_proxies),
        )

    async def admit(
        self,
        conn: HTTPConnection,
        authorization: str | None,
        authenticate: Authenticate,
        *,
        compiled: bool = False,
        charge: bool = True,
    ) -> Admitted:
        """Steps 1 to 3 (module docstring). `compiled`: the request may take a compiled
        read, so a remembered caller is not looked up; `charge`: an operation, which
        spends the caller's request budget (a websocket's connection_init does not)."""
        hashed = _token_hash(authorization) if compiled else None
        remembered = self.principals.get(hashed) if hashed is not None else None

        async def looked_up() -> Principal:
            try:
                return await self._authenticate(conn, authorization, authenticate)
            except Exception:
                # A remembered caller whose token is no longer good (`confirm`): the
                # request is nobody's, in the access log too, as on the plain path.
                info = request_info()
                if info is not None:
                    info.caller_id = info.tenant_id = None
                raise

        principal = remembered or await looked_up()
        info = request_info()
        if info is not None:
            info.caller_id, info.tenant_id = principal.caller_id, principal.tenant_id
        if charge:
            try:
                await self.limiter.charge_request(principal.caller_id, info)
            except Exception:
                if remembered is not None:
                    await looked_up()  # a bad token is told so first
                raise
        if hashed is not None:
            self.principals.put(hashed, principal)
        return Admitted(principal, hashed, remembered is not None, _confirm=looked_up)

    async def read_body(self, request: Request, admitted: Admitted) -> None:
        """Step 4: the body of a request that may take a compiled read. When it cannot
        be read (over the limit, the client left), a remembered caller is looked up
        first, so a bad token is told before the body's fault."""
        try:
            admitted.body = await request.body()
        except Exception as exc:
            admitted.body_error = exc
            await admitted.confirm()

    def forget(self, admitted: Admitted) -> None:
        """The compiled read did not answer for this caller (maybe its token is revoked):
        its next request is looked up first."""
        if admitted.token_hash is not None:
            self.principals.drop(admitted.token_hash)

    async def _authenticate(
        self, conn: HTTPConnection, authorization: str | None, authenticate: Authenticate
    ) -> Principal:
        """Step 1 around the lookup: a request without a valid token spends its address's
        allowance; an address with none left is refused before the lookup, unless the
        token authenticated lately."""
        budget = self.addresses
        if not budget.enabled:
            return await authenticate()
        try:
            hashed = bearer_token_hash(authorization)
        except Unauthenticated:
            budget.spend(budget.client_key(conn))
            raise
        if not budget.known(hashed):
            budget.check(budget.client_key(conn))
        try:
            principal = await authenticate()
        except Unauthenticated:
            budget.spend(budget.client_key(conn), hashed)
            raise
        budget.authenticated(hashed)
        return principal


def _token_hash(authorization: str | None) -> str | None:
    try:
        return bearer_token_hash(authorization)
    except DomainError:
        return None
