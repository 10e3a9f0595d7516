"""Any context crosses the ring: a prompt whose hidden states exceed a frame goes round in chunks, exactly."""
import torch
import trio
from transformers import AutoModelForCausalLM

from helpers import running_ring
from peers.wire import codec as wire
from tiny import make_model


def test_4800_token_prompt_at_7b_width_is_exact(tmp_path):
    # Qwen2.5-7B's width (hidden 3584, 28 heads, 4 KV heads), three layers, a narrow MLP to spare the CPU
    model = make_model(tmp_path / "wide-qwen2", "qwen2", layers=3, hidden=3584, num_attention_heads=28,
                       num_key_value_heads=4, intermediate_size=256, max_position_embeddings=8192)
    torch.manual_seed(0)
    prompt = torch.randint(3, 300, (4800,)).tolist()  # just past one frame's worth: 4,682 positions
    assert len(prompt) * 3584 * 4 > wire.MAX_FRAME  # one frame could not carry the prompt's hidden states
    new = 4

    async def through_ring() -> tuple[list[int], list[str]]:
        async with running_ring(model, 2, conversations=1) as (host, _):
            spans = [str(host.shard.span)] + [str(m.span) for m in host.ring]
            rs = host.new_session("long")
            tokens = list(prompt)
            for _ in range(new):
                logits, _ = await host.forward(rs, tokens, [])
                tokens.append(int(logits[-1].argmax()))
                rs.set_position(len(tokens) - 1, len(tokens))
            return tokens[len(prompt):], spans

    got, spans = trio.run(through_ring)
    assert spans == ["0-0", "1-1", "2-2"], spans  # three processes, a layer each
    ref = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    with torch.inference_mode():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False)[0, len(prompt):].tolist()
    assert got == want
