"""Real database faults for tests: a TCP proxy that can stop answering, a private
PostgreSQL server to stop, restart and size, and a load that counts answers by status.

Nothing here touches the shared PostgreSQL server beyond the databases and roles a test
creates on it; servers that are stopped or sized are the test's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import glob
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
from sqlalchemy.engine import make_url

from tests.databases import POSTGRES_URL, direct_url, service_unavailable
from tests.events.brokers import free_port

# --- the shared server, as its superuser -----------------------------------------------


def postgres_dsn(url: str = POSTGRES_URL, database: str | None = None) -> str:
    """asyncpg's form of a SQLAlchemy URL, optionally for another database; always to
    the server itself, never through a PgBouncer."""
    parsed = make_url(direct_url(url)).set(drivername="postgresql")
    if database is not None:
        parsed = parsed.set(database=database)
    return parsed.render_as_string(hide_password=False)


async def admin(*statements: str, database: str | None = None) -> None:
    """Run statements on the shared server as its superuser (autocommit)."""
    connection = await asyncpg.connect(postgres_dsn(database=database), timeout=10)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


def terminate_backends(where: str) -> str:
    """A statement that ends the sessions matching `where` (a pg_stat_activity condition)
    and waits until they are gone."""
    return (
        "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
        f"WHERE {where} AND pid <> pg_backend_pid()"
    )


async def refuse_database(name: str, within_s: float = 20.0) -> None:
    """`ALTER DATABASE … ALLOW_CONNECTIONS false` and every session of it ended, until
    none is left: a connection that passed its start-up checks before the ALTER
    committed may not be in pg_stat_activity yet when the first termination runs, and
    would go on answering (seen once under load: a 200 during the fault)."""
    await admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    connection = await asyncpg.connect(postgres_dsn(), timeout=10)
    try:
        deadline = time.monotonic() + within_s
        while True:
            await connection.execute(terminate_backends(f"datname = '{name}'"))
            left = await connection.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", name
            )
            if not left:
                return
            assert time.monotonic() < deadline, f"{left} sessions of {name} still open"
    finally:
        await connection.close()


async def hold_lock(database_url: str, statement: str) -> Callable[[], Awaitable[None]]:
    """Run `statement` (a LOCK TABLE) in a transaction of a session of the test's own and
    keep it open; returns what rolls it back and closes the session."""
    session = await asyncpg.connect(postgres_dsn(database_url), timeout=10)
    transaction = session.transaction()
    await transaction.start()
    await session.execute(statement)

    async def release() -> None:
        await transaction.rollback()
        await session.close()

    return release


# --- a proxy that stops answering -------------------------------------------------------


class StallingProxy:
    """Forwards 127.0.0.1:`port` to an upstream server until `stall()`: from then on it
    accepts connections and reads what clients send, but forwards nothing either way,
    as a server that hangs or a network path that drops packets would. `resume()`
    forwards again, including what was held back, as TCP does once a path heals."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = free_port()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def stall(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        upstream_w: asyncio.StreamWriter | None = None
        try:
            await self._flowing.wait()  # a stalled server accepts but never answers
            upstream_r, upstream_w = await asyncio.open_connection(*self.upstream)
            await asyncio.gather(self._pipe(client_r, upstream_w), self._pipe(upstream_r, client_w))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for writer in (client_w, upstream_w):
                if writer is not None:
                    writer.close()
            self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()


# --- a SQLite file that stops answering --------------------------------------------------

# Run in a process of its own (POSIX record locks never conflict within one process): on
# "stall", take SQLite's WAL-index read locks, bytes 123-127 of the -shm file, exclusively
# (waiting for readers in flight); on "resume", release them; exit at end of input.
_WAL_LOCKER = """
import fcntl, os, sys
fd = os.open(sys.argv[1] + "-shm", os.O_RDWR)
for line in sys.stdin:
    for byte in range(123, 128):
        fcntl.lockf(fd, fcntl.LOCK_EX if line.strip() == "stall" else fcntl.LOCK_UN, 1, byte)
    print("done", flush=True)
"""


