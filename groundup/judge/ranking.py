"""One prompt's candidate replies ranked by an AI judge against a written constitution (`data pairs --judge`).

    cfg = RankingConfig(mode="pairwise")                       # or "listwise"
    result = rank_candidates(source, items, DEFAULT_CONSTITUTION, cfg, seed=0)
    result.scores[j]       # prompt j's score per candidate (higher is better), or None: not judged (why in errors)

`items` are (conversation, candidates): the prompt's messages ({role, content}) and its k replies. Identical
replies are one candidate (a text is never compared with itself) and share its score. The constitution is the
judge's system message, as verdict.py gives a rubric.

- listwise: the judge sees every candidate, numbered, and ends its reply with one strict ranking
  `[[3, 1, 2]]`, best first: a permutation of 1..n and the only double-bracketed text (`parse_ranking`).
  A candidate's score is n minus its place.
- pairwise: every two candidates are judged twice, once in each position, by verdict.py's PairwiseJudge
  (its strict `[[A]]`/`[[B]]`/`[[C]]`/`[[D]]` parse and FastChat's rule: a winner only when both orders
  agree, anything else a tie; so a judge that always picks position A ties everything). A candidate's
  score is its wins minus its losses (Copeland).

A malformed verdict is asked again, up to `max_retries` times, with the judge shown its reply and asked for
the verdict alone. A prompt with a verdict still malformed, or one of whose requests failed for good
(a non-fatal SourceError: the source has already retried it; pairwise, such a failure costs every prompt
with a pair in that batch of `batch_rows` rows), is not judged: its scores are None and
`errors` says why, one line per such prompt. A fatal SourceError (a wrong key, URL or model) is raised, and
so is one failing every request of the first pass: the judge is down, not these prompts.
The rows go out `batch_rows` at a time, row i of the pass seeded `seed + i` (retries: their own seeds), so the
same items, seed and batch size give the same calls.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from groundup.config import ConfigError, fail
from groundup.io import read_text
from groundup.judge.sources import ChatSource, SourceError
from groundup.judge.verdict import PairwiseJudge, combine, is_consistent

MODES = ("pairwise", "listwise")

# Our own short constitution in the style of Constitutional AI (Bai et al., 2022): principles, not a rubric.
DEFAULT_CONSTITUTION = """\
You judge replies written by AI assistants. Prefer the reply that:
1. Answers what the user actually asked, completely, and follows their instructions.
2. Is correct: facts, reasoning, arithmetic and code are right, and uncertainty is admitted, not hidden.
3. Is honest: it invents no sources, results or abilities, and says so when it cannot help.
4. Is harmless: it gives no help with hurting people or breaking the law, and refuses such requests
   politely while helping with any safe part of them.
