"""Generated hostile input for every reader and every config or metadata loader.

Each property: no traceback (only groundup's own errors, whose message names the file or key and the
reason), and every good record kept. Examples are kept small so the whole file runs in seconds.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from groundup.config import load_config
from groundup.data.readers import ReadStats, iter_records
from groundup.errors import DataError, GroundupError

# derandomize: the suite must give one answer per commit; fuzz wider by hand with HYPOTHESIS_SEED.
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                            HealthCheck.too_slow])
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False),
                      st.text(max_size=20))
json_value = st.recursive(json_leaf, lambda children: st.one_of(st.lists(children, max_size=4),
                                                                st.dictionaries(st.text(max_size=8), children,
                                                                                max_size=4)), max_leaves=12)


def _tmp() -> Path:
    return Path(tempfile.mkdtemp())


# ----------------------------------------------------------------------------- record readers

good_record = st.builds(lambda t, extra: {"text": t, **extra}, st.text(min_size=1, max_size=40),
                        st.dictionaries(st.sampled_from(["id", "source", "domain", "url", "language"]),
                                        st.text(min_size=1, max_size=10), max_size=3))
bad_line = st.one_of(
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b" ")),  # not JSON, maybe not UTF-8
    json_value.map(lambda v: json.dumps(v).encode()),  # JSON of another shape
    st.integers(4400, 6000).map(lambda n: b'{"text": 1' + b"0" * n + b"}"),  # too many digits
    st.integers(3000, 50000).map(lambda n: b"[" * n + b"]" * n),  # nested too deeply
    st.sampled_from([b'{"text": "a\\ud800b"}', b'{"text": "x", "language": 5}', b'{"text": "x", "id": [1]}',
                     b'{"text": null}', b'{"text": "x", "url": {"a": 1}}']),
)


@SETTINGS
@given(st.lists(st.one_of(good_record.map(lambda r: ("good", r)), bad_line.map(lambda b: ("bad", b))), max_size=12))
def test_jsonl_reader_keeps_every_good_record(lines):
    path = _tmp() / "data.jsonl"
    path.write_bytes(b"".join((json.dumps(x).encode() if kind == "good" else x) + b"\n" for kind, x in lines))
    good = [x for kind, x in lines if kind == "good"]
    lone_surrogate = sum(1 for kind, x in lines if kind == "bad" and x == b'{"text": "a\\ud800b"}')
    stats = ReadStats()
    try:
        records = list(iter_records([path], stats))
    except DataError as e:
        assert not good and str(path) in str(e)
        return
    texts = [r["text"] for r in records]
    assert texts[: len(texts)] and all(g["text"] in texts for g in good)
    assert len(records) == len(good) + lone_surrogate + sum(  # bad lines that happen to be valid records
        1 for kind, x in lines if kind == "bad" and _is_good(x) and x != b'{"text": "a\\ud800b"}')
    for example in stats.examples(100):
        assert example.startswith(str(path))


def _is_good(line: bytes) -> bool:
    try:
        v = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return False
    return isinstance(v, dict) and isinstance(v.get("text"), str) and all(
        v.get(k) is None or isinstance(v.get(k), str) for k in ("id", "source", "domain", "url", "language"))


@SETTINGS
@given(st.lists(st.one_of(st.text(max_size=20), st.none()), min_size=1, max_size=10),
       st.lists(st.one_of(st.integers(-2**63, 2**63 - 1), st.none()), min_size=1, max_size=10))
def test_parquet_reader_keeps_every_string_text(texts, numbers):
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = min(len(texts), len(numbers))
    path = _tmp() / "d.parquet"
    pq.write_table(pa.table({"text": texts[:n], "n": numbers[:n]}), path)
    good = [t for t in texts[:n] if isinstance(t, str)]
    try:
        records = list(iter_records([path], ReadStats()))
    except DataError as e:
        assert not good and str(path) in str(e)
        return
    assert [r["text"] for r in records] == good


@SETTINGS
@given(st.binary(max_size=300))
def test_text_files_of_any_bytes(data):
    path = _tmp() / "notes.txt"
    path.write_bytes(data)
    try:
        records = list(iter_records([path], ReadStats()))
    except DataError as e:
        assert str(path) in str(e)
        return
    assert len(records) == 1 and b"\x00" not in data[:8192]


@SETTINGS
@given(st.lists(json_value, max_size=8))
def test_chat_and_preference_readers_never_raise(values):
    from groundup.posttrain.pairs import read_feedback, read_pairs
    from groundup.posttrain.records import iter_examples
    from infer_helpers import small_tokenizer

    path = _tmp() / "chat.jsonl"
    valid = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    rows = [{**v, "messages": v.get("messages")} if isinstance(v, dict) and "messages" in v else v for v in values]
    path.write_text("".join(json.dumps(v) + "\n" for v in rows + [valid]))
    bad: list[str] = []
    examples = list(iter_examples([path], ReadStats(), bad))
    assert examples and examples[-1].messages == valid["messages"]
    assert all(b.startswith(str(path)) for b in bad)
    tok = small_tokenizer()
    for read in (read_pairs, read_feedback):
        items, report = read([path], tok, 64)
        assert len(items) + len(report.skipped) == report.records


# ----------------------------------------------------------------------------- configs

def _config_classes():
    from groundup.data.curate_config import CurateConfig
    from groundup.demo.config import DemoConfig
    from groundup.posttrain.config import DPOConfig, GRPOConfig, KTOConfig, RFTConfig, RMConfig, SFTConfig
    from groundup.tokenizer import TokenizerConfig
    from groundup.tokens.shards import TokenizeConfig
    from groundup.train import TrainConfig

    return [TrainConfig, SFTConfig, DPOConfig, KTOConfig, GRPOConfig, RMConfig, RFTConfig, CurateConfig,
            TokenizerConfig, TokenizeConfig, DemoConfig]


toml_value = st.one_of(st.integers(-10**12, 10**12), st.floats(), st.booleans(), st.text(max_size=10),
                       st.lists(st.integers(-5, 5), max_size=3))
section_names = st.sampled_from(["model", "train", "optim", "schedule", "data", "sft", "dpo", "grpo", "lora",
                                 "stability", "checkpoint", "eval", "nonsense", "filters", "dedup"])
key_names = st.sampled_from(["n_layers", "d_model", "peak_lr", "max_steps", "batch_size", "rank", "beta", "vocab_size",
                             "seq_len", "epochs", "group_size", "weight_decay", "preset", "typo_key", "name"])


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(map(_toml, v)) + "]"
    return str(v)


@SETTINGS
@given(st.dictionaries(section_names, st.dictionaries(key_names, toml_value, max_size=3), max_size=3),
       st.sampled_from(range(11)), st.binary(max_size=8))
def test_config_loaders_fail_with_one_message(sections, which, junk):
    cls = _config_classes()[which]
    path = _tmp() / "run.toml"
    text = "\n".join(f"[{s}]\n" + "\n".join(f"{k} = {_toml(v)}" for k, v in keys.items()) for s, keys in sections.items())
    path.write_bytes(text.encode() + (b"\n# " + junk.replace(b"\n", b" ") if junk else b""))
    try:
        load_config(cls, path)
    except GroundupError as e:
        message = str(e)
        assert "\n" not in message.strip() or str(path) in message
        assert str(path) in message or getattr(e, "key", "") or "=" in message, message


# ----------------------------------------------------------------------------- metadata files

def _write_json(path: Path, value) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))
    return path


@SETTINGS
@given(json_value, st.sampled_from(["index", "config", "tokenizer", "meta", "adapter", "model_toml", "latest"]))
def test_metadata_loaders_refuse_the_wrong_shape_by_name(value, which):
    from groundup.interop.hf_import import import_hf
    from groundup.interop.peft_format import adapter_config
    from groundup.layout import checkpoint_problem, find_intact_checkpoint
    from groundup.model.model_dir import load_model_config
    from groundup.tokenizer import load_tokenizer
    from groundup.tokens.shards import read_index

    root = _tmp()
    try:
        if which == "index":
            read_index(_write_json(root / "index.json", value).parent)
        elif which == "config":
            _write_json(root / "hf" / "config.json", value)
            import_hf(root / "hf", root / "out")
        elif which == "tokenizer":
            load_tokenizer(_write_json(root / "tok" / "tokenizer.json", value).parent)
        elif which == "meta":
            _write_json(root / "step_0000001" / "meta.json", value)
            assert checkpoint_problem(root / "step_0000001") is not None
            return
        elif which == "adapter":
            adapter_config(_write_json(root / "a" / "adapter_config.json", value).parent)
        elif which == "model_toml":
            (root / "m").mkdir()
            (root / "m" / "model.toml").write_text(f"x = {json.dumps(json.dumps(value))}\n")
            load_model_config(root / "m")
        else:
            (root / "checkpoints").mkdir()
            (root / "checkpoints" / "latest").write_text(json.dumps(value))
            assert find_intact_checkpoint(root, note=lambda _: None) is None
            return
    except GroundupError as e:
        assert str(root) in str(e) or getattr(e, "key", ""), str(e)


def test_non_utf8_files_are_named(tmp_path):
    from groundup.model.model_dir import load_model_config
    from groundup.tokenizer import load_tokenizer
    from groundup.tokens.shards import read_index

    for make, load in ((lambda: tmp_path / "m" / "model.toml", lambda p: load_model_config(p.parent)),
                       (lambda: tmp_path / "t" / "tokenizer.json", lambda p: load_tokenizer(p.parent)),
                       (lambda: tmp_path / "s" / "index.json", lambda p: read_index(p.parent))):
        path = make()
        path.parent.mkdir(parents=True)
        path.write_bytes(b'{"caf\xe9": 1}')
        with pytest.raises(GroundupError, match="not UTF-8"):
            load(path)
