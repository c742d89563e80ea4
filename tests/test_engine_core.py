"""The engine core: the block pool's accounting, prefix caching (identical outputs, hits counted, stale blocks
never reused), a request's choices sharing its prompt, aborts and oversized prompts, and blocks always returned."""

from __future__ import annotations

import torch

from groundup.infer import Generator
from groundup.infer.core import EngineCore, ErrorEvent, Request
from groundup.infer.kv_blocks import BlockPool, block_hashes
from groundup.infer.sampling import SamplingConfig
from infer_helpers import small_tokenizer, tiny_model

GREEDY = SamplingConfig(max_new_tokens=12, temperature=0)


def test_the_pool_counts_references_and_keeps_freed_blocks_for_their_prefix():
    pool = BlockPool(num_blocks=5, block_size=4)
    keys = block_hashes(list(range(10)), 4)
    assert len(keys) == 2 and keys != block_hashes(list(range(10)), 4, extra=1)  # the adapter is in the key
    a = pool.allocate(3)
    assert a is not None and 0 not in a and pool.free_count == 1 and pool.allocate(2) is None
    for block, key in zip(a, keys):
        pool.register(block, key)
    pool.release(a)
    assert pool.used == 0
    hit = pool.cached_prefix(keys + [123])  # a third key nobody cached
    assert hit == a[:2] and (pool.hits, pool.queries) == (2, 3) and pool.used == 2
    shared = pool.share(hit)
    pool.release(hit)
    assert pool.used == 2  # still held by the sharer
    pool.release(shared)
    fresh = pool.allocate(4)  # takes every free block: the cached ones lose their keys
    assert fresh is not None and pool.cached_prefix(keys) == []


def _run(core: EngineCore, requests: list[Request]) -> list[list[int]]:
    """Each choice's tokens, in the order of the requests and their choices."""
    for r in requests:
        core.add(r)
    out: dict[tuple[int, int], list[int]] = {(r.id, i): [] for r in requests for i in range(r.n)}
    while core.has_work():
        for e in core.step():
            assert not isinstance(e, ErrorEvent), e.message
            if e.token is not None:
                out[(e.request.id, e.index)].append(e.token)
    return list(out.values())


def test_a_shared_prefix_is_prefilled_once_and_changes_no_output():
    tok, model = small_tokenizer(), tiny_model(max_seq_len=256)
    system = [tok.eot_id] + tok.encode("You are a helpful assistant who answers in verse. " * 3)
    prompts = [system + tok.encode(q) for q in ("What is the sea?", "Who was the king?", "Why")]
    cold = EngineCore(model, tok, max_batch=4, block_size=8, prefix_caching=False)
    ref = _run(cold, [Request(p, GREEDY) for p in prompts])
    core = EngineCore(model, tok, max_batch=4, block_size=8)
    first = _run(core, [Request(prompts[0], GREEDY)])
    rest = _run(core, [Request(p, GREEDY) for p in prompts[1:]])
    assert first + rest == ref
    full = len(system) // 8
    assert core.pool.hits >= 2 * full and cold.pool.hits == 0  # the later two took the system prompt's blocks
    assert core.pool.used == 0 and cold.pool.used == 0  # every block came back


def test_choices_share_the_prompt_and_decode_as_alone():
    tok, model = small_tokenizer(), tiny_model(max_seq_len=128)
    prompt = [tok.eot_id] + tok.encode("To be, or not to be, that is")
    sampled = SamplingConfig(max_new_tokens=10, temperature=1.0)
    core = EngineCore(model, tok, max_batch=4, block_size=4)
    together = _run(core, [Request(prompt, sampled, seeds=[7, 8, 9])])
    alone = [_run(EngineCore(model, tok, block_size=4), [Request(prompt, sampled, seeds=[s])]) for s in (7, 8, 9)]
    assert together == [a[0] for a in alone]
    assert core.pool.used == 0


