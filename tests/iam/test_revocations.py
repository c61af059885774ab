"""The revocation watcher on a real database (both dialects): which revocations it finds.
The sockets here are stand-ins that record their close; the websocket path is tested in
tests/events/test_token_revocation.py."""

from __future__ import annotations

from sqlalchemy import update

from app.db.engine import Database
from app.db.models import ApiToken, utcnow
from app.iam.callers import revoke_token
from app.iam.revocations import WINDOW, RevocationWatcher
from app.ids import token_hash
from tests.events.support import wait_until
from tests.support import Fleet


class Socket:
    def __init__(self) -> None:
        self.closed = 0

    async def close_revoked(self) -> None:
        self.closed += 1


async def watcher_with(db: Database, *tokens: str) -> tuple[RevocationWatcher, list[Socket]]:
    watcher = RevocationWatcher(db, interval_s=3600)  # checks run only when the test says
    sockets = []
    for token in tokens:
        socket = Socket()
        watcher.register(token_hash(token), socket)
        sockets.append(socket)
    return watcher, sockets


async def test_it_closes_the_sockets_of_a_token_revoked_after_it_started(
    db: Database, fleet: Fleet
) -> None:
    await fleet.tenant("acme")
    revoked, kept = await fleet.caller("acme"), await fleet.caller("acme")
    watcher, (doomed, spared) = await watcher_with(db, revoked, kept)
    await watcher.start()
    try:
        assert await watcher.check() == 0
        assert await revoke_token(db, revoked)
        assert await watcher.check() == 1
        await wait_until(lambda: doomed.closed == 1)
        assert spared.closed == 0
        assert await watcher.check() == 0  # closed once; it left the registry
    finally:
        await watcher.stop()


async def test_it_finds_a_revocation_older_than_the_newest_it_saw_within_the_window(
    db: Database, fleet: Fleet
) -> None:
    """A revocation that commits late, or from a process whose clock is behind; and a
    socket that registers just after its token's revocation was read."""
    await fleet.tenant("acme")
    first, late, raced = [await fleet.caller("acme") for _ in range(3)]
    watcher, _ = await watcher_with(db, first)
    await watcher.start()
    try:
        assert await revoke_token(db, first)
        assert await watcher.check() == 1
        earlier = utcnow() - WINDOW / 2
        async with db.writer.begin() as conn:
            await conn.execute(
                update(ApiToken)
                .where(ApiToken.token_hash == token_hash(late))
                .values(revoked_at=earlier)
            )
        assert await revoke_token(db, raced)
        assert await watcher.check() == 0  # neither has a socket yet
        late_socket, raced_socket = Socket(), Socket()
        watcher.register(token_hash(late), late_socket)
        watcher.register(token_hash(raced), raced_socket)
        assert await watcher.check() == 2
        await wait_until(lambda: late_socket.closed == raced_socket.closed == 1)
    finally:
        await watcher.stop()
