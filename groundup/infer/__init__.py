"""Inference: the one generation engine, sampling, and the `generate` / `chat` commands.

    from groundup.infer import Generator
    gen = Generator.from_checkpoint("out/model")          # or a training run directory
    print(gen.generate(["To be, or not"], max_new_tokens=32, temperature=0)[0])

    requests.py        Request, TokenEvent, ErrorEvent, PromptEvent (in and out of the core) and Sequence (one choice)
    core.py            EngineCore: requests join and leave one running batch (admit, prefill, decode, sample,
                       preempt); the server drives it from its thread, Generator synchronously
    kv_blocks.py       the paged KV cache: BlockPool (blocks, reference counts, the prefix cache), KVPages, PagedView
    paged_decode.py    DecodeStep: one token per sequence over the pages, eager or torch.compile'd (one graph)
    engine.py          Generator: prompts or chats in, text out (batched, streamed) through the core
    prompts.py         PromptEncoder: the one prompt path (prefix, special-token spellings, chat format), serve's too
    speculative.py     speculative decoding: prompt lookup (n-gram) or a draft model proposes, the target verifies
    sampling.py        SamplingConfig and Sampler: greedy, temperature, top-k, top-p, min-p, repetition penalty
    structured.py      structured output: JSON schema, JSON object, regex, choice or grammar, masked by llguidance
    json_budget.py     JSON that closes before max_tokens: near the budget, a plan to close is followed when needed
    text_stream.py     TextStream: token ids to text as it becomes final (incremental UTF-8, stop strings)
    tool_loop.py       generate_with_tools: replies whose tool calls run, results appended, generation goes on
    chat.py            ChatSession (history trimmed to fit the context) and the terminal loop of `groundup chat`
    commands.py        `groundup generate` (with best-of-n by reward) and `groundup chat`
"""

from groundup.infer.engine import Completion, Generator
from groundup.infer.sampling import SamplingConfig
from groundup.infer.tool_loop import ToolRollout, generate_with_tools

__all__ = ["Completion", "Generator", "SamplingConfig", "ToolRollout", "generate_with_tools"]
