"""Threads that work beside a role's main loop (the learner's intake and publisher): each owns its
sockets, waits in one ZeroMQ poll, and is woken by the loop through a pipe, never a shared socket.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

log = logging.getLogger("zmqrl")


class Waker:
    """A pipe a thread's poller watches (``fd``): :meth:`wake` from any thread ends its wait at once."""

    def __init__(self) -> None:
        self.fd, self._write = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write, False)
        self.closed = False

    def wake(self) -> None:
        if self.closed:
            return
        try:
            os.write(self._write, b"!")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already: the thread will look

    def clear(self) -> None:
        """Read the wake-ups that came (the watching thread, after its poll)."""
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fd in (self.fd, self._write):
            try:
                os.close(fd)
            except OSError:
                pass


class Beside:
    """A daemon thread running :meth:`work` until :meth:`stop`; an exception in it is logged, kept in
    :attr:`error` and raised again by :meth:`check` in the loop's thread. Its CPU time is :attr:`cpu_s`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.waker = Waker()
        self.stopping = False
        self.error: BaseException | None = None
        self._cpu_s = 0.0
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _main(self) -> None:
        started = time.thread_time()
        try:
            self.work()
        except BaseException as exc:  # handed to the loop's thread (check)
            log.error("%s: stopped by %s: %s", self.name, type(exc).__name__, exc)
            self.error = exc
        finally:
            self._cpu_s = time.thread_time() - started

    def work(self) -> None:
        raise NotImplementedError

    def check(self) -> None:
        """Raise, in the calling thread, what ended this thread early (if anything did)."""
        if self.error is not None:
            raise RuntimeError(f"{self.name} failed: {type(self.error).__name__}: {self.error}") from self.error

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to finish, wait up to ``timeout`` for it, and close the waker."""
        self.stopping = True
        self.waker.wake()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self.waker.close()

    def cpu_s(self) -> float:
        """CPU seconds the thread has used (while it runs: read from the kernel's per-thread clock)."""
        if self._thread.is_alive():
            return _thread_cpu_s(self._thread.native_id)
        return self._cpu_s


def _thread_cpu_s(tid: Any) -> float:
    """CPU seconds of thread ``tid`` of this process, from /proc (0 where it cannot be read)."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, TypeError):
        return 0.0
