"""The invite (`sfchat join ADDRESS --token …`) and the addresses other machines can reach this host by.

A wildcard listen address (0.0.0.0) is no address to give away: the invite names this machine's outward
addresses instead, the one of the default route's interface first (the way to other networks), then every other
non-loopback one. `--advertise HOST[:PORT]` overrides them (NAT, port forwarding, a name in DNS).
"""
from __future__ import annotations

import fcntl
import ipaddress
import os
import shlex
import shutil
import socket
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

from peers import parse_addr

WILDCARDS = ("0.0.0.0", "::", "")
SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's (primary) IPv4 address


@dataclass
class Interface:
    name: str
    address: str


def default_route_interface(route_table: str) -> str | None:
    """The interface of the IPv4 default route in /proc/net/route's text (destination 0, mask 0)."""
    for line in route_table.splitlines()[1:]:
        f = line.split()
        if len(f) >= 8 and f[1] == "00000000" and f[7] == "00000000":
            return f[0]
    return None


def _ipv4_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:  # down, or no IPv4 address
            return None
    return socket.inet_ntoa(raw[20:24])  # struct ifreq: 16 bytes of name, then sockaddr_in (port at 2, addr at 4)


def interfaces() -> list[Interface]:
    """This machine's interfaces with an IPv4 address."""
    return [Interface(name, addr) for _, name in socket.if_nameindex() if (addr := _ipv4_of(name))]


def machine_addresses(ifaces: list[Interface] | None = None, route_table: str | None = None) -> list[str]:
    """Non-loopback IPv4 addresses, the default route's interface first; [] when there is only loopback."""
    if ifaces is None:
        ifaces = interfaces()
    if route_table is None:
        try:
            route_table = Path("/proc/net/route").read_text()
        except OSError:
            route_table = ""
    default = default_route_interface(route_table)
    outward = [i for i in ifaces if not ipaddress.ip_address(i.address).is_loopback]
    outward.sort(key=lambda i: i.name != default)  # stable: the rest keep the kernel's order
    return list(dict.fromkeys(i.address for i in outward))


@dataclass
class Reach:
    """Where to tell others to connect: the first address goes into the invite, the rest are alternatives."""

    addresses: list[str]  # HOST:PORT, best first
    note: str = ""  # said beside the invite (only loopback, …)


def reach(listen: str, port: int, advertise: str | None = None, addresses: list[str] | None = None,
          listen_flag: str = "--listen") -> Reach:
    if advertise:
        return Reach([with_port(advertise, port)])
    host = parse_addr(listen)[0]
    if host not in WILDCARDS:
        note = "" if not _is_loopback(host) else \
            f"this host listens on {host} only: other machines cannot join (use {listen_flag} 0.0.0.0:{port})"
        return Reach([f"{host}:{port}"], note)
    found = machine_addresses() if addresses is None else addresses
    if not found:
        return Reach([f"127.0.0.1:{port}"], "this machine has only a loopback address: other machines cannot "
                                            "reach it (connect a network, or use --relay or --advertise)")
    return Reach([f"{a}:{port}" for a in found])


def with_port(host_port: str, port: int) -> str:
    """HOST[:PORT] -> HOST:PORT, `port` filling a missing one (an IPv6 host gets its brackets)."""
    host, sep, p = host_port.rpartition(":")
    if not sep or not p.isdigit() or (":" in host and not host.endswith("]")):
        host, p = host_port, ""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    if not host.strip("[]"):
        raise ValueError(f"--advertise wants HOST[:PORT], got {host_port!r}")
    return f"{host}:{p or port}"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def program() -> str:
    """How to run sfchat again as this process was run: `sfchat` when that is on PATH, else the full command."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    on_path = shutil.which("sfchat")
    if on_path and (argv0 is None or argv0.name != "sfchat" or Path(on_path).resolve() == argv0.resolve()):
        return "sfchat"
    if argv0 is not None and argv0.name == "sfchat" and os.access(argv0, os.X_OK):
        return shlex.quote(str(argv0.resolve()))
    return f"{shlex.quote(sys.executable)} -P -m sfchat"  # -P: not a folder named sfchat here


def program_there() -> str:
    """How another machine runs sfchat, for the invite: `sfchat` where that runs here too, or where this process is
    an `sfchat` launcher (a venv's: a path into this machine's venv would not exist there, and the set-up puts
    `sfchat` on PATH or says the line that does); else, started as `python -m sfchat`, that command."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    return "sfchat" if argv0 is not None and argv0.name == "sfchat" else program()


def command(address: str, token: str, tls_fingerprint: str = "") -> str:
    tls = f" --tls {tls_fingerprint}" if tls_fingerprint else ""
    return f"{program_there()} join {address} --token {token}{tls}"


@dataclass
class Invite:
    command: str  # what to run on another machine
    address: str  # HOST:PORT (or relay://…) in it
    others: list[str]  # other addresses of this machine, for a network the first does not reach
    note: str = ""

    def lines(self) -> list[str]:
        out = [self.command]
        if self.others:
            out.append(f"(this machine is also at {', '.join(self.others)})")
        if self.note:
            out.append(f"note: {self.note}")
        return out

    def __str__(self) -> str:
        return "\n  ".join(self.lines())


def listening(host) -> str:
    """What a serving host listens on, as bound: a wildcard stays one (the invite names the reachable addresses)."""
    name = parse_addr(host.listen)[0]
    where = " (every network interface)" if name in WILDCARDS else ""
    return with_port(name or "0.0.0.0", host.port) + where


def for_host(host, advertise: str | None = None, addresses: list[str] | None = None,
             listen_flag: str = "--listen") -> Invite:
    """The invite of a serving peers.host.Host (its port known); listen_flag: the option that sets its address."""
    fp = host.tls.fingerprint if host.tls.enabled else ""
    if host.relay_address:
        return Invite(command(host.relay_address, host.token, fp), host.relay_address, [])
    r = reach(host.listen, host.port, advertise, addresses, listen_flag)
    return Invite(command(r.addresses[0], host.token, fp), r.addresses[0], r.addresses[1:], r.note)
