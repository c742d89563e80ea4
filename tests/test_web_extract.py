"""HTML to text (groundup/data/web/extract.py) and the test pages it is measured on (corpus/web_pages.py).

Pinned: each backend's exact text on a small page (boilerplate gone, paragraphs kept), tables and lists as
text, the trafilatura backend byte-equal to datatrove's Trafilatura step and to `trafilatura.extract` with
datatrove's arguments, the shingle metric on hand-computed cases, hostile pages (100k nesting, 10 MB on one
line, a dying backend) counted without raising, and config errors naming the key.
"""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("trafilatura")
pytest.importorskip("resiliparse")

from groundup.config import ConfigError  # noqa: E402
from groundup.corpus.web_pages import HEADINGS, make_pages  # noqa: E402
from groundup.data.web.extract import (  # noqa: E402
    BACKENDS, BackendError, Crashed, ExtractConfig, Extracted, Extractor, Sandbox, mean_scores, shingle_scores)

P1 = ("The river rose slowly through the night, and by morning the lower fields were under water. Farmers "
      "moved their animals to the hill before dawn.")
P2 = ("Nobody in the village could remember a flood like it. The old bridge held, but the road to the market "
      "town stayed closed for three days.")
P3 = ("When the water finally went down, neighbours came together to clear the mud from the school and the "
      "church hall.")
SMALL = f"""<!DOCTYPE html><html><head><title>Flood &amp; recovery | Valley News</title>
<script>var banner = "Please enable JavaScript to see this site";</script><style>p {{ color: red; }}</style></head>
<body>
<nav><ul><li><a href="/">Home</a></li><li><a href="/news">News</a></li>
<li><a href="/contact">Contact</a></li></ul></nav>
<div class="cookie-banner" id="cookie-consent"><p>We use cookies to improve your experience. By clicking Accept you
agree to our cookie policy.</p><button>Accept</button></div>
<article><h1>The night the river rose</h1>
<p>{P1}</p>
<p>{P2}</p>
<table><tr><th>Day</th><th>Level</th></tr><tr><td>Monday</td><td>4.2 m</td></tr></table>
LIST
<p>{P3}</p>
</article>
<section id="comments" class="comments"><h3>2 comments</h3><div class="comment"><p>So glad everyone is safe, thanks
for the report!</p></div></section>
<aside class="sidebar"><h3>Popular</h3><ul><li><a href="/a">Ten tips for gardeners</a></li></ul></aside>
<footer><p>Copyright 2024 Valley News Ltd. All rights reserved.</p><a href="/privacy">Privacy policy</a></footer>
</body></html>"""
UL = "<ul><li>Sandbags at the school</li><li>Blankets at the church hall</li></ul>"
OL = UL.replace("ul>", "ol>")


def extract(backend: str, html: str, **kw) -> Extracted | None:
    with Extractor(ExtractConfig(backend=backend, **kw)) as extractor:
        return extractor(html)


def test_small_page_boilerplate_dropped_paragraphs_kept():
    traf = extract("trafilatura", SMALL.replace("LIST", UL))
    assert traf == Extracted(
        text=f"The night the river rose\n{P1}\n{P2}\n| Day | Level | \n|---|---|\n| Monday | 4.2 m | \n"
             f"- Sandbags at the school\n- Blankets at the church hall\n{P3}",
        title="Flood & recovery | Valley News")
    res = extract("resiliparse", SMALL.replace("LIST", OL))
    assert res == Extracted(
        text=f"The night the river rose\n\n{P1}\n\n{P2}\n\nDay\t\tLevel\nMonday\t\t4.2 m\n"
             f"  1. Sandbags at the school\n  2. Blankets at the church hall\n\n{P3}",
        title="Flood & recovery | Valley News")
    for out in (traf, res):  # navigation, cookie banner, comments, sidebar, footer, script, style: all gone
        for junk in ("Home", "cookies", "So glad", "Popular", "gardeners", "Copyright", "Privacy", "JavaScript",
                     "color"):
            assert junk not in out.text


def test_tables_and_lists_as_text():
    for backend, lst, items in [("trafilatura", UL, ["- Sandbags at the school", "- Blankets at the church hall"]),
                                ("resiliparse", OL, ["1. Sandbags at the school", "2. Blankets at the church hall"])]:
        text = extract(backend, SMALL.replace("LIST", lst)).text
        lines = [line.strip(" |") for line in text.splitlines()]
        assert [line for line in lines if "Monday" in line or "Level" in line] in (
            [["Day | Level", "Monday | 4.2 m"], ["Day\t\tLevel", "Monday\t\t4.2 m"]])
        assert all(item in lines for item in items), (backend, lines)
    # resiliparse's main-content heuristics drop short <ul> lists as navigation (a known backend trait).
    assert "Sandbags" not in extract("resiliparse", SMALL.replace("LIST", UL)).text


