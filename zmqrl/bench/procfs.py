"""Processes as ``/proc`` shows them: found by their command line, their children, memory, CPU time and
sockets, and killed by pid. Linux only; used by the bench groups and the soak, and by the tests to find
and stop what a run left behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def read_text(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def ppid_and_state(pid: int) -> tuple[int, str] | None:
    """The parent pid and state letter (R, S, Z, ...) of ``pid``; None when there is no such process."""
    stat = read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[1]), fields[0]


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    info = ppid_and_state(pid)
    return info is not None and info[1] != "Z"


def cmdline(pid: int) -> list[str]:
    text = read_text(f"/proc/{pid}/cmdline")
    return [a for a in text.split("\0") if a] if text else []


def children(pid: int) -> list[int]:
    """Direct children of ``pid``: from ``/proc/PID/task/*/children`` where the kernel has it, else a scan."""
    found: set[int] = set()
    have_children_files = False
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = read_text(str(task / "children"))
            if text is not None:
                have_children_files = True
                found.update(int(x) for x in text.split())
    except OSError:
        return []
    if have_children_files:
        return sorted(found)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            info = ppid_and_state(int(entry.name))
            if info is not None and info[0] == pid:
                found.add(int(entry.name))
    return sorted(found)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    out: list[int] = []
    todo = children(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children(p))
    return out


def pids_with_arg(arg: str) -> list[int]:
    """Live processes other than this one with ``arg`` as one exact command-line argument (a unique run directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid() and arg in cmdline(int(entry.name)) \
                and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def rss_bytes(pid: int) -> int | None:
    """Resident memory of ``pid`` (``VmRSS`` in ``/proc/PID/status``); None when it is gone."""
    for line in (read_text(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def cpu_seconds(pid: int, thread: int | None = None, fine: bool = False) -> float:
    """CPU time (user + system) of process ``pid`` (all its threads), or of one of its threads; 0 when
    gone. ``fine``: every thread's nanoseconds from the scheduler, not the process's clock ticks (10 ms)."""
    if thread is not None:  # nanoseconds on a CPU, from the scheduler
        text = read_text(f"/proc/{pid}/task/{thread}/schedstat")
        return int(text.split()[0]) / 1e9 if text else 0.0
    if fine:
        try:
            threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            return 0.0
        return sum(cpu_seconds(pid, t) for t in threads)
    stat = read_text(f"/proc/{pid}/stat")
    if stat is None:
        return 0.0
    fields = stat.rsplit(")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_sockets(pid: int) -> int:
    """Sockets ``pid`` holds open (its ``/proc/PID/fd`` entries that are sockets: listeners and connections)."""
    count = 0
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                count += os.readlink(fd).startswith("socket:")
            except OSError:
                pass
    except OSError:
        return 0
    return count


def kill_pids(pids: list[int], grace_s: float = 5.0) -> None:
    """SIGTERM each pid, then SIGKILL whatever is left after ``grace_s``."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
