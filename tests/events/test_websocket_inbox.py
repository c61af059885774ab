"""The lean websocket protocol's inbox (app/websocket_protocol.py): what uvicorn relies on
from asyncio.Queue, for its one reader."""

from __future__ import annotations

import asyncio

from app.websocket_protocol import Inbox


async def test_messages_come_out_in_order_and_a_waiting_reader_is_woken() -> None:
    inbox = Inbox()
    assert inbox.empty()
    inbox.put_nowait("connect")
    inbox.put_nowait("receive")
    assert not inbox.empty()
    assert [await inbox.get(), await inbox.get()] == ["connect", "receive"]
    assert inbox.empty()
    reader = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    inbox.put_nowait("disconnect")
    assert await reader == "disconnect"


async def test_a_cancelled_read_loses_nothing() -> None:
    inbox = Inbox()
    reader = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    reader.cancel()
    inbox.put_nowait("receive")  # arrives as the cancelled reader unwinds
    await asyncio.gather(reader, return_exceptions=True)
    assert reader.cancelled()
    assert await inbox.get() == "receive"
