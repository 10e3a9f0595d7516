"""The invite names an address other machines reach: stubbed interface lists, then real network namespaces."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from helpers import ROOT, child_env
from sfchat import invite
from sfchat.invite import Interface

ROUTES = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0
wlan0\t0001A8C0\t00000000\t0001\t0\t0\t600\t00FFFFFF\t0\t0\t0
"""
IFACES = [Interface("lo", "127.0.0.1"), Interface("docker0", "172.17.0.1"), Interface("wlan0", "192.168.1.23")]


def test_default_route_interface_comes_first_and_loopback_never():
    assert invite.default_route_interface(ROUTES) == "wlan0"
    assert invite.machine_addresses(IFACES, ROUTES) == ["192.168.1.23", "172.17.0.1"]
    assert invite.machine_addresses(IFACES, ROUTES.splitlines()[0]) == ["172.17.0.1", "192.168.1.23"]  # no route
    assert invite.machine_addresses([Interface("lo", "127.0.0.1")], "") == []


def test_reach_for_each_kind_of_listen_address():
    r = invite.reach("0.0.0.0:7341", 7341, addresses=["192.168.1.23", "172.17.0.1"])
    assert r.addresses == ["192.168.1.23:7341", "172.17.0.1:7341"] and not r.note
    r = invite.reach("0.0.0.0:7341", 7341, addresses=[])
    assert r.addresses == ["127.0.0.1:7341"] and "only a loopback address" in r.note
    assert invite.reach("10.0.0.5:7341", 7341, addresses=["192.168.1.23"]).addresses == ["10.0.0.5:7341"]
    r = invite.reach("127.0.0.1:7340", 7340)
    assert r.addresses == ["127.0.0.1:7340"] and "--listen 0.0.0.0:7340" in r.note
    assert "(use --ring-listen 0.0.0.0:7340)" in invite.reach("127.0.0.1:7340", 7340, listen_flag="--ring-listen").note
    assert invite.reach("0.0.0.0:0", 41234, "chat.example.org").addresses == ["chat.example.org:41234"]
    assert invite.reach("0.0.0.0:0", 41234, "203.0.113.9:443").addresses == ["203.0.113.9:443"]
    assert invite.with_port("fe80::1", 7) == "[fe80::1]:7" and invite.with_port("[::1]:8", 7) == "[::1]:8"
    with pytest.raises(ValueError):
        invite.with_port(":5", 7)


def test_invite_lines_and_the_command_that_runs_here(monkeypatch):
    host = SimpleNamespace(listen="0.0.0.0:7341", port=7341, token="tok", relay_address="",
                           tls=SimpleNamespace(enabled=True, fingerprint="ab12"))
    inv = invite.for_host(host, addresses=["192.168.1.23", "10.8.0.2"])
    assert inv.command.endswith(" join 192.168.1.23:7341 --token tok --tls ab12")
    assert inv.lines()[1] == "(this machine is also at 10.8.0.2:7341)"
    # the program: bare `sfchat` only when that is what PATH runs; else the command that started this one
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "sfchat" / "__main__.py")])
    assert invite.program() == f"{shlex.quote(sys.executable)} -P -m sfchat"
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/local/bin/sfchat")
    assert invite.program() == "sfchat"
    # the invite runs on another machine: a venv's launcher here is `sfchat` there (its set-up puts it on PATH),
    # while what this machine runs again (--resume, `sfchat pull`) stays the path that runs here
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "argv", [str(ROOT / ".venv" / "bin" / "sfchat")])
    host.tls.enabled = False
    assert invite.for_host(host, addresses=["192.168.1.23"]).command == "sfchat join 192.168.1.23:7341 --token tok"
    monkeypatch.setattr(os, "access", lambda *a: True)
    assert invite.program() == shlex.quote(str(ROOT / ".venv" / "bin" / "sfchat"))


# --- real network namespaces: two "machines" joined by a veth pair ---------------------------------------------

