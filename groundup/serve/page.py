"""The chat page: one self-contained HTML file (inline CSS and JavaScript, nothing fetched from outside).

A conversation whose replies stream in (fetch + ReadableStream over the chat endpoint's server-sent
events), a stop button (AbortController: the server frees the row at once), a system prompt,
temperature and max-tokens fields, the model or adapter to talk to (from /v1/models), an API key
field (kept in the browser's localStorage) and a new-chat button. `HEADERS` adds a Content-Security-
Policy that lets the page talk to this server only.
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
