"""Perplexity filtering as CCNet does it: each document scored by a small language model, then kept or
dropped by its language's head / middle / tail bucket or by a maximum value.

    scorer = PerplexityScorer(PerplexityConfig(enabled=True, kenlm_model="lm/{language}.arpa.bin",
                                               sp_model="lm/{language}.sp.model", cutoffs={"en": [a, b]}))
    value = scorer.score(text, "en")       # perplexity under lm/en.arpa.bin
    scorer.verdict(value, "en")            # "bucket:tail", "above_max", or None to keep

The promise: with a KenLM model, `score` is the number datatrove's `KenlmModel.get_perplexity` gives
for the same model and text (Wenzek et al. 2019's pipeline as datatrove 0.10 implements it). The text
is normalised (lowercase; each number, decimals included, to "0"; accents stripped; typographic and
full-width punctuation mapped to ASCII; non-printing characters removed, newlines among them, so a
document scores as one line, as in CCNet), split into SentencePiece pieces when `sp_model` is given
(else on spaces), and scored by KenLM with <s> and </s> around each line: perplexity =
10 ** (-sum of log10 p / (tokens + 1 per line)), rounded to 0.1 as CCNet and datatrove round it.
(CCNet itself maps each digit to 0, "42" to "00"; datatrove maps the number, "42" to "0".)

With a groundup checkpoint the score is the document's bits per byte under it. The model sits on a
higher layer than data (docs/architecture.md), so the caller hands that scorer in:
`PerplexityScorer(cfg, checkpoint_scorer=groundup.eval.bpb.CheckpointBitsPerByte(cfg.checkpoint, ...))`,
the same windows and log-probabilities as `groundup eval --bpb`.

Buckets follow CCNet's `PerplexityBucket`: with cutoffs [a, b] for the document's language (its 30th and
60th percentiles, see `cutoffs_from_scores`), a value below a is "head", below b "middle", else "tail".
A language without cutoffs, or a document without a score (no model for its language; no bytes), is
unbucketed (None) and kept unless it exceeds `max_value`. Models load on first use, once per process;
a scorer pickles without them (workers are spawned).
"""

from __future__ import annotations

import glob
import importlib.util
import math
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from groundup.config import fail
from groundup.errors import ConfigError
from groundup.layout import is_model_dir, is_run_dir

BUCKETS = ("head", "middle", "tail")
LANGUAGE = "{language}"  # in a model path: replaced by the document's language code
SENTENCEPIECE_MISSING = "SentencePiece tokenisation needs the sentencepiece package: pip install sentencepiece"


@dataclass
class PerplexityConfig:
    enabled: bool = False  # score documents in `domains` and drop them by bucket or value; false: off
    # a KenLM model (.arpa or .bin); "{language}" in the path picks one per language (CCNet's
    # lm_sp/{language}.arpa.bin); a language without its file is not scored
    kenlm_model: str | None = None
    # the SentencePiece model that KenLM model was trained on (same "{language}" rule); none: split on spaces
    sp_model: str | None = None
    # or a groundup model or run directory: the score is bits per byte under it (exactly one of the two)
    checkpoint: str | None = None
    device: str = "cpu"  # where the checkpoint runs: auto, cpu, cuda or cuda:N
    batch_size: int = 8  # windows per forward pass of the checkpoint
    # language -> [head_max, middle_max] in the score's units: below head_max is head, below middle_max
    # middle, else tail (CCNet's cutoff.csv at percentiles 30 and 60; see cutoffs_from_scores); a language
    # not listed is unbucketed and kept
    cutoffs: dict[str, list[float]] = field(default_factory=dict)
    keep_buckets: list[str] = field(default_factory=lambda: list(BUCKETS))  # all three: no bucket filtering
    max_value: float | None = None  # drop documents scoring above this; none: off
    domains: list[str] = field(default_factory=lambda: ["text"])  # domains scored and filtered

    def validate(self) -> None:
        for lang, edges in self.cutoffs.items():
            if len(edges) != 2 or not all(math.isfinite(e) and e >= 0 for e in edges) or edges[0] > edges[1]:
                fail(f"cutoffs.{lang}", edges, "[head_max, middle_max]: two numbers, 0 <= head_max <= middle_max")
        if not self.keep_buckets or any(b not in BUCKETS for b in self.keep_buckets):
            fail("keep_buckets", self.keep_buckets, "a non-empty list of head, middle, tail")
        if set(self.keep_buckets) != set(BUCKETS) and not self.cutoffs:
            fail("keep_buckets", self.keep_buckets, "all three buckets while `cutoffs` is empty (without "
                 "cutoffs no document has a bucket)")
        if self.max_value is not None and not self.max_value > 0:
            fail("max_value", self.max_value, "a positive number, or none for no maximum")
        if not self.domains:
            fail("domains", self.domains, "at least one domain")
        if self.batch_size < 1:
            fail("batch_size", self.batch_size, "at least 1")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            fail("device", self.device, "auto, cpu, cuda or cuda:N")
        if not self.enabled:
            return
        if (self.kenlm_model is None) == (self.checkpoint is None):
            fail("kenlm_model", self.kenlm_model, f"exactly one of kenlm_model and checkpoint (checkpoint = "
                 f"{self.checkpoint!r}) when perplexity filtering is enabled")
        if self.checkpoint is not None:
            if self.sp_model is not None:
                fail("sp_model", self.sp_model, "none with `checkpoint` (a checkpoint has its own tokenizer)")
            if not (is_model_dir(self.checkpoint) or is_run_dir(self.checkpoint)):
                fail("checkpoint", self.checkpoint, "a groundup model directory (model.safetensors + model.toml) "
                     "or training run directory")
            return
        _check_model_path("kenlm_model", self.kenlm_model, "KenLM model file (.arpa or .bin)")
        if self.sp_model is not None:
            if importlib.util.find_spec("sentencepiece") is None:
                raise ConfigError(f"sp_model = {self.sp_model!r}: {SENTENCEPIECE_MISSING}", key="sp_model")
            _check_model_path("sp_model", self.sp_model, "SentencePiece model file (.sp.model)")


