"""A crawl from end to end, as a user runs it: `data sample --crawl --hostile` writes WARC files (pages around
the embedded corpus plus damaged files), `data extract` turns every HTML page into one record, and `data
curate` reads the same WARCs like any other input, extracting, identifying language and filtering, with
every damaged record counted by file and offset in the report.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastwarc", reason="the web extra (pip install 'groundup[web]') is not installed")
pytest.importorskip("trafilatura", reason="the web extra (pip install 'groundup[web]') is not installed")

sys.path.insert(0, str(Path(__file__).parent))

from groundup.cli import main  # noqa: E402
from groundup.corpus.crawl import HOSTILE_KINDS  # noqa: E402
from groundup.corpus.web_pages import make_pages  # noqa: E402
from groundup.data.readers import ReadStats, iter_records  # noqa: E402
from groundup.data.web.extract import shingle_scores  # noqa: E402

PAGES = 40


@pytest.fixture(scope="module")
def crawl(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("crawl") / "crawl"
    assert main(["data", "sample", "--crawl", "--out", str(out), "--pages", str(PAGES), "--pages-per-file", "15",
                 "--hostile"]) == 0
    return out


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sample_crawl_writes_pages_and_damaged_files(crawl):
    names = sorted(p.name for p in crawl.iterdir() if not p.name.startswith("."))
    assert names[:3] == ["crawl-00000.warc.gz", "crawl-00001.warc.gz", "crawl-00002.warc.gz"]
    assert len(names) == 3 + len(HOSTILE_KINDS)
    assert "hostile-long_length_plain.warc" in names  # uncompressed files are named so


def test_extract_writes_one_record_per_page_with_its_origin(crawl, tmp_path, capsys):
    out = tmp_path / "pages.jsonl"
    assert main(["data", "extract", str(crawl / "crawl-00000.warc.gz"), "--out", str(out), "--quiet"]) == 0
    records = _lines(out)
    pages = make_pages(PAGES)[:15]
    assert [r["url"] for r in records] == [p.url for p in pages]  # one per page, in file order, none filtered
    first = records[0]
    assert set(first) == {"id", "url", "text", "title", "language", "language_score", "warc"}
    assert first["id"] == first["warc"]["record_id"] and first["id"].startswith("<urn:uuid:")
    assert first["warc"]["file"].endswith("crawl-00000.warc.gz") and first["warc"]["offset"] > 0
    assert first["title"] == pages[0].title
    for record, page in zip(records, pages):
        assert record["language"] == page.language or page.url.split("/")[3] == "multilingual", record["url"]
        assert 0 < record["language_score"] <= 1
    # Main content, not boilerplate: the article-extraction benchmarks' shingle F1 against the hand-made truth.
    f1 = [shingle_scores(r["text"], p.truth)[2] for r, p in zip(records, pages)]
    assert sum(f1) / len(f1) > 0.85, f1
    assert sum("All rights reserved" in r["text"] for r in records) <= 2
    assert "15 HTML pages from 1 crawl files" in capsys.readouterr().out


def test_extract_into_a_folder_counts_damage_and_a_rerun_keeps_finished_files(crawl, tmp_path, capsys):
    out = tmp_path / "pages"
    assert main(["data", "extract", str(crawl), "--out", str(out), "--quiet", "--backend", "resiliparse"]) == 0
    report = json.loads((out / "report.json").read_text())
    read = report["read"]
    assert report["files"] == 3 + len(HOSTILE_KINDS) and report["files_reused"] == 0
    assert (read["truncated"], read["bad_length"], read["empty_files"], read["too_large"]) == (2, 4, 1, 1)
    assert read["non_html_by_type"] == {"image/png": 1, "application/pdf": 1}
    assert any(p.startswith(str(crawl / "hostile-truncated.warc.gz") + "@") for p in read["positions"]["truncated"])
    assert sum(1 for _ in (out / "crawl-00000.jsonl").open()) == 15
    printed = capsys.readouterr().out
    assert "2 truncated, 4 bad length" in printed and "with backend resiliparse" in printed
    # A crash after some files: their outputs are complete (renamed into place), the rest is redone.
    (out / "crawl-00002.jsonl").unlink()
    assert main(["data", "extract", str(crawl), "--out", str(out), "--quiet", "--backend", "resiliparse"]) == 0
    again = json.loads((out / "report.json").read_text())
    assert again["files_reused"] == 3 + len(HOSTILE_KINDS) - 1
    assert again["records"] == report["records"] and again["read"] == report["read"]


def test_extract_refuses_inputs_without_a_crawl_file(tmp_path, capsys):
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    assert main(["data", "extract", str(tmp_path / "a.jsonl"), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "no crawl file (.warc, .warc.gz" in capsys.readouterr().err


def test_readers_yield_extracted_text_from_a_warc(crawl):
    stats = ReadStats()
    records = list(iter_records([crawl / "crawl-00001.warc.gz"], stats))
    assert len(records) == 15 and stats.crawl.pages == 15 and stats.records == 15
    assert all(r["domain"] == "text" and r["source"] == "crawl-00001" and "<html" not in r["text"]
               for r in records)
    assert "format" not in records[0] and records[0]["language"] in {"en", "fr", "de", "es"}


def test_curate_reads_a_crawl_filters_by_language_and_reports_damage(crawl, tmp_path, capsys):
    out = tmp_path / "curated"
    assert main(["data", "curate", "--input", str(crawl), "--out", str(out), "--no-progress", "language.enabled=true",
                 "filters.text=[]"]) == 0
    report = json.loads((out / "report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    assert [s["name"] for s in report["stages"]][:4] == ["extract", "normalize", "url", "language"]
    languages = stages["language"]["extra"]
    expected = {}
    for page in make_pages(PAGES):
        expected[page.language] = expected.get(page.language, 0) + 1
    assert sum(languages.values()) == stages["extract"]["by_domain"]["text"]["docs_out"]
    assert languages.get("en", 0) >= expected["en"] - 2 and stages["language"]["removed_docs"] == \
        sum(languages.values()) - languages.get("en", 0) + stages["language"]["by_domain"]["text"]["reasons"].get(
            "low_score", 0)
    assert report["read"]["crawl"]["truncated"] == 2 and report["read"]["crawl"]["pages"] == PAGES + 24  # + good pages around the damage
    kept = [json.loads(m) for m in _shard_column(out, "meta")]
    assert kept and all(m["language_score"] > 0.65 and "warc" in m for m in kept)
    assert set(_shard_column(out, "language")) == {"en"}
    md = (out / "report.md").read_text()
    assert "## Crawl files" in md and "hostile-truncated.warc.gz@" in md
    assert "truncated hostile" not in capsys.readouterr().err


def _shard_column(out: Path, name: str) -> list:
    import pyarrow.parquet as pq

    return [v for p in sorted((out / "shards").glob("part-*.parquet")) for v in pq.read_table(p)[name].to_pylist()]


def _texts_file(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return path


PROSE = ["the cat sat on the mat", "the mat sat on the cat", "a cat sat on a mat", "the the the cat cat",
         "on on on mat mat mat a a", "zebra quantum violin", "the cat sat on the mat and the cat sat on a mat"]


def test_curate_keeps_perplexity_buckets_as_configured(tmp_path):
    """CCNet's head/middle/tail under a KenLM model: the stage drops exactly the documents the scorer puts in
    a dropped bucket, and the report counts every bucket."""
    pytest.importorskip("kenlm", reason="the kenlm extra is not installed")
    from test_web_perplexity import write_arpa

    from groundup.data.web.language import LanguageIdentifier
    from groundup.data.web.perplexity import PerplexityConfig, PerplexityScorer

    model = write_arpa(tmp_path / "en.arpa")
    cfg = PerplexityConfig(enabled=True, kenlm_model=model)
    scorer = PerplexityScorer(cfg)
    values = sorted(scorer.score(t, None) for t in PROSE)
    head, middle = values[2], values[4]
    raw = _texts_file(tmp_path / "prose.jsonl", PROSE)
    out = tmp_path / "curated"
    assert main(["data", "curate", "--input", str(raw), "--out", str(out), "--no-progress", "filters.text=[]",
                 "pii.enabled=false", "dedup.minhash.enabled=false", "perplexity.enabled=true",
                 f"perplexity.kenlm_model={model}", f"perplexity.cutoffs={{ en = [{head}, {middle}] }}",
                 'perplexity.keep_buckets=["head", "middle"]', "language.enabled=true",
                 "language.min_score=0"]) == 0
    report = json.loads((out / "report.json").read_text())
    stage = next(s for s in report["stages"] if s["name"] == "perplexity")
    cfg.cutoffs = {"en": [head, middle]}
    languages = [LanguageIdentifier().predict(t)[0] for t in PROSE]  # cutoffs are per language: en only here
    buckets = [PerplexityScorer(cfg).bucket(scorer.score(t, None), lang) or "unbucketed"
               for t, lang in zip(PROSE, languages)]
    assert stage["extra"] == {b: buckets.count(b) for b in set(buckets)}
    assert stage["removed_docs"] == buckets.count("tail") > 0
    assert sorted(_shard_column(out, "id")) == [f"d{i}" for i, b in enumerate(buckets) if b != "tail"]


def test_curate_scores_with_a_groundup_checkpoint_in_bits_per_byte(tmp_path):
    """perplexity.checkpoint: the `data curate` verb hands the model's scorer down to the curator."""
    from infer_helpers import model_dir, tiny_model

    from groundup.eval.bpb import CheckpointBitsPerByte

    path = model_dir(tmp_path / "model", tiny_model(3))
    bpb = CheckpointBitsPerByte(path)(PROSE)
    limit = sorted(bpb)[3]
    raw = _texts_file(tmp_path / "prose.jsonl", PROSE)
    out = tmp_path / "curated"
    assert main(["data", "curate", "--input", str(raw), "--out", str(out), "--no-progress", "filters.text=[]",
                 "pii.enabled=false", "dedup.minhash.enabled=false", "perplexity.enabled=true",
                 f"perplexity.checkpoint={path}", f"perplexity.max_value={limit}"]) == 0
    report = json.loads((out / "report.json").read_text())
    stage = next(s for s in report["stages"] if s["name"] == "perplexity")
    assert stage["removed_docs"] == sum(v > limit for v in bpb) == 3
    assert sorted(json.loads(m)["perplexity"] for m in _shard_column(out, "meta")) == pytest.approx(sorted(bpb)[:4])


