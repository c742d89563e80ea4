"""URL block lists and word rules against datatrove's URLFilter itself, given the same lists."""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path

import pytest

from groundup.config import ConfigError, from_dict
from groundup.data.curate_config import CurateConfig
from groundup.data.web.url_lists import URLBlocker, URLFilterConfig, classify_line

pytest.importorskip("tldextract")
datatrove_filters = pytest.importorskip("datatrove.pipeline.filters")
from datatrove.data import Document  # noqa: E402
from datatrove.utils._import_utils import ASSETS_PATH  # noqa: E402
from tldextract import TLDExtract  # noqa: E402

# datatrove's own word lists (its bundled assets), used as ours: real lists, the same on both sides.
WORD_LISTS = {key: (Path(ASSETS_PATH) / f"{key}.txt").read_text().splitlines()
              for key in ("banned_words", "soft_banned_words", "banned_subwords")}

DOMAINS_FILE = """# my own list
example-blocked.com
bad.co.uk

sub.shady.org
foo.blogspot.com
münchen-bad.de
xn--bcher-kva.com
1.2.3.4
not a domain!
localhost
http//broken
"""
URLS_FILE = """http://news.example.com/bad/article.html
https://fine.org/secret?x=1
# UT1 writes URLs without their scheme:
shop.example.net/hidden/page
"""
UT1 = {"adult": {"domains": "hot-site.com\nadult-only.net\n", "urls": "free.example.org/gallery-42\n"},
       "gambling": {"domains": "casino-royal.net\n", "urls": "http://games.example.org/poker\n"},
       "press": {"domains": "news.example.com\n"}}

HOSTS = ["example-blocked.com", "www.example-blocked.com", "deep.www.example-blocked.com", "EXAMPLE-BLOCKED.COM",
         "Example-Blocked.com.", "example-blocked.com.", "bad.co.uk", "x.bad.co.uk", "co.uk", "shady.org",
         "sub.shady.org", "a.sub.shady.org", "sub.shady.org.", "foo.blogspot.com", "bar.blogspot.com",
         "münchen-bad.de", "xn--mnchen-bad-9ib.de", "bücher.com", "xn--bcher-kva.com", "1.2.3.4", "localhost",
         "[::1]", "hot-site.com", "www.hot-site.com", "adult-only.net", "casino-royal.net", "news.example.com",
         "example.com", "shop.example.net", "fine.org", "free.example.org", "games.example.org",
         "user:pw@sub.shady.org"]
PORTS = ["", ":8080"]
SCHEMES = ["http://", "https://", "HTTP://", ""]
PATHS = ["/", "", "/bad/article.html", "/hidden/page", "/Free-PORN-videos", "/xxx", "/gallery-42", "/sex/cum/x",
         "/SEX/CUM", "/path?q=casino&ok=1", "/a/b#frag", "/2-girls-1-cup", "/secret?x=1", "/poker"]


def _urls() -> list[str]:
    urls = [s + h + p + path for h, p, s, path in itertools.product(HOSTS, PORTS, SCHEMES, PATHS)]
    listed = [line for line in URLS_FILE.splitlines() if line and not line.startswith("#")]
    return urls + listed + ["http://" + u for u in listed] + ["//example-blocked.com/x", "http://EXAMPLE.com\\x"]


URLS = _urls()
pytestmark = pytest.mark.filterwarnings("ignore:The 'registered_domain' property is deprecated")
# datatrove's reasons, in our names
KINDS = {"domain": "domain", "subdomain": "domain", "url": "url", "hard_blacklisted": "banned_word",
         "soft_blacklisted": "soft_banned_words", "blacklisted_subword": "banned_subword"}


