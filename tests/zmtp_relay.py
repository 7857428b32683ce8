"""A loopback TCP relay between a worker and the router that parses ZMTP 3 framing just enough
to find message frames: it records what crosses, and on request injects, modifies, replays or
drops the next message frame in one direction (the attacker on the network path of
docs/security.md). Every wait is bounded."""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field

GREETING = 64  # ZMTP 3 greeting: signature, version, mechanism, as-server, filler
MORE, LONG, COMMAND = 0x01, 0x02, 0x04


def frame(body: bytes, flags: int = 0) -> bytes:
    """One ZMTP frame."""
    if len(body) > 255:
        return bytes([flags | LONG]) + len(body).to_bytes(8, "big") + body
    return bytes([flags, len(body)]) + body


@dataclass
class Attack:
    """What to do to the next message frame going `direction` ("up": worker → router)."""

    direction: str
    kind: str  # "inject" (send `payload` before it), "modify", "replay", "drop"
    payload: bytes = b""
    done: threading.Event = field(default_factory=threading.Event)


class Relay:
    """Listens on a free loopback port and relays each connection to `upstream` (host, port)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.addr = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.seen: list[tuple[str, bytes]] = []  # (direction, body) of every message frame
        self.attack: Attack | None = None
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def arm(self, attack: Attack) -> Attack:
        """Apply `attack` to the next message frame in its direction."""
        with self.lock:
            self.attack = attack
        return attack

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                down, _ = self.listener.accept()
            except TimeoutError:
                continue
            up = socket.create_connection(self.upstream, timeout=5)
            for src, dst, d in ((down, up, "up"), (up, down, "down")):
                t = threading.Thread(target=self._pump, args=(src, dst, d), daemon=True)
                t.start()
                self.threads.append(t)

    def _take(self, direction: str) -> Attack | None:
        with self.lock:
            a = self.attack
            if a is not None and a.direction == direction:
                self.attack = None
                return a
            return None

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        buf, greeted = b"", False
        src.settimeout(0.2)
        try:
            while not self.stop.is_set():
                try:
                    chunk = src.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                buf += chunk
                if not greeted:
                    if len(buf) < GREETING:
                        continue
                    dst.sendall(buf[:GREETING])
                    buf, greeted = buf[GREETING:], True
                while (parsed := self._frame(buf)) is not None:
                    flags, body, size = parsed
                    raw, buf = buf[:size], buf[size:]
                    if flags & COMMAND:
                        dst.sendall(raw)
                        continue
                    self.seen.append((direction, body))
                    dst.sendall(self._apply(direction, flags, body, raw))
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    @staticmethod
    def _frame(buf: bytes) -> tuple[int, bytes, int] | None:
        """(flags, body, bytes used) of the first whole frame in `buf`."""
        if len(buf) < 2:
            return None
        flags = buf[0]
        head = 9 if flags & LONG else 2
        if len(buf) < head:
            return None
        n = int.from_bytes(buf[1:head], "big")
        if len(buf) < head + n:
            return None
        return flags, buf[head : head + n], head + n

    def _apply(self, direction: str, flags: int, body: bytes, raw: bytes) -> bytes:
        a = self._take(direction)
        if a is None:
            return raw
        a.done.set()
        if a.kind == "inject":
            return frame(a.payload) + raw
        if a.kind == "modify":
            bad = bytearray(body)
            bad[len(bad) // 2] ^= 0x01
            return frame(bytes(bad), flags & MORE)
        if a.kind == "replay":
            return raw + raw
        assert a.kind == "drop", a.kind
        return b""

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(2)
        self.listener.close()