def _check_model_path(key: str, value: str, what: str) -> None:
    if LANGUAGE in value:
        if not glob.glob(glob.escape(value).replace(LANGUAGE, "*")):
            fail(key, value, f"a {what} per language; no file matches {value.replace(LANGUAGE, '*')}")
    elif not Path(value).is_file():
        fail(key, value, f"an existing {what}; no such file")


# ----------------------------------------------------------------------------- CCNet's score, as datatrove


NUMBER = re.compile(r"\d+([.,،٫⎖⎗⎘]\d+)?")  # datatrove's \p{Nd}: str patterns' \d is Unicode category Nd
UNICODE_PUNCT = {
    "，": ",", "。": ".", "、": ",", "„": '"', "”": '"', "“": '"', "«": '"', "»": '"', "１": '"', "」": '"',
    "「": '"', "《": '"', "》": '"', "´": "'", "∶": ":", "：": ":", "？": "?", "！": "!", "（": "(", "）": ")",
    "；": ";", "–": "-", "—": " - ", "．": ". ", "～": "~", "’": "'", "…": "...", "━": "-", "〈": "<", "〉": ">",
    "【": "[", "】": "]", "％": "%", "►": "-",
}
NON_PRINTING = re.compile("[" + "".join(map(chr, [*range(0, 32), *range(127, 160)])) + "]")


def normalize(text: str) -> str:
    """CCNet's normalisation in datatrove's order (`KenlmModel.normalize`)."""
    text = NUMBER.sub("0", text.lower())
    text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn").strip()
    text = "".join(UNICODE_PUNCT.get(c, c) for c in text)
    return NON_PRINTING.sub("", text)


def kenlm_perplexity(model, text: str, sp=None) -> float:
    """Perplexity of `text` under a `kenlm.Model`, tokenised by a SentencePieceProcessor `sp` if given."""
    text = normalize(text)
    if sp is not None:
        text = " ".join(sp.encode_as_pieces(text))
    log_score, length = 0.0, 0
    for line in text.split("\n"):  # one line after normalisation; kept as CCNet's per-line sum
        log_score += model.score(line)  # log10 p(line </s> | <s>)
        length += len(line.split()) + 1
    return round(10.0 ** (-log_score / length), 1)


_MODELS: dict[tuple[str, str], object] = {}  # (kind, path) -> loaded model or None (no such file): once per process


