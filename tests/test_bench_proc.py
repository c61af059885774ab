"""What the benchmarks read of a process from /proc (bench/proc.py): the scheduler's own
accounting of a thread's CPU and of its waits for a core."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.proc import cpu_s, run_queue_s

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/schedstat"), reason="the kernel keeps no schedstat"
)

_SPIN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"


def test_a_busy_process_is_charged_its_cpu_and_a_gone_one_nothing() -> None:
    child = subprocess.Popen([sys.executable, "-c", _SPIN + "input()"], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while cpu_s(child.pid) < 0.3 and time.monotonic() < deadline:  # its spin done
            time.sleep(0.05)
        ran, waited = run_queue_s(child.pid)
        # schedstat counts in nanoseconds what stat counts in ticks: the same CPU, finer.
        assert ran >= 0.3
        assert abs(ran - cpu_s(child.pid)) < 0.1
        assert waited >= 0.0
        assert run_queue_s(child.pid, thread=child.pid) == pytest.approx((ran, waited), abs=0.01)
    finally:
        child.communicate(b"\n", timeout=60)
    assert run_queue_s(child.pid) == (0.0, 0.0)