class StallingSQLite:
    """Another process that, on `stall()`, holds every read lock of a WAL-mode SQLite
    file's shared index, as SQLite's own locking protocol takes them (a process stopped
    mid-checkpoint or hung on a stalled disk holds them alike): from then on no new read
    or write transaction begins. A reader retries inside SQLite for about 10 s, whatever
    its busy timeout, and gives up with SQLITE_PROTOCOL ("locking protocol"); readers
    already reading finish. `resume()` releases them. The file must be open in WAL mode
    (its -shm file there) when it starts."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _WAL_LOCKER,
            self.path,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )

    async def _tell(self, what: str) -> None:
        assert self._process is not None and self._process.stdin and self._process.stdout
        self._process.stdin.write(f"{what}\n".encode())
        await self._process.stdin.drain()
        try:
            async with asyncio.timeout(30):
                line = await self._process.stdout.readline()
        except TimeoutError:
            raise RuntimeError(f"no {what} within 30 s: {self._holders()}") from None
        if line.strip() != b"done":
            raise RuntimeError(f"the SQLite lock holder did not {what}")

    def _holders(self) -> str:
        """Who holds locks on the -shm file (/proc/locks), for a stall that never came."""
        inode = os.stat(self.path + "-shm").st_ino
        with open("/proc/locks") as locks:  # "N: [->] POSIX ADVISORY type pid dev:inode s e"
            rows = [line.replace("->", "waits").split()[1:] for line in locks]
        held = [row for row in rows if row[-3].endswith(f":{inode}")]
        return f"test process {os.getpid()}; locks on -shm: {held}"

    async def stall(self) -> None:
        # The file is the worker's one migrated database, shared by its tests in turn. A
        # read an earlier test's shutdown cancelled mid-statement (a relay drain) leaves
        # its sqlite3 cursor in a reference cycle with the CancelledError's traceback: the
        # closed connection lingers, holding its read mark, until the cycle collector
        # frees it, and nothing in an idle test allocates enough to run it (CI waited
        # 30 s for the lock). Free it now.
        gc.collect()
        await self._tell("stall")

    async def resume(self) -> None:
        await self._tell("resume")

    async def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            assert process.stdin is not None
            process.stdin.close()  # its locks go with it
            async with asyncio.timeout(30):
                await process.wait()


# --- a private PostgreSQL server ---------------------------------------------------------


def _postgres_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    on_path = shutil.which("initdb")
    if found:
        return Path(found[-1]).parent
    if on_path:
        return Path(on_path).parent
    service_unavailable("PostgreSQL server binaries (initdb, pg_ctl) are not installed")


class PrivatePostgres:
    """A PostgreSQL server of the test's own in a temporary directory, on a free port,
    trust authentication for user `postgres`. PostgreSQL refuses to run as root, so as
    root it runs as the system's `postgres` user."""

    def __init__(self, max_connections: int = 100) -> None:
        self.port = free_port()
        self.max_connections = max_connections
        self._bin = _postgres_bin()
        self._dir = Path(tempfile.mkdtemp(prefix="bc-private-pg-"))
        self.data = self._dir / "data"
        self._as: list[str] = []
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                service_unavailable("running as root and there is no `postgres` user")
            os.chown(self._dir, account.pw_uid, account.pw_gid)
            self._as = ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}"]
            self._as += ["--init-groups"]

    def url(self, database: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql+asyncpg://{user}@127.0.0.1:{self.port}/{database}"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    async def _run(self, *args: str) -> None:
        process = await asyncio.create_subprocess_exec(
            *self._as, *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        out, _ = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {out.decode(errors='replace')[-2000:]}")

    async def init(self) -> None:
        await self._run(
            str(self._bin / "initdb"),
            *("-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync"),
        )
        settings = {
            "port": self.port,
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": "''",
            "max_connections": self.max_connections,
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "'32MB'",
        }
        with (self.data / "postgresql.conf").open("a") as conf:
            for key, value in settings.items():
                conf.write(f"{key} = {value}\n")

    async def start(self) -> None:
        await self._run(
            str(self._bin / "pg_ctl"),
            *("-D", str(self.data), "-l", str(self._dir / "server.log"), "-w", "start"),
        )

    async def stop(self, mode: str = "fast", *, wait: bool = True) -> None:
        await self._run(
            str(self._bin / "pg_ctl"),
            *("-D", str(self.data), "-m", mode, "-W" if not wait else "-w", "stop"),
        )

    async def refusing(self, within_s: float = 30.0) -> None:
        """Wait until the postmaster has taken a shutdown in hand: `pg_ctl stop -W` returns
        before it has, and a session that starts in between would keep a smart shutdown
        waiting for ever."""
        deadline = time.monotonic() + within_s
        while True:
            try:
                connection = await asyncpg.connect(self.dsn(), timeout=10)
            except asyncpg.CannotConnectNowError:
                return
            await connection.close()
            if time.monotonic() > deadline:
                raise AssertionError("the private server still accepts connections")
            await asyncio.sleep(0.02)

    async def wait_stopped(self, within_s: float = 60.0) -> None:
        pid_file = self.data / "postmaster.pid"
        await wait_for(lambda: not pid_file.exists(), within_s, "the private server to stop")

    async def execute(self, statement: str, database: str = "postgres") -> None:
        connection = await asyncpg.connect(self.dsn(database), timeout=10)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    async def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            if (self.data / "postmaster.pid").exists():
                await self.stop("immediate")
        shutil.rmtree(self._dir, ignore_errors=True)


@asynccontextmanager
async def private_postgres(max_connections: int = 100) -> AsyncIterator[PrivatePostgres]:
    server = PrivatePostgres(max_connections)
    try:
        await server.init()
        await server.start()
        yield server
    finally:
        await server.close()


# --- load and measurement ----------------------------------------------------------------


async def wait_for(condition: Callable[[], bool], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


Call = Callable[[], Awaitable[httpx.Response]]


@dataclass(frozen=True)
class Answer:
    began: float
    ended: float
    status: int  # 0: no HTTP answer at all (refused, reset, client timeout)


@dataclass
class Load:
    """Clients calling in a loop, each answer recorded with when it began and ended, so a
    test can count statuses inside a fault window and find the first 200 after it."""

    call: Call
    clients: int = 4
    answers: list[Answer] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def __aenter__(self) -> Load:
        self._tasks = [asyncio.create_task(self._client()) for _ in range(self.clients)]
        return self

    async def __aexit__(self, *_: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _client(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                status = (await self.call()).status_code
            except httpx.HTTPError:
                status = 0
            self.answers.append(Answer(began, time.monotonic(), status))
            await asyncio.sleep(0.01)  # a client answered at once does not spin

    def within(self, start: float, end: float) -> list[Answer]:
        """Requests that began at or after `start` and ended before `end`."""
        return [a for a in self.answers if a.began >= start and a.ended < end]

    def statuses(self, start: float, end: float) -> Counter[int]:
        return Counter(a.status for a in self.within(start, end))

    def answered_since(self, since: float) -> int:
        return sum(1 for a in self.answers if a.began >= since)

    async def answered(self, count: int, since: float, within_s: float) -> None:
        """Wait until `count` requests that began after `since` have been answered."""
        await wait_for(lambda: self.answered_since(since) >= count, within_s, f"{count} answers")

    async def first_success_after(self, since: float, within_s: float) -> float:
        """Seconds from `since` (the fault ending) to the first 200 answered after it."""

        def successes() -> list[float]:
            return [a.ended for a in self.answers if a.status == 200 and a.ended >= since]

        await wait_for(lambda: bool(successes()), within_s, "the first 200 after the fault")
        return min(successes()) - since


def report(
    name: str,
    during: Counter[int],
    recovery_s: float | None,
    label: str = "during the fault",
    **extra: object,
) -> str:
    """One line for the log (`pytest -s` shows it): answers by status during the fault,
    and the time from the fault ending to the first 200."""
    statuses = ", ".join(f"{status}: {n}" for status, n in sorted(during.items()))
    parts = [f"{name}: {label} {{{statuses}}}"]
    if recovery_s is not None:
        parts.append(f"first 200 {recovery_s:.2f} s after it ended")
    parts += [f"{key} {value}" for key, value in extra.items()]
    line = "; ".join(parts)
    print(line)
    return line
