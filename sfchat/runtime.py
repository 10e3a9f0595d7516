"""Bring up a ring for the application: the host, its local peers, the drafter; shared by ask, host and bench."""
from __future__ import annotations

import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from peers import eos_ids, load_tokenizer
from peers import make_drafter
from peers import FitError
from peers import Host
from sfchat import invite
from sfchat.local import LocalPeers
from sfchat.options import RingOptions

JOIN_TIMEOUT_S = 300  # local peers and --wait-peers joiners must be in by then
REVIVE_S = 1.0  # how often the host looks for local peers that died


def say(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


@dataclass
class Ring:
    host: Host
    tokenizer: object
    eos: set[int]
    local: LocalPeers | None


def build_host(opts: RingOptions, **kw) -> Host:
    return Host(opts.host, say=say, **kw)


@asynccontextmanager
async def open_ring(opts: RingOptions, *, announce: bool = True, host: Host | None = None, stay: bool = False):
    """Serve a host, start --local-peers, wait for them and any --wait-peers joiners, plan; close it all after.
    `stay` (host, serve): a ring that cannot hold the model yet (the host's --offer-gb, say) stays up, says why and
    refuses prompts until members that can hold it join; otherwise (ask, bench) that is the command's error."""
    host = host or build_host(opts)
    tokenizer = load_tokenizer(host.model_dir)
    n_local, wait_peers = opts.local_peers, opts.wait_peers
    host.plan_at_start = not (n_local or wait_peers)  # members are coming: plan (and fetch) once they are here
    reviving = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        await nursery.start(host.serve)
        local = LocalPeers(n_local, host.relay_address or host.address, host.token, model=host.source.spec,
                           dtype=opts.host.dtype, quant=opts.host.quant, graphs=opts.host.graphs,
                           extra=["--tls", host.tls.fingerprint] if host.tls.enabled else None,
                           cores=opts.local_cores, own=opts.local_args) if n_local else None
        try:
            if wait_peers and announce:
                say(f"Waiting for {wait_peers} peer(s). On each, run:\n  {invite_for(opts, host)}")
            want = n_local + wait_peers
            with trio.fail_after(JOIN_TIMEOUT_S):
                while sum(m.state != "lost" for m in host.members) < want:
                    if local is not None:
                        local.check()
                    with trio.move_on_after(0.2):
                        await host.wait_members(want)
            if want or host.shard is None:  # (no shard: the host alone could not hold it, and says why now)
                try:
                    await host.replan()
                except FitError as e:
                    if not stay:
                        raise
                    if e.host_short:  # the host's own part: no joiner takes it over
                        host.say(f"{e}; a joiner cannot help (the host itself holds these, and its draft model's "
                                 f"weights once loaded): prompts are refused; start the host with more (--offer-gb)")
                    else:
                        host.say(f"{e}; prompts are refused until a machine that can hold the rest joins")
            host.auto_replan = True  # from now on a member that (re)joins is planned in
            if local is not None:
                nursery.start_soon(keep_alive, local, host, reviving)
            yield Ring(host, tokenizer, eos_ids(host.model_dir, host.config, tokenizer), local)
        finally:
            reviving.cancel()  # before the ring closes: peers that leave then are not started again
            with trio.CancelScope(shield=True):
                await host.close()
            if local is not None:
                local.close()
            nursery.cancel_scope.cancel()


async def keep_alive(local: LocalPeers, host: Host, scope: trio.CancelScope) -> None:
    """The local peers this host started: one that died is reaped and started again, with a line in the log."""
    with scope:
        while True:
            await trio.sleep(REVIVE_S)
            for line in local.revive():
                host.say(line)


def invite_for(opts: RingOptions, host: Host) -> invite.Invite:
    return invite.for_host(host, opts.advertise)


async def new_drafter(spec: str | None, ring: Ring, say=say):
    """The drafter `spec` names (--draft), for the ring's target model, in the host's dtype, loaded on a worker
    thread: a draft model takes seconds to load, and the host's event loop keeps its members' heartbeats going
    meanwhile. What its weights hold is counted in the host's plans from then on."""
    host = ring.host
    hub_id = host.source.hub.repo_id if host.source.hub is not None else None
    drafter = await trio.to_thread.run_sync(lambda: make_drafter(
        spec, host.model_dir, host.config.vocab_size, ring.tokenizer, device=host.device, say=say,
        dtype=host.torch_dtype, hub_id=hub_id, room=host.free_bytes(),
        embedding=host.shard.embed.weight if host.shard is not None else None))
    host.set_drafter_bytes(getattr(drafter, "bytes", 0))
    return drafter


def compute_line(host) -> str:
    """The host's number format as start-up lines say it: its dtype (what --dtype auto took), its quantization."""
    return host.dtype + (f", {host.quant} weights" if host.quant != "none" else "")