def test_trafilatura_backend_equals_datatrove_and_direct_call():
    import trafilatura
    from trafilatura.deduplication import LRU_TEST

    pages = [p.html for p in make_pages(10, seed=3)] + [SMALL.replace("LIST", UL)]
    pages += pages[:3] * 3  # a 4th sighting: trafilatura drops what it saw more than twice, the same in all three
    ours = [(e.text if e else None) for e in map(Extractor(ExtractConfig(timeout_s=0)), pages)]
    LRU_TEST.clear()
    direct = [trafilatura.extract(h, favor_precision=True, include_comments=False, deduplicate=True) for h in pages]
    assert ours == direct
    assert ours[-1] != ours[2]  # the repeat really was deduplicated
    sandboxed = Extractor(ExtractConfig(timeout_s=5))
    assert [(e.text if e else None) for e in map(sandboxed, pages[:4])] == direct[:4]
    sandboxed.close()
    datatrove = pytest.importorskip("datatrove.pipeline.extractors")
    LRU_TEST.clear()
    assert [datatrove.Trafilatura().extract(h) for h in pages] == ours


def test_shingle_scores_hand_computed():
    # predicted tokens: Home The cat sat on the mat -> 4 shingles; truth: 7 shingles, 3 shared (case matters).
    p, r, f1 = shingle_scores("Home. The cat sat on the mat.", "The cat sat on the mat, the cat sat on")
    assert (p, r) == (3 / 4, 3 / 7) and f1 == pytest.approx(6 / 11)
    # multiset: the repeated shingle counts once as a hit, four times as extra.
    assert shingle_scores("x y z w x y z w", "x y z w") == (0.2, 1.0, pytest.approx(1 / 3))
    assert shingle_scores("a b", "a b") == (1.0, 1.0, 1.0)  # under n tokens: one short shingle
    assert shingle_scores("", "") == (1.0, 1.0, 1.0)
    assert shingle_scores("", "a b c d") == (0.0, 0.0, 0.0)
    # corpus means as evaluate.py: an empty prediction is left out of precision, counted in recall.
    scores = mean_scores([("", "x y z w"), ("x y z w", "x y z w")])
    assert scores == {"precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3)}


def test_hostile_markup_returns_quickly_and_is_counted():
    deep = "<html><body>" + "<div>" * 100_000 + "<p>deep text here</p>" + "</div>" * 100_000 + "</body></html>"
    line = "<html><body><p>" + "word " * 2_000_000 + "</p></body></html>"  # 10 MB on one line
    res = Extractor(ExtractConfig(backend="resiliparse", timeout_s=1, max_html_bytes=0))
    start = time.perf_counter()
    assert res(deep, url="https://x.example/deep") is None  # resiliparse alone: minutes
    assert time.perf_counter() - start < 8
    assert res.counts["timeout"] == 1 and res.last_skip == "timeout: resiliparse ran over 1 s (timeout_s) " \
                                                          "(https://x.example/deep)"
    assert res(line).text.startswith("word word")  # a fresh child after the kill
    res.close()
    for backend in BACKENDS:
        with Extractor(ExtractConfig(backend=backend)) as extractor:  # default: 10 MB is over max_html_bytes
            start = time.perf_counter()
            assert extractor(line) is None and extractor.counts == {"too_big": 1}
            assert time.perf_counter() - start < 1
            assert extractor.last_skip == "too_big: 10000033 bytes > max_html_bytes=5242880"
    weird = ["\ud800<p>lone surrogate</p>", "\x00" * 1000, bytes(range(256)).decode("latin-1") * 500, "<" * 10**6,
             "<!--" + "x" * 10**5, "<table>" + "<tr><td>x" * 150_000, "<p>" + "<b>" * 10**5 + "x", "<svg>" * 5000]
    for backend in BACKENDS:
        with Extractor(ExtractConfig(backend=backend, timeout_s=1)) as extractor:
            start = time.perf_counter()
            [extractor(html) for html in weird]  # none raises, each is extracted or counted
            assert time.perf_counter() - start < 15 and sum(extractor.counts.values()) == len(weird)
            assert set(extractor.counts) <= {"extracted", "no_content", "error", "timeout"}
            if backend == "trafilatura":  # the 150,000-row table takes it ~20 s
                assert extractor.counts["timeout"] == 1
    traf = Extractor(ExtractConfig(backend="trafilatura", max_html_bytes=0))
    start = time.perf_counter()
    assert traf(deep) is None and traf(line) is None  # lxml refuses both: no main content, no exception
    assert time.perf_counter() - start < 8 and traf.counts == {"no_content": 2}
    traf.close()


def dies_on_boom(html: str) -> str:
    """A backend for the sandbox test (module level: the sandbox's child process unpickles it)."""
    if html == "boom":
        os._exit(3)
    return html.upper()


def test_backend_errors_and_crashes_are_counted():
    extractor = Extractor(ExtractConfig(timeout_s=0))
    extractor._fn = lambda html: (_ for _ in ()).throw(RecursionError("maximum recursion depth exceeded"))
    assert extractor("<p>x</p>") is None and extractor.counts == {"error": 1}
    assert extractor.last_skip == "error: trafilatura: RecursionError: maximum recursion depth exceeded"
    assert extractor(b"<p>bytes</p>") is None and extractor.counts["error"] == 2

    sandbox = Sandbox(dies_on_boom, timeout_s=5)
    assert sandbox("ok") == "OK"
    with pytest.raises(BackendError, match="^AttributeError: 'int' object has no attribute 'upper'$"):
        sandbox(3)
    with pytest.raises(Crashed):
        sandbox("boom")
    assert sandbox("again") == "AGAIN"  # restarted
    sandbox.close()


def test_config_errors_name_the_key():
    ExtractConfig().validate()
    for kw, key in [({"backend": "lxml"}, "backend"), ({"min_chars": -1}, "min_chars"),
                    ({"max_html_bytes": 1.5}, "max_html_bytes"), ({"timeout_s": -1}, "timeout_s"),
                    ({"timeout_s": float("nan")}, "timeout_s"), ({"favor_precision": "yes"}, "favor_precision")]:
        with pytest.raises(ConfigError) as err:
            Extractor(ExtractConfig(**kw))
        assert err.value.key == key and str(err.value).startswith(f"{key} = ")
    assert str(pytest.raises(ConfigError, ExtractConfig(backend="lxml").validate).value) == \
        "backend = 'lxml': expected one of ['trafilatura', 'resiliparse']"


def test_min_chars_and_empty_pages():
    html = SMALL.replace("LIST", UL)
    with Extractor(ExtractConfig(min_chars=10_000, timeout_s=0)) as extractor:
        assert extractor(html) is None and extractor.counts == {"too_short": 1}
        assert extractor("") is None and extractor("<html></html>") is None
        assert extractor.counts == {"too_short": 1, "no_content": 2}


def test_make_pages_deterministic_and_realistic():
    pages = make_pages(60)
    assert [p.html for p in pages] == [p.html for p in make_pages(60)]
    assert [p.html for p in make_pages(5, seed=1)] != [p.html for p in pages[:5]]
    assert {p.language for p in pages} == {"en", "fr", "de", "es"}
    assert len({p.charset for p in pages}) >= 5
    multilingual = [p for p in pages if "/multilingual/" in p.url]
    assert multilingual and all(HEADINGS[lang] in m.truth for m in multilingual for lang in ("fr", "de", "es"))
    for p in pages:
        p.html.encode(p.charset)  # the declared charset holds every character
        assert f"charset={p.charset}" in p.html or f'charset="{p.charset}"' in p.html
        assert "\n\n" in p.truth and "We use cookies" not in p.truth and "All rights reserved" not in p.truth
        assert "cookie" in p.html or "<nav" in p.html
    assert any('<div class="wrap">' * 300 in p.html for p in pages)  # deeply nested layout
    assert any("<table>" in p.html and "City Population Founded" in p.truth.split("\n\n") for p in pages)
    assert any("<li>Bake for thirty minutes</li>" in p.html and "Bake for thirty minutes" in p.truth.split("\n\n")
               for p in pages)


def test_extractor_pickles_for_other_processes():
    import pickle

    extractor = Extractor(ExtractConfig(backend="resiliparse"))
    extractor(SMALL)
    copy = pickle.loads(pickle.dumps(extractor))
    assert copy.cfg == extractor.cfg and copy.counts == {"extracted": 1}
    assert copy(SMALL) == extractor(SMALL)
    extractor.close(), copy.close()
