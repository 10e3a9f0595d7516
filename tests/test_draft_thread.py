"""A static draft (what CUDA graphs need) computes every step on one thread of its own, whichever of trio's
worker threads asks: a CUDA graph is captured and replayed by one thread (pytorch#123177)."""
import threading

from peers.drafting import ModelDrafter
from peers.sampling import SamplingParams


def test_static_draft_steps_on_one_thread(tiny_llama):
    d = ModelDrafter(tiny_llama, 300, static=True, max_len=256)
    seen = set()
    d.model.register_forward_pre_hook(lambda *a: seen.add(threading.current_thread()))
    results = {}

    def ask(i):
        results[i] = d.propose([5, 17, 42, 99 + i], 4, SamplingParams())[0]

    for i in range(3):  # each from a thread of its own, as trio.to_thread would
        t = threading.Thread(target=ask, args=(i,))
        t.start()
        t.join()
    d.reset()
    assert len(seen) == 1 and next(iter(seen)).name.startswith("draft-graph"), seen
    eager = ModelDrafter(tiny_llama, 300)
    assert all(results[i] == eager.propose([5, 17, 42, 99 + i], 4, SamplingParams())[0] for i in range(3))
    d.close()  # its thread ends with it
    assert not next(iter(seen)).is_alive()
