"""The chat page: one self-contained HTML file (inline CSS and JavaScript, nothing fetched from outside).

A conversation whose replies stream in (fetch + ReadableStream over the chat endpoint's server-sent
events), a stop button (AbortController: the server frees the row at once), a system prompt,
temperature and max-tokens fields, the model or adapter to talk to (from /v1/models), an API key
field (kept in the browser's localStorage) and a new-chat button. With the server's --arena-log, a "Blind
battle" button (or the address /#arena) turns it into a side-by-side battle: one prompt, Model A and Model B
answering at once (POST /arena/battle, then /arena/answer for each side), four vote buttons (A is better, B is
better, Tie, Both are bad: POST /arena/vote), and the two names shown only once the vote is recorded
(serve/votes.py). `HEADERS` adds a Content-Security-Policy that lets the page talk to this server only.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

HEADERS = {"Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                      "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'",
           "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}


@lru_cache(maxsize=1)
def page_html() -> str:
    return resources.files("groundup.serve").joinpath("page.html").read_text(encoding="utf-8")
