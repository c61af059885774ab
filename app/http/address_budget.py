"""Work for requests without a valid token, bounded per client address (issue 19).

A request with no token, a malformed one, or one the database does not know spends one
unit of its client address's allowance: `UNAUTHENTICATED_BURST` at once, refilled at
`UNAUTHENTICATED_PER_SECOND`. An address with nothing left is answered 429
RESOURCE_EXHAUSTED before its token is looked up, so a flood of bad tokens costs no
database query. A token that authenticated lately is looked up whatever its address has
left: the callers who share an address (a NAT, a proxy) with a flood keep working.

The table is this process's memory, no round trip (the `limits` library's memory storage
keeps every key until its window ends and its Redis storage costs a round trip; a bucket
is two floats): at most `UNAUTHENTICATED_MAX_ADDRESSES` addresses, the least recently
seen forgotten first. An IPv6 client is keyed by its /64, which one host usually holds
whole. The client is the peer address, unless the peer is one of `TRUSTED_PROXIES`: then
the rightmost address of `X-Forwarded-For` that is not a trusted proxy (the one the
proxies saw; what a client writes there itself, further left, is not believed).
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Iterable

from starlette.requests import HTTPConnection

from app import metrics
from app.errors import ResourceExhausted
from app.observe import request_info

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# Tokens that authenticated lately, for which the allowance is not consulted.
KNOWN_TOKENS = 4096


class AddressLimited(ResourceExhausted):
    def __init__(self, retry_after_s: int) -> None:
        super().__init__(
            "too many requests without a valid token from this address; "
            f"retry in {retry_after_s} s",
            limit="rate",
            budget="unauthenticated",
            retryAfterSeconds=retry_after_s,
        )
        self.retry_after_s = retry_after_s
        info = request_info()
        if info is not None:
            info.headers["retry-after"] = str(retry_after_s)
        metrics.RATE_LIMITED.labels("unauthenticated").inc()


def trusted_networks(entries: Iterable[str]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(entry.strip(), strict=False) for entry in entries)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class AddressBudget:
    def __init__(
        self,
        burst: int,
        per_s: float,
        max_addresses: int,
        trusted_proxies: tuple[IPNetwork, ...] = (),
    ) -> None:
        self.enabled = burst > 0
        self._burst = float(burst)
        self._per_s = per_s
        self._max = max(1, max_addresses)
        self._trusted = trusted_proxies
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at
        self._known: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def client_key(self, conn: HTTPConnection) -> str:
        """The key of the request's client: its address, an IPv6 one's /64."""
        peer = conn.client.host if conn.client is not None else ""
        address = _address(peer)
        if address is not None and self._is_trusted(address):
            forwarded = ",".join(conn.headers.getlist("x-forwarded-for")).split(",")
            for entry in reversed(forwarded):
                hop = _address(entry)
                if hop is None:
                    break  # not an address: believe nothing further left
                address = hop
                if not self._is_trusted(hop):
                    break
        if address is None:
            return peer[:64] or "unknown"
        if isinstance(address, ipaddress.IPv6Address):
            return str(ipaddress.IPv6Network((address, 64), strict=False))
        return str(address)

    def _is_trusted(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return any(address in network for network in self._trusted)

    def known(self, token_hash: str) -> bool:
        return token_hash in self._known

    def authenticated(self, token_hash: str) -> None:
        self._known[token_hash] = None
        self._known.move_to_end(token_hash)
        if len(self._known) > KNOWN_TOKENS:
            self._known.popitem(last=False)

    def check(self, key: str) -> None:
        """AddressLimited when `key` has nothing left (nothing is spent)."""
        if self.enabled:
            tokens, _ = self._refilled(key)
            if tokens < 1:
                raise AddressLimited(self._retry_after(tokens))

    def spend(self, key: str, token_hash: str | None = None) -> None:
        """One request without a valid token from `key`; AddressLimited when it had
        nothing left. `token_hash`: the token that failed, no longer known good."""
        if token_hash is not None:
            self._known.pop(token_hash, None)
        if not self.enabled:
            return
        tokens, now = self._refilled(key)
        if tokens < 1:
            raise AddressLimited(self._retry_after(tokens))
        self._buckets[key] = (tokens - 1, now)

    def _refilled(self, key: str) -> tuple[float, float]:
        now = time.monotonic()
        entry = self._buckets.get(key)
        if entry is None:
            tokens = self._burst
            self._buckets[key] = (tokens, now)
            if len(self._buckets) > self._max:
                self._buckets.popitem(last=False)
        else:
            tokens = min(self._burst, entry[0] + (now - entry[1]) * self._per_s)
            self._buckets.move_to_end(key)
        self._buckets[key] = (tokens, now)
        return tokens, now

    def _retry_after(self, tokens: float) -> int:
        if self._per_s <= 0:
            return 60
        return max(1, math.ceil((1 - tokens) / self._per_s))
