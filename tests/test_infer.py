"""The generation engine: cached greedy equals full-forward argmax, sampling, stops, streaming, context."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import VARIANTS
from groundup.errors import CheckpointError, ConfigError, DataError
from groundup.infer import Generator, SamplingConfig
from groundup.infer.sampling import Sampler, filtered_probs
from groundup.infer.text_stream import TextStream
from groundup.layout import CHECKPOINT_FORMAT, file_digest
from infer_helpers import VOCAB, model_dir, small_tokenizer, tiny_model


@pytest.fixture(scope="module")
def tok():
    return small_tokenizer()


@pytest.fixture(scope="module")
def gen(tok):
    return Generator(tiny_model(), tok)


def _prompts(tok) -> list[list[int]]:
    texts = ["To be, or not to be, that is the question", "Hello", "My lord, I will"]
    return [[tok.eot_id] + tok.encode(t) for t in texts]


def _greedy_by_full_forward(model, prompt: list[int], n: int) -> list[int]:
    """The definition: argmax of a full forward over the whole sequence, one token at a time."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1, :VOCAB].argmax()))
    return seq[len(prompt):]


@pytest.mark.parametrize("variant", ["gqa", "mla", "moe"])
def test_cached_batched_greedy_equals_argmax_of_full_forward(tok, variant):
    model = tiny_model(**VARIANTS[variant])
    prompts = _prompts(tok)
    assert len({len(p) for p in prompts}) == 3  # left padding is exercised
    gen = Generator(model, tok)
    out = gen.generate_ids(prompts, max_new_tokens=24, temperature=0, stop_ids=())
    for prompt, got in zip(prompts, out):
        assert got == _greedy_by_full_forward(model, prompt, 24)
    # Blocks of 4 tokens in a pool too small for all three rows at once: rows cross block boundaries
    # mid-prompt, the newest is preempted and prefilled again; the tokens do not change.
    small = Generator(model, tok, block_size=4)
    small.core.ensure_blocks = lambda blocks: small.core._make_pool(18)  # 17 blocks: 68 token slots
    assert small.generate_ids(prompts, max_new_tokens=24, temperature=0, stop_ids=()) == out
    assert small.core.steps > 24  # a preempted row took extra steps


def test_a_prompt_completes_the_same_alone_and_in_a_batch(gen):
    batch = gen.generate(["Hello", "To be, or not to be", "A"], max_new_tokens=16, temperature=0)
    assert gen.generate(["To be, or not to be"], max_new_tokens=16, temperature=0) == [batch[1]]


def test_sampling_is_reproducible_for_a_seed_and_varies_across_seeds(gen):
    kwargs = dict(max_new_tokens=24, temperature=1.0, top_p=0.95)
    a = gen.generate(["To be"] * 2, seed=1, **kwargs)
    assert a == gen.generate(["To be"] * 2, seed=1, **kwargs)
    assert a != gen.generate(["To be"] * 2, seed=2, **kwargs)
    assert a[0] != a[1]  # rows draw different samples


def test_filters_that_keep_one_token_reduce_sampling_to_greedy(gen):
    greedy = gen.generate(["My lord"], max_new_tokens=12, temperature=0)
    for option in ({"top_k": 1}, {"top_p": 1e-6}, {"min_p": 0.999999}):
        assert gen.generate(["My lord"], max_new_tokens=12, temperature=1.5, seed=3, **option) == greedy, option


