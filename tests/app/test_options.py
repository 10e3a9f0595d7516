"""Each role's options, built from the command line over the settings file."""
import dataclasses

import pytest

from peers.base.options import HostOptions
from sfchat import settings
from sfchat.cli import parser
from sfchat.options import AnswerOptions, join_options, ring_options


def test_an_explicit_flag_wins_and_the_settings_file_fills_the_rest():
    s = settings.Settings(temperature=0.4, k="3", draft="none", model="mymodel")
    opts = ring_options(parser().parse_args(["host"]), s)
    assert (opts.answer.temperature, opts.answer.k, opts.answer.draft, opts.host.model) == (0.4, 3, "none", "mymodel")
    opts = ring_options(parser().parse_args(["host", "--temperature", "0", "--k", "0", "--model", "x",
                                             "--draft", "ngram"]), s)
    assert (opts.answer.temperature, opts.answer.k, opts.answer.draft, opts.host.model) == (0.0, 0, "ngram", "x")
    assert ring_options(parser().parse_args(["host"]), settings.Settings()).answer.temperature == 0.0


def test_each_command_gets_its_own_defaults():
    ask = ring_options(parser().parse_args(["ask", "hi", "--wait-peers", "2", "--top-k", "5"]))
    assert ask.host == HostOptions() and ask.serve is None and ask.wait_peers == 2  # ask ignores the settings file
    assert ask.answer == AnswerOptions(top_k=5)
    serve = ring_options(parser().parse_args(["serve", "--ring-listen", "0.0.0.0:7000", "--api-key", "k", "--tls"]))
    assert (serve.host.listen, serve.host.tls, serve.serve.listen, serve.serve.api_key) == \
        ("0.0.0.0:7000", True, "127.0.0.1:8000", "k")
    host = ring_options(parser().parse_args(["host", "--serve", "--relay", "r:1"]), settings.Settings())
    assert (host.host.listen, host.host.relay, host.serve.listen) == ("127.0.0.1:7340", "r:1", "127.0.0.1:8000")
    join = join_options(parser().parse_args(["join", "h:1", "--token", "t", "--tls", "AB:" * 31 + "AB", "--stay"]))
    assert (join.peer.address, join.peer.token, join.peer.tls_pin, join.peer.name, join.stay) == \
        ("h:1", "t", "ab" * 32, "peer", True)  # the fingerprint as the invite prints it, whatever its case or colons


def test_no_prefix_cache_reaches_serve_and_host():
    assert ring_options(parser().parse_args(["serve"])).prefix_cache
    for cmd in (["serve"], ["host", "--serve"], ["host"]):
        assert not ring_options(parser().parse_args([*cmd, "--no-prefix-cache"]), settings.Settings()).prefix_cache


def test_options_are_frozen_and_a_change_is_a_new_object():
    opts = ring_options(parser().parse_args(["host"]), settings.Settings())
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.answer.temperature = 1.0
    hotter = dataclasses.replace(opts.answer, temperature=1.0)
    assert (hotter.temperature, opts.answer.temperature) == (1.0, 0.0)


def test_no_graphs_reaches_the_host_each_joiner_and_the_local_peers():
    for cmd in (["ask", "hi"], ["host"], ["serve"]):
        assert ring_options(parser().parse_args(cmd)).host.graphs
        assert not ring_options(parser().parse_args(cmd + ["--no-graphs"])).host.graphs
    assert not join_options(parser().parse_args(["join", "h:1", "--no-graphs"])).peer.graphs
    assert join_options(parser().parse_args(["join", "h:1"])).peer.graphs
    assert parser().parse_args(["bench", "--no-graphs"]).no_graphs


def test_in_flight_reaches_the_draft_policy_of_ask_host_and_serve_and_makes_a_bench_row_per_value():
    from peers.speculation.adaptive import KPolicy
    from sfchat.bench import policy_for, ring_modes

    for cmd in (["ask", "hi"], ["host"], ["serve"]):
        for flag, want in ((None, None), ("auto", None), ("1", 1), ("3", 3)):
            args = parser().parse_args(cmd + (["--in-flight", flag] if flag else []))
            answer = ring_options(args, settings.Settings()).answer
            assert answer.in_flight == want and answer.pin(KPolicy(in_flight=7)).in_flight == want
    bench = parser().parse_args(["bench"])
    assert bench.in_flight == [None, 1]  # auto,1: rounds in flight against one at a time, in the same run
    assert parser().parse_args(["bench", "--in-flight", "3,auto,1,3"]).in_flight == [3, None, 1]
    rows = ring_modes("simulated:0.8,0.6", ["ring", "ring-spec"], bench.in_flight)
    assert rows == [("ring", "none", None), ("ring-spec", "simulated:0.8,0.6", "auto"),
                    ("ring-spec", "simulated:0.8,0.6", 1)]
    assert [policy_for(bench, flight).in_flight for *_, flight in rows] == [None, None, 1]


@pytest.mark.parametrize("generation, want", [({"temperature": 0.6, "top_p": 0.9}, 0.6),
                                              ({"do_sample": False, "temperature": 0.9}, 0.0),
                                              ({"bos_token_id": 1}, 0.0), (None, 0.0)])
def test_one_default_temperature_from_the_models_generation_config(tmp_path, generation, want):
    import json

    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    model = ["--model", str(tmp_path)]
    for cmd in (["ask", "hi"], ["serve"]):
        assert ring_options(parser().parse_args([*cmd, *model])).answer.temperature == want
        assert ring_options(parser().parse_args([*cmd, *model, "--temperature", "0.2"])).answer.temperature == 0.2
    assert ring_options(parser().parse_args(["host", *model]), settings.Settings()).answer.temperature == want
    # a temperature the user set in the chat (/temp, kept in the settings file) wins over the model's
    assert ring_options(parser().parse_args(["host", *model]), settings.Settings(temperature=0.3)).answer.temperature \
        == 0.3


def test_a_hosts_token_lasts_until_new_token(tmp_path):
    """host and serve reuse the token kept in the config folder (readable by its user only); --new-token makes a new
    one and drops the TLS certificate with it; ask, a one-off, keeps none."""
    import os

    from peers import config_dir
    from peers.links.tls import ensure_cert

    first = ring_options(parser().parse_args(["serve"])).host.token
    assert first and ring_options(parser().parse_args(["host"]), settings.Settings()).host.token == first
    assert os.stat(config_dir() / "host-token").st_mode & 0o777 == 0o600
    cert, _ = ensure_cert("host")
    rotated = ring_options(parser().parse_args(["serve", "--new-token"])).host.token
    assert rotated != first and not cert.exists()  # a new certificate is made when TLS is next set up
    assert ring_options(parser().parse_args(["serve"])).host.token == rotated
    assert ring_options(parser().parse_args(["serve", "--token", "mine"])).host.token == "mine"
    assert ring_options(parser().parse_args(["ask", "hi"])).host.token is None


def test_give_up_after_takes_durations():
    for text, seconds in (("90", 90), ("90s", 90), ("5m", 300), ("1h", 3600), ("0", 0)):
        args = parser().parse_args(["join", "h:1", "--token", "t", "--give-up-after", text])
        assert join_options(args).give_up_after == seconds
    assert join_options(parser().parse_args(["join", "h:1", "--token", "t"])).give_up_after is None
    with pytest.raises(SystemExit):
        parser().parse_args(["join", "h:1", "--give-up-after", "soon"])
