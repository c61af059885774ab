"""Persisted queries on `/graphql` (docs/graphql.md "Persisted queries").

- `automatic` (default): Apollo's automatic persisted queries. A request may send
  `extensions.persistedQuery.sha256Hash` without `query`; an unknown hash answers
  PERSISTED_QUERY_NOT_FOUND and the client sends the query with its hash, which is then
  kept for the caller's tenant only: another tenant's request by that hash answers
  PERSISTED_QUERY_NOT_FOUND, so no tenant can tell which query texts another one sent.
  Kept per process, least recently used first out, bounded in total across tenants:
  at most `max_bytes` (4 MiB) of query text plus `ENTRY_OVERHEAD` bytes per entry, and
  at most `max_entries` (10,000) entries. A GET with only the hash is a short URL.
- `allowlist`: only the operations of a manifest (Apollo's persisted query manifest,
  `BETTERCOMPUTE_PERSISTED_QUERIES_MANIFEST`; global, every tenant's) run, by hash or
  by their exact text; any other document is PERSISTED_QUERY_NOT_ALLOWED. Nothing is
  registered at run time.
- `off`: a persistedQuery extension is PERSISTED_QUERY_NOT_SUPPORTED.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from pathlib import Path

MODES = ("automatic", "allowlist", "off")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# What an entry costs beyond its query text: its key (digest and tenant) and the
# OrderedDict's node, counted against `max_bytes` so tiny queries cannot exceed it.
ENTRY_OVERHEAD = 256


class PersistedQueryError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def sha256(query: str) -> str:
    return hashlib.sha256(query.encode()).hexdigest()


def load_manifest(path: str) -> dict[str, str]:
    """Apollo's manifest: {"format": "apollo-persisted-query-manifest", "version": 1,
    "operations": [{"id": sha256(body), "name", "type", "body"}]}. An id that is not
    its body's hash is refused at start-up, not at the first request."""
    document = json.loads(Path(path).read_text())
    if document.get("format") != "apollo-persisted-query-manifest":
        raise ValueError(f"{path}: not an apollo-persisted-query-manifest")
    operations: dict[str, str] = {}
    for operation in document.get("operations", []):
        body, op_id = operation["body"], operation["id"]
        if sha256(body) != op_id:
            raise ValueError(f"{path}: operation {operation.get('name')!r}: id is not sha256(body)")
        operations[op_id] = body
    return operations


class PersistedQueries:
    def __init__(
        self,
        mode: str,
        manifest: dict[str, str] | None = None,
        max_bytes: int = 4 << 20,
        max_entries: int = 10_000,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"persisted queries mode must be one of {MODES}, not {mode!r}")
        if mode == "allowlist" and not manifest:
            raise ValueError("the allowlist mode needs a manifest with at least one operation")
        self.mode = mode
        self.manifest = dict(manifest or {})
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        # (tenant, sha256) -> query text: registrations are the tenant's own.
        self._cache: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._bytes = 0

    def resolve(
        self, query: str | None, extensions: dict[str, object] | None, tenant: str | None
    ) -> str | None:
        """The document to run for a request's `query` and `extensions`, sent by a caller
        of `tenant` (None: no authenticated caller, which registers and finds nothing)."""
        persisted = (extensions or {}).get("persistedQuery")
        if persisted is None:
            allowed = self.mode != "allowlist" or query is None or sha256(query) in self.manifest
            if not allowed:
                raise _not_allowed()
            return query
        if self.mode == "off":
            raise PersistedQueryError("PERSISTED_QUERY_NOT_SUPPORTED", "PersistedQueryNotSupported")
        if (
            not isinstance(persisted, dict)
            or persisted.get("version") != 1
            or not isinstance(persisted.get("sha256Hash"), str)
            or not _SHA256.match(persisted["sha256Hash"])
        ):
            raise PersistedQueryError(
                "INVALID_INPUT",
                "extensions.persistedQuery must be {version: 1, sha256Hash: <64 hex digits>}",
            )
        digest: str = persisted["sha256Hash"]
        if query is not None:
            if sha256(query) != digest:
                raise PersistedQueryError("INVALID_INPUT", "provided sha does not match query")
            if self.mode == "allowlist":
                if digest not in self.manifest:
                    raise _not_allowed()
            elif tenant is not None:
                self._keep((tenant, digest), query)
            return query
        found = self.manifest.get(digest)
        if found is None and self.mode == "automatic" and tenant is not None:
            found = self._cache.get((tenant, digest))
            if found is not None:
                self._cache.move_to_end((tenant, digest))
        if found is None:
            raise PersistedQueryError("PERSISTED_QUERY_NOT_FOUND", "PersistedQueryNotFound")
        return found

    def _keep(self, key: tuple[str, str], query: str) -> None:
        size = _size(key, query)
        if key in self._cache or size > self.max_bytes or self.max_entries < 1:
            return
        self._cache[key] = query
        self._bytes += size
        while self._bytes > self.max_bytes or len(self._cache) > self.max_entries:
            evicted_key, evicted = self._cache.popitem(last=False)
            self._bytes -= _size(evicted_key, evicted)

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def cached_bytes(self) -> int:
        return self._bytes


def _size(key: tuple[str, str], query: str) -> int:
    return len(query.encode()) + len(key[0]) + ENTRY_OVERHEAD


def _not_allowed() -> PersistedQueryError:
    return PersistedQueryError(
        "PERSISTED_QUERY_NOT_ALLOWED", "only registered operations run on this server"
    )