NS = (f"i18-host-{os.getpid()}", f"i18-join-{os.getpid()}")
HOST_IP, JOIN_IP, OTHER_IP = "10.231.18.1", "10.231.18.2", "10.231.19.1"


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@pytest.fixture
def two_machines():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    host, join = NS
    try:
        for ns in NS:
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        # a second interface first, so the kernel's order alone would put the wrong address first
        sh("ip", "-n", host, "link", "add", "other0", "type", "veth", "peer", "name", "other1")
        sh("ip", "-n", host, "addr", "add", f"{OTHER_IP}/24", "dev", "other0")
        sh("ip", "-n", host, "link", "set", "other0", "up")
        sh("ip", "link", "add", "i18h0", "netns", host, "type", "veth", "peer", "name", "i18j0", "netns", join)
        sh("ip", "-n", host, "addr", "add", f"{HOST_IP}/24", "dev", "i18h0")
        sh("ip", "-n", join, "addr", "add", f"{JOIN_IP}/24", "dev", "i18j0")
        for ns, dev in ((host, "i18h0"), (join, "i18j0")):
            sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", host, "route", "add", "default", "via", JOIN_IP, "dev", "i18h0")
        yield host, join
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot make network namespaces here: {e.stderr.decode().strip()}")
    finally:
        for ns in NS:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def in_ns(ns: str, *cmd: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *cmd]


def test_a_wildcard_host_invites_by_its_default_route_address(two_machines):
    host, _ = two_machines
    code = "from sfchat import invite; print(invite.machine_addresses())"
    out = subprocess.run(in_ns(host, sys.executable, "-c", code), capture_output=True, text=True, check=True,
                         env=child_env()).stdout
    assert out.strip() == str([HOST_IP, OTHER_IP])


def test_the_printed_invite_joins_from_another_machine(two_machines, tiny_llama):
    """A headless host in one namespace listening on 0.0.0.0; the invite it prints, run as printed in the other
    namespace (sfchat on PATH there), joins; an answer comes through both; the host ends: both exit 0."""
    host_ns, join_ns = two_machines
    env = child_env(PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    if shutil.which("sfchat", path=env["PATH"]) is None:
        pytest.skip("no sfchat launcher next to this python")
    host = subprocess.Popen(in_ns(host_ns, sys.executable, "-m", "sfchat", "host", "--headless", "--model",
                                  str(tiny_llama), "--listen", "0.0.0.0:7341", "--max-new-tokens", "8",
                                  "--temperature", "0", "--draft", "none"),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT)
    joiner = None
    try:
        lines = []
        while not any(" join " in line for line in lines):
            line = host.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        printed = next(line for line in lines if " join " in line).strip()
        assert printed.startswith(f"sfchat join {HOST_IP}:7341 --token ")
        joiner = subprocess.Popen(in_ns(join_ns, "bash", "-c", printed + " --model " + shlex.quote(str(tiny_llama))
                                        + " --headless --name far --give-up-after 0"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        while "+ member 1 (far) joined" not in "".join(lines):
            line = host.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        deadline = time.monotonic() + 60
        while "ring: host" not in "".join(lines):  # planned in: the joiner holds layers
            assert time.monotonic() < deadline, "".join(lines)
            lines.append(host.stderr.readline())
        out, err = host.communicate("hello world\n", timeout=120)
        assert host.returncode == 0, err
        assert out.strip()  # the answer, through the joiner's layers
        assert "WARNING" not in err and "lost" not in err  # the host ending is no loss
        _, jerr = joiner.communicate(timeout=30)
        assert joiner.returncode == 0 and "the host closed the ring" in jerr
    finally:
        for p in (host, joiner):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_the_relay_hint_never_names_a_wildcard():
    from sfchat.relay import relay_hint

    hint = relay_hint("0.0.0.0:7342")
    assert " host --relay " in hint and "0.0.0.0" not in hint and hint.endswith(":7342")
    assert relay_hint("ab12@10.0.0.7:7342").endswith(" host --relay ab12@10.0.0.7:7342")
