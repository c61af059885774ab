"""What a benchmark reads of a process from /proc (Linux), and when a server it started
is ready."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

TICKS = os.sysconf("SC_CLK_TCK")


def _proc_file(pid: int, thread: int | None, name: str) -> Path:
    """/proc's file `name` of a process, or of one of its threads."""
    return Path(f"/proc/{pid}/{name}" if thread is None else f"/proc/{pid}/task/{thread}/{name}")


def cpu_s(pid: int, thread: int | None = None) -> float:
    """User + system CPU seconds of a process so far, or of one of its threads (its main
    thread: `thread=pid`); 0 once it is gone."""
    try:
        stat = _proc_file(pid, thread, "stat").read_text()
    except FileNotFoundError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def run_queue_s(pid: int, thread: int | None = None) -> tuple[float, float]:
    """(CPU seconds, seconds spent runnable but waiting for a core) of a process's main
    thread, or of one of its threads, so far, from the scheduler's own accounting
    (/proc/<pid>/schedstat); (0, 0) once it is gone or where the kernel keeps none."""
    try:
        on_cpu, waiting = _proc_file(pid, thread, "schedstat").read_text().split()[:2]
    except (FileNotFoundError, ValueError):
        return 0.0, 0.0
    return int(on_cpu) / 1e9, int(waiting) / 1e9


class Profiler:
    """`--profile DIR`: py-spy samples the server through a phase (needs `py-spy` on
    PATH or in the venv; not a project dependency). Writes collapsed stacks (DIR/name.txt,
    for flamegraph tools or a grep) of the server's event loop thread."""

    def __init__(self, directory: str | None, pid: int) -> None:
        self.directory = Path(directory) if directory else None
        self.pid = pid
        self.running: subprocess.Popen[bytes] | None = None

    def start(self, name: str) -> None:
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        spy = Path(sys.executable).with_name("py-spy")
        self.running = subprocess.Popen(
            [
                str(spy if spy.exists() else "py-spy"),
                "record",
                "--pid",
                str(self.pid),
                "--format",
                "raw",
                "--rate",
                "200",
                "--nonblocking",
                "--output",
                str(self.directory / f"{name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.running is not None:
            self.running.send_signal(signal.SIGINT)
            self.running.wait(30)
            self.running = None


def until_ready(
    process: subprocess.Popen[bytes],
    port: int,
    log: Path,
    also: Callable[[], bool] = lambda: True,
) -> None:
    """Until the server on `port` answers /readyz with 200 and `also()` holds (two
    minutes at most); if it exits or never does, it is killed and its log raised."""
    for _ in range(1200):
        try:
            ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
            if ready and also():
                return
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"serve did not start:\n{log.read_text()}")
