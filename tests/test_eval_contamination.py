"""Contamination (13-gram overlap, lm-eval's rule), the curation stage that removes it, and the
membership scores Min-K% Prob and Min-K%++."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest

from groundup.cli import main
from groundup.data.decontaminate import NgramIndex, item_text, normalize, task_texts
from groundup.eval.contamination import contamination
from groundup.eval.membership import auc, membership, min_k_plus_plus, min_k_prob
from groundup.benchmarks import get_task
from infer_helpers import model_dir, small_tokenizer, tiny_model


def test_ngram_overlap_equals_lm_eval_janitor():
    pytest.importorskip("lm_eval")
    from lm_eval.decontamination.janitor import Janitor, word_ngrams

    rnd = random.Random(0)
    vocab = "the a Cat dog sat, on THE mat! Éclair naïve x-ray ?? 12 3.5 don't".split()
    items = [" ".join(rnd.choice(vocab) for _ in range(rnd.randint(0, 40))) for _ in range(60)]
    train = []
    for k in range(150):  # spliced from items, shouted, across newlines: some overlap, most not
        a, b = rnd.choice(items).split(), rnd.choice(items).split()
        text = " ".join(a[rnd.randint(0, len(a)):] + ["\n"] + b[: rnd.randint(0, len(b))])
        train.append(text.upper() if k % 3 == 0 else text)
    janitor = Janitor()
    assert all(normalize(t) == janitor.normalize_string(t) for t in items + train)
    grams = [set(word_ngrams(janitor.normalize_string(t), 13)) for t in items]
    expected = {(d, i) for d, t in enumerate(train) for i, g in enumerate(grams)
                if g & set(word_ngrams(janitor.normalize_string(t), 13))}
    index = NgramIndex(items)
    assert len(expected) > 10 and set(index.probe(train)) == expected
    assert index.unchecked == [i for i, g in enumerate(grams) if not g]
    assert index.overlaps(train).tolist() == [any(d == dd for dd, _ in expected) for d in range(len(train))]


def write_jsonl(path, texts, prefix="doc"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": f"{prefix}-{i}", "text": t, "domain": "text"}) + "\n"
                            for i, t in enumerate(texts)))
    return path


def clean_texts(n=40):
    from groundup.corpus import chunk_text, iter_shakespeare

    work = next(iter_shakespeare())
    return list(itertools.islice(chunk_text(work["text"], 2000), n))


def test_planted_items_are_found_and_a_clean_corpus_reports_none(tmp_path):
    (name, ids, texts), = task_texts("arc_easy", limit=20)
    checked = [t for t in texts if len(normalize(t).split()) >= 13]
    planted = clean_texts(30)
    for k, t in enumerate(texts):  # each item's text inside a training document
        planted[k] = planted[k][:500] + "\n" + t + "\n" + planted[k][500:]
    dirty = write_jsonl(tmp_path / "dirty.jsonl", planted)
    report = contamination([dirty], "arc_easy", limit=20)
    r = report["tasks"]["arc_easy"]
    assert r["items"] == 20 and r["unchecked"] == 20 - len(checked)
    assert r["contaminated"] == len(checked) and r["share"] == pytest.approx(len(checked) / 20)
    found = {rec["id"]: rec["doc_ids"] for rec in report["records"]["arc_easy"] if rec["contaminated"]}
    assert all(f"doc-{k}" in found[ids[k]] for k in range(20) if ids[k] in found)

    clean = write_jsonl(tmp_path / "clean.jsonl", clean_texts(30))
    report = contamination([clean], "arc_easy", limit=20, chunk_chars=5000)  # several chunks
    assert report["tasks"]["arc_easy"]["contaminated"] == 0 and report["documents"] == 30


def test_contamination_reads_token_shards_and_the_cli_writes_its_report(tmp_path, capsys):
    from groundup.tokens.shards import tokenize_to_shards

    (_, ids, texts), = task_texts("piqa", limit=5)
    docs = clean_texts(10) + [f"Notes.\n{texts[2]}\nMore notes."]
    src = write_jsonl(tmp_path / "src.jsonl", docs)
    tok_dir = small_tokenizer().save(tmp_path / "tok")
    tokenize_to_shards([src], tok_dir, tmp_path / "tokens")
    out = tmp_path / "contam"
    code = main(["eval", "contamination", "--data", str(tmp_path / "tokens"), "--tasks", "piqa", "--limit", "5",
                 "--out", str(out), "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0 and "piqa" in printed and "20.0%" in printed
    report = json.loads((out / "contamination.json").read_text())["contamination"]
    assert report["tasks"]["piqa"]["contaminated"] == 1 and report["documents"] == 11
    records = [json.loads(line) for line in (out / "items" / "piqa.jsonl").read_text().splitlines()]
    assert [r["contaminated"] for r in records] == [False, False, True, False, False]
    assert records[2]["doc_ids"] == ["doc-10"]


def test_curation_drops_overlapping_documents_as_a_stage(tmp_path):
    from groundup.config import from_dict
    from groundup.data.curate_config import CurateConfig
    from groundup.data.pipeline import curate

    (_, _, texts), = task_texts("arc_easy", limit=10)
    planted = [t for t in texts if len(normalize(t).split()) >= 13][:3]
    docs = clean_texts(20)
    for k, t in enumerate(planted):
        docs[3 * k] = docs[3 * k] + "\n\n" + t
    src = write_jsonl(tmp_path / "raw.jsonl", docs)
    cfg = from_dict(CurateConfig, {"decontaminate": {"tasks": ["arc_easy"], "limit": 10},
                                   "filters": {"text": []}, "dedup": {"minhash": {"enabled": False}}})
    report = curate([src], tmp_path / "curated", cfg, progress=False)
    stage = next(s for s in report["stages"] if s["name"] == "decontaminate")
    assert stage["removed_docs"] == len(planted) == 3
    assert stage["by_domain"]["text"]["reasons"] == {"overlaps_eval_item": 3}
    assert all(e["reason"].startswith("overlaps arc_easy/") for e in stage["examples"])
    assert report["totals"]["docs_kept"] == 20 - 3
    names = [s["name"] for s in report["stages"]]
    assert names.index("decontaminate") < names.index("exact_dedup")
    with pytest.raises(Exception, match="unknown task 'arc_eazy'"):
        from_dict(CurateConfig, {"decontaminate": {"tasks": ["arc_eazy"]}})


def test_min_k_definitions_on_a_constructed_distribution():
    lp = [-0.1, -3.0, -0.2, -5.0, -0.3, -0.4, -0.5, -2.0, -0.6, -0.7]
    assert min_k_prob(lp, 0.2) == pytest.approx((-5.0 - 3.0) / 2)  # the 2 lowest of 10
    assert min_k_prob(lp[:3], 0.2) == -3.0  # at least one token
    assert min_k_prob(lp, 1.0) == pytest.approx(np.mean(lp))
    mu = [-1.0] * 10
    sigma = [2.0] * 9 + [0.5]
    z = [(a + 1.0) / s for a, s in zip(lp, sigma)]  # the last token: -0.7 is +0.6 sigma
    assert min_k_plus_plus(lp, mu, sigma, 0.2) == pytest.approx(np.mean(sorted(z)[:2]))
    # standardising changes the ranking: a token unlikely in absolute terms but typical of a flat distribution
    assert min_k_plus_plus([-8.0, -1.0], [-8.0, -0.1], [0.1, 0.1], 0.5) == pytest.approx(-9.0)
    assert auc([3, 4, 5], [0, 1, 2]) == 1.0 and auc([1, 1], [1, 1]) == 0.5 and auc([0], [1]) == 0.0


def test_membership_scores_a_task_against_unseen_text(tmp_path, capsys):
    tok = small_tokenizer()
    model = tiny_model(9)
    found = membership(model, tok, {"arc_easy": [item_text(i) for i in get_task("arc_easy").items(limit=4)]})
    entry = found["tasks"]["arc_easy"]
    assert entry["min_k_prob"]["task"]["n"] == 4 and entry["min_k_prob"]["reference"]["n"] == 4
    assert 0 <= entry["min_k_plus_plus"]["auc"] <= 1 and len(entry["items"]) == 4
    assert all(s["min_k_prob"] <= 0 for s in entry["items"])
    d = model_dir(tmp_path / "model", model)
    code = main(["eval", "contamination", "--model", str(d), "--tasks", "arc_easy", "--limit", "3",
                 "--reference", "math", "--no-progress"])
    assert code == 0 and "min_k_plus_plus" in capsys.readouterr().out