def test_filters_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    keep = lambda **kw: (filtered_probs(logits, SamplingConfig.make(temperature=1.0, **kw)) > 0)[0].tolist()
    assert keep(top_k=2) == [True, True, False, False]
    assert keep(top_p=0.7) == [True, True, False, False]  # 0.5 < 0.7, 0.75 reaches it
    assert keep(top_p=0.75) == [True, True, False, False]
    assert keep(top_p=0.76) == [True, True, True, False]
    assert keep(min_p=0.3) == [True, True, True, False]  # 0.1 < 0.3 * 0.5
    hot = filtered_probs(logits, SamplingConfig.make(temperature=2.0))
    assert torch.allclose(hot, torch.softmax(logits / 2, -1))


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    cfg = SamplingConfig.make(temperature=0, repetition_penalty=2.0)
    sampler = Sampler(cfg, [[0, 1]], vocab_size=4, device=torch.device("cpu"))
    # Seen tokens 0 (3.0 -> 1.5) and 1 (-1.0 -> -2.0) lose to the unseen token 2 (2.0).
    assert sampler(torch.tensor([[3.0, -1.0, 2.0, 0.0]])).tolist() == [2]
    assert sampler.seen[0].tolist() == [True, True, True, False]  # the choice is remembered
    assert sampler(torch.tensor([[3.0, -1.0, 2.0, 1.6]])).tolist() == [3]  # 3.0 -> 1.5 and 2.0 -> 1.0 < 1.6


def test_the_model_never_samples_token_ids_the_tokenizer_lacks(tok):
    model = tiny_model(vocab_size=VOCAB + 64)  # an embedding padded past the vocabulary
    with torch.no_grad():
        model.embed.weight[VOCAB:] = 0
        model.embed.weight[VOCAB:, 0] = 100.0  # tied: padding ids would dominate every logit
    out = Generator(model, tok).generate_ids(_prompts(tok), max_new_tokens=8, temperature=0, stop_ids=())
    assert max(max(row) for row in out) < VOCAB


def test_stop_tokens_and_stop_strings_end_a_row_and_are_not_shown(gen, tok):
    full = gen.complete(["To be, or not"], max_new_tokens=24, temperature=0)[0]
    assert full.finish_reason == "length" and len(full.token_ids) == 24
    stop_token = full.token_ids[5]
    gen.stop_ids.add(stop_token)
    try:
        stopped = gen.complete(["To be, or not"], max_new_tokens=24, temperature=0)[0]
    finally:
        gen.stop_ids.discard(stop_token)
    first = full.token_ids.index(stop_token)
    assert stopped.finish_reason == "stop" and stopped.token_ids == full.token_ids[: first + 1]
    assert stopped.text == tok.decode(full.token_ids[:first])
    stop_string = full.text[len(full.text) // 2 :][:3]
    cut = gen.complete(["To be, or not"], max_new_tokens=24, temperature=0, stop=[stop_string])[0]
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.index(stop_string)]


def test_streamed_pieces_concatenate_to_the_generated_text(gen):
    for options in ({"temperature": 0}, {"temperature": 1.0, "seed": 5}, {"temperature": 0, "stop": ["e t"]}):
        pieces = list(gen.stream("To be, or not", max_new_tokens=32, **options))
        assert "".join(pieces) == gen.generate(["To be, or not"], max_new_tokens=32, **options)[0]
    steps = list(gen.stream_batch(["A", "To be"], max_new_tokens=8, temperature=0))
    assert ["".join(s[i] for s in steps) for i in range(2)] == gen.generate(["A", "To be"], max_new_tokens=8,
                                                                             temperature=0)


def test_text_stream_holds_back_partial_characters_and_possible_stop_strings(tok):
    ids = tok.encode_bytes("é".encode())  # two byte tokens at this vocabulary size, or one
    stream = TextStream(tok, stop_strings=["END"])
    pieces = [stream.push(i) for i in tok.encode("ab") + ids + tok.encode(" xEN")]
    assert "\ufffd" not in "".join(pieces) and "".join(pieces) == "abé x"  # "EN" may begin "END"
    assert stream.push(tok.encode("D")[0]) == "" and stream.done and stream.text == "abé xEN"[:5]
    broken = TextStream(tok)
    assert broken.push(0xC3) == "" and broken.finish() == "\ufffd"  # a cut character, once final