@pytest.fixture
def lists(tmp_path) -> dict[str, Path]:
    (tmp_path / "my-domains.txt").write_text(DOMAINS_FILE)
    (tmp_path / "my-urls.txt").write_text(URLS_FILE)
    for category, files in UT1.items():
        for name, text in files.items():
            (tmp_path / "ut1" / category).mkdir(parents=True, exist_ok=True)
            (tmp_path / "ut1" / category / name).write_text(text)
    (tmp_path / "ut1" / "README").write_text("not a category")
    (tmp_path / "ut1" / "empty").mkdir()
    return {"domains": tmp_path / "my-domains.txt", "urls": tmp_path / "my-urls.txt", "ut1": tmp_path / "ut1"}


def _config(lists, **change) -> URLFilterConfig:
    settings = {"block_lists": [str(lists["domains"]), str(lists["urls"]), str(lists["ut1"])],
                "categories": ["adult", "gambling"], **WORD_LISTS, "soft_word_threshold": 2}
    cfg = URLFilterConfig(**{**settings, **change})
    cfg.validate()
    return cfg


def _datatrove(lists):
    """URLFilter with the same lists, its bundled domain/URL lists off, suffixes from the same offline copy."""
    ut1 = [lists["ut1"] / c for c in ("adult", "gambling")]
    domain_lines = lists["domains"].read_text().splitlines(keepends=True) + [
        line for c in ut1 for line in (c / "domains").read_text().splitlines(keepends=True)]
    url_lines = lists["urls"].read_text().splitlines(keepends=True) + [
        line for c in ut1 for line in (c / "urls").read_text().splitlines(keepends=True)]
    # Blank lines left out: datatrove would keep "" as a listed domain, and "" is the registered domain
    # tldextract gives IP addresses and bare suffixes, so one blank line would block all of them.
    domain_lines, url_lines = ([line for line in lines if line.strip()] for lines in (domain_lines, url_lines))
    filt = datatrove_filters.URLFilter(soft_word_threshold=2, extra_domains=domain_lines, extra_urls=url_lines,
                                       **WORD_LISTS, use_integrated_lists=False)
    filt.tldextractor = TLDExtract(suffix_list_urls=(), cache_dir=None)  # datatrove's would fetch the list
    return filt


def _datatrove_kind(filt, url) -> str | None:
    result = filt.filter(Document(text="", id=url, metadata={"url": url}))
    return None if result is True else KINDS[result[1]]


def test_datatrove_exact_mode_gives_datatrove_verdict_and_rule_for_every_url(lists):
    blocker, reference = URLBlocker(_config(lists, datatrove_exact=True)), _datatrove(lists)
    counts = {}
    for url in URLS:
        ours = blocker.check(url)
        kind = ours.split(":")[0] if ours else None
        assert kind == _datatrove_kind(reference, url), url
        counts[kind] = counts.get(kind, 0) + 1
    assert len(URLS) > 1000 and all(counts.get(k, 0) >= 100 for k in ("domain", "banned_word", "soft_banned_words",
                                                                     "banned_subword", None)), counts
    assert counts["url"] >= 4, counts  # the listed URLs, each exactly as written


def test_default_mode_blocks_a_superset_and_closes_datatrove_gaps(lists):
    blocker, reference = URLBlocker(_config(lists)), _datatrove(lists)
    extra = 0
    for url in URLS:
        ours, theirs = blocker.check(url), _datatrove_kind(reference, url)
        assert theirs is None or ours is not None, url
        extra += theirs is None and ours is not None
    assert extra > 50
    gaps = {  # datatrove passes each of these; the lists mean to block them
        "http://EXAMPLE-BLOCKED.COM/": "domain:my-domains.txt",  # host names have no case
        "http://a.sub.shady.org/": "domain:my-domains.txt",  # a listed domain's subdomain
        "http://1.2.3.4/": "domain:my-domains.txt",  # a listed IP address (tldextract has no domain for it)
        "https://shop.example.net/hidden/page": "url:my-urls.txt",  # UT1's scheme-less URL entry
        "http://free.example.org/gallery-42": "url:ut1/adult",
        "https://games.example.org/poker": "url:ut1/gambling",  # the scheme differs from the listed one
        "http://site.org/Free-PORN-videos": "banned_word",  # words have no case either
        "http://site.org/SEX/CUM": "soft_banned_words",
    }
    for url, reason in gaps.items():
        assert _datatrove_kind(reference, url) is None and blocker.check(url) == reason, url


