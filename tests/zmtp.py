"""A bare ZMTP 3.0 (NULL mechanism) client on a plain TCP socket, for the tests: enough to flood a
ZeroMQ socket with messages no zmqrl role would send and then reset the connection (SO_LINGER 0),
as a vanished peer would."""

from __future__ import annotations

import select
import socket
import struct
import time


def greeting() -> bytes:
    return b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31


def command(name: bytes, body: bytes) -> bytes:
    data = bytes([len(name)]) + name + body
    head = b"\x04" + bytes([len(data)]) if len(data) < 256 else b"\x06" + struct.pack(">Q", len(data))
    return head + data


def ready(socket_type: bytes) -> bytes:
    prop = bytes([len(b"Socket-Type")]) + b"Socket-Type" + struct.pack(">I", len(socket_type)) + socket_type
    return command(b"READY", prop)


def frame(data: bytes, more: bool) -> bytes:
    flag = 0x01 if more else 0x00
    if len(data) < 256:
        return bytes([flag]) + bytes([len(data)]) + data
    return bytes([flag | 0x02]) + struct.pack(">Q", len(data)) + data


def message(frames: list) -> bytes:
    parts = [bytes(f) for f in frames]
    return b"".join(frame(p, i < len(parts) - 1) for i, p in enumerate(parts))


class Client:
    """Connects, handshakes as ``socket_type`` and sends messages without reading anything back."""

    def __init__(self, port: int, socket_type: bytes, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=5)
        self.sock.sendall(greeting() + ready(socket_type))
        self._read_exactly(64)  # the peer's greeting, then its READY: the handshake is done
        flags, size = self._read_exactly(2)
        if flags & 0x02:
            size = struct.unpack(">Q", bytes([size]) + self._read_exactly(7))[0]
        self._read_exactly(size)
        self.sock.setblocking(False)
        self.sent = 0

    def _read_exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the peer closed during the handshake")
            data += chunk
        return data

    def flood(self, payload: bytes, seconds: float, stall_s: float = 0.5) -> int:
        """Send ``payload`` (one or more whole messages) over and over for ``seconds`` or until the peer
        has taken nothing for ``stall_s`` (its queues are full: it stopped reading). Returns bytes sent."""
        buf = memoryview(b"")
        end = time.monotonic() + seconds
        last_progress = time.monotonic()
        while time.monotonic() < end:
            if not buf:
                buf = memoryview(payload)
            _, writable, _ = select.select([], [self.sock], [], 0.05)
            if not writable:
                if time.monotonic() - last_progress > stall_s:
                    break
                continue
            try:
                n = self.sock.send(buf)
            except BlockingIOError:
                continue
            buf = buf[n:]
            self.sent += n
            last_progress = time.monotonic()
        return self.sent

    def reset(self) -> None:
        """Close with SO_LINGER 0: the kernel sends RST (the peer sees a connection reset)."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        self.sock.close()
