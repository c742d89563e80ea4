"""Perplexity filtering (data/web/perplexity.py): KenLM scores equal datatrove's `KenlmModel` and a
closed-form bigram computation, CCNet's buckets at their edges, per-language models, a checkpoint's bits
per byte equal to `groundup eval`'s, and config errors that name the key."""

from __future__ import annotations

import importlib.util
import json
import math
import pickle

import numpy as np
import pytest

from groundup.config import from_dict
from groundup.corpus import iter_shakespeare
from groundup.data.web import perplexity
from groundup.data.web.perplexity import (PerplexityConfig, PerplexityScorer, cutoffs_from_scores, kenlm_perplexity,
                                          normalize)
from groundup.errors import ConfigError
from groundup.eval.bpb import CheckpointBitsPerByte, bits_per_byte
from infer_helpers import model_dir, small_tokenizer, tiny_model

kenlm = pytest.importorskip("kenlm", reason="the `kenlm` extra is not installed")

# A bigram model written by hand: unigram probabilities that sum to 1 and, for each context, bigram
# probabilities plus a backoff weight that renormalises the unseen words' unigram mass (Katz).
UNIGRAMS = {"</s>": 0.2, "<unk>": 0.05, "the": 0.2, "cat": 0.1, "sat": 0.1, "on": 0.1, "mat": 0.1, "0": 0.05, "a": 0.1}
BIGRAMS = {("<s>", "the"): 0.5, ("the", "cat"): 0.4, ("the", "mat"): 0.3, ("cat", "sat"): 0.6, ("sat", "on"): 0.7,
           ("on", "the"): 0.8, ("mat", "</s>"): 0.5, ("mat", "0"): 0.2}

DOCS = [
    "The cat sat on the mat.",
    "The Cat sat on the MAT 42 times\nand then 3.14 more, on a mat",
    "Ça, c'est «un» café… très—très “bon”！ \t (１２３)\x00\x9f",
    "",
    "   \n\n  ",
    "on on on the the the cat cat mat mat 0 0 0",
    "A line.\r\nAnother line with é, ü and ñ; 1,000,000 and ٣٤ digits.",
]


def backoffs(unigrams: dict, bigrams: dict) -> dict[str, float]:
    contexts = {h for h, _ in bigrams}
    out = {}
    for h in contexts:
        seen = [w for hh, w in bigrams if hh == h]
        out[h] = (1 - sum(bigrams[h, w] for w in seen)) / (1 - sum(unigrams[w] for w in seen))
    return out


def write_arpa(path, unigrams=UNIGRAMS, bigrams=BIGRAMS) -> str:
    bo = backoffs(unigrams, bigrams)
    ones = [f"-99\t<s>\t{math.log10(bo['<s>']):.7f}" if "<s>" in bo else "-99\t<s>"]
    for w, p in unigrams.items():
        ones.append(f"{math.log10(p):.7f}\t{w}" + (f"\t{math.log10(bo[w]):.7f}" if w in bo else ""))
    twos = [f"{math.log10(p):.7f}\t{h} {w}" for (h, w), p in bigrams.items()]
    lines = ["", "\\data\\", f"ngram 1={len(ones)}"] + ([f"ngram 2={len(twos)}"] if twos else []) + ["", "\\1-grams:"]
    lines += ones + ([""] + ["\\2-grams:"] + twos if twos else []) + ["", "\\end\\", ""]
    path.write_text("\n".join(lines))
    return str(path)


def closed_form_log10(words: list[str]) -> float:
    """log10 p(words </s> | <s>) under UNIGRAMS/BIGRAMS: the bigram where listed, else backoff x unigram."""
    bo = backoffs(UNIGRAMS, BIGRAMS)
    words = [w if w in UNIGRAMS else "<unk>" for w in words] + ["</s>"]
    total, prev = 0.0, "<s>"
    for w in words:
        p = BIGRAMS.get((prev, w), bo.get(prev, 1.0) * UNIGRAMS[w])
        total += math.log10(p)
        prev = w
    return total


@pytest.fixture(scope="module")
def arpa(tmp_path_factory):
    return write_arpa(tmp_path_factory.mktemp("lm") / "en.arpa")


def kenlm_config(**kw) -> PerplexityConfig:
    cfg = PerplexityConfig(enabled=True, **kw)
    cfg.validate()
    return cfg


