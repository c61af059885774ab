"""`bettercompute serve` as a real subprocess, for tests that need separate processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.events.brokers import free_port

STARTUP_S = 120.0


@dataclass(frozen=True)
class Served:
    address: str  # host:port
    pid: int
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def rss_kib(self) -> int:
        """The process's resident memory; FileNotFoundError once it has exited."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")


@asynccontextmanager
async def bettercompute_serve(*args: str, **env: str) -> AsyncIterator[Served]:
    """Run `bettercompute serve` on a free port (more arguments in `args`) with
    BETTERCOMPUTE_* settings in `env`;
    yields once /healthz answers, stops the process on exit."""
    port = free_port()
    descriptor, name = tempfile.mkstemp(prefix="bettercompute-serve-", suffix=".log")
    binary = Path(sys.executable).with_name("bettercompute")
    try:
        process = await asyncio.create_subprocess_exec(
            str(binary),
            *("serve", "--port", str(port), *args),
            env={**os.environ, **env},
            stdout=descriptor,
            stderr=subprocess.STDOUT,
        )
    finally:
        os.close(descriptor)
    address = f"127.0.0.1:{port}"
    served = Served(address, process.pid, Path(name))
    try:
        # Generous: a busy machine can take many seconds to import and start the app.
        deadline = time.monotonic() + STARTUP_S
        async with httpx.AsyncClient(timeout=STARTUP_S) as client:
            while True:
                if process.returncode is not None:
                    raise RuntimeError(f"serve exited: {served.output()[-2000:]}")
                try:
                    if (await client.get(f"http://{address}/healthz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"serve did not answer: {served.output()[-2000:]}")
                await asyncio.sleep(0.05)
        yield served
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
        os.unlink(name)
