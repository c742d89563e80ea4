"""Realistic web pages with hand-made ground truth, built from the embedded corpus (no network).

Promise: `make_pages(n, seed)` returns the same `n` pages for the same seed. Each page wraps main content
(Shakespeare speeches, a stdlib code listing, arithmetic word problems, or hand-written French, German and
Spanish paragraphs) in the boilerplate a crawl is full of: navigation menus, headers and footers, ads,
cookie banners, sidebars, scripts and styles, comment sections, related-link lists, newsletter forms and
deeply nested layout markup. `truth` is the main content as a reader would copy it: one paragraph (or
heading, list item, table row, code line block) per block, blocks separated by blank lines, table cells
separated by a space. The `<h1>` headline and everything outside the article are not main content.

`charset` names the encoding the page declares in `<meta>`; every character of `html` encodes in it
(characters it cannot hold are written as numeric character references), so a caller writing a WARC
encodes with `html.encode(charset)`.
"""

from __future__ import annotations

import functools
import html as html_lib
import random
import re
from dataclasses import dataclass

from groundup.corpus.math_problems import generate_math_records
from groundup.corpus.shakespeare import iter_shakespeare
from groundup.corpus.stdlib_code import iter_stdlib_code


@dataclass(frozen=True)
class WebPage:
    url: str
    html: str       # the page, declaring `charset` in a <meta> tag
    truth: str      # the main content as a reader would copy it, blocks separated by blank lines
    title: str      # the <title> text
    language: str   # ISO 639-1 code of the main content (a multilingual page: its majority language)
    charset: str    # the declared encoding; html.encode(charset) never fails


# Hand-written paragraphs for the non-English pages (original text, written for these tests).
PARAGRAPHS = {
    "fr": [
        "Le marché du samedi matin attire toujours autant de monde. Les maraîchers installent leurs étals "
        "dès six heures, et les premiers clients arrivent avant même que le café ne soit prêt. On y trouve "
        "des légumes de saison, du fromage de chèvre et du pain encore tiède.",
        "Selon la mairie, la fréquentation a augmenté de près d'un tiers depuis l'ouverture de la nouvelle "
        "halle couverte. Les commerçants se réjouissent de pouvoir travailler à l'abri de la pluie, même si "
        "certains regrettent l'ambiance de la place ouverte.",
        "Les habitants du quartier apprécient surtout la possibilité de discuter avec les producteurs. Chacun "
        "explique volontiers comment il cultive ses tomates ou pourquoi ses pommes ont un goût différent "
        "cette année, après un printemps particulièrement sec.",
        "Pour l'hiver, les organisateurs prévoient des animations pour les enfants et un concours de soupes. "
        "Les recettes gagnantes seront publiées dans le bulletin municipal et affichées à l'entrée de la halle.",
    ],
    "de": [
        "Die Bibliothek im alten Rathaus hat nach zwei Jahren Umbau wieder geöffnet. Neben den Regalen mit "
        "Romanen und Sachbüchern gibt es jetzt einen ruhigen Lesesaal, eine Werkstatt für Jugendliche und "
        "einen kleinen Garten im Innenhof.",
        "Die Leiterin erklärt, dass viele Besucher vor allem zum Arbeiten kommen. Deshalb wurden zusätzliche "
        "Steckdosen eingebaut, und das kostenlose Netz reicht nun bis in die hinterste Ecke des Gebäudes.",
        "Besonders beliebt sind die Abende, an denen Autorinnen und Autoren aus der Region ihre Bücher "
        "vorstellen. Die Plätze sind oft schon Wochen vorher vergeben, obwohl der Eintritt frei ist.",
        "Im kommenden Frühjahr soll außerdem eine Sammlung historischer Stadtpläne gezeigt werden. Die "
        "Karten stammen aus Privatbesitz und werden zum ersten Mal öffentlich ausgestellt.",
    ],
    "es": [
        "El huerto comunitario del barrio cumple diez años este otoño. Lo que empezó como un solar "
        "abandonado es hoy un espacio lleno de bancales, árboles frutales y una pequeña caseta para las "
        "herramientas que comparten todos los vecinos.",
        "Cada parcela la cuida una familia distinta, pero las tareas grandes se hacen en grupo. Los sábados "
        "por la mañana se reparten el riego, la poda y la limpieza de los caminos entre los voluntarios.",
        "Los más pequeños aprenden a plantar semillas y a reconocer las plantas aromáticas. Según los "
        "maestros del colegio cercano, muchos niños prueban por primera vez una verdura que ellos mismos "
        "han cultivado.",
        "Para celebrar el aniversario habrá una comida popular con productos del huerto y música en directo. "
        "La asociación invita a todos los vecinos a traer un plato y a participar en la fiesta.",
    ],
}
HEADINGS = {"fr": "À propos du projet", "de": "Über das Projekt", "es": "Sobre el proyecto", "en": "Background"}
TITLES = {"fr": "Le marché couvert fête sa première année", "de": "Die Bibliothek im Rathaus öffnet wieder",
          "es": "Diez años del huerto comunitario"}