def test_one_line_document_matches_the_closed_form(arpa):
    text = "The Cat sat on the MAT 42 times"  # normalised: the cat sat on the mat 0 times (times: <unk>)
    words = "the cat sat on the mat 0 times".split()
    assert normalize(text) == " ".join(words)
    log10 = closed_form_log10(words)
    model = kenlm.Model(arpa)
    assert model.score(" ".join(words)) == pytest.approx(log10, abs=1e-5)  # kenlm stores float32
    expected = 10 ** (-log10 / (len(words) + 1))
    got = PerplexityScorer(kenlm_config(kenlm_model=arpa)).score(text, "en")
    assert got == round(expected, 1) and abs(got - expected) <= 0.05 + 1e-6


class _NoSentencePiece:
    """datatrove's SentencePiece slot, passing the text through: its KenlmModel scoring words split on spaces."""

    def tokenize(self, text):
        return text


def datatrove_model(path, tokenizer=None):
    from datatrove.utils.perplexity import KenlmModel

    reference = KenlmModel(model_dataset="local", language="en")
    reference._model = kenlm.Model(path)  # the file given, instead of the Hub download
    reference._tokenizer = tokenizer or _NoSentencePiece()
    return reference


def test_scores_equal_datatrove_kenlm_model(arpa):
    pytest.importorskip("datatrove", reason="datatrove (the `bench` extra) is not installed")
    reference = datatrove_model(arpa)
    play = next(iter(iter_shakespeare()))["text"]
    docs = DOCS + [play[i: i + 2000] for i in range(0, 20_000, 2000)]
    for doc in docs:
        assert normalize(doc) == reference.normalize(doc), doc
    scorer = PerplexityScorer(kenlm_config(kenlm_model=arpa))
    got = scorer.score_batch(docs, ["en"] * len(docs))
    want = [reference.get_perplexity(d) for d in docs]
    assert got == pytest.approx(want, rel=1e-6)
    assert len(set(want)) > 5  # the documents score differently: the comparison has something to compare


def test_language_picks_the_model_and_unknown_languages_are_not_scored(tmp_path):
    write_arpa(tmp_path / "en.arpa")
    other = {("<s>", "a"): 0.4, **{k: v for k, v in BIGRAMS.items() if k[0] != "<s>"}}
    write_arpa(tmp_path / "fr.arpa", {**UNIGRAMS, "cat": 0.05, "a": 0.15}, other)
    scorer = PerplexityScorer(kenlm_config(kenlm_model=str(tmp_path / "{language}.arpa")))
    text = "the cat sat on a mat"
    en, fr = scorer.score(text, "en"), scorer.score(text, "fr")
    assert en == kenlm_perplexity(kenlm.Model(str(tmp_path / "en.arpa")), text)
    assert fr == kenlm_perplexity(kenlm.Model(str(tmp_path / "fr.arpa")), text)
    assert en != fr
    for missing in ("de", None, "", "../en"):
        assert math.isnan(scorer.score(text, missing))
        assert scorer.verdict(scorer.score(text, missing), missing) is None  # unscored: kept


def test_buckets_at_the_cutoff_edges_and_verdicts(arpa):
    scorer = PerplexityScorer(kenlm_config(kenlm_model=arpa, cutoffs={"en": [100.0, 300.0]},
                                           keep_buckets=["head", "middle"], max_value=250.0))
    assert [scorer.bucket(v, "en") for v in (0.0, 99.9, 100.0, 299.9, 300.0, 1e9)] == [
        "head", "head", "middle", "middle", "tail", "tail"]  # CCNet: value < cutoff
    assert scorer.bucket(10.0, "fr") is None and scorer.bucket(10.0, None) is None
    assert scorer.bucket(math.nan, "en") is None
    assert scorer.verdict(300.0, "en") == "bucket:tail"
    assert scorer.verdict(250.1, "en") == "above_max" and scorer.verdict(250.0, "en") is None
    assert scorer.verdict(99.0, "en") is None
    assert scorer.verdict(1000.0, "fr") == "above_max" and scorer.verdict(200.0, "fr") is None
    assert scorer.verdict(math.nan, "en") is None
    open_tail = PerplexityScorer(kenlm_config(kenlm_model=arpa, cutoffs={"en": [100.0, 300.0]}))
    assert open_tail.verdict(1e9, "en") is None  # every bucket kept, no maximum: nothing dropped


