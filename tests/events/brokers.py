"""A private Redis server for tests that stop and restart it (never the shared one)."""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import time

from redis.asyncio import Redis

from tests.databases import service_unavailable


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class PrivateRedis:
    """`redis-server` on its own port, no persistence; `stop()` and `start()` at will."""

    def __init__(self) -> None:
        self.port = free_port()
        self._process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            service_unavailable("redis-server is not installed")
        self._process = await asyncio.create_subprocess_exec(
            binary,
            *("--port", str(self.port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = Redis.from_url(self.url)
        try:
            deadline = time.monotonic() + 60  # generous: a busy machine starts it slowly
            while time.monotonic() < deadline:
                try:
                    await client.ping()
                    return
                except Exception:  # not listening yet
                    await asyncio.sleep(0.02)
            raise RuntimeError("private redis-server did not start")
        finally:
            await client.aclose()

    async def stop(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            await self._process.wait()
        self._process = None

    def pause(self) -> None:
        """Silent: connections are still accepted (by the kernel), nothing is answered."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)
