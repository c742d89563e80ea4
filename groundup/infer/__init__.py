"""Inference: the generation engine, sampling, and the `generate` / `chat` commands.

    from groundup.infer import Generator
    gen = Generator.from_checkpoint("out/model")          # or a training run directory
    print(gen.generate(["To be, or not"], max_new_tokens=32, temperature=0)[0])

    engine.py          Generator: prompts or chats in, text out (batched lockstep decode over a KV cache, streamed)
    sampling.py        SamplingConfig and Sampler: greedy, temperature, top-k, top-p, min-p, repetition penalty
    text_stream.py     TextStream: token ids to text as it becomes final (incremental UTF-8, stop strings)
    static_decode.py   StaticDecoder: the engine's `compile=True` decode step, torch.compile'd over preallocated buffers
    chat.py            ChatSession (history trimmed to fit the context) and the terminal loop of `groundup chat`
    commands.py        `groundup generate` (with best-of-n by reward) and `groundup chat`
"""

from groundup.infer.engine import Completion, Generator
from groundup.infer.sampling import SamplingConfig

__all__ = ["Completion", "Generator", "SamplingConfig"]