def test_cutoffs_from_scores_are_the_30th_and_60th_percentiles():
    scores = {"en": [float(v) for v in range(10, 0, -1)] + [math.nan], "fr": [5.0], "de": [math.nan]}
    cut = cutoffs_from_scores(scores)
    assert cut == {"en": [pytest.approx(3.7), pytest.approx(6.4)], "fr": [5.0, 5.0]}  # linear: 1 + 0.3 x 9
    assert cutoffs_from_scores(scores, (10, 90))["en"] == pytest.approx(list(np.percentile(range(1, 11), [10, 90])))
    cfg = PerplexityConfig(cutoffs=cut)
    cfg.validate()
    buckets = [PerplexityScorer(cfg).bucket(v, "en") for v in range(1, 11)]
    assert buckets.count("head") == 3 and buckets.count("middle") == 3 and buckets.count("tail") == 4


def test_scorer_pickles_and_loads_its_model_once(arpa):
    scorer = PerplexityScorer(kenlm_config(kenlm_model=arpa))
    first = scorer.score("the cat sat", "en")
    loaded = perplexity._MODELS["kenlm", arpa]
    clone = pickle.loads(pickle.dumps(scorer))
    assert clone.score("the cat sat", "en") == first
    assert perplexity._MODELS["kenlm", arpa] is loaded
    assert b"kenlm" not in pickle.dumps(scorer).lower().replace(b"kenlm_model", b"")


# ----------------------------------------------------------------------------- SentencePiece


def test_sp_model_without_sentencepiece_names_the_install(tmp_path, arpa, monkeypatch):
    sp = tmp_path / "en.sp.model"
    sp.write_bytes(b"x")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sentencepiece" else real(name, *a))
    with pytest.raises(ConfigError, match=r"perplexity\.sp_model = .*pip install sentencepiece") as e:
        from_dict(PerplexityConfig, {"enabled": True, "kenlm_model": arpa, "sp_model": str(sp)}, prefix="perplexity.")
    assert e.value.key == "perplexity.sp_model"


def test_sentencepiece_tokenised_scores_equal_datatrove(tmp_path):
    spm = pytest.importorskip("sentencepiece", reason="sentencepiece is not installed (pip install sentencepiece); "
                                                      "the SentencePiece path is not tested")
    pytest.importorskip("datatrove", reason="datatrove (the `bench` extra) is not installed")
    from datatrove.utils.perplexity import SentencePiece
    play = next(iter(iter_shakespeare()))["text"][:60_000]
    lines = [normalize(line) for line in play.splitlines() if line.strip()]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(tmp_path / "en"), vocab_size=200,
                                   minloglevel=2)
    processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "en.model"))
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    counts = {p: 1 for p in pieces if p not in ("<s>", "</s>", "<unk>")}
    pairs: dict[tuple[str, str], int] = {}
    for line in lines:
        tokens = processor.encode_as_pieces(line)
        for p in tokens:
            counts[p] = counts.get(p, 0) + 1
        for pair in zip(["<s>"] + tokens, tokens):
            pairs[pair] = pairs.get(pair, 0) + 1
    total = sum(counts.values()) * 1.25
    unigrams = {"</s>": 0.15, "<unk>": 0.05, **{p: c / total for p, c in counts.items()}}
    contexts = sorted(counts, key=counts.get)[-10:] + ["<s>"]  # half of each frequent context's mass to its pairs
    bigrams = {(h, w): 0.5 * c / sum(n for (hh, _), n in pairs.items() if hh == h)
               for (h, w), c in pairs.items() if h in contexts}
    arpa = write_arpa(tmp_path / "en.arpa", unigrams, bigrams)
    (tmp_path / "en.sp.model").write_bytes((tmp_path / "en.model").read_bytes())

    tokenizer = SentencePiece("local", "en")
    tokenizer._model = processor
    reference = datatrove_model(arpa, tokenizer)
    scorer = PerplexityScorer(kenlm_config(kenlm_model=str(tmp_path / "{language}.arpa"),
                                           sp_model=str(tmp_path / "{language}.sp.model")))
    docs = DOCS + [play[i: i + 1500] for i in range(0, 15_000, 1500)]
    want = [reference.get_perplexity(d) for d in docs]
    assert scorer.score_batch(docs, ["en"] * len(docs)) == pytest.approx(want, rel=1e-6)
    assert len(set(want)) > 5


# ----------------------------------------------------------------------------- a groundup checkpoint


