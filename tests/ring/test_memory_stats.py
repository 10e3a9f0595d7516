"""Memory you can see: `sfchat ask --json` lists every member's memory in use and its peak, and the figures are
each process's own resident set (on a CPU), as the kernel reports it."""
import os

import trio

from helpers import running_ring
from shared_ring import ask_in_process


def vm_rss(pid: int) -> int:
    """The process's resident set, read apart from the code under test: /proc/PID/status's VmRSS."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_ask_json_has_memory_per_member(tiny_llama):
    got = ask_in_process("hello world", "--model", str(tiny_llama), "--local-peers", "1", "--max-new-tokens", "4",
                         "--draft", "none")
    members = got["stats"]["members"]
    assert [m["name"] for m in members] == ["host", "local-a"], members
    for m in members:
        assert m["memory_bytes"] > 0 and m["peak_memory_bytes"] >= m["memory_bytes"], m


def test_each_members_memory_is_its_own_resident_set(tiny_llama):
    async def main():
        async with running_ring(tiny_llama, 1) as (host, lp):
            host_info, peer_info = host.members_info()
            return (host_info, vm_rss(os.getpid())), (peer_info, vm_rss(lp.procs[0].pid))

    for info, rss in trio.run(main):
        # read at other moments (a member's at its last heartbeat): close, not equal
        assert abs(info["memory_bytes"] - rss) < 0.15 * rss, (info, rss)
        assert info["peak_memory_bytes"] >= info["memory_bytes"], info
