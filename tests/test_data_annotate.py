"""`groundup data annotate` against a local fake OpenAI-compatible server whose judge follows a rule we set.

Pinned: the strict verdict parse; exact counts of a clean run and of one whose endpoint times out, answers junk,
malformed verdicts, 500s and 400s (retried, then counted); a kill mid-run and a torn last line, then a resume
that annotates no document twice; a changed setting refused naming its key; the API key read from the
environment, sent to the endpoint and written to no file; the classifier's agreement measured as sklearn and
scipy measure it, and the file loading as curation's classifier.model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openai")

from annotate_helpers import FakeJudge, make_corpus, score_of  # noqa: E402
from groundup.cli import main  # noqa: E402
from groundup.data.annotate import AnnotateConfig, draw_sample, read_annotations  # noqa: E402
from groundup.data.annotate_client import DEFAULT_RUBRIC, parse_verdict  # noqa: E402
from groundup.data.annotate_report import RunCounts, evaluate_classifier, ranks, spearman  # noqa: E402
from groundup.data.classifier import QualityClassifier  # noqa: E402
from groundup.data.readers import ReadStats  # noqa: E402
from groundup.errors import ConfigError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-test-3f9c1d7e-never-written"
@pytest.fixture
def judge():
    j = FakeJudge()
    yield j
    j.close()


def run(*args) -> int:
    return main(["data", "annotate", *map(str, args), "--quiet"])


def common(corpus: Path, judge: FakeJudge, out: Path, *extra) -> list:
    return ["--input", corpus, "--endpoint", judge.url, "--model", "judge", "--out", out, "--bits", "16",
            "--backoff", "0.01", *extra]


def report_of(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def lines_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "annotations.jsonl").read_text().splitlines()]


def no_file_holds(folder: Path, secret: str) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


# ----------------------------------------------------------------------------- the verdict


@pytest.mark.parametrize("answer, expected", [
    ("Clear and useful.\nEducational score: 4", (4, "Clear and useful.")),
    ("Reasons here.\n\n**Educational score: 3**\n", (3, "Reasons here.")),
    ("Reasons.\nEducational score: 0.", (0, "Reasons.")),
    ("educational score:5", (5, "")),
    ("Reasons.\nEducational score: 6", "over 5"),
    ("Reasons.\nEducational score: 3/5", "not a whole number"),
    ("Reasons.\nEducational score: 2.5", "not a whole number"),
    ("Educational score: 3\nBut on reflection it is weak.", "the last line is not"),
    ("I would give it a 4.", "the last line is not"),
    ("   \n", "empty answer"),
])
def test_the_verdict_is_parsed_strictly(answer, expected):
    if isinstance(expected, tuple):
        assert parse_verdict(answer) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            parse_verdict(answer)


def test_the_default_rubric_asks_for_the_verdict_line_and_holds_the_document_once():
    assert DEFAULT_RUBRIC.count("{document}") == 1
    assert DEFAULT_RUBRIC.rstrip().endswith("Educational score: <points>")


def test_spearman_and_ranks_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    x, y = rng.random(50), rng.integers(0, 6, 50)
    assert np.array_equal(ranks(y.astype(float)), stats.rankdata(y))
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)


# ----------------------------------------------------------------------------- the sample


def test_the_sample_does_not_depend_on_input_order_and_grows_as_a_superset(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    make_corpus(a, 200)
    make_corpus(b, 200, shuffle=True)

    def ids(path, n, seed=0):
        return [d.id for d in draw_sample([path], AnnotateConfig(sample=n, seed=seed), ReadStats(), RunCounts())]

    small = ids(a, 30)
    assert len(small) == len(set(small)) == 30
    assert sorted(ids(a, 30)) == sorted(small)
    assert set(small) < set(ids(a, 60))
    assert set(ids(a, 30, seed=1)) != set(small)
    # the key is (source, id): the same records in another order (and a file of the same name) give the same sample
    moved = tmp_path / "shuffled"
    moved.mkdir()
    b.rename(moved / "a.jsonl")
    assert sorted(ids(moved / "a.jsonl", 30)) == sorted(small)


# ----------------------------------------------------------------------------- a clean run


def test_a_clean_run_counts_exactly_and_its_classifier_agrees_with_the_judge(tmp_path, judge, monkeypatch):
    metrics = pytest.importorskip("sklearn.metrics")
    stats = pytest.importorskip("scipy.stats")
    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "ann"
    make_corpus(corpus, 300)
    monkeypatch.setenv("JUDGE_KEY", SECRET)
    assert run(*common(corpus, judge, out, "--sample", "160", "--held-out", "0.25", "--api-key-env", "JUDGE_KEY")) == 0
    rep = report_of(out)
    r, f = rep["this_run"], rep["folder"]
    assert (r["sent"], r["scored"], r["unparsable"], r["failed"], r["requests"], r["retries"], r["timeouts"]) == \
           (160, 160, 0, 0, 160, 0, 0)
    lines = lines_of(out)
    numbers = sorted(int(line["id"][1:]) for line in lines)
    assert len(numbers) == len(set(numbers)) == 160 and sorted(judge.log) == numbers
    assert all(line["score"] == score_of(int(line["id"][1:])) and line["status"] == "scored"
               and line["attempts"] == 1 and line["model"] == "judge" for line in lines)
    expected = {str(s): sum(score_of(n) == s for n in numbers) for s in range(6)}
    assert f["score_histogram"] == expected and f["pending"] == 0 and f["scored"] == 160
    # the key: read from the variable named, sent as the bearer token, written nowhere
    assert judge.auth == {f"Bearer {SECRET}"}
    assert no_file_holds(out, SECRET) == []
    assert rep["settings"]["api_key_env"] == "JUDGE_KEY"
    # agreement: the report's numbers are sklearn's and scipy's on the held-out documents
    clf = rep["classifier"]
    held = clf["held_out"]
    assert clf["trained"] and held["docs"] == rep["sample"]["held_out"] > 20
    docs = draw_sample([corpus], AnnotateConfig(sample=160, held_out=0.25), ReadStats(), RunCounts())
    test = [d for d in docs if d.held_out]
    model = QualityClassifier.load(out / "classifier.npz")  # what data curate's classifier.model loads
    p = model.score([d.text for d in test])
    s = np.array([score_of(int(d.id[1:])) for d in test])
    assert held["auc"] == pytest.approx(metrics.roc_auc_score(s >= 3, p), abs=1e-6)
    assert held["accuracy"] == pytest.approx(metrics.accuracy_score(s >= 3, p >= 0.5), abs=1e-6)
    assert held["f1"] == pytest.approx(metrics.f1_score(s >= 3, p >= 0.5), abs=1e-6)
    assert held["spearman"] == pytest.approx(stats.spearmanr(p, s).statistic, abs=1e-6)
    assert held["pearson"] == pytest.approx(stats.pearsonr(p, s).statistic, abs=1e-6)
    assert held["accuracy"] >= 0.9 and held["auc"] >= 0.95 and held["spearman"] >= 0.7
    assert clf["train_positive"] + clf["train_negative"] == 160 - held["docs"]
    md = (out / "report.md").read_text()
    assert "| sent this run | 160 |" in md and "| timeouts | 0 |" in md and "| Spearman |" in md


# ----------------------------------------------------------------------------- a bad endpoint


def test_timeouts_junk_and_errors_are_retried_then_counted_and_a_rerun_finishes(tmp_path, judge):
    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "ann"
    make_corpus(corpus, 12)
    judge.plan = {
        0: ["sleep"],                        # a timeout, then an answer: scored at attempt 2
        1: ["sleep", "sleep", "sleep"],      # every attempt times out: failed (pending)
        2: ["junk", "nochoices"],            # junk twice, then an answer: scored at attempt 3
        3: ["malformed"] * 3,                # never a verdict: unparsable after 3 attempts
        4: ["500", "500"],                   # 500 twice, then an answer
        5: ["500"] * 3,                      # 500 every time: failed
        6: ["400"],                          # a 400 is not retried: failed after 1 attempt
        7: ["junk"] * 3,                     # junk every time: unparsable
        8: ["429"],                          # rate-limited once: retried after its Retry-After (0.2 s)
    }
    args = common(corpus, judge, out, "--sample", "12", "--max-retries", "2", "--timeout", "0.6", "--held-out", "0")
    assert run(*args) == 0
    r, f = report_of(out)["this_run"], report_of(out)["folder"]
    assert (r["sent"], r["scored"], r["unparsable"], r["failed"]) == (12, 7, 2, 3)
    assert r["attempt_failures"] == {"bad_response": 5, "http_429": 1, "http_500": 5, "malformed_verdict": 3,
                                     "rejected_400": 1, "timeout": 4}
    assert r["timeouts"] == 4 and r["requests"] == 12 + 1 + 2 + 2 + 2 + 2 + 2 + 0 + 2 + 1
    t8 = [t for n, t in zip(judge.log, judge.times) if n == 8]
    assert t8[1] - t8[0] >= 0.19  # the server's Retry-After, not the 0.01 s backoff
    assert (f["annotated"], f["pending"], f["scored"], f["unparsable"]) == (9, 3, 7, 2)
    by_id = {line["id"]: line for line in lines_of(out)}
    assert [by_id[f"d{n}"]["attempts"] for n in (0, 2, 4, 8, 9)] == [2, 3, 3, 2, 1]
    assert by_id["d3"]["status"] == "unparsable" and by_id["d3"]["score"] is None
    assert "the last line is not 'Educational score: <points>'" in by_id["d3"]["error"]
    assert by_id["d7"]["status"] == "unparsable" and "not JSON" in by_id["d7"]["error"]
    assert {"d1", "d5", "d6"}.isdisjoint(by_id)
    assert any(e.startswith("corpus/d6: HTTP 400") for e in r["failed_examples"])
    # the endpoint recovers: a rerun sends only the three pending documents, none twice
    judge.plan, judge.log = {}, []
    assert run(*args) == 0  # the endpoint now answers everything
    r, f = report_of(out)["this_run"], report_of(out)["folder"]
    assert sorted(judge.log) == [1, 5, 6]
    assert (r["already_annotated"], r["sent"], r["scored"], f["annotated"], f["pending"]) == (9, 3, 3, 12, 0)
    assert len(lines_of(out)) == 12


def test_a_refusing_endpoint_stops_the_run_at_once(tmp_path, judge, capsys):
    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "ann"
    make_corpus(corpus, 20)
    judge.plan = {i: ["401"] for i in range(20)}
    assert run(*common(corpus, judge, out, "--sample", "20", "--concurrency", "1")) == 2
    err = capsys.readouterr().err
    assert "the endpoint refused a request: HTTP 401" in err and "run the same command again" in err
    assert len(judge.log) == 1 and report_of(out)["this_run"]["stopped"].startswith("the endpoint refused")
    assert not (out / "annotations.jsonl").read_text()


def test_a_failing_endpoint_stops_after_consecutive_failures(tmp_path, judge, capsys):
    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "ann"
    make_corpus(corpus, 20)
    judge.plan = {i: ["500"] * 9 for i in range(20)}
    assert run(*common(corpus, judge, out, "--sample", "20", "--concurrency", "1", "--max-retries", "1",
                       "--max-consecutive-failures", "3")) == 2
    assert "stopped after 3 documents in a row failed (the last: HTTP 500" in capsys.readouterr().err
    assert len(judge.log) == 6 and report_of(out)["this_run"]["failed"] == 3


# ----------------------------------------------------------------------------- kill and resume


def test_a_killed_run_resumes_without_annotating_any_document_twice(tmp_path):
    judge = FakeJudge(delay=0.05)
    try:
        corpus, out = tmp_path / "corpus.jsonl", tmp_path / "ann"
        make_corpus(corpus, 40)
        args = common(corpus, judge, out, "--sample", "30", "--concurrency", "1", "--held-out", "0.2")
        env = {**os.environ, "OPENAI_API_KEY": SECRET, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen([sys.executable, "-m", "groundup", "data", "annotate", *map(str, args), "--quiet"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        path = out / "annotations.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not path.exists() or path.read_text().count("\n") < 8):
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kept = lines_of(out)
        assert 8 <= len(kept) < 30
        with open(path, "a") as f:  # a kill in the middle of a write leaves a torn last line
            f.write('{"id": "d39", "source": "corpus", "status": "sco')
        before = {line["id"] for line in kept}
        judge.log = []
        assert run(*args, "--resume") == 0
        rep = report_of(out)
        lines = lines_of(out)
        ids = [line["id"] for line in lines]
        assert len(ids) == len(set(ids)) == 30  # the torn line is gone, every document once
        assert {f"d{n}" for n in judge.log}.isdisjoint(before)  # nothing annotated before was sent again
        assert len(judge.log) == 30 - len(before)
        assert rep["folder"]["torn_lines_skipped"] == 1 and rep["this_run"]["already_annotated"] == len(before)
        assert (rep["folder"]["annotated"], rep["folder"]["pending"]) == (30, 0)
        assert rep["classifier"]["trained"]
        assert no_file_holds(out, SECRET) == []
        # a third run has nothing to send and says so
        judge.log = []
        assert run(*args) == 0
        assert judge.log == [] and report_of(out)["this_run"]["already_annotated"] == 30
    finally:
        judge.close()


def test_reading_annotations_skips_and_counts_bad_lines_and_a_torn_tail(tmp_path):
    path = tmp_path / "annotations.jsonl"
    good = {"id": "a", "source": "s", "status": "scored", "score": 3}
    path.write_text(json.dumps(good) + "\n" + "not json\n" + json.dumps({**good, "score": 9}) + "\n"
                    + json.dumps(good) + "\n" + json.dumps({**good, "id": "b", "status": "unparsable"}) + "\n"
                    + '{"id": "c"')
    counts = RunCounts()
    found = read_annotations(path, counts)
    assert found == {"s\0a": {"status": "scored", "score": 3}, "s\0b": {"status": "unparsable", "score": None}}
    assert (counts.bad_lines, counts.duplicate_lines, counts.torn_lines) == (2, 1, 1)
    assert counts.bad_line_examples[0] == f"{path}:2: not an annotation, skipped"
    text = path.read_text()  # the torn tail is cut, so the next line appends cleanly
    assert text.endswith("\n") and '"c"' not in text and len(text.splitlines()) == 5


# ----------------------------------------------------------------------------- settings


def test_a_changed_setting_is_refused_naming_its_key_and_the_sample_may_grow(tmp_path, judge, capsys):
    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "ann"
    make_corpus(corpus, 60)
    make_corpus(tmp_path / "more.jsonl", 5)

    def args(model="judge", extra=()):
        return ["--input", corpus, "--endpoint", judge.url, "--model", model, "--out", out, "--bits", "16",
                "--held-out", "0", *extra]

    assert run(*args(extra=["--sample", "20"])) == 0
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("Rate this: {document}\nEnd with: Educational score: <points>\n")
    for model, extra, message in (("other", [], "model = 'other'"), ("judge", ["--seed", "1"], "seed = 1"),
                                  ("judge", ["--max-chars", "50"], "max_chars = 50"),
                                  ("judge", ["--rubric", rubric], "rubric = "),
                                  ("judge", ["--input", corpus, tmp_path / "more.jsonl"], "input = "),
                                  ("judge", ["--sample", "10"], "sample = 10: expected at least 20")):
        capsys.readouterr()
        assert run(*args(model, ["--sample", "20", *extra])) == 2, extra
        assert f"error: {message}" in capsys.readouterr().err, extra
    base = args()
    judge.log = []
    assert run(*base, "--sample", "30", "--concurrency", "2", "--threshold", "4") == 0  # not fixed: accepted
    assert len(judge.log) == 10 and report_of(out)["folder"]["annotated"] == 30


def test_bad_settings_and_resume_without_annotations_are_refused(tmp_path, judge, capsys, monkeypatch):
    corpus = tmp_path / "corpus.jsonl"
    make_corpus(corpus, 10)
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("No placeholder here. Educational score: <points>")
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    for extra, message in ((["--rubric", rubric], "rubric = "), (["--api-key-env", "NO_SUCH_KEY_VAR"], "api_key_env = "),
                           (["--threshold", "0"], "threshold = 0"), (["--held-out", "1"], "held_out = 1")):
        capsys.readouterr()
        assert run(*common(corpus, judge, tmp_path / "x", *extra)) == 2
        assert f"error: {message}" in capsys.readouterr().err
    assert run("--input", corpus, "--endpoint", judge.url, "--model", "m", "--resume", tmp_path / "new") == 2
    assert "cannot resume" in capsys.readouterr().err and judge.log == []
    with pytest.raises(ConfigError, match="endpoint = 'localhost:8000'"):
        AnnotateConfig(endpoint="localhost:8000", model="m").validate()


def test_a_curation_folder_is_refused(tmp_path, judge, capsys):
    corpus = tmp_path / "corpus.jsonl"
    make_corpus(corpus, 10)
    folder = tmp_path / "curated"
    folder.mkdir()
    (folder / ".groundup-output.json").write_text('{"verb": "data curate"}')
    assert run(*common(corpus, judge, folder)) == 2
    assert f"{folder} holds the output of 'groundup data curate'; 'groundup data annotate'" in capsys.readouterr().err
    assert judge.log == [] and sorted(p.name for p in folder.iterdir()) == [".groundup-output.json"]


def test_agreement_is_null_where_undefined():
    one_class = evaluate_classifier([0.9, 0.8, 0.7], [4, 4, 4], threshold=3)
    assert (one_class["accuracy"], one_class["auc"], one_class["spearman"], one_class["recall"]) == (1.0, None, None, 1.0)
    assert one_class["confusion"] == {"tp": 3, "fp": 0, "fn": 0, "tn": 0}
    assert evaluate_classifier([], [], threshold=3) == {"docs": 0}
    json.dumps(evaluate_classifier([0.2, 0.6], [1, 4], threshold=3), allow_nan=False)  # no NaN in report.json


def test_rate_spaces_requests(tmp_path, judge):
    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "ann"
    make_corpus(corpus, 8)
    assert run(*common(corpus, judge, out, "--sample", "8", "--concurrency", "4", "--rate", "20")) == 0
    times = sorted(judge.times)  # 20 a second: one every 50 ms whatever the concurrency (arrival adds jitter)
    assert len(times) == 8 and times[-1] - times[0] >= 0.28 and np.median(np.diff(times)) >= 0.04


def test_a_groundup_serve_model_is_an_endpoint(tmp_path, capsys):
    """The wire format against the project's own server: its answers arrive and are parsed (a random tiny model
    never writes the verdict line, so each is a malformed verdict, never a bad response), and a prompt over the
    model's context is its 400, not retried."""
    pytest.importorskip("uvicorn")
    from serve_helpers import LiveServer, make_server

    corpus = tmp_path / "corpus.jsonl"
    make_corpus(corpus, 4)
    rubric = tmp_path / "short.txt"
    rubric.write_text("{document}\nEducational score:")
    with LiveServer(make_server()) as live:
        assert run("--input", corpus, "--endpoint", live.url, "--model", "tiny", "--out", tmp_path / "a", "--rubric",
                   rubric, "--max-chars", "30", "--max-tokens", "4", "--max-retries", "1", "--backoff", "0") == 0
        r = report_of(tmp_path / "a")["this_run"]
        assert (r["sent"], r["unparsable"], r["attempt_failures"]) == (4, 4, {"malformed_verdict": 8})
        assert report_of(tmp_path / "a")["settings"]["endpoint"] == f"{live.url}/v1"
        assert run("--input", corpus, "--endpoint", live.url, "--model", "tiny", "--out", tmp_path / "b",
                   "--max-tokens", "4", "--max-consecutive-failures", "2", "--concurrency", "1") == 2
        r = report_of(tmp_path / "b")["this_run"]
        assert (r["sent"], r["failed"], r["attempt_failures"]) == (2, 2, {"rejected_400": 2})
        assert "stopped after 2 documents in a row failed (the last: HTTP 400" in capsys.readouterr().err


def test_retries_back_off_exponentially(tmp_path, judge):
    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "ann"
    make_corpus(corpus, 1)
    judge.plan = {0: ["500", "500", "500"]}
    assert run(*common(corpus, judge, out, "--sample", "1", "--max-retries", "3", "--backoff", "0.1")) == 0
    gaps = np.diff(judge.times)
    assert len(judge.times) == 4 and report_of(out)["this_run"]["scored"] == 1
    assert all(0.1 * 2 ** i <= gap < 0.1 * 2 ** i + 0.15 for i, gap in enumerate(gaps)), gaps  # 0.1, 0.2, 0.4 s