LANG_CHARSETS = {"en": ["utf-8", "utf-8", "windows-1252", "iso-8859-1", "us-ascii", "shift_jis", "koi8-r"],
                 "fr": ["utf-8", "iso-8859-1", "windows-1252", "iso-8859-15"],
                 "de": ["utf-8", "iso-8859-1", "windows-1252"], "es": ["utf-8", "iso-8859-1", "windows-1252"]}

SITES = ["daily-chronicle.example", "quillandpaper.example", "tech-notes.example", "the-meadow.example",
         "harbor-news.example", "studyhall.example"]
NAV = ["Home", "News", "World", "Opinion", "Culture", "Sport", "Science", "Contact", "About us"]
ADS = ["Sponsored: Save 40% on premium garden tools this week only. Shop now!",
       "Advertisement - Try our meal kits free for 14 days. Cancel anytime.",
       "Limited offer: get the new smartphone with zero down payment. Terms apply."]
COOKIE = ("We use cookies to improve your experience, personalise content and analyse our traffic. By "
          "clicking Accept all you agree to the storing of cookies on your device. Manage preferences")
COMMENTS = ["Great article, thanks for sharing! I have been reading this site for years.",
            "I completely disagree with the second point, but it was an interesting read nonetheless.",
            "Does anyone know where I can find the full text of this? The link in the footer seems broken.",
            "First! Also, check out my channel for more content like this."]
RELATED = ["Ten tips for a better morning routine", "Why the city council voted against the new bridge",
           "Review: the best budget headphones of the year", "How to grow tomatoes on a balcony",
           "Interview with the director of the local theatre"]
SCRIPT = ("window.dataLayer = window.dataLayer || []; function gtag(){dataLayer.push(arguments);} "
          "gtag('js', new Date()); gtag('config', 'UA-000000-1'); var msg = 'Please enable JavaScript';")
STYLE = "body { font-family: Georgia, serif; } .cookie-banner { position: fixed; bottom: 0; } nav a { margin: 4px; }"


@functools.lru_cache(maxsize=1)
def _shakespeare_paragraphs() -> tuple[str, ...]:
    """Speeches of 200-900 characters from the modern-spelling works, lines joined by spaces."""
    out = []
    for record in iter_shakespeare():
        if record["edition"] != "modern":
            continue
        for block in record["text"].split("\n\n"):
            para = " ".join(block.split())
            if 200 <= len(para) <= 900 and sum(c.isupper() for c in para) < len(para) / 4:
                out.append(para)
    return tuple(out)


@functools.lru_cache(maxsize=1)
def _code_snippets() -> tuple[tuple[str, str], ...]:
    """(module name, the first function of 6-25 lines) from a few stdlib modules."""
    out = []
    for record in iter_stdlib_code():
        if len(out) >= 200:
            break
        m = re.search(r"^def \w+\(.*?(?=^\S)", record["text"], re.M | re.S)
        if m and not record["id"].startswith("stdlib/encodings/") and "\t" not in m.group(0) \
                and 6 <= m.group(0).rstrip().count("\n") + 1 <= 25:
            out.append((record["id"].removeprefix("stdlib/"), m.group(0).rstrip()))
    return tuple(out)


def _paragraph(rng: random.Random, language: str) -> str:
    """Three sentences drawn from the language's hand-written paragraphs: each page's text is its own, so
    trafilatura's cross-page deduplication (a paragraph seen more than twice) does not remove it."""
    sentences = [s for p in PARAGRAPHS[language] for s in re.split(r"(?<=[.!?]) ", p)]
    return " ".join(rng.sample(sentences, 3))


def _esc(text: str) -> str:
    return html_lib.escape(text, quote=False)


