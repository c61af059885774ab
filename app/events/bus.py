"""Wake-ups between processes. The outbox is the source of truth; the broker only says
"there is something newer than you have", carrying the newest cursor."""

from __future__ import annotations

from broadcaster import Broadcast

CHANNEL = "bettercompute.pool-events"


class EventBus:
    def __init__(self, url: str) -> None:
        self.url = url
        self.broadcast = Broadcast(url)

    async def connect(self) -> None:
        await self.broadcast.connect()

    async def disconnect(self) -> None:
        await self.broadcast.disconnect()

    async def notify(self, seq: int) -> None:
        await self.broadcast.publish(CHANNEL, str(seq))