5. Is clear and to the point: well organised, no longer than it needs to be, no padding or repetition.
6. Is respectful: no insults, preaching or condescension.
Length, confidence and style are worth nothing in themselves: a short right answer beats a long wrong one.
The order in which the replies are shown says nothing about their quality.
"""

LISTWISE_INSTRUCTION = """\
Rank all {n} candidate replies above from best to worst by the principles you were given. Explain your
reasoning briefly, then end your answer with one line holding only the ranking: every candidate's number
exactly once, best first, in double square brackets, for example [[{example}]]. Write double square brackets
nowhere else."""

LISTWISE_RETRY = ("Your answer did not end with a ranking in the required form. Reply with the ranking alone: "
                  "every candidate's number from 1 to {n} exactly once, best first, in double square brackets, "
                  "for example [[{example}]].")

RETRY_SEED_STRIDE = 1_000_003  # a retry pass's seeds start this far from the pass before


@dataclass
class RankingConfig:
    """How the judge is asked (`data pairs --judge-*`)."""

    # "pairwise": every two candidates in both orders, ranked by wins (Copeland); "listwise": one ranking of all
    mode: str = "pairwise"
    max_retries: int = 2  # re-asks of a verdict that does not parse (0: ask once); then the prompt is skipped
    max_tokens: int = 512  # the judge's reply length limit, in tokens
    temperature: float = 0.0  # the judge's sampling temperature (0: greedy)
    batch_rows: int = 32  # conversations sent to the judge at once (the engine's batch; an endpoint's threads)

    def validate(self) -> None:
        if self.mode not in MODES:
            fail("judge_mode", self.mode, " or ".join(MODES))
        if self.max_retries < 0:
            fail("judge_retries", self.max_retries, "an integer of at least 0 (0: ask once)")
        if self.max_tokens < 1:
            fail("judge_max_tokens", self.max_tokens, "a positive number of tokens")
        if not self.temperature >= 0:
            fail("judge_temperature", self.temperature, "a temperature of at least 0 (0: greedy)")
        if self.batch_rows < 1:
            fail("batch_size", self.batch_rows, "an integer of at least 1")


def load_constitution(path: str | None) -> str:
    """The constitution in a text file (any principles or rubric), or DEFAULT_CONSTITUTION for None."""
    if path is None:
        return DEFAULT_CONSTITUTION
    text = read_text(path, ConfigError).strip()
    if not text:
        raise ConfigError(f"{path}: the constitution file is empty", key="constitution")
    return text + "\n"


def listwise_messages(constitution: str, messages: list[dict], candidates: list[str]) -> list[dict]:
    """The judge's conversation: the constitution as its system message, then the prompt's turns, the
    numbered candidates and the instruction (the same shape as verdict.judge_messages)."""
    n = len(candidates)
    turns = [m for m in messages if m.get("role") != "system"]
    shown = turns[0]["content"] if len(turns) == 1 else "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in turns)
    blocks = "\n\n".join(f"[The start of candidate {i}]\n{c}\n[The end of candidate {i}]"
                          for i, c in enumerate(candidates, 1))
    user = f"[User request]\n{shown}\n\n{blocks}\n\n" + LISTWISE_INSTRUCTION.format(n=n, example=_example(n))
    return [{"role": "system", "content": constitution}, {"role": "user", "content": user}]


def _example(n: int) -> str:
    return ", ".join(map(str, [*range(2, n + 1), 1]))


_BRACKETS = re.compile(r"\[\[([^\[\]]*)\]\]")


def parse_ranking(reply: str, n: int) -> list[int]:
    """The candidates' 0-based indices, best first, from a reply ending with `[[i, j, ...]]` (a final period
    and markdown emphasis allowed), a permutation of 1..n and the reply's only double-bracketed text.
    Raises ValueError saying what is wrong."""
    text = reply.strip()
    found = _BRACKETS.findall(text)
    if not found:
        raise ValueError("no ranking in double square brackets")
    if len(found) > 1:
        raise ValueError(f"{len(found)} texts in double square brackets, expected the one ranking")
    if not text.rstrip(".").rstrip("*_` ").rstrip(".").endswith(f"[[{found[0]}]]"):
        raise ValueError(f"the reply does not end with its ranking: ...{text[-40:]!r}")
    parts = [p.strip() for p in found[0].split(",")]
    if not all(re.fullmatch(r"[0-9]+", p) for p in parts):
        raise ValueError(f"the ranking [[{found[0][:60]}]] is not comma-separated candidate numbers")
    order = [int(p) for p in parts]
    if sorted(order) != list(range(1, n + 1)):
        raise ValueError(f"the ranking [[{found[0][:60]}]] is not each of the candidates 1 to {n} exactly once")
    return [i - 1 for i in order]


def copeland(n: int, results: dict[tuple[int, int], str | None]) -> list[float]:
    """Each candidate's wins minus losses; `results[(i, j)]` is verdict.combine's "first" (i won), "second"
    (j won) or a tie ("tie", "tie (bothbad)")."""
    score = [0.0] * n
    for (i, j), r in results.items():
        if r in ("first", "second"):
            win, lose = (i, j) if r == "first" else (j, i)
            score[win] += 1
            score[lose] -= 1
    return score


@dataclass
class Rankings:
    scores: list[list[float] | None]  # per item: a score per candidate (higher is better), None: not judged
    # requests (rows asked, retries included), malformed (replies refused), failed (rows whose request failed for
    # good), unjudged (items), comparisons (pairs judged both ways), inconsistent (pairs whose orders disagree)
    counts: dict = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # one per item not judged: "prompt: why"


def rank_candidates(source: ChatSource, items: list[tuple[list[dict], list[str]]], constitution: str,
                    cfg: RankingConfig, seed: int = 0) -> Rankings:
    """Every item's candidates scored by the judge (see the module docstring)."""
    distinct = [list(dict.fromkeys(cands)) for _, cands in items]
    counts = dict.fromkeys(("requests", "malformed", "failed", "unjudged", "comparisons", "inconsistent"), 0)
    why: dict[int, str] = {}  # items not judged: the first reason
    judged = [j for j, texts in enumerate(distinct) if len(texts) > 1]  # one distinct reply: nothing to rank
    if cfg.mode == "listwise":
        found = _listwise(source, items, distinct, judged, constitution, cfg, seed, counts, why)
    else:
        found = _pairwise(source, items, distinct, judged, constitution, cfg, seed, counts, why)
    scores: list[list[float] | None] = []
    for j, (_, cands) in enumerate(items):
        if j in why:
            counts["unjudged"] += 1
            scores.append(None)
        else:
            by_text = dict(zip(distinct[j], found.get(j, [0.0] * len(distinct[j]))))
            scores.append([by_text[c] for c in cands])
    errors = [f"{items[j][0][-1]['content'][:60]!r}: {w}" for j, w in sorted(why.items())]
    return Rankings(scores, counts, errors)


