"""`--compile`: the torch.compile'd decode step decodes the tokens of the eager engine.

Compiling takes 20-90 s on a 2-core CPU (less with a warm inductor cache), hence its own file.
"""

from __future__ import annotations

import torch._dynamo.utils

from groundup.infer import Generator
from infer_helpers import small_tokenizer, tiny_model


def test_the_compiled_decode_step_gives_the_tokens_of_the_eager_one():
    tok = small_tokenizer()
    model = tiny_model()
    prompts = [[tok.eot_id] + tok.encode(t) for t in ("To be, or not to be", "Hello", "My lord, I will")]
    eager = Generator(model, tok).generate_ids(prompts, max_new_tokens=12, temperature=0, stop_ids=())
    torch._dynamo.utils.counters.clear()
    compiled = Generator(model, tok, compile=True)
    assert compiled.generate_ids(prompts, max_new_tokens=12, temperature=0, stop_ids=()) == eager
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    # A longer run needs a bigger pool and longer gathers: dynamic dimensions, so no recompile.
    longer = compiled.generate_ids(prompts, max_new_tokens=40, temperature=0, stop_ids=())
    assert [row[:12] for row in longer] == eager
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs == 1
