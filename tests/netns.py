"""Network-namespace helpers for the multi-host tests: a private switched LAN on one machine.

:class:`Lan` builds a "switch" namespace holding a Linux bridge and one namespace per host, each
joined to the bridge by a veth pair whose host end is ``eth0`` with an address in a private /24.
Everything is created inside namespaces this module makes (the veth pairs are created in the
switch namespace and their host ends moved straight into the host namespaces), so the root
namespace's interfaces, addresses and routes are never touched, and traffic flows only between
these namespaces. Names carry a per-run suffix so parallel runs do not collide.

    lan = Lan.create(["learner", "actors", "evaluator"])
    try:
        argv = lan.exec_argv("learner", [sys.executable, "-m", "zmqrl.cli", "learner", ...])
        lan.cut("actors")   # switch-side link down: the host is partitioned from the others
        lan.heal("actors")
    finally:
        lan.destroy()       # stop the processes running inside first
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

IP_TIMEOUT_S = 10.0


class NetnsError(RuntimeError):
    """An ``ip`` command failed; the message holds the command and its stderr."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` (bounded in time); raise :class:`NetnsError` on failure when ``check``."""
    cmd = ["ip", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(cmd)}: {exc}") from exc
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)} exited with {done.returncode}: {done.stderr.strip()}")
    return done


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be used here (not root, no ``ip``, ``ip netns add`` fails), or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (network namespaces and veth pairs)"
    if shutil.which("ip") is None:
        return "needs the iproute2 'ip' command"
    probe = f"zq-probe-{os.getpid()}"
    try:
        ip("netns", "add", probe)
    except NetnsError as exc:
        return f"'ip netns add' failed: {exc}"
    try:
        ip("-n", probe, "link", "add", "zqbr", "type", "bridge")
    except NetnsError as exc:
        return f"cannot create a bridge inside a namespace: {exc}"
    finally:
        ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    """One host namespace on the LAN."""

    name: str  # logical name, e.g. "learner"
    netns: str  # namespace name
    addr: str  # IPv4 address on the LAN
    switch_port: str  # the veth end inside the switch namespace (bring it down to cut the host off)


@dataclass
class Lan:
    """A bridge in a switch namespace and hosts hanging off it; see the module docstring."""

    suffix: str
    subnet: str  # first three octets, e.g. "10.231.17"
    switch: str
    hosts: dict[str, Host] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)  # created so far, for destroy()

    @classmethod
    def create(cls, names: Sequence[str], suffix: str | None = None, subnet: str | None = None) -> Lan:
        """Build the LAN: host ``names[i]`` gets ``SUBNET.(i+1)/24``. On failure, undo what was made and raise."""
        suffix = suffix or str(os.getpid())
        subnet = subnet or f"10.231.{os.getpid() % 250 + 1}"
        lan = cls(suffix=suffix, subnet=subnet, switch=f"zq-sw-{suffix}")
        try:
            lan._build(names)
        except BaseException:
            lan.destroy()
            raise
        return lan

    def _add_netns(self, name: str) -> None:
        ip("netns", "add", name)
        self.namespaces.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def _build(self, names: Sequence[str]) -> None:
        self._add_netns(self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        for i, name in enumerate(names):
            host = Host(name=name, netns=f"zq-{name}-{self.suffix}", addr=f"{self.subnet}.{i + 1}",
                        switch_port=f"p{i}")
            self._add_netns(host.netns)
            # Created in the switch namespace, host end moved straight into the host's: the root
            # namespace never sees either end.
            ip("-n", self.switch, "link", "add", host.switch_port, "type", "veth",
               "peer", "name", "eth0", "netns", host.netns)
            ip("-n", self.switch, "link", "set", host.switch_port, "master", "br0")
            ip("-n", self.switch, "link", "set", host.switch_port, "up")
            ip("-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", "eth0")
            ip("-n", host.netns, "link", "set", "eth0", "up")
            self.hosts[name] = host

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def addr(self, name: str) -> str:
        return self.hosts[name].addr

    def exec_argv(self, name: str, argv: Sequence[str]) -> list[str]:
        """``ip netns exec NS ARGV...``: run ``argv`` on host ``name`` (ip execs it: the PID is the program's)."""
        return ["ip", "netns", "exec", self.hosts[name].netns, *argv]

    def cut(self, name: str) -> None:
        """Partition host ``name`` from every other: its switch port goes down."""
        ip("-n", self.switch, "link", "set", self.hosts[name].switch_port, "down")

    def heal(self, name: str) -> None:
        """Undo :meth:`cut`."""
        ip("-n", self.switch, "link", "set", self.hosts[name].switch_port, "up")

    def ping(self, src: str, dst: str, timeout_s: int = 1) -> bool:
        """One ping from host ``src`` to host ``dst``; True when answered."""
        done = subprocess.run(["ip", "netns", "exec", self.hosts[src].netns, "ping", "-c", "1", "-W",
                               str(timeout_s), self.hosts[dst].addr], capture_output=True,
                              timeout=timeout_s + IP_TIMEOUT_S)
        return done.returncode == 0

    def destroy(self) -> list[str]:
        """Delete every namespace this LAN made (the veth pairs and the bridge go with them).

        Stop the processes running inside first. Returns the errors met (destroy never raises).
        """
        errors = []
        for ns in reversed(self.namespaces):
            try:
                ip("netns", "del", ns)
            except NetnsError as exc:
                errors.append(str(exc))
        self.namespaces.clear()
        self.hosts.clear()
        return errors
