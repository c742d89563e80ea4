"""One document's verdict from an OpenAI-compatible endpoint: the rubric prompt, the strict parse, retries.

    client = AnnotationClient(endpoint, model, rubric, api_key, timeout=60, max_retries=3, rate=5)
    outcome = client.annotate(text)   # never raises for what the endpoint does; see Outcome.status

The promise: every request ends in exactly one of these, and `Outcome.events` names each attempt that
failed, so the caller counts them:
- "scored": the answer's last non-empty line is `<verdict label>: N` with N an integer 0..5 (markdown bold
  and a final period tolerated, nothing else); the text before it is the reasons.
- "unparsable": the last of the 1 + max_retries attempts came back, but as junk (not JSON, no message) or
  without a well-formed verdict (the last attempt decides between this and "failed").
- "failed": the last attempt timed out, could not connect, got a retryable HTTP error (408, 409, 429, 5xx)
  after every retry, or a 400/413/422 that no retry would change (a document too long for the server).
- "fatal": 401, 403 or 404: a wrong key, endpoint or model name, the same for every document.
- "stopped": the caller's stop event was set before an answer came (the document stays pending).

The official `openai` client makes each request with its own timeout; its retries are off (max_retries=0)
because this module counts every timeout, HTTP error and malformed answer and shares one budget of
retries between them, backing off exponentially (or as the server's Retry-After asks). A shared
RateLimiter spaces requests from all threads to at most `rate` a second.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

from groundup.errors import DataError

DEFAULT_VERDICT = "Educational score"
DOCUMENT_PLACEHOLDER = "{document}"
MAX_SCORE = 5

# Our own wording of FineWeb-Edu's additive 5-point scale (Penedo et al., 2024): points are added per
# criterion met, and the answer ends with one fixed line that the parser reads.
DEFAULT_RUBRIC = """\
Read the web page extract below and judge its value for teaching, from primary school to the first years of
college. Score it on an additive scale from 0 to 5: start from 0 and add one point for each of these
criteria that the extract meets, in order.

1. It offers at least some basic information relevant to a subject taught in school, even if ads,
   promotions or other material without teaching value surround it.
2. It covers some aspects of a school subject, though not the way teaching material would: it may mix
   useful content with unrelated text, stay superficial, or be poorly organised.
3. It is suitable for teaching and introduces ideas that belong in a school or college curriculum in a
   coherent way, even if it leaves gaps or strays at times, as an introductory textbook section or a
   basic tutorial does.
4. It is clearly useful for teaching at school level: well organised and clearly written, like a
   textbook chapter or a tutorial, with examples or exercises, and with little irrelevant material.
5. It would be an excellent lesson in its own right: its reasoning is detailed and easy to follow, it
   gives deep insight into its subject, and it holds nothing that does not serve teaching.

The extract:
<extract>
{document}
</extract>

First give your reasons in no more than 100 words. Then end your answer with one last line, and
nothing after it, of exactly this form, where <points> is the total from 0 to 5:
Educational score: <points>
"""

RETRYABLE_STATUS = {408, 409, 429}  # and every 5xx, as the openai client's own policy has it
FATAL_STATUS = {401: "the endpoint refused the API key", 403: "the endpoint refused access",
                404: "the endpoint has no such route or model"}
MAX_BACKOFF_S = 30.0
MAX_RETRY_AFTER_S = 60.0


def check_rubric(rubric: str, verdict: str = DEFAULT_VERDICT) -> str | None:
    """Why `rubric` cannot be used (None when it can): it needs the document placeholder once and the
    verdict line the parser reads."""
    n = rubric.count(DOCUMENT_PLACEHOLDER)
    if n != 1:
        return f"it must hold the placeholder {DOCUMENT_PLACEHOLDER} exactly once (found {n})"
    if f"{verdict}:" not in rubric:
        return f"it must ask for the verdict line '{verdict}: <points>' that the answers are parsed by"
    return None


def build_prompt(rubric: str, text: str) -> str:
    return rubric.replace(DOCUMENT_PLACEHOLDER, text)


def parse_verdict(answer: str, verdict: str = DEFAULT_VERDICT) -> tuple[int, str]:
    """(score, reasons) from an answer whose last non-empty line is `verdict: N`, N in 0..5.

    Raises ValueError saying what is wrong: no such last line, a score out of range or not an integer."""
    lines = [line for line in answer.strip().splitlines() if line.strip()]
    if not lines:
        raise ValueError("empty answer")
    last = lines[-1].strip().strip("*_ ").rstrip(".").strip("*_ ")
    label = re.escape(verdict)
    match = re.fullmatch(rf"{label}\s*[*_]*\s*:\s*[*_]*\s*(\S+?)", last, re.IGNORECASE)
    if match is None:
        raise ValueError(f"the last line is not '{verdict}: <points>': {lines[-1].strip()[:80]!r}")
    points = match.group(1)
    if not re.fullmatch(r"[0-9]+", points):
        raise ValueError(f"the score {points!r} is not a whole number from 0 to {MAX_SCORE}")
    score = int(points)
    if score > MAX_SCORE:
        raise ValueError(f"the score {score} is over {MAX_SCORE}")
    return score, "\n".join(lines[:-1]).strip()


class RateLimiter:
    """At most `rate` acquisitions a second across all threads (0: no limit), evenly spaced."""

    def __init__(self, rate: float):
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.next = time.monotonic()
        self.lock = threading.Lock()

    def wait(self, stop: threading.Event) -> bool:
        """Block until this caller's turn; False when `stop` was set first."""
        if not self.interval:
            return not stop.is_set()
        with self.lock:
            now = time.monotonic()
            turn = max(now, self.next)
            self.next = turn + self.interval
        return not stop.wait(max(0.0, turn - now))