def test_more_choices_than_a_batch_holds_run_in_parts_of_at_most_the_batch():
    """Seven choices through a batch of three: parts of 3, 3 and 1 with the request's id, never more than three
    rows running (forks counted at admission), each choice's tokens those it gets alone."""
    tok, model = small_tokenizer(), tiny_model(max_seq_len=128)
    prompt = [tok.eot_id] + tok.encode("To be, or not")
    sampled = SamplingConfig(max_new_tokens=4, temperature=1.0, stop=[])
    core = EngineCore(model, tok, max_batch=3, block_size=4)
    request = Request(prompt, sampled, seeds=list(range(7)), base_index=2, stop_ids=frozenset())
    core.add(request)
    out: dict[int, list[int]] = {}
    steps = 0
    while core.has_work():
        events = core.step()
        steps += 1
        assert len(core.running) <= 3 and {e.request.id for e in events} <= {request.id}
        for e in events:
            out.setdefault(e.index, []).append(e.token)
    assert sorted(out) == list(range(2, 9)) and steps == 3 * 4  # three parts, four tokens each, one per step
    alone = [_run(EngineCore(model, tok, block_size=4), [Request(prompt, sampled, seeds=[s], stop_ids=frozenset())])
             for s in range(7)]
    assert [out[i + 2] for i in range(7)] == [a[0] for a in alone]
    assert core.pool.used == 0
    core.add(Request(prompt, sampled, seeds=list(range(7))))
    core.step()
    core.abort(next(w for w in core.waiting))  # aborting one part aborts the request's other parts too
    core.step()
    assert not core.has_work() and core.pool.used == 0


def test_a_request_decoded_in_a_finished_ones_blocks_sees_its_own_keys():
    """The decode step keeps the K/V it gathered while the block tables stay equal; a later request
    prefilled into the same freed block under the same table must not decode from the stale copy (the
    server's first request after its warm-up once did)."""
    tok, model = small_tokenizer(), tiny_model(max_seq_len=128, init_std=0.2)
    prompt = tok.encode("the the the the the the the")
    greedy = SamplingConfig(max_new_tokens=12, temperature=0)
    alone = _run(EngineCore(model, tok), [Request(prompt, greedy, stop_ids=frozenset())])
    for caching in (True, False):
        core = EngineCore(model, tok, prefix_caching=caching)
        _run(core, [Request([core.filler] * 2, greedy, stop_ids=frozenset())])
        if caching:
            core.clear_prefix_cache()  # a fresh pool hands out the same block again
        assert _run(core, [Request(prompt, greedy, stop_ids=frozenset())]) == alone


def test_an_aborted_request_frees_its_blocks_at_the_next_step_and_an_oversized_one_fails_alone():
    tok, model = small_tokenizer(), tiny_model(max_seq_len=128)
    core = EngineCore(model, tok, max_batch=2, kv_blocks=9, block_size=4)  # 8 usable blocks: 32 tokens
    long = Request([tok.eot_id] * 40, GREEDY)
    ok = Request([tok.eot_id] + tok.encode("Hello"), SamplingConfig(max_new_tokens=200, temperature=0),
                 stop_ids=frozenset())
    core.add(long)
    core.add(ok)
    events = core.step()
    assert [e.message for e in events if isinstance(e, ErrorEvent)] == [
        "the prompt needs 10 KV blocks of 4 tokens; the pool has 8"]
    assert core.pool.used > 0
    core.abort(ok)
    core.step()
    assert core.pool.used == 0 and not core.has_work()


def test_a_prompt_that_fills_the_context_fails_alone():
    tok, model = small_tokenizer(), tiny_model(max_seq_len=32)
    core = EngineCore(model, tok, max_batch=2)
    ok = Request([tok.eot_id] + tok.encode("Hello"), GREEDY)
    core.add(Request([tok.eot_id] * 32, GREEDY))
    core.add(ok)
    errors = [e.message for e in core.step() if isinstance(e, ErrorEvent)]
    assert errors == ["the prompt has 32 tokens; the model's context is 32, which leaves none to generate"]
    while core.has_work():
        core.step()
    assert core.pool.used == 0


def test_a_generator_forgets_its_cache_when_the_weights_change():
    tok, model = small_tokenizer(), tiny_model(max_seq_len=128)
    gen = Generator(model, tok, block_size=4)
    prompt = "To be, or not to be, that is the question"
    before = gen.generate([prompt], max_new_tokens=8, temperature=0)
    again = gen.generate([prompt], max_new_tokens=8, temperature=0)
    assert again == before and gen.core.pool.hits > 0
    with torch.no_grad():  # a training step
        for p in model.parameters():
            p.mul_(1.5)
    hits = gen.core.pool.hits
    after = gen.generate([prompt], max_new_tokens=8, temperature=0)
    assert gen.core.pool.hits == 0 <= hits  # a fresh cache: nothing computed by the old weights is read
    assert after == Generator(model, tok).generate([prompt], max_new_tokens=8, temperature=0)