def _load(kind: str, path: str | None):
    if path is None:
        return None
    if (kind, path) not in _MODELS:
        if not Path(path).is_file():
            _MODELS[kind, path] = None
        elif kind == "kenlm":
            import kenlm  # optional: the `kenlm` extra

            _MODELS[kind, path] = kenlm.Model(path)
        else:
            if importlib.util.find_spec("sentencepiece") is None:
                raise ConfigError(f"sp_model = {path!r}: {SENTENCEPIECE_MISSING}", key="sp_model")
            import sentencepiece  # optional

            _MODELS[kind, path] = sentencepiece.SentencePieceProcessor(model_file=path)
    return _MODELS[kind, path]


def _model_path(template: str | None, language: str | None) -> str | None:
    """The file for `language`: None where the template needs a language and this one is absent or not a code."""
    if template is None or LANGUAGE not in template:
        return template
    if not language or not re.fullmatch(r"[A-Za-z0-9_-]+", language):
        return None
    return template.replace(LANGUAGE, language)


# ----------------------------------------------------------------------------- the scorer


class PerplexityScorer:
    """Scores documents (KenLM perplexity, or bits per byte under a checkpoint) and judges them by bucket."""

    def __init__(self, cfg: PerplexityConfig, checkpoint_scorer: Callable[[list[str]], list[float]] | None = None):
        """`checkpoint_scorer`: texts -> bits per byte each, required with `cfg.checkpoint` (the model layer's
        `groundup.eval.bpb.CheckpointBitsPerByte`); picklable, loading its model on first use."""
        if cfg.checkpoint is not None and checkpoint_scorer is None:
            raise ConfigError(f"checkpoint = {cfg.checkpoint!r}: scoring with a checkpoint needs the model layer; "
                              "pass checkpoint_scorer=groundup.eval.bpb.CheckpointBitsPerByte(...)", key="checkpoint")
        self.cfg = cfg
        self.checkpoint_scorer = checkpoint_scorer

    @property
    def unit(self) -> str:
        return "bits per byte" if self.cfg.checkpoint is not None else "perplexity"

    def score(self, text: str, language: str | None = None) -> float:
        """Perplexity (KenLM) or bits per byte (checkpoint) of one text; nan where it cannot be scored."""
        if self.cfg.checkpoint is not None:
            return float(self.checkpoint_scorer([text])[0])
        model = _load("kenlm", _model_path(self.cfg.kenlm_model, language))
        sp_path = _model_path(self.cfg.sp_model, language)
        sp = _load("sp", sp_path)
        if model is None or (self.cfg.sp_model is not None and sp is None):
            return math.nan
        return kenlm_perplexity(model, text, sp)

    def score_batch(self, texts: Sequence[str], languages: Sequence[str | None]) -> list[float]:
        """`score` of each text (the checkpoint scores them in batches of windows)."""
        if len(texts) != len(languages):
            raise ValueError(f"{len(texts)} texts but {len(languages)} languages")
        if self.cfg.checkpoint is not None:
            return [float(v) for v in self.checkpoint_scorer(list(texts))] if texts else []
        return [self.score(t, lang) for t, lang in zip(texts, languages)]

    def bucket(self, value: float, language: str | None) -> str | None:
        """head / middle / tail by the language's cutoffs (CCNet's strict `<`); None: unbucketed."""
        edges = self.cfg.cutoffs.get(language) if language else None
        if edges is None or math.isnan(value):
            return None
        return "head" if value < edges[0] else "middle" if value < edges[1] else "tail"

    def verdict(self, value: float, language: str | None) -> str | None:
        """Why the document is dropped ("bucket:<name>" or "above_max"); None keeps it."""
        if math.isnan(value):
            return None
        name = self.bucket(value, language)
        if name is not None and name not in self.cfg.keep_buckets:
            return f"bucket:{name}"
        if self.cfg.max_value is not None and value > self.cfg.max_value:
            return "above_max"
        return None


def cutoffs_from_scores(scores_by_language: dict[str, Sequence[float]],
                        percentiles: tuple[float, float] = (30, 60)) -> dict[str, list[float]]:
    """language -> [head_max, middle_max]: the given percentiles (numpy's linear interpolation) of the
    language's scores, as CCNet's cutoff.csv holds them; nan scores are left out, languages without any
    score too."""
    if not 0 <= percentiles[0] <= percentiles[1] <= 100:
        raise ValueError(f"percentiles {percentiles}: expected 0 <= head <= middle <= 100")
    out = {}
    for language, scores in scores_by_language.items():
        values = np.asarray([s for s in scores if not math.isnan(s)], dtype=np.float64)
        if values.size:
            out[language] = [float(v) for v in np.percentile(values, percentiles)]
    return out