def test_checkpoint_bits_per_byte_equals_eval(tmp_path):
    model = tiny_model(3, max_seq_len=16)  # short windows: the long text spans several
    path = model_dir(tmp_path / "model", model)
    cfg = kenlm_config(checkpoint=str(path), batch_size=3)
    scorer = PerplexityScorer(cfg, checkpoint_scorer=CheckpointBitsPerByte(path, cfg.device, cfg.batch_size))
    texts = ["To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer",
             "def add(a, b):\n    return a + b\n", "Shall I compare thee to a summer's day?", "O"]
    got = scorer.score_batch(texts, ["en", None, "en", "en"])
    for i, text in enumerate(texts):
        one = tmp_path / f"doc{i}.jsonl"
        one.write_text(json.dumps({"text": text}) + "\n")
        want = bits_per_byte(model, small_tokenizer(), one)["bpb"]
        assert got[i] == pytest.approx(want, rel=1e-6)
        assert scorer.score(text, "en") == pytest.approx(want, rel=1e-6)
    assert len(set(got)) == len(texts) and all(v > 0 for v in got)
    clone = pickle.loads(pickle.dumps(scorer))  # a loaded scorer pickles without its model
    assert clone.checkpoint_scorer._loaded is None and clone.score(texts[2], "en") == pytest.approx(got[2], rel=1e-6)
    assert math.isnan(scorer.score("", "en")) and scorer.verdict(scorer.score("", "en"), "en") is None
    assert scorer.unit == "bits per byte"


def test_checkpoint_without_its_scorer_is_refused(tmp_path):
    path = model_dir(tmp_path / "model")
    with pytest.raises(ConfigError, match="checkpoint_scorer") as e:
        PerplexityScorer(kenlm_config(checkpoint=str(path)))
    assert e.value.key == "checkpoint"


# ----------------------------------------------------------------------------- config errors


@pytest.mark.parametrize("values, message", [
    ({"enabled": True}, r"perplexity\.kenlm_model = None: expected exactly one of kenlm_model and checkpoint"),
    ({"enabled": True, "kenlm_model": "{arpa}", "checkpoint": "{tmp}"}, r"perplexity\.kenlm_model = .*exactly one"),
    ({"enabled": True, "kenlm_model": "{tmp}/none.arpa"},
     r"perplexity\.kenlm_model = '.*/none\.arpa': expected an existing KenLM model file .*no such file"),
    ({"enabled": True, "kenlm_model": "{tmp}/lm/{language}.bin"},
     r"perplexity\.kenlm_model = .*per language; no file matches .*/lm/\*\.bin"),
    ({"enabled": True, "checkpoint": "{tmp}"}, r"perplexity\.checkpoint = .*: expected a groundup model directory"),
    ({"enabled": True, "kenlm_model": "{arpa}", "sp_model": "{tmp}/none.sp.model"},
     r"perplexity\.sp_model = .*(no such file|pip install sentencepiece)"),
    ({"cutoffs": {"en": [300.0, 100.0]}}, r"perplexity\.cutoffs\.en = \[300\.0, 100\.0\]: expected \[head_max"),
    ({"cutoffs": {"en": [1.0]}}, r"perplexity\.cutoffs\.en"),
    ({"keep_buckets": ["top"], "cutoffs": {"en": [1.0, 2.0]}}, r"perplexity\.keep_buckets = \['top'\]"),
    ({"keep_buckets": ["head"]}, r"perplexity\.keep_buckets = .*while `cutoffs` is empty"),
    ({"max_value": 0.0}, r"perplexity\.max_value = 0\.0: expected a positive number"),
    ({"batch_size": 0}, r"perplexity\.batch_size = 0"),
    ({"device": "gpu"}, r"perplexity\.device = 'gpu': expected auto, cpu, cuda or cuda:N"),
    ({"domains": []}, r"perplexity\.domains"),
])
def test_config_errors_name_the_key(tmp_path, arpa, values, message):
    filled = json.loads(json.dumps(values).replace("{arpa}", arpa).replace("{tmp}", str(tmp_path)))
    with pytest.raises(ConfigError, match=message):
        from_dict(PerplexityConfig, filled, prefix="perplexity.")


def test_sp_model_with_a_checkpoint_is_refused(tmp_path):
    path = model_dir(tmp_path / "model")
    with pytest.raises(ConfigError, match=r"perplexity\.sp_model = .*none with `checkpoint`"):
        from_dict(PerplexityConfig, {"enabled": True, "checkpoint": str(path), "sp_model": "x.model"},
                  prefix="perplexity.")