def test_a_prompt_longer_than_the_context_is_refused_or_left_truncated(tok):
    gen = Generator(tiny_model(max_seq_len=32), tok)
    long_prompt = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer"
    with pytest.raises(DataError, match="prompt 0 is .* tokens but the model's context is 32.*truncat"):
        gen.generate([long_prompt], max_new_tokens=4)
    c = gen.complete([long_prompt], max_new_tokens=4, temperature=0, overflow="truncate")[0]
    assert c.prompt_tokens == 28 and len(c.token_ids) == 4
    ids = gen.encode_prompts([long_prompt], SamplingConfig.make(max_new_tokens=4, overflow="truncate"))[0]
    assert ids == ([tok.eot_id] + tok.encode(long_prompt))[-28:]  # the end of the prompt is kept
    short = gen.complete(["To be"], max_new_tokens=100, temperature=0)[0]  # capped by the room left
    assert short.finish_reason == "length" and short.prompt_tokens + len(short.token_ids) == 32


@pytest.mark.parametrize("option, message", [
    ({"temperature": -0.5}, "temperature = -0.5: expected a number >= 0"),
    ({"top_p": 0.0}, r"top_p = 0.0: expected a number in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p = 1.5: expected a number in \(0, 1\]"),
    ({"top_k": -1}, "top_k = -1"),
    ({"min_p": 1.0}, "min_p = 1.0"),
    ({"repetition_penalty": 0}, "repetition_penalty = 0"),
    ({"max_new_tokens": 0}, "max_new_tokens = 0"),
    ({"overflow": "wrap"}, "overflow = 'wrap'"),
    ({"temprature": 1.0}, "unknown sampling option 'temprature' .did you mean 'temperature'"),
])
def test_invalid_sampling_values_are_named(gen, option, message):
    with pytest.raises(ConfigError, match=message):
        gen.generate(["Hi"], **option)


def test_loads_a_model_directory_and_a_training_run(tmp_path, tok):
    model = tiny_model(seed=3)
    ref = Generator(model, tok).generate(["To be"], max_new_tokens=10, temperature=0)
    model_dir(tmp_path / "model", model, tok)
    assert Generator.from_checkpoint(tmp_path / "model").generate(["To be"], max_new_tokens=10, temperature=0) == ref
    run = tmp_path / "run"
    step = run / "checkpoints" / "step_0000100"
    model_dir(step, model, tok)
    (step / "tokenizer").rename(run / "tokenizer")  # a run keeps one tokenizer for all its checkpoints
    (run / "checkpoints" / "latest").write_text("step_0000100\n")
    # A checkpoint's meta.json vouches for its files (every reader checks): write it as the trainer does.
    files = {f.name: file_digest(f) for f in step.iterdir() if f.is_file()}
    meta = {"format": CHECKPOINT_FORMAT, "files": files}
    (step / "meta.json").write_text(json.dumps({**meta, "tokenizer_hash": tok.hash}))
    assert Generator.from_checkpoint(run).generate(["To be"], max_new_tokens=10, temperature=0) == ref
    (step / "meta.json").write_text(json.dumps({**meta, "tokenizer_hash": "0123456789abcdef"}))
    with pytest.raises(CheckpointError, match="differs from 0123456789abcdef"):
        Generator.from_checkpoint(run)


def test_missing_and_mismatched_checkpoints_and_tokenizers_are_refused(tmp_path, tok):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        Generator.from_checkpoint(tmp_path / "nope")
    model_dir(tmp_path / "m")
    with pytest.raises(DataError, match="tokenizer not found"):
        Generator.from_checkpoint(tmp_path / "m", tokenizer=tmp_path)
    (tmp_path / "m" / "tokenizer" / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="no tokenizer found beside the checkpoint"):
        Generator.from_checkpoint(tmp_path / "m")
    model_dir(tmp_path / "small", tiny_model(vocab_size=300))
    with pytest.raises(CheckpointError, match="512 tokens but .* embeds only 300"):
        Generator.from_checkpoint(tmp_path / "small")
    with pytest.raises(ConfigError, match="dtype = 'int3'"):
        Generator.from_checkpoint(tmp_path / "m", dtype="int3")


def test_bf16_weights_generate(tok):
    gen = Generator(tiny_model().to(torch.bfloat16), tok)
    ids = [[tok.eot_id] + tok.encode(p) for p in ("To be", "Hi")]
    assert [len(x) for x in gen.generate_ids(ids, max_new_tokens=6, temperature=1.0, top_k=20, seed=0, stop_ids=())] \
        == [6, 6]