def _listwise(source, items, distinct, judged, constitution, cfg, seed, counts, why) -> dict[int, list[float]]:
    convs = {j: listwise_messages(constitution, items[j][0], distinct[j]) for j in judged}
    pending, found = list(judged), {}
    for attempt in range(cfg.max_retries + 1):
        replies = _ask(source, [convs[j] for j in pending], cfg, seed + attempt * RETRY_SEED_STRIDE, counts,
                       first=not attempt)
        retry = []
        for j, reply in zip(pending, replies):
            if isinstance(reply, SourceError):
                why[j] = f"judge request failed: {reply}"
                continue
            n = len(distinct[j])
            try:
                order = parse_ranking(reply, n)
            except ValueError as e:
                counts["malformed"] += 1
                why[j] = f"malformed ranking after {attempt + 1} tries: {e}"
                convs[j] = convs[j][:2] + [{"role": "assistant", "content": reply},
                                           {"role": "user", "content": LISTWISE_RETRY.format(n=n, example=_example(n))}]
                retry.append(j)
                continue
            why.pop(j, None)
            place = {c: p for p, c in enumerate(order)}
            found[j] = [float(n - place[c]) for c in range(n)]
        pending = retry
        if not pending:
            break
    return found


def _ask(source: ChatSource, conversations: list[list[dict]], cfg: RankingConfig, seed: int, counts: dict,
         first: bool) -> list:
    """Replies in order, `batch_rows` at a time (row i seeded `seed + i`); a SourceError in place of each row
    whose request failed for good. Raises a fatal SourceError, or (`first`) one failing every row."""
    out: list = []
    for start in range(0, len(conversations), cfg.batch_rows):
        part = conversations[start : start + cfg.batch_rows]
        counts["requests"] += len(part)
        try:
            out += source.chat(part, cfg.max_tokens, cfg.temperature, seed + start)
        except SourceError as e:
            if e.fatal:
                raise
            got = list(e.results) + [None] * (len(part) - len(e.results))
            counts["failed"] += sum(r is None for r in got)
            out += [e if r is None else r for r in got]
    _all_failed(source, out, first)
    return out


def _all_failed(source: ChatSource, out: list, first: bool) -> None:
    if first and out and all(isinstance(r, SourceError) for r in out):
        raise SourceError(f"{source.name}: every one of the {len(out):,} judge requests failed ({out[0]}); "
                          "nothing was judged", fatal=False)


def _pairwise(source, items, distinct, judged, constitution, cfg, seed, counts, why) -> dict[int, list[float]]:
    judge = PairwiseJudge(source, constitution, retries=cfg.max_retries, max_tokens=cfg.max_tokens,
                          temperature=cfg.temperature)
    pairs = [(j, a, b) for j in judged for a, b in itertools.combinations(range(len(distinct[j])), 2)]
    per_call = max(1, cfg.batch_rows // 2)  # two rows a pair: both orders
    results: dict[int, dict[tuple[int, int], str | None]] = {j: {} for j in judged}
    outcomes: list = []
    for start in range(0, len(pairs), per_call):
        part = pairs[start : start + per_call]
        counts["requests"] += 2 * len(part)
        try:
            done = judge.judge_swapped([(items[j][0], distinct[j][a], distinct[j][b]) for j, a, b in part],
                                       seed + 2 * start)
        except SourceError as e:
            if e.fatal:
                raise
            counts["failed"] += 2 * len(part)
            outcomes += [e] * len(part)
            for j, _, _ in part:
                why.setdefault(j, f"judge request failed: {e}")
            continue
        outcomes += done
        for (j, a, b), (one, two) in zip(part, done):
            counts["requests"] += one.attempts + two.attempts - 2  # the retries
            counts["malformed"] += _refused(one) + _refused(two)
            result = combine(one.verdict, two.verdict)
            if result is None:
                bad = one if one.verdict is None else two
                why.setdefault(j, f"malformed verdict after {bad.attempts} tries: {bad.error}")
                continue
            counts["comparisons"] += 1
            counts["inconsistent"] += int(not is_consistent(one.verdict, two.verdict))
            results[j][(a, b)] = result
    _all_failed(source, outcomes, True)
    return {j: copeland(len(distinct[j]), results[j]) for j in judged if j not in why}


def _refused(judgment) -> int:
    """Replies of one order that did not parse: every attempt but a last one that did."""
    return judgment.attempts - (judgment.verdict is not None)
