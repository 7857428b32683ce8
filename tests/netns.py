"""Hosts as Linux network namespaces for multi-host tests: one bridge, a veth per host.

`Hosts(["r", "a", "b"])` makes one namespace per name, a bridge in the first one and a veth
pair from each other namespace to that bridge; every host gets 10.231.0.(i+1) on an interface
named `IFACE` (the first host on the bridge itself). Nothing is made or addressed outside the
namespaces it creates, and `close()` deletes them (the veths and the bridge go with them).

`unavailable()` says why namespaces cannot be made here (not root, no `ip`), or None.
`enter(name)` moves the calling thread into a namespace (a client thread of a test).
Namespaces left by a test process that was killed are deleted by the next one.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import uuid

IFACE = "nt0"  # every host's interface: the same name, so one UCX_NET_DEVICES fits all
SUBNET = "10.231.0"
_CLONE_NEWNET = 0x40000000
PREFIX = "nitsum-t"  # nitsum-t<pid of the test process>-<tag>-<host>


def unavailable() -> str | None:
    """Why network namespaces cannot be made on this machine, or None when they can."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"nitsum-probe-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def sweep_stale() -> None:
    """Delete the namespaces a killed test run left (named after a process that is gone)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.strip() else ""
        pid = name.removeprefix(PREFIX).split("-")[0]
        if name.startswith(PREFIX) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Hosts:
    """Namespaces on one bridge (see the module docstring); `addr[name]` is a host's address."""

    def __init__(self, names: list[str]) -> None:
        sweep_stale()
        tag = f"{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.ns = {n: f"{PREFIX}{tag}-{n}" for n in names}
        self.addr = {n: f"{SUBNET}.{i + 1}" for i, n in enumerate(names)}
        self.made: list[str] = []
        try:
            self._build(names)
        except BaseException:
            self.close()
            raise

    def _build(self, names: list[str]) -> None:
        hub = self.ns[names[0]]
        for n in names:
            _ip("netns", "add", self.ns[n])
            self.made.append(self.ns[n])
            _ip("-n", self.ns[n], "link", "set", "lo", "up")
        _ip("-n", hub, "link", "add", IFACE, "type", "bridge")
        _ip("-n", hub, "addr", "add", f"{self.addr[names[0]]}/24", "dev", IFACE)
        _ip("-n", hub, "link", "set", IFACE, "up")
        for i, n in enumerate(names[1:], 1):
            port = f"nt-port{i}"
            _ip(
                "link", "add", IFACE, "netns", self.ns[n], "type", "veth",
                "peer", "name", port, "netns", hub,
            )  # fmt: skip
            _ip("-n", hub, "link", "set", port, "master", IFACE, "up")
            _ip("-n", self.ns[n], "addr", "add", f"{self.addr[n]}/24", "dev", IFACE)
            _ip("-n", self.ns[n], "link", "set", IFACE, "up")

    def cmd(self, name: str, argv: list[str]) -> list[str]:
        """`argv` run inside host `name` (ip netns exec execs it: the pid is argv's)."""
        return ["ip", "netns", "exec", self.ns[name], *argv]

    def link(self, name: str, up: bool) -> None:
        """Take host `name`'s only link down, or up again."""
        _ip("-n", self.ns[name], "link", "set", IFACE, "up" if up else "down")

    def enter(self, name: str) -> None:
        """Move the calling thread into host `name`'s namespace (its sockets then live there)."""
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{self.ns[name]}", os.O_RDONLY)
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {self.ns[name]}")
        finally:
            os.close(fd)

    def close(self) -> None:
        """Delete every namespace made (their veths and bridge with them)."""
        for ns in self.made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made = []
