"""The Hugging Face tokenizer backend: the same ids, chat renderings and special tokens as transformers,
one interface with groundup's backend, and a clear DataError for every malformed file.

The tokenizers are built here with the `tokenizers` library in the shapes real models ship: byte-level
BPE with a split regex (Llama 3, Qwen/ChatML) and SentencePiece-style BPE with byte fallback and the
`▁` metaspace (Llama 2, Gemma), each with its special tokens and chat template."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from groundup.errors import DataError
from groundup.tokenizer import Tokenizer, load_tokenizer
from groundup.tokenizer.hf_tokenizer import HFTokenizer
from tokenizer_helpers import byte_level_tokenizer, corpus_text

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[bench]')")

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
CHATML_TEMPLATE = (
    "{%- for message in messages %}{%- if loop.first and message['role'] != 'system' %}{{- '<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n' }}{%- endif %}{{- '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\n' }}{%- endif %}")
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
# The specials each style declares (in id order after the learned vocabulary, or, for SentencePiece, first).
STYLES = {
    "llama3": dict(specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                             "<|eot_id|>"], bos="<|begin_of_text|>", eos="<|end_of_text|>", end_of_turn="<|eot_id|>",
                   template=LLAMA3_TEMPLATE, generation_eos=["<|end_of_text|>", "<|eot_id|>"]),
    "chatml": dict(specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], bos=None, eos="<|im_end|>",
                   pad="<|endoftext|>", end_of_turn="<|im_end|>", template=CHATML_TEMPLATE),
    "llama2": dict(specials=["<unk>", "<s>", "</s>"], bos="<s>", eos="</s>", unk="<unk>", end_of_turn=None,
                   template=None),
    "gemma": dict(specials=["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"], bos="<bos>",
                  eos="<eos>", pad="<pad>", unk="<unk>", end_of_turn="<end_of_turn>", template=GEMMA_TEMPLATE),
}
TEXTS = ["KING HENRY. Now, lords, for France!", "  Naïve café, déjà vu; Ærøskøbing", "日本語のテキストと中文", "emoji 👋🏽 🇫🇷 ❤️",
         "digits 1234567 3.14159 2024-01-01", "def f(x):\n    return x ** 2\n\n\tif y:  pass\n",
         "spelled <|im_end|> <s> </s> <|eot_id|> <end_of_turn> <|endoftext|> <bos>", " leading space", ""]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "It is 5."}, {"role": "user", "content": "And 2+4?"},
        {"role": "assistant", "content": "6, my lord."}]


def spm_vocab(vocab_size: int = 600) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of a SentencePiece-style vocabulary: <unk>, <s>, </s>, the 256 byte
    tokens, then pieces learned on `▁`-joined text, scored best merge first (as Llama 2's)."""
    from tokenizers import Tokenizer as RustTokenizer, models, pre_tokenizers, trainers

    tk = RustTokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    tk.train_from_iterator(corpus_text(), trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False))
    pieces = [p for p, _ in sorted(tk.get_vocab().items(), key=lambda kv: kv[1])]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    return tokens, scores, types


def spm_tokenizer(specials: list[str], prefix_space: bool = True):
    """A SentencePiece-style BPE (byte fallback, metaspace) with `specials` first, like Llama 2 and Gemma."""
    from tokenizers import AddedToken, Tokenizer as RustTokenizer, decoders, models, normalizers, pre_tokenizers

    from groundup.interop.gguf_tokenizer import merges_from_scores

    tokens, scores, _ = spm_vocab()
    tokens = specials + tokens[3:]
    scores = [0.0] * len(specials) + scores[3:]
    vocab = {t: i for i, t in enumerate(tokens)}
    tk = RustTokenizer(models.BPE(vocab=vocab, merges=merges_from_scores(vocab, dict(zip(tokens, scores))),
                                  byte_fallback=True, fuse_unk=True, unk_token="<unk>"))
    if prefix_space:  # Llama 2
        tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    else:  # Gemma: spaces become ▁ in a normalizer, and nothing is prepended
        tk.normalizer = normalizers.Replace(" ", "\u2581")
        steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tk.decoder = decoders.Sequence(steps)
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tk


