"""The per-caller budget (CONTRACT section 3, RESOURCE_EXHAUSTED): requests per window
and, on GraphQL, query cost per window (the cost schema/limits.py computes), counted by
the `limits` library in Redis when the service has one (shared by every process) or in
memory. Each answer carries GitHub-style `X-RateLimit-*` headers; a refusal is HTTP 429
with `Retry-After`. Off unless configured (BETTERCOMPUTE_RATE_LIMIT_*).

A Redis that does not answer within `RATE_LIMIT_STORE_TIMEOUT_SECONDS` (tens of
milliseconds) lets the request through (logged): the budget protects the service, it must
not take it down with the broker. The budgets are then off (`enforced` is false: `/readyz`
says `rateLimits: "off"`, the `bettercompute_rate_limits_enforced` gauge is 0) and no
request waits for the store until a probe, once a second, finds it answering again."""

from __future__ import annotations

import asyncio
import logging
import math
import time

from limits import RateLimitItem, RateLimitItemPerSecond
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import FixedWindowRateLimiter
from redis.asyncio import ConnectionPool

from app import metrics
from app.config import Settings
from app.errors import ResourceExhausted
from app.observe import RequestInfo

log = logging.getLogger(__name__)


class RateLimited(ResourceExhausted):
    def __init__(self, budget: str, limit: int, retry_after_s: int) -> None:
        super().__init__(
            f"the {budget} budget of {limit} per window is spent; retry in {retry_after_s} s",
            limit="rate",
            budget=budget,
            retryAfterSeconds=retry_after_s,
        )
        self.retry_after_s = retry_after_s


# While the store is off, how often it is asked whether it answers again.
PROBE_INTERVAL_S = 1.0


def _storage(settings: Settings) -> tuple[Storage, ConnectionPool | None]:
    url = settings.rate_limit_storage_url
    if not url and settings.broadcast_url.startswith(("redis://", "rediss://")):
        url = settings.broadcast_url
    if url.startswith(("redis://", "rediss://")):
        # Our own pool: bounded waits, and closed with the app (limits has no close).
        timeout = settings.rate_limit_store_timeout_s
        pool = ConnectionPool.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        storage = RedisStorage(
            f"async+{url}",
            implementation="redispy",
            connection_pool=pool,  # type: ignore[arg-type]  # typed as scalar options
        )
        return storage, pool
    return MemoryStorage(), None


class RateLimiter:
    def __init__(self, settings: Settings) -> None:
        window = settings.rate_limit_window_s
        self.requests: RateLimitItem | None = (
            RateLimitItemPerSecond(settings.rate_limit_requests, window)
            if settings.rate_limit_requests > 0
            else None
        )
        self.cost: RateLimitItem | None = (
            RateLimitItemPerSecond(settings.rate_limit_cost, window)
            if settings.rate_limit_cost > 0
            else None
        )
        self.enabled = self.requests is not None or self.cost is not None
        self._limiter: FixedWindowRateLimiter | None = None
        self._storage: Storage | None = None
        self._pool: ConnectionPool | None = None
        self._timeout_s = settings.rate_limit_store_timeout_s
        self._probe: asyncio.Task[None] | None = None
        self.enforced = True
        metrics.RATE_LIMITS_ENFORCED.set(1)
        if self.enabled:
            self._storage, self._pool = _storage(settings)
            self._limiter = FixedWindowRateLimiter(self._storage)

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        if self._pool is not None:
            await self._pool.aclose()

    def _store_silent(self, exc: BaseException) -> None:
        """Off until the store answers a probe; one probe task at a time."""
        if self.enforced:
            log.warning("rate limit store unavailable, not limiting: %s", type(exc).__name__)
        self.enforced = False
        metrics.RATE_LIMITS_ENFORCED.set(0)
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._probe_until_answered())

    async def _probe_until_answered(self) -> None:
        assert self._storage is not None
        while not self.enforced:
            await asyncio.sleep(PROBE_INTERVAL_S)
            try:
                async with asyncio.timeout(self._timeout_s):
                    answered = await self._storage.check()
            except Exception:  # still silent (or refusing): stay off
                answered = False
            if answered:
                log.warning("rate limit store answers again, limiting")
                self.enforced = True
                metrics.RATE_LIMITS_ENFORCED.set(1)

    async def charge_request(self, caller_id: str, info: RequestInfo | None) -> None:
        """One request of `caller_id`; RateLimited when its budget is spent."""
        if self.requests is not None:
            await self._hit(self.requests, "requests", caller_id, 1, info)

    async def charge_cost(self, caller_id: str, cost: int, info: RequestInfo | None) -> None:
        """A GraphQL operation's cost; RateLimited when it does not fit what is left."""
        if self.cost is not None:
            await self._hit(self.cost, "cost", caller_id, max(cost, 0), info)

    async def _hit(
        self, item: RateLimitItem, budget: str, caller_id: str, cost: int, info: RequestInfo | None
    ) -> None:
        assert self._limiter is not None
        if not self.enforced:
            return  # the store is silent: no request waits for it (a probe watches it)
        try:
            async with asyncio.timeout(self._timeout_s):  # both round trips, one bound
                allowed = await self._limiter.hit(item, budget, caller_id, cost=cost)
                stats = await self._limiter.get_window_stats(item, budget, caller_id)
        except Exception as exc:
            self._store_silent(exc)
            return
        reset = math.ceil(stats.reset_time)
        if info is not None:
            limit = item.amount
            info.headers.update(
                {
                    "x-ratelimit-limit": str(limit),
                    "x-ratelimit-remaining": str(stats.remaining),
                    "x-ratelimit-used": str(limit - stats.remaining),
                    "x-ratelimit-reset": str(reset),
                    "x-ratelimit-resource": budget,
                }
            )
        if not allowed:
            retry_after = max(1, reset - math.floor(time.time()))
            if info is not None:
                info.headers["retry-after"] = str(retry_after)
            metrics.RATE_LIMITED.labels(budget).inc()
            raise RateLimited(budget, item.amount, retry_after)