def _content(rng: random.Random, kind: str, language: str) -> tuple[list[tuple[str, str]], str]:
    """The article as blocks (tag, text) and its headline. Tags: p, h2, li, tr (cells joined by tabs), pre."""
    if kind == "shakespeare":
        paras = rng.sample(_shakespeare_paragraphs(), rng.randint(3, 7))
        blocks = [("p", p) for p in paras]
        title = rng.choice(["A speech worth reading twice", "Notes from last night's performance",
                            "What the old plays still teach us", "Lines we keep coming back to",
                            "An evening at the theatre"])
        if rng.random() < 0.5:
            blocks.insert(rng.randint(1, len(blocks) - 1), ("h2", HEADINGS["en"]))
    elif kind == "code":
        module, code = rng.choice(_code_snippets())
        title = f"Reading the source of {module}"
        blocks = [("p", f"This note walks through a short function from the module {module} of the Python "
                        "standard library, explaining what each step does and why it was written that way."),
                  ("pre", code),
                  ("p", f"The function {code[4:].split('(')[0]} is short, but it shows the conventions the "
                        "standard library follows: clear names, early returns and no hidden state between calls.")]
    elif kind == "math":
        problems = list(generate_math_records(rng.randint(3, 5), seed=rng.randint(0, 10**6)))
        title = "Practice problems with worked solutions"
        blocks = [("p", f"Work through each of the {len(problems)} problems of set {rng.randint(100, 999)} "
                        "before reading its solution. The answers are checked at the end of the page, together "
                        "with the method used for each step.")]
        for p in problems:
            blocks += [("p", " ".join(p["text"].split()))]
    elif kind == "multilingual":
        title = "Community news in four languages"
        blocks = [("p", p) for p in rng.sample(_shakespeare_paragraphs(), 3)]
        for lang in ("fr", "de", "es"):
            blocks += [("h2", HEADINGS[lang]), ("p", _paragraph(rng, lang))]
    else:  # a hand-written French, German or Spanish page
        title = TITLES[language]
        blocks = [("p", _paragraph(rng, language)) for _ in range(rng.randint(3, 4))]
        blocks.insert(2, ("h2", HEADINGS[language]))
    # A list or a table inside the article on some pages.
    if rng.random() < 0.4:
        items = rng.sample(["Preheat the oven", "Measure the flour and the sugar", "Whisk the eggs with milk",
                            "Fold everything together gently", "Bake for thirty minutes", "Let it cool"], 4)
        blocks.insert(rng.randint(1, len(blocks)), ("ul", "\n".join(items)))
    if rng.random() < 0.35:
        rows = [("City", "Population", "Founded")] + rng.sample(
            [("Lyon", "522000", "43 BC"), ("Porto", "232000", "300 BC"), ("Bremen", "569000", "787"),
             ("Graz", "291000", "1128"), ("Seville", "684000", "206 BC"), ("Ghent", "265000", "630")], 3)
        blocks.insert(rng.randint(1, len(blocks)), ("table", "\n".join("\t".join(r) for r in rows)))
    return blocks, title


def _render_blocks(blocks: list[tuple[str, str]]) -> tuple[str, str]:
    """(article html, truth) for the blocks."""
    parts, truth = [], []
    for tag, text in blocks:
        if tag == "ul":
            items = text.split("\n")
            parts.append("<ul>" + "".join(f"<li>{_esc(i)}</li>" for i in items) + "</ul>")
            truth += items
        elif tag == "table":
            rows = [r.split("\t") for r in text.split("\n")]
            head = "<tr>" + "".join(f"<th>{_esc(c)}</th>" for c in rows[0]) + "</tr>"
            body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
            parts.append(f"<table><thead>{head}</thead><tbody>{body}</tbody></table>")
            truth += [" ".join(r) for r in rows]
        elif tag == "pre":
            parts.append(f"<pre><code>{_esc(text)}</code></pre>")
            truth.append(text)
        else:
            parts.append(f"<{tag}>{_esc(text)}</{tag}>")
            truth.append(text)
    return "\n".join(parts), "\n\n".join(truth)