def hf_dir(path: Path, style: str) -> Path:
    """A Hugging Face tokenizer directory of `style` (see STYLES): tokenizer.json, tokenizer_config.json, ..."""
    from tokenizers import processors

    s = STYLES[style]
    tk = spm_tokenizer(s["specials"], style == "llama2") if style in ("llama2", "gemma") else \
        byte_level_tokenizer(s["specials"])
    if s["bos"]:  # Llama 2, Llama 3 and Gemma put bos before a text; Qwen nothing
        bos = (s["bos"], tk.token_to_id(s["bos"]))
        template = processors.TemplateProcessing(single=f"{bos[0]} $A", pair=f"{bos[0]} $A {bos[0]} $B",
                                                 special_tokens=[bos])
        tk.post_processor = template if style != "llama3" else processors.Sequence(
            [processors.ByteLevel(trim_offsets=False), template])
    path.mkdir(parents=True, exist_ok=True)
    tk.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              **{f"{role}_token": s[role] for role in ("bos", "eos", "pad", "unk") if s.get(role)}}
    if s["template"]:
        config["chat_template"] = s["template"]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    if s.get("generation_eos"):
        (path / "generation_config.json").write_text(json.dumps(
            {"eos_token_id": [tk.token_to_id(t) for t in s["generation_eos"]]}))
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf_tokenizers")
    return {style: hf_dir(root / style, style) for style in STYLES}


def auto(path: Path, **kwargs):
    return transformers.AutoTokenizer.from_pretrained(str(path), **kwargs)


@pytest.mark.parametrize("style", list(STYLES))
def test_encode_decode_and_prefix_equal_transformers(dirs, style):
    tok = load_tokenizer(dirs[style])
    assert isinstance(tok, HFTokenizer) and tok.backend == "huggingface"
    theirs, split = auto(dirs[style]), auto(dirs[style], split_special_tokens=True)
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == split(text, add_special_tokens=False)["input_ids"], text
        assert not set(ids) & tok.special_token_ids  # spelled specials stay text
        assert theirs(text)["input_ids"] == tok.prefix_ids + theirs(text, add_special_tokens=False)["input_ids"]
        # Llama 2's decoder strips one leading space (the one its pre-tokenizer prepends, or the text's own)
        assert tok.decode(ids) == theirs.decode(ids) == (text[1:] if style == "llama2" and text[:1] == " " else text)
        assert tok.encode_to_numpy(text).dtype == np.uint32 and tok.encode_to_numpy(text).tolist() == ids
    assert tok.encode_batch(TEXTS) == [tok.encode(t) for t in TEXTS]
    assert tok.prefix_ids == ([tok.bos_id] if STYLES[style]["bos"] else [])
    assert tok.vocab_size == len(theirs) and tok.eos_id == tok.eot_id == theirs.eos_token_id
    assert tok.encode("a\ud800b") == tok.encode("a\ufffdb")  # lone surrogates as U+FFFD, as groundup's backend


