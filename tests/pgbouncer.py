"""A private PgBouncer in transaction mode, in front of the test run's PostgreSQL.

The Debian `pgbouncer` package's binary, started with its own config in a temporary
directory on a free port (never the system service). Every database on the server is
reachable through it under its own name; trust authentication, as the server's.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

BINARIES = ("pgbouncer", "/usr/sbin/pgbouncer")
START_TIMEOUT_S = 30.0
# Before 1.19.0 PgBouncer exits (FATAL "disconnect_client(): bad client state: 0") when a
# cancel request's own connection closes before PgBouncer has passed the cancel on: it
# frees the client and closes it again (pgbouncer#801, fixed by #846 in 1.19.0). asyncpg
# drops its cancel request when the cancelled connection is lost, which PgBouncer 1.18 does
# itself when the cancel lands on its parameter SETs for a new server link. Debian 12
# ships 1.18.0; seen in CI: 120 tests of one worker failed after it.
CANCELS_SAFELY_FROM = (1, 19, 0)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _binary() -> str:
    for candidate in BINARIES:
        found = shutil.which(candidate)
        if found:
            return found
    raise FileNotFoundError("pgbouncer is not installed (apt-get install pgbouncer)")


@cache
def version() -> tuple[int, ...]:
    """The installed PgBouncer's version, as `pgbouncer --version` prints it."""
    printed = subprocess.run(
        [_binary(), "--version"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    found = re.search(r"PgBouncer (\d+)\.(\d+)\.(\d+)", printed)
    if found is None:
        raise RuntimeError(f"no version in pgbouncer --version: {printed[:200]!r}")
    return tuple(int(part) for part in found.groups())


def cancel_hazard() -> str | None:
    """Why the installed PgBouncer may exit under a test that cancels statements at every
    step, or None when it is fixed (CANCELS_SAFELY_FROM)."""
    if version() >= CANCELS_SAFELY_FROM:
        return None
    installed, fixed = (".".join(map(str, v)) for v in (version(), CANCELS_SAFELY_FROM))
    return (
        f"PgBouncer {installed} exits on a cancel request that ends early "
        f"(pgbouncer#801, fixed in {fixed})"
    )


@dataclass
class PgBouncer:
    port: int
    directory: Path
    process: subprocess.Popen[bytes]

    @classmethod
    async def start(
        cls,
        server_host: str,
        server_port: int,
        user: str | None,
        *,
        pool_size: int = 10,
        max_client_conn: int = 2000,
    ) -> PgBouncer:
        """Started and accepting connections."""
        bouncer = cls.launch(
            server_host, server_port, user, pool_size=pool_size, max_client_conn=max_client_conn
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if bouncer.process.poll() is not None:
                log = bouncer.log()
                bouncer.stop()
                raise RuntimeError(f"pgbouncer exited: {log[-2000:]}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", bouncer.port)
            except OSError:
                if time.monotonic() > deadline:
                    bouncer.stop()
                    raise TimeoutError(f"pgbouncer did not listen on {bouncer.port}") from None
                await asyncio.sleep(0.1)
                continue
            writer.close()
            return bouncer

    @classmethod
    def launch(
        cls,
        server_host: str,
        server_port: int,
        user: str | None,
        *,
        pool_size: int = 10,
        max_client_conn: int = 2000,
    ) -> PgBouncer:
        """Started; may not be listening yet."""
        binary = _binary()
        directory = Path(tempfile.mkdtemp(prefix="bc-pgbouncer-"))
        port = _free_port()
        name = user or "postgres"
        (directory / "users.txt").write_text(f'"{name}" ""\n')
        (directory / "pgbouncer.ini").write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={server_host} port={server_port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {directory / 'users.txt'}",
                    "pool_mode = transaction",
                    f"default_pool_size = {pool_size}",
                    f"max_client_conn = {max_client_conn}",
                    # Give server connections back soon: the server is shared.
                    "server_idle_timeout = 10",
                    "server_lifetime = 300",
                    # After a refused server login PgBouncer refuses every client of that
                    # database for this long (15 s by default): a fault test's outage must
                    # not spill into the tests after it.
                    "server_login_retry = 1",
                    f"logfile = {directory / 'pgbouncer.log'}",
                    f"pidfile = {directory / 'pgbouncer.pid'}",
                    # PgBouncer refuses to run as root; drop to the server's user if we are.
                    *(["user = postgres"] if os.geteuid() == 0 else []),
                    "",
                ]
            )
        )
        if os.geteuid() == 0:
            shutil.chown(directory, "postgres")
            for child in directory.iterdir():
                shutil.chown(child, "postgres")
        # Its early errors (before the logfile opens) go to stderr: keep them in a file.
        with (directory / "stderr.txt").open("wb") as stderr:
            process = subprocess.Popen(
                [binary, str(directory / "pgbouncer.ini")],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        return cls(port, directory, process)

    def log(self) -> str:
        text = ""
        for name in ("stderr.txt", "pgbouncer.log"):
            path = self.directory / name
            if path.exists():
                text += path.read_text(errors="replace")
        return text

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)