@dataclass
class Outcome:
    status: str  # "scored", "unparsable", "failed", "fatal" or "stopped" (see the module docstring)
    score: int | None = None
    reasons: str = ""
    answer: str = ""  # the last answer the endpoint gave (empty when none came back)
    attempts: int = 0  # requests made for this document
    events: list[str] = field(default_factory=list)  # one kind per failed attempt: timeout, http_500, ...
    error: str = ""  # why the last failed attempt failed


class AnnotationClient:
    """Sends one document at a time (thread-safe: one client, many threads) and returns its Outcome."""

    def __init__(self, endpoint: str, model: str, rubric: str, api_key: str, *, verdict: str = DEFAULT_VERDICT,
                 timeout: float = 60.0, max_retries: int = 3, backoff: float = 1.0, rate: float = 0.0,
                 temperature: float = 0.0, max_tokens: int = 512, stop: threading.Event | None = None):
        try:
            import openai  # the `web` extra: the core installs without it
        except ImportError:
            raise DataError("data annotate sends documents with the openai package: pip install 'groundup[web]'") \
                from None
        self.openai = openai
        self.client = openai.OpenAI(base_url=endpoint, api_key=api_key, timeout=timeout, max_retries=0)
        self.model, self.rubric, self.verdict = model, rubric, verdict
        self.max_retries, self.backoff, self.timeout = max_retries, backoff, timeout
        self.temperature, self.max_tokens = temperature, max_tokens
        self.limiter = RateLimiter(rate)
        self.stop = stop or threading.Event()

    def annotate(self, text: str) -> Outcome:
        out = Outcome("failed")
        prompt = build_prompt(self.rubric, text)
        delay = self.backoff
        for attempt in range(self.max_retries + 1):
            waited = attempt and self.stop.wait(min(delay, MAX_BACKOFF_S))  # backoff, 2x per retry
            delay *= 2 if attempt else 1
            if waited or not self.limiter.wait(self.stop):
                out.status = "stopped"  # the run is ending: this document stays pending
                return out
            out.attempts += 1
            kind, detail, retry_after = self._ask(prompt)
            if kind == "answer":
                out.answer = detail
                try:
                    out.score, out.reasons = parse_verdict(detail, self.verdict)
                except ValueError as e:
                    kind, detail = "malformed_verdict", str(e)
                else:
                    out.status, out.error = "scored", ""
                    return out
            out.events.append(kind)
            out.error = detail
            if kind in ("bad_response", "malformed_verdict"):
                out.status = "unparsable"
                continue
            out.status = "fatal" if kind.startswith("fatal") else "failed"
            if kind.startswith(("fatal", "rejected")):  # the same answer every time: no retry
                return out
            if retry_after is not None:
                delay = retry_after
        return out

    def _ask(self, prompt: str) -> tuple[str, str, float | None]:
        """("answer", the answer, None), or (kind, reason, Retry-After seconds or None) for a failed attempt."""
        openai = self.openai
        try:
            response = self.client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": prompt}],
                temperature=self.temperature, max_tokens=self.max_tokens)
        except openai.APITimeoutError:
            return "timeout", f"no answer within {self.timeout:g} s", None
        except openai.APIConnectionError as e:
            return "connection_error", f"cannot connect: {_short(str(e.__cause__ or e))}", None
        except openai.APIStatusError as e:
            code = e.status_code
            reason = f"HTTP {code}: {_short(e.message)}"
            if code in FATAL_STATUS:
                return (f"fatal_{code}", f"{reason} ({FATAL_STATUS[code]}: check --endpoint, --model and the API "
                                         "key's environment variable)", None)
            if code in RETRYABLE_STATUS or code >= 500:
                return f"http_{code}", reason, _retry_after(e.response)
            return f"rejected_{code}", reason, None
        except (ValueError, TypeError, openai.APIResponseValidationError) as e:  # a body that is not JSON
            return "bad_response", f"the endpoint's answer is not JSON ({_short(str(e))})", None
        choices = getattr(response, "choices", None)
        message = getattr(choices[0], "message", None) if isinstance(choices, list) and choices else None
        content = getattr(message, "content", None)
        if not isinstance(content, str):
            return "bad_response", "the endpoint's answer has no choices[0].message.content", None
        return "answer", content, None


def _retry_after(response) -> float | None:
    """Seconds a Retry-After header asks for (capped), or None."""
    try:
        value = float(response.headers.get("retry-after", ""))
    except (AttributeError, TypeError, ValueError):
        return None
    return min(max(value, 0.0), MAX_RETRY_AFTER_S)


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."
