"""Principals by token hash, remembered for the compiled reads (app/capacity/json_reads.py);
one per process, held by admission (app/http/admission.py).

An entry is never trusted alone: the one statement of a compiled read checks, in the same
snapshot as the data it reads, that the token is still live and the caller's role binding
is still the one remembered, and answers nothing otherwise (the request then takes the
plain path, which authenticates anew). So a revocation or a new role binding takes effect
on the next request in every process, whatever this cache holds.
"""

from __future__ import annotations

from collections import OrderedDict

from app.iam.principal import Principal

MAX_ENTRIES = 4096


class PrincipalCache:
    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._entries: OrderedDict[str, Principal] = OrderedDict()
        self._max = max_entries

    def get(self, token_hash: str) -> Principal | None:
        principal = self._entries.get(token_hash)
        if principal is not None:
            self._entries.move_to_end(token_hash)
        return principal

    def put(self, token_hash: str, principal: Principal) -> None:
        self._entries[token_hash] = principal
        self._entries.move_to_end(token_hash)
        if len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def drop(self, token_hash: str) -> None:
        self._entries.pop(token_hash, None)
