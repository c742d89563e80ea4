"""`groundup data curate` end to end on a small sample of the embedded corpus: output contract,
report, restart after a crash, settings guard, workers, JSONL output and the classifier stage."""

from __future__ import annotations

import itertools
import json

import pyarrow.parquet as pq
import pytest

from groundup.cli import main
from groundup.config import load_config
from groundup.corpus import iter_corpus
from groundup.data import curate_shard
from groundup.data.classifier import train
from groundup.data.curate_config import CurateConfig
from groundup.data.pipeline import curate
from groundup.errors import DataError


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """40 Shakespeare chunks, 25 stdlib files and 150 math problems, plus planted duplicates."""
    root = tmp_path_factory.mktemp("sample")
    text = list(itertools.islice(iter_corpus(["text"], chunk_chars=3000), 40))
    code = list(itertools.islice(iter_corpus(["code"]), 25))
    math = list(iter_corpus(["math"], math_count=150))
    copy = {**text[5], "id": "copy-of-5", "source": "mirror"}  # exact duplicate from another source
    near = {**text[6], "id": "near-6", "source": "mirror", "text": text[6]["text"][:-200] + " an edited ending"}
    for name, records in (("text", text + [copy, near]), ("code", code), ("math", math)):
        with open(root / f"{name}.jsonl", "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    with open(root / "text.jsonl", "a") as f:
        f.write('{"text": "broken\n')
    return root


def run(sample, out, *overrides):
    return main(["data", "curate", "--input", str(sample), "--out", str(out), "--no-progress",
                 "output.shard_docs=50", *overrides])


def rows(out) -> list[dict]:
    parts = sorted((out / "shards").glob("part-*"))
    return [r for p in parts for r in pq.read_table(p).to_pylist()]


def test_cli_end_to_end_outputs_report_and_config(sample, tmp_path, capsys):
    out = tmp_path / "out"
    assert run(sample, out, "mixing.weights={code=0.55,text=0.25,math=0.20}") == 0
    printed = capsys.readouterr().out
    assert "documents" in printed and "mix (bytes out)" in printed
    data = rows(out)
    assert set(data[0]) == {"id", "source", "domain", "text", "url", "language", "quality", "meta"}
    ids = {r["id"] for r in data}
    assert "copy-of-5" not in ids and "near-6" not in ids  # exact and near duplicates across sources
    assert any(r["domain"] == "code" and r["language"] == "python" for r in data)
    math = next(r for r in data if r["domain"] == "math")
    assert "answer" in json.loads(math["meta"])
    report = json.loads((out / "report.json").read_text())
    assert report["read"]["bad_json"] == 1 and "text.jsonl:43" in report["read"]["bad_json_examples"][0]
    stages = {s["name"]: s for s in report["stages"]}
    assert stages["gopher_quality"]["applies_to"] == ["text"]  # prose rules never judge code
    assert stages["code"]["applies_to"] == ["code"] and stages["math"]["applies_to"] == ["math"]
    assert stages["exact_dedup"]["by_source"]["mirror"]["reasons"] == {"duplicate_text": 1}
    assert report["dedup"]["minhash"]["clusters"] >= 1
    assert any(m["id"] == "near-6" for c in report["dedup"]["minhash"]["largest"] for m in c["members"])
    shares = {d: c["share"] for d, c in report["mix"]["output"].items()}
    assert shares["code"] == pytest.approx(0.55, abs=0.08) and shares["math"] == pytest.approx(0.20, abs=0.08)
    assert report["timing"]["total_s"] > 0 and all("seconds" in s for s in report["stages"])
    assert "# Curation report" in (out / "report.md").read_text()
    assert load_config(CurateConfig, out / "config.toml").mixing.weights["code"] == 0.55


def test_restart_after_a_crash_skips_completed_shards(sample, tmp_path, monkeypatch):
    cfg = load_config(CurateConfig, None, ["output.shard_docs=50"])
    reference = tmp_path / "reference"
    curate([sample], reference, cfg, progress=False)
    out = tmp_path / "crashed"
    original = curate_shard.ShardCurator.__call__

    def crash_on_third(self, index, records, work):
        if index == 2:
            raise RuntimeError("power cut")
        return original(self, index, records, work)

    monkeypatch.setattr(curate_shard.ShardCurator, "__call__", crash_on_third)
    with pytest.raises(RuntimeError, match="power cut"):
        curate([sample], out, cfg, progress=False)
    work = out / ".work"
    assert (work / "stats-00001.json").exists() and not (work / "stats-00002.json").exists()
    assert not list(work.glob(".*tmp*")) and not (out / "report.json").exists()
    monkeypatch.setattr(curate_shard.ShardCurator, "__call__", original)
    report = curate([sample], out, cfg, progress=False)
    assert report["shards"]["skipped_complete_work_shards"] == 2
    assert rows(out) == rows(reference)
    again = curate([sample], out, cfg, progress=False)  # nothing left to do: every part is reused
    assert again["shards"]["skipped_existing_parts"] == again["shards"]["written"] + again["shards"]["skipped_existing_parts"]
    assert again["totals"] == report["totals"]


def test_other_settings_into_the_same_directory_are_refused(sample, tmp_path):
    out = tmp_path / "out"
    curate([sample], out, load_config(CurateConfig, None, ["output.shard_docs=50"]), progress=False)
    with pytest.raises(DataError, match="gopher_quality.min_doc_words"):
        curate([sample], out, load_config(CurateConfig, None, ["output.shard_docs=50", "gopher_quality.min_doc_words=10"]),
               progress=False)


def test_workers_give_the_same_output_and_jsonl_format(sample, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert run(sample, one, "output.format=jsonl", "output.shuffle=false") == 0
    assert run(sample, two, "output.format=jsonl", "output.shuffle=false", "workers=2") == 0
    parts = sorted((one / "shards").glob("part-*.jsonl"))
    assert parts and [p.read_text() for p in parts] == [(two / "shards" / p.name).read_text() for p in parts]
    first = json.loads(parts[0].read_text().splitlines()[0])
    assert {"id", "source", "domain", "text"} <= set(first)


def test_classifier_threshold_and_top_fraction(sample, tmp_path):
    good = [r["text"] for r in iter_corpus(["text"], chunk_chars=3000)][:60]
    bad = [" ".join(sorted(t.split())) for t in good]  # the same words, sorted: no prose left
    model = tmp_path / "q.npz"
    train(good, bad, epochs=4).save(model)
    out = tmp_path / "out"
    cfg = load_config(CurateConfig, None, ["output.shard_docs=50", f"classifier.model='{model}'",
                                           "classifier.top_fraction=0.5", "filters.text=[]"])
    report = curate([sample], out, cfg, progress=False)
    stages = {s["name"]: s for s in report["stages"]}
    assert stages["classifier"]["applies_to"] == ["text"]
    top = stages["classifier_top_fraction"]["by_domain"]["text"]
    assert top["docs_out"] == pytest.approx(top["docs_in"] / 2, abs=2)
    scores = [r["quality"] for r in rows(out) if r["domain"] == "text"]
    assert scores and all(s is not None for s in scores)


def test_bad_config_and_missing_input_fail_before_work(sample, tmp_path, capsys):
    assert run(sample, tmp_path / "o", "filters.text=[\"gopher\"]") == 2
    assert "expected filter names" in capsys.readouterr().err
    assert main(["data", "curate", "--input", str(tmp_path / "missing"), "--out", str(tmp_path / "o2")]) == 2
    assert "input not found" in capsys.readouterr().err