def test_reasons_name_the_list(lists):
    blocker = URLBlocker(_config(lists, blocked_domains=["inline.com"], blocked_urls=["http://x.org/a"]))
    assert blocker.check("http://www.example-blocked.com/") == "domain:my-domains.txt"
    assert blocker.check("http://news.example.com/bad/article.html") == "url:my-urls.txt"
    assert blocker.check("http://news.example.com/other") is None  # ut1/press is not a chosen category
    assert blocker.check("http://hot-site.com/x") == "domain:ut1/adult"
    assert blocker.check("http://casino-royal.net/") == "domain:ut1/gambling"
    assert blocker.check("http://inline.com/") == "domain:blocked_domains"
    assert blocker.check("http://x.org/a") == "url:blocked_urls"
    assert blocker.check("http://site.org/2-girls-1-cup") == "banned_subword"
    assert blocker.check("http://site.org/recipes/soup") is None
    every = URLBlocker(_config(lists, categories=[]))  # empty: every category of the folder
    assert every.check("http://news.example.com/other") == "domain:ut1/press"


def test_bad_lines_are_skipped_and_counted(lists):
    blocker = URLBlocker(_config(lists))
    blocker.load()
    assert blocker.bad_lines == {"my-domains.txt": 3}
    assert blocker.entries == {"my-domains.txt": 7, "my-urls.txt": 3, "ut1/adult": 3, "ut1/gambling": 2}
    assert blocker.bad_line_examples[0] == f"{lists['domains']}:10: contains whitespace: 'not a domain!'"
    assert [e.split(": ")[1] for e in blocker.bad_line_examples] == [
        "contains whitespace", "not a domain or URL", "not a URL with a host name"]


@pytest.mark.parametrize("line, kind", [("example.com", "domain"), ("münchen.de", "domain"),
                                        ("a-b_c.co.uk.", "domain"),
                                        ("http://x.org", "url"), ("x.org/a/b", "url"), ("//x.org/a", "url"),
                                        ("http://[::1]:80/", "url"), ("  # note", "blank"), ("", "blank"),
                                        ("localhost", "bad"), ("a b.com", "bad"), ("/just/a/path", "bad"),
                                        ("ex ample", "bad"), ("x.org:8080", "bad")])
def test_line_classes(line, kind):
    assert classify_line(line)[0] == kind


def test_blocker_pickles_without_its_lists(lists):
    blocker = URLBlocker(_config(lists))
    blocker.check("http://example.org/")
    state = pickle.dumps(blocker)
    assert b"example-blocked" not in state
    assert pickle.loads(state).check("http://www.hot-site.com/") == "domain:ut1/adult"


def test_config_errors_name_the_key(lists, tmp_path):
    cases = [({"block_lists": [str(tmp_path / "missing.txt")]}, "block_lists", "missing.txt does not exist"),
             ({"block_lists": [str(lists["ut1"])], "categories": ["shopping"]}, "categories", "no shopping"),
             ({"categories": ["adult"]}, "categories", "UT1 folders"),
             ({"blocked_domains": ["not a domain"]}, "blocked_domains", "domains"),
             ({"banned_words": ["--"]}, "banned_words", "letter or digit"),
             ({"soft_word_threshold": 0}, "soft_word_threshold", "at least 1")]
    for change, key, words in cases:
        with pytest.raises(ConfigError) as err:
            URLFilterConfig(**change).validate()
        assert err.value.key == key and words in str(err.value), str(err.value)
    with pytest.raises(ConfigError, match="url.blocked_words.: renamed banned_words"):  # renamed keys say so
        from_dict(CurateConfig, {"url": {"blocked_words": ["x"]}})
    with pytest.raises(ConfigError) as err:
        from_dict(CurateConfig, {"url": {"block_lists": [str(tmp_path / "nope")]}})
    assert err.value.key == "url.block_lists"