def test_extract_killed_midway_resumes_and_writes_what_an_uninterrupted_run_writes(tmp_path):
    import signal
    import subprocess
    import time

    crawl = tmp_path / "crawl"
    assert main(["data", "sample", "--crawl", "--out", str(crawl), "--pages", "120", "--pages-per-file", "30"]) == 0
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert main(["data", "extract", str(crawl), "--out", str(whole), "--quiet"]) == 0
    child = subprocess.Popen([sys.executable, "-m", "groundup", "data", "extract", str(crawl), "--out", str(part),
                              "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list((part / ".done").glob("*.json")) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    child.wait()
    finished = len(list((part / ".done").glob("*.json")))
    assert 1 <= finished < 4, "the kill came after every file was done: make the crawl bigger"
    assert main(["data", "extract", str(crawl), "--out", str(part), "--quiet"]) == 0
    report = json.loads((part / "report.json").read_text())
    assert report["files_reused"] == finished
    names = ["crawl-00000.jsonl", "crawl-00001.jsonl", "crawl-00002.jsonl", "crawl-00003.jsonl"]
    assert sorted(p.name for p in part.glob("*.jsonl")) == names  # no half-written file under a final name
    for name in names:
        assert (part / name).read_bytes() == (whole / name).read_bytes(), name