def test_special_ids_bytes_and_roles(dirs):
    llama2 = load_tokenizer(dirs["llama2"])
    assert (llama2.unk_id, llama2.bos_id, llama2.eot_id) == (0, 1, 2)  # specials at the start, not the end
    assert llama2.special_token_ids == {0, 1, 2} and llama2.is_special(1) and not llama2.is_special(3)
    assert llama2.id_to_bytes(3 + 0x41) == b"A" and llama2.id_to_bytes(1) == b"<s>"
    ids = llama2.encode("the king")
    assert llama2.decode_bytes(ids) == b" the king"  # the prepended metaspace is a byte too
    lengths = llama2.token_bytes()
    assert lengths.dtype == np.int32 and lengths[:3].tolist() == [0, 0, 0] and lengths[3 + 0x41] == 1
    assert llama2.end_of_turn_id is None and llama2.chat_template is None and llama2.stop_ids == {2}
    with pytest.raises(DataError, match="no chat template"):
        llama2.render_chat(CHAT)
    llama3 = load_tokenizer(dirs["llama3"])
    eot = llama3.encode(" KING")  # byte-level: Ġ is the space byte
    assert llama3.decode_bytes(eot) == b" KING" and sum(llama3.token_bytes()[eot]) == 5
    assert llama3.end_of_turn_id == llama3._chat.token_to_id("<|eot_id|>")
    assert llama3.stop_ids == {llama3.eot_id, llama3.end_of_turn_id}  # generation_config.json's ids among them
    assert llama3.special_ids["bos"] == llama3.bos_id and "pad" not in llama3.special_ids
    chatml = load_tokenizer(dirs["chatml"])
    assert chatml.bos_id is None and chatml.eot_id == chatml.end_of_turn_id == chatml._chat.token_to_id("<|im_end|>")
    assert chatml.pad_id == chatml._chat.token_to_id("<|endoftext|>")


@pytest.mark.parametrize("style", ["llama3", "chatml", "gemma"])
def test_chat_ids_equal_apply_chat_template_and_mask_assistant_turns(dirs, style):
    tok, theirs = load_tokenizer(dirs[style]), auto(dirs[style])
    chat = CHAT[1:] if style == "gemma" else CHAT  # Gemma's template refuses a system message
    for gen, messages in ((False, chat), (True, chat[:-1])):
        ids, mask = tok.render_chat(messages, add_generation_prompt=gen)
        expected = theirs.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True, return_dict=False)
        assert ids == list(expected) and len(mask) == len(ids)
    ids, mask = tok.render_chat(chat)
    end = tok.end_of_turn_id
    # Runs of masked tokens: each assistant's content and the tokens closing its turn.
    runs = [[i for i, m in group] for key, group in itertools.groupby(zip(ids, mask), key=lambda p: p[1]) if key]
    replies = [m["content"] for m in chat if m["role"] == "assistant"]
    assert len(runs) == len(replies)
    for run, reply in zip(runs, replies):
        content = tok.decode(run[: run.index(end)])
        # Gemma's SentencePiece has no pre-tokenizer, so a token may straddle the prompt's "\n" and the reply:
        # the span then starts at that token (the first one that carries the reply).
        assert end in run and (content.removeprefix("\n") if style == "gemma" else content) == reply
        assert tok.decode(run[run.index(end) + 1:]) in ("", "\n")  # ChatML and Gemma end a turn with a newline
    _, gen_mask = tok.render_chat(chat[:-1], add_generation_prompt=True)
    assert sum(gen_mask) == len(runs[0])  # the generation prompt itself is not learned


def test_chat_template_errors_are_data_errors(dirs):
    gemma = load_tokenizer(dirs["gemma"])
    with pytest.raises(DataError, match="System role not supported"):
        gemma.render_chat(CHAT)
    with pytest.raises(DataError, match=r"messages\[0\]: role must be a string"):
        gemma.render_chat([{"content": "hi"}])


