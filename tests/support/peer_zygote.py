"""A process that imports what `sfchat join` imports, once, then forks a peer process per request: each child runs
`sfchat join`'s own main on its own sockets, without the ~4 s of CPU that importing torch and transformers costs
every fresh interpreter (tests/support/forked_peers.py). It never runs a torch op. A fork copies only the thread that
forks, so before each one `fork_safe` asserts that no thread was started since the imports (counted in
/proc/self/task, native threads included: importing torch may start one idle thread, which no child has) and
that CUDA was never initialised. Environment read at import time (HF_*, TRANSFORMERS_*, OMP_* ...: see
tests/support/forked_peers.py IMPORT_TIME_ENV) keeps the zygote's values in a child, so a request that changes one starts a
fresh interpreter instead.

Requests on stdin, one JSON line each, a JSON line back on stdout:
  {"start": argv, "env": {...}, "cwd": dir, "log": path} -> {"pid": pid}
  {"poll": pid} -> {"code": the Popen-style exit status, or null while it runs}"""
import json
import os
import signal
import sys
import threading
import traceback

import sfchat.cli  # noqa: F401 - what every child needs, imported once here
import sfchat.join  # noqa: F401
import sfchat.local
import peers.member.peer  # noqa: F401

codes: dict[int, int] = {}
TASKS = set(os.listdir("/proc/self/task"))  # this process's threads once the imports are done


def fork_safe() -> None:
    """Raise unless forking now gives a child whose every lock is free: no thread (Python's or native) was
    started since the imports, and CUDA, whose driver state a fork cannot copy, was never initialised."""
    new = set(os.listdir("/proc/self/task")) - TASKS  # (one started by the imports may have ended since)
    assert not new, f"the zygote started threads since its imports ({len(new)})"
    assert threading.active_count() == 1, "a fork copies only the thread that forks"
    torch = sys.modules.get("torch")
    assert torch is None or not torch.cuda.is_initialized(), "CUDA was initialised in the zygote"


def reap(*_) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        codes[pid] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def run_child(req: dict) -> None:
    """In the forked child: become `sfchat join ...` as LocalPeers would have started it; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.chdir(req["cwd"])
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = ["sfchat", *req["start"]]
        code = sfchat.cli.main(req["start"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - said in the log, as an interpreter would
        traceback.print_exc()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code or 0)


def main() -> None:
    fork_safe()
    signal.signal(signal.SIGCHLD, reap)
    sfchat.local.die_with_parent()  # it goes with the test process, and its children with it
    for line in sys.stdin:
        req = json.loads(line)
        if "start" in req:
            fork_safe()
            pid = os.fork()
            if pid == 0:
                run_child(req)
            reply = {"pid": pid}
        else:
            reap()
            reply = {"code": codes.get(req["poll"])}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
