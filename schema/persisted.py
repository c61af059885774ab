"""Persisted queries on `/graphql` (docs/graphql.md "Persisted queries").

- `automatic` (default): Apollo's automatic persisted queries. A request may send
  `extensions.persistedQuery.sha256Hash` without `query`; an unknown hash answers
  PERSISTED_QUERY_NOT_FOUND and the client sends the query with its hash, which is then
  kept (per process, bounded by bytes, least recently used first out). A GET with only
  the hash is a short, cacheable URL.
- `allowlist`: only the operations of a manifest (Apollo's persisted query manifest,
  `BETTERCOMPUTE_PERSISTED_QUERIES_MANIFEST`) run, by hash or by their exact text; any
  other document is PERSISTED_QUERY_NOT_ALLOWED. Nothing is registered at run time.
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
        self, mode: str, manifest: dict[str, str] | None = None, max_bytes: int = 4 << 20
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"persisted queries mode must be one of {MODES}, not {mode!r}")
        if mode == "allowlist" and not manifest:
            raise ValueError("the allowlist mode needs a manifest with at least one operation")
        self.mode = mode
        self.manifest = dict(manifest or {})
        self.max_bytes = max_bytes
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._bytes = 0

    def resolve(self, query: str | None, extensions: dict[str, object] | None) -> str | None:
        """The document to run for a request's `query` and `extensions`."""
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
            else:
                self._keep(digest, query)
            return query
        found = self.manifest.get(digest)
        if found is None and self.mode == "automatic":
            found = self._cache.get(digest)
            if found is not None:
                self._cache.move_to_end(digest)
        if found is None:
            raise PersistedQueryError("PERSISTED_QUERY_NOT_FOUND", "PersistedQueryNotFound")
        return found

    def _keep(self, digest: str, query: str) -> None:
        if digest in self._cache or len(query) > self.max_bytes:
            return
        self._cache[digest] = query
        self._bytes += len(query)
        while self._bytes > self.max_bytes:
            _, evicted = self._cache.popitem(last=False)
            self._bytes -= len(evicted)


def _not_allowed() -> PersistedQueryError:
    return PersistedQueryError(
        "PERSISTED_QUERY_NOT_ALLOWED", "only registered operations run on this server"
    )