def test_save_load_keeps_files_and_hash(dirs, tmp_path):
    tok = load_tokenizer(dirs["llama3"])
    tok.save(tmp_path / "copy")
    again = load_tokenizer(tmp_path / "copy")
    assert again.hash == tok.hash and len(tok.hash) == 16 and again.stop_ids == tok.stop_ids
    assert (tmp_path / "copy" / "tokenizer.json").read_text() == (dirs["llama3"] / "tokenizer.json").read_text()
    assert again.chat_template == LLAMA3_TEMPLATE and again.prefix_ids == tok.prefix_ids
    config = json.loads((tmp_path / "copy" / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|eot_id|>"  # other role tokens: another tokenization identity
    (tmp_path / "copy" / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_tokenizer(tmp_path / "copy").hash != tok.hash
    assert load_tokenizer(tmp_path / "copy" / "tokenizer.json").eot_id == tok.end_of_turn_id  # the file works too


def test_the_chat_template_may_sit_in_its_own_file(dirs, tmp_path):
    tok = load_tokenizer(dirs["chatml"])
    tok.save(tmp_path / "t")
    config = json.loads((tmp_path / "t" / "tokenizer_config.json").read_text())
    (tmp_path / "t" / "chat_template.jinja").write_text(config.pop("chat_template"))
    (tmp_path / "t" / "tokenizer_config.json").write_text(json.dumps(config))
    again = load_tokenizer(tmp_path / "t")
    assert again.chat_template == CHATML_TEMPLATE and again.render_chat(CHAT) == tok.render_chat(CHAT)


def _write(directory: Path, name: str, data) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize("change, message", [
    (lambda d: [d], r"tokenizer.json: expected a JSON object, got a list"),
    (lambda d: {**d, "model": [1, 2]}, r"tokenizer.json: model: expected an object, got a list"),
    (lambda d: {**d, "pre_tokenizer": ["Split"]}, r"tokenizer.json: pre_tokenizer: expected an object or null"),
    (lambda d: {**d, "model": {**d["model"], "merges": [["a", "zzz"]]}}, r"model.merges\[0\]: 'zzz' is not in"),
    (lambda d: {**d, "model": {**d["model"], "merges": ["a b c"]}}, r"model.merges\[0\]: expected 'a b' or \[a, b\]"),
    (lambda d: {**d, "model": {**d["model"], "vocab": {**d["model"]["vocab"], "zz": 10**9}}},
     r"model.vocab: token 'zz' has id 1000000000, outside"),
    (lambda d: {**d, "model": {**d["model"], "vocab": {**d["model"]["vocab"], "zz": 5}}}, r"share id 5"),
    (lambda d: {**d, "added_tokens": [{"id": "x", "content": "<s>"}]}, r"added_tokens\[0\]: expected an object"),
    (lambda d: {**d, "model": {"type": "Mystery", "vocab": {}}}, r"model.type: 'Mystery' is not one of"),
])
def test_malformed_tokenizer_json_is_a_data_error_naming_the_key(dirs, tmp_path, change, message):
    data = json.loads((dirs["llama3"] / "tokenizer.json").read_text())
    _write(tmp_path / "t", "tokenizer.json", change(data))
    with pytest.raises(DataError, match=message):
        load_tokenizer(tmp_path / "t")


def test_unreadable_files_are_data_errors(dirs, tmp_path):
    _write(tmp_path / "a", "tokenizer.json", b'{"model": "\xff\xfe"}')
    with pytest.raises(DataError, match=r"tokenizer.json: not UTF-8 text"):
        load_tokenizer(tmp_path / "a")
    _write(tmp_path / "b", "tokenizer.json", '{"model": ')
    with pytest.raises(DataError, match=r"tokenizer.json:1: invalid JSON"):
        load_tokenizer(tmp_path / "b")
    good = (dirs["chatml"] / "tokenizer.json").read_text()
    _write(tmp_path / "c", "tokenizer.json", good)
    _write(tmp_path / "c", "tokenizer_config.json", {"eos_token": "<|nope|>"})
    with pytest.raises(DataError, match=r"tokenizer_config.json: eos_token '<\|nope\|>' is not in the vocabulary"):
        load_tokenizer(tmp_path / "c")
    _write(tmp_path / "c", "tokenizer_config.json", ["not", "an", "object"])
    with pytest.raises(DataError, match=r"tokenizer_config.json: expected a JSON object, got a list"):
        load_tokenizer(tmp_path / "c")
    _write(tmp_path / "c", "tokenizer_config.json", {"eos_token": 7})
    with pytest.raises(DataError, match=r"eos_token: expected a token string"):
        load_tokenizer(tmp_path / "c")
    _write(tmp_path / "c", "tokenizer_config.json", {})
    _write(tmp_path / "c", "generation_config.json", {"eos_token_id": "2"})
    with pytest.raises(DataError, match=r"generation_config.json: eos_token_id: expected an id or a list of ids"):
        load_tokenizer(tmp_path / "c")
    with pytest.raises(DataError, match="tokenizer not found"):
        load_tokenizer(tmp_path / "missing")
    _write(tmp_path / "d", "tokenizer.json", good)
    _write(tmp_path / "d", "groundup_tokenizer.json", b"\x80")  # groundup's format, damaged
    with pytest.raises(DataError, match=r"groundup_tokenizer.json: not UTF-8 text"):
        load_tokenizer(tmp_path / "d")


def test_load_tokenizer_picks_the_backend(dirs, tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from infer_helpers import small_tokenizer

    small_tokenizer().save(tmp_path / "ours")
    ours = load_tokenizer(tmp_path / "ours")
    assert isinstance(ours, Tokenizer) and ours.backend == "groundup" and ours.prefix_ids == [ours.eot_id]
    assert load_tokenizer(tmp_path / "ours" / "tokenizer.json").hash == ours.hash
    assert ours.stop_ids == {ours.eot_id, ours.end_of_turn_id} and ours.special_token_ids == set(ours.specials.values())
    # Without groundup_tokenizer.json the same file is just a Hugging Face tokenizer, with the same ids.
    _write(tmp_path / "plain", "tokenizer.json", (tmp_path / "ours" / "tokenizer.json").read_text())
    plain = load_tokenizer(tmp_path / "plain")
    assert isinstance(plain, HFTokenizer) and plain.prefix_ids == [ours.eot_id] and plain.eot_id == ours.eot_id
    assert all(plain.encode(t) == ours.encode(t) for t in TEXTS)
    assert (plain.token_bytes() == ours.token_bytes()).all()


def test_data_tokenize_and_stats_with_a_hugging_face_tokenizer(dirs, tmp_path, capsys):
    from groundup.cli import main
    from groundup.tokenizer.parallel import map_batches
    from groundup.tokens.shards import open_split, read_index

    tok = load_tokenizer(dirs["chatml"])
    records = [{"id": str(i), "source": "s", "domain": "text", "text": f"{TEXTS[i % 7]} number {i}"} for i in range(40)]
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    assert main(["data", "tokenize", "--tokenizer", str(dirs["chatml"]), "--input", str(data), "--out",
                 str(tmp_path / "tokens"), "--val-fraction", "0.2", "--workers", "2", "--quiet"]) == 0
    index = read_index(tmp_path / "tokens")
    assert index["tokenizer_hash"] == tok.hash and index["eot_id"] == tok.eot_id and index["bos_id"] is None
    files = open_split(tmp_path / "tokens", "train") + open_split(tmp_path / "tokens", "val")
    tokens = np.concatenate([np.asarray(f.tokens) for f in files])
    assert (tokens == tok.eot_id).sum() == 40  # one end of text after each document
    first = files[0].tokens[files[0].starts[0]:files[0].starts[1]].tolist()
    assert first[-1] == tok.eot_id and tok.decode(first[:-1]) in [r["text"] for r in records]
    batches = [[r["text"] for r in records[:20]], [r["text"] for r in records[20:]]]
    parallel = [a.tolist() for arrays in map_batches(tok, batches, workers=2) for a in arrays]
    assert parallel == [tok.encode(r["text"]) for r in records]
    assert main(["tokenizer", "stats", "--tokenizer", str(dirs["chatml"]), "--input", str(data), "--json",
                 str(tmp_path / "s.json")]) == 0
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["tokenizer_hash"] == tok.hash and stats["total"]["documents"] == 40
    assert all(t["id"] not in tok.special_token_ids for t in stats["longest_tokens"])


def test_text_stream_hides_specials_anywhere_in_the_vocabulary(dirs):
    from groundup.infer.text_stream import TextStream

    tok = load_tokenizer(dirs["llama2"])
    ids = tok.encode("KING HENRY. Now, lords")
    stream = TextStream(tok, stop_ids=[tok.eot_id])
    text = "".join(stream.push(i) for i in [ids[0], tok.bos_id, *ids[1:], tok.eot_id, ids[0]])  # <s> is id 1
    assert stream.done and text == tok.decode_bytes(ids).decode()
