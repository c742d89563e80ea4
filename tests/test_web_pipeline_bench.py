"""The web pipeline benchmark's own comparison logic (benchmarks/web_pipeline.py), against datatrove itself:
its LanguageFilter reads groundup's lid.176 file (no download) and survives the pickling datatrove's worker
processes need, and the per-page stage diagnosis names the stage each side's pipeline drops a page at."""

import importlib.util
import pickle
import sys
from pathlib import Path

import pytest

pytest.importorskip("datatrove.pipeline.filters")
pytest.importorskip("fasttext")
from datatrove.data import Document  # noqa: E402

from groundup.data.web.language import LanguageConfig, LanguageIdentifier, language_verdict  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "web_pipeline_bench", Path(__file__).resolve().parents[1] / "benchmarks" / "web_pipeline.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # pickle finds the benchmark's classes by module name, as datatrove's workers do
_spec.loader.exec_module(bench)

ENGLISH = ("The old harbour town wakes early. Fishermen check their nets while the bakers open their doors, and "
           "the smell of fresh bread drifts down to the water. Most visitors come for the market, which has been "
           "held in the square every Saturday for more than two hundred years. Farmers bring cheese, apples and "
           "honey from the hills; children chase gulls along the quay. By noon the stalls are packed away, the "
           "tide has turned, and the cafes fill with people who have walked since dawn and want nothing more "
           "than a quiet table in the sun with a view of boats.")
FRENCH = ("Le marché du samedi matin attire toujours autant de monde. Les maraîchers installent leurs étals dès "
          "six heures, et les premiers clients arrivent avant même que le café ne soit prêt. ") * 3
TEXTS = {"kept": ENGLISH, "language": FRENCH, "short": "Fishermen check their nets at dawn.",
         "repeated": "\n".join(["Buy the best shoes and the best hats at the lowest prices today."] * 12),
         "extract": ""}


def test_language_filter_uses_groundups_model_and_pickles():
    filt = pickle.loads(pickle.dumps(bench.datatrove_language_filter()))  # as a datatrove worker receives it
    cfg = LanguageConfig(enabled=True, languages=bench.LANGUAGES, min_score=bench.THRESHOLD)
    ident = LanguageIdentifier()
    for text in (ENGLISH, FRENCH, "short words here"):
        doc = Document(text=text, id="x")
        kept = filt.filter(doc)
        language, score = ident.predict(text)
        assert doc.metadata["language"] == language
        assert doc.metadata["language_score"] == pytest.approx(score, abs=1e-6)
        assert bool(kept) == (language_verdict(language, score, cfg) is None)


def test_stage_diagnosis_names_the_dropping_stage_on_both_sides():
    filters, cfg, ident = bench.datatrove_filters(), bench.curate_config(1), LanguageIdentifier()
    dt = {name: bench.datatrove_stage(text, filters) for name, text in TEXTS.items()}
    gu = {name: bench.groundup_stage(text, cfg, ident) for name, text in TEXTS.items()}
    # six words: one 2-gram holds over 20% of the characters, so Gopher's top-2-gram rule drops it first
    assert dt == {"kept": "kept", "language": "Language ID", "short": "Gopher Repetition:top_2_gram",
                  "repeated": "Gopher Repetition:dup_line_frac", "extract": "extract"}
    assert gu == {"kept": "kept", "language": "language:language:fr", "short": "gopher_repetition:top_2_gram",
                  "repeated": "gopher_repetition:dup_line_frac", "extract": "extract"}