def _boilerplate(rng: random.Random, site: str) -> dict[str, str]:
    nav = rng.sample(NAV, rng.randint(4, len(NAV)))
    links = "".join(f'<li><a href="/{w.lower().replace(" ", "-")}">{w}</a></li>' for w in nav)
    related = "".join(f'<li><a href="/r/{i}">{t}</a></li>' for i, t in enumerate(rng.sample(RELATED, 4)))
    comments = "".join(f'<div class="comment"><span class="author">user{rng.randint(1, 999)}</span>'
                       f"<p>{c}</p></div>" for c in rng.sample(COMMENTS, rng.randint(1, 4)))
    return {
        "header": f'<header class="site-header"><a class="logo" href="/">{site}</a>'
                  f'<form class="search"><input type="text" name="q" placeholder="Search"></form></header>',
        "nav": f'<nav class="main-nav"><ul>{links}</ul></nav>',
        "cookie": f'<div class="cookie-banner" id="cookie-consent"><p>{COOKIE}</p><button>Accept all</button></div>',
        "ad": f'<div class="ad advertisement"><p>{rng.choice(ADS)}</p></div>',
        "sidebar": f'<aside class="sidebar"><h3>Popular posts</h3><ul>{related}</ul>'
                   f'<div class="widget"><p>Follow us on social media for daily updates.</p></div></aside>',
        "related": f'<section class="related"><h3>Related articles</h3><ul>{related}</ul></section>',
        "comments": f'<section id="comments" class="comments"><h3>{rng.randint(2, 40)} comments</h3>{comments}'
                    '<form class="comment-form"><textarea name="c"></textarea><button>Post comment</button></form>'
                    "</section>",
        "newsletter": '<div class="newsletter"><p>Subscribe to our newsletter and never miss a story.</p>'
                      '<input type="email" placeholder="you@example.com"><button>Subscribe</button></div>',
        "footer": f'<footer class="site-footer"><p>&copy; {rng.randint(2005, 2025)} {site}. All rights reserved.</p>'
                  '<ul><li><a href="/privacy">Privacy policy</a></li><li><a href="/terms">Terms of use</a></li>'
                  '<li><a href="/imprint">Imprint</a></li></ul></footer>',
    }


def _page(i: int, seed: int) -> WebPage:
    rng = random.Random(f"web-page/{seed}/{i}")
    kind = "multilingual" if i % 23 == 7 else rng.choices(
        ["shakespeare", "code", "math", "fr", "de", "es"], weights=[10, 2, 2, 1, 1, 1])[0]
    language = kind if kind in PARAGRAPHS else "en"
    charset = rng.choice(LANG_CHARSETS[language])
    site = rng.choice(SITES)
    blocks, headline = _content(rng, kind, language)
    article, truth = _render_blocks(blocks)
    bp = _boilerplate(rng, site)
    byline = f'<p class="byline">By Staff Writer &middot; {rng.randint(1, 28)} March {rng.randint(2010, 2025)}</p>'
    wrapper = rng.choice(["article", "main", "div-content", "div-post"])
    if wrapper == "article":
        main = f"<article><h1>{_esc(headline)}</h1>{byline}\n{article}</article>"
    elif wrapper == "main":
        main = f'<main id="main"><h1>{_esc(headline)}</h1>{byline}<div class="entry-content">\n{article}</div></main>'
    else:
        cls = "content" if wrapper == "div-content" else "post-body"
        main = f'<div class="{cls}"><h1>{_esc(headline)}</h1>{byline}<div class="text">\n{article}</div></div>'
    # Layout nesting: a few levels usually, hundreds on some pages.
    depth = rng.choice([2, 5, 10, 30]) if i % 50 != 3 else 300
    main = '<div class="wrap">' * depth + main + "</div>" * depth
    optional = [k for k in ("cookie", "ad", "sidebar", "related", "comments", "newsletter") if rng.random() < 0.6]
    before = [bp["header"], bp["nav"]] + [bp[k] for k in optional if k in ("cookie", "ad")]
    after = [bp[k] for k in optional if k in ("related", "comments", "newsletter")]
    side = bp["sidebar"] if "sidebar" in optional else ""
    title = f"{headline} | {site}"
    meta = (f'<meta charset="{charset}">' if rng.random() < 0.7 else
            f'<meta http-equiv="Content-Type" content="text/html; charset={charset}">')
    doc = (f'<!DOCTYPE html>\n<html lang="{language}"><head>{meta}<title>{_esc(title)}</title>'
           f"<style>{STYLE}</style><script>{SCRIPT}</script></head>\n<body>\n" + "\n".join(before)
           + f'\n<div class="layout">{main}{side}</div>\n' + "\n".join(after) + "\n" + bp["footer"]
           + f"<script>{SCRIPT}</script>\n</body></html>\n")
    doc = doc.encode(charset, "xmlcharrefreplace").decode(charset)
    slug = re.sub(r"[^a-z0-9]+", "-", headline.lower()).strip("-")[:40] or "page"
    return WebPage(url=f"https://{site}/{kind}/{slug}-{i}.html", html=doc, truth=truth, title=title,
                   language=language, charset=charset)


def make_pages(n: int, seed: int = 0) -> list[WebPage]:
    """`n` pages, the same for the same seed (page `i` depends only on `seed` and `i`)."""
    return [_page(i, seed) for i in range(n)]


__all__ = ["PARAGRAPHS", "WebPage", "make_pages"]
