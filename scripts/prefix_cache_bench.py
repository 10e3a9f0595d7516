"""Time to first token with and without warm rows (the prefix cache across requests), through the real `openai`
client against `sfchat serve --local-peers 2` in the defaults, at each emulated round trip.

Two patterns, each run with the cache and without (`cache_prompt: false`), the two alternating request by request
on the same server, so a busy machine slows both alike:
- a 12-turn chat: a ~300-word system prompt, ~60-word user turns, max_tokens 32, temperature 0, the whole history
  resent every turn (each chat keeps its own answers); after it, the 12th request again with `cache_prompt: false`,
  whose answer must equal the cached one;
- the agent pattern: one ~1,500-token system prompt and 5 different short questions, each a fresh request (a
  system prompt no row holds yet: the first question pays for it).
The round trip is a shaping relay that delays each of the ring's links by rtt / (peers + 1), as `sfchat bench`.

    .venv/bin/python scripts/prefix_cache_bench.py --rtt-ms 0,86 --json prefix_cache.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parent.parent
SFCHAT = [sys.executable, "-m", "sfchat"]

SYSTEM = (
    "You are the front-desk assistant of Harbor Lane Library, a public library in a small coastal town. You answer "
    "questions from visitors about borrowing books, using the reading rooms, booking the meeting room, printing and "
    "scanning, the children's programmes, the local history archive and the library's opening hours. Be friendly, "
    "brief and precise. The library opens from nine in the morning to seven in the evening on weekdays, from ten to "
    "four on Saturdays, and it is closed on Sundays and public holidays. Members may borrow up to twelve items at "
    "once: books for three weeks, films and games for one week, and magazines for one week. Items can be renewed "
    "twice online or at the desk unless another member has reserved them. Late returns cost twenty cents a day for "
    "adults and nothing for children. A library card is free for anyone who lives, works or studies in the county; "
    "visitors from elsewhere pay ten dollars a year. The meeting room holds twenty people, has a projector and can "
    "be booked up to a month ahead for two hours at a time, free for community groups and fifteen dollars an hour "
    "for businesses. Printing costs ten cents a page in black and white and fifty cents in colour; scanning to email "
    "is free. Story time for children under five is on Tuesday and Thursday mornings at half past ten, and the "
    "homework club meets on weekday afternoons from half past three. The local history archive is on the second "
    "floor and opens by appointment on Wednesdays and Fridays; its maps and newspapers cannot leave the building. "
    "Wireless internet is free and needs no password. Never invent rules that are not stated here; if you do not "
    "know an answer, say so and suggest the visitor ask a librarian at the desk.")
TURNS = [
    "Hello! I just moved to town last week and I would like to get a library card for myself and my two children. "
    "What do I need to bring with me, is there any fee for us, and can the children have cards of their own even "
    "though the youngest is only four years old? Also, how many books can each of us take home at once?",
    "Thanks. My daughter loves picture books and I read that there is a story time for small children. Which days "
    "and times is it held, does she need to be registered in advance, and may I stay in the room with her while "
    "the librarian reads, or is it a programme where the parents wait outside in the main hall?",
    "My son is eleven and often needs help with his homework in the afternoons. Is there some kind of homework club "
    "or quiet study space he could use after school, and on which days does it meet? Would he need a separate "
    "permission form from me, and can he use the library computers there for his school projects?",
    "I work from home and sometimes need to print documents. How much does printing cost per page in black and "
    "white and in colour, can I send files from my phone or laptop, and is scanning possible too? I also wonder "
    "whether the wireless internet needs a password and whether it is fast enough for video calls.",
    "I run a small book club of about fifteen people and we are looking for a place to meet once a month in the "
    "evening. Could we book your meeting room, how far in advance, and is there any charge for a community group "
    "like ours? We would also like to use a projector now and then to show author interviews.",
    "A friend of mine who runs a small design business also asked whether she could rent the meeting room for a "
    "workshop with clients. Would the price be different for her, how long can a booking last, and could she book "
    "two sessions in a row on the same day if her workshop runs for most of the afternoon?",
    "I am interested in the history of the town, especially the old harbour and the fishing families who lived "
    "here a hundred years ago. Do you keep old maps, photographs or newspapers from that time, where are they kept, "
    "and can I borrow some of them to study at home over a weekend, or must they stay in the building?",
    "When is the local history archive open, and do I need to make an appointment before I come? If I need one, "
    "how do I book it, and is there someone who can help me find records about a particular family, for example "
    "my great grandmother, who I believe worked at the cannery near the harbour around nineteen twenty?",
    "I borrowed three novels and a film two weeks ago. The film is now a few days late, I am afraid. How much will "
    "I have to pay for it, and can I still renew the novels online tonight? One of them might have been reserved by "
    "someone else, so what happens in that case, and how would I find out before I go to the desk?",
    "My sister is visiting from another state for the summer and would like to borrow books while she is here. "
    "Can she get a card even though she does not live or work in the county? If so, how much would it cost her, "
    "how long would it last, and could she return the books by post once she has gone back home?",
    "We are planning to come in on Sunday afternoon as a family, since that is the only day we are all free. "
    "Will the library be open then, and if not, what are the hours on Saturday? Is there anywhere in the building "
    "where the children can play board games or read aloud without disturbing other visitors too much?",
    "Thank you so much for all your help today. One last question before I go: is there a way to suggest that the "
    "library buy a particular book that you do not have yet, and how long does it usually take before a new book "
    "arrives on the shelves? I will pass by the desk tomorrow morning to pick up our new cards.",
]
TOOLS = ["search_catalogue", "place_hold", "renew_loan", "book_room", "list_events", "pay_fine", "archive_request"]
QUESTIONS = ["Is the novel Middlemarch on the shelf right now?", "Can I renew my loans before Friday?",
             "Book the meeting room for Tuesday at six.", "What events are on for children this week?",
             "How do I pay a late fee online?"]


def agent_system(marker: str) -> str:
    """~1,500 tokens (SmolLM2's tokenizer): an agent's instructions and its tools, each described at length (marker:
    a first line no row holds yet)."""
    tools = "\n\n".join(
        f"Tool {i + 1}: {name}. Call {name} when the visitor's request concerns {name.replace('_', ' ')}. Its "
        f"arguments are a JSON object with the fields 'query' (a string in the visitor's own words), 'member_id' (a "
        f"string of eight digits, optional), 'date' (an ISO date, optional) and 'notes' (free text for the "
        f"librarian). It returns a JSON object with a 'status' of ok, not_found or refused and a 'detail' that you "
        f"must summarise in one or two sentences. Never call {name} twice for the same request, never guess a "
        f"member's identifier, and when the result is refused explain why in plain words and suggest what the "
        f"visitor can do next." for i, name in enumerate(TOOLS))
    return f"{marker}\n{SYSTEM}\n\nYou can call these tools:\n\n{tools}\n\nAnswer in at most three sentences."


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


class Serve:
    """`sfchat serve --local-peers N` (behind a shaping relay for a round trip)."""

    def __init__(self, peers: int, rtt_ms: float, extra: list[str], log: Path):
        self.procs = []
        args = []
        if rtt_ms > 0:
            relay = subprocess.Popen(SFCHAT + ["relay", "--listen", "127.0.0.1:0", "--delay-ms",
                                               f"{rtt_ms / (peers + 1):.4f}"], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
            self.procs.append(relay)
            args = ["--relay", relay.stdout.readline().split()[3]]
        self.log = log
        out = open(log, "w")
        self.procs.append(subprocess.Popen(SFCHAT + ["serve", "--local-peers", str(peers), "--http-listen",
                                                     "127.0.0.1:0", "--ring-listen", "127.0.0.1:0", *args, *extra],
                                           stdout=out, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 300
        while not (m := re.search(r"serving \S+ at (http://\S+)/v1", log.read_text())):
            if time.monotonic() > deadline or self.procs[-1].poll() is not None:
                self.close()
                raise SystemExit(f"the server did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.5)
        self.url = m.group(1)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=600)
        self.model = self.client.models.list().data[0].id

    def ask(self, messages: list[dict], cache: bool, max_tokens: int = 32) -> dict:
        t0, first, text, usage, stats = time.perf_counter(), None, [], None, {}
        for ch in self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"cache_prompt": cache}):
            if ch.choices and ch.choices[0].delta.content:
                first = first or time.perf_counter() - t0
                text.append(ch.choices[0].delta.content)
            if ch.usage is not None:
                usage = ch.usage
            stats = (ch.model_extra or {}).get("sfchat") or stats  # (the last chunk's: the answer's rounds)
        epoch = self.client.get("/../health", cast_to=object)["epoch"]  # a re-plan leaves no warm row trusted
        return {"ttft_ms": round((first or time.perf_counter() - t0) * 1e3, 1), "text": "".join(text),
                "prompt_tokens": usage.prompt_tokens, "cached_tokens": usage.prompt_tokens_details.cached_tokens,
                "tokens_per_round": stats.get("tokens_per_round"), "epoch": epoch}

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # (a background shell leaves its jobs deaf to SIGINT)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()


def chat(s: Serve, turns: int) -> dict:
    """The 12-turn chat, with and without the cache, request by request in turn."""
    history = {True: [{"role": "system", "content": SYSTEM}], False: [{"role": "system", "content": SYSTEM}]}
    rows = {True: [], False: []}
    for q in TURNS[:turns]:
        for cache in (True, False):
            history[cache].append({"role": "user", "content": q})
            r = s.ask(history[cache], cache)
            rows[cache].append(r)
            history[cache].append({"role": "assistant", "content": r["text"]})
    again = s.ask(history[True][:-1], False)  # the 12th request once more, from scratch
    return {"with": rows[True], "without": rows[False],
            "twelfth_from_scratch_equal": again["text"] == rows[True][-1]["text"],
            "first_turn_answered_differently": next((i + 1 for i, (a, b) in enumerate(zip(rows[True], rows[False]))
                                                     if a["text"] != b["text"]), None)}


def agent(s: Serve, marker: str) -> dict:
    rows = {True: [], False: []}
    system = {c: agent_system(f"{marker} ({'with' if c else 'without'} the cache)") for c in (True, False)}
    for q in QUESTIONS:
        for cache in (True, False):
            rows[cache].append(s.ask([{"role": "system", "content": system[cache]}, {"role": "user", "content": q}],
                                     cache))
    return {"with": rows[True], "without": rows[False]}


def summary(rtt: float, c: dict, agents: list[dict]) -> dict:
    out = {"rtt_ms": rtt}
    for key in ("with", "without"):
        t = [r["ttft_ms"] for r in c[key]]
        out[f"chat_{key}"] = {"turns_2_4_ms": median(t[1:4]), "turns_10_12_ms": median(t[9:12]),
                              "ratio": round(median(t[9:12]) / median(t[1:4]), 2)}
        q1 = median([a[key][0]["ttft_ms"] for a in agents])
        rest = median([r["ttft_ms"] for a in agents for r in a[key][1:]])
        out[f"agent_{key}"] = {"q1_ms": q1, "q2_5_ms": rest, "ratio": round(rest / q1, 2)}
    out["chat_cached_share_min_from_turn_2"] = round(min(r["cached_tokens"] / r["prompt_tokens"]
                                                         for r in c["with"][1:]), 3)
    out["twelfth_from_scratch_equal"] = c["twelfth_from_scratch_equal"]
    out["first_turn_answered_differently"] = c["first_turn_answered_differently"]
    out["agent_prompt_tokens"] = agents[0]["with"][0]["prompt_tokens"]
    for key in ("with", "without"):  # the draft's state comes back with a row: its rounds as long as from scratch
        out[f"chat_tokens_per_round_{key}"] = median([r["tokens_per_round"] for r in c[key][1:]
                                                      if r["tokens_per_round"]])
    epochs = [r["epoch"] for r in c["with"] + [q for a in agents for q in a["with"]]]
    out["replans_during_run"] = epochs[-1] - epochs[0]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rtt-ms", default="0,86", help="round trips to emulate, comma-separated")
    ap.add_argument("--local-peers", type=int, default=2)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--agent-runs", type=int, default=2, help="agent patterns per round trip (medians over them)")
    ap.add_argument("--serve-args", default="", help="more flags for sfchat serve (e.g. '--dtype float32')")
    ap.add_argument("--json", type=Path, help="write every request's figures here")
    args = ap.parse_args()
    report = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "date": time.strftime("%Y-%m-%d"), "load_before": os.getloadavg(), "rtts": []}
    for rtt in [float(x) for x in args.rtt_ms.split(",")]:
        s = Serve(args.local_peers, rtt, args.serve_args.split(), Path(f"/tmp/prefix_cache_serve_{rtt:g}.log"))
        try:
            s.ask([{"role": "user", "content": "Hello"}], False, 4)  # warm-up
            c = chat(s, args.turns)
            agents = [agent(s, f"Agent run {i + 1} at {rtt:g} ms.") for i in range(args.agent_runs)]
        finally:
            s.close()
        row = summary(rtt, c, agents)
        report["rtts"].append({"summary": row, "chat": c, "agents": agents})
        print(f"\n== {rtt:g} ms round trip ==")
        print("turn  prompt  cached  TTFT with  TTFT without")
        for i, (a, b) in enumerate(zip(c["with"], c["without"])):
            print(f"{i + 1:4d}  {a['prompt_tokens']:6d}  {a['cached_tokens']:6d}  {a['ttft_ms']:7.0f} ms  "
                  f"{b['ttft_ms']:8.0f} ms")
        print(json.dumps(row, indent=1))
    report["load_after"] = os.getloadavg()
    print(f"load average before {report['load_before']}, after {report['load_after']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
