"""Items, tasks, and lm-evaluation-harness's prompt assembly, reproduced string for string.

    item = task.items(limit=5)[0]
    item.requests()          # [(context, continuation), ...] exactly as lm-eval's Instances
    task.data_hash           # sha256 of the source files

A `Template` is one lm-eval task YAML in Python: `doc_to_text`, `doc_to_choice`, `doc_to_target`,
`target_delimiter`, `fewshot_delimiter` and `description`. `build_context` is lm-eval's
`ConfigurableTask.fewshot_context` (plain text, no chat template): the description, then for
each few-shot document `text + target_delimiter + answer + fewshot_delimiter`, then the item's
own text. When `doc_to_text` returns an int (Winogrande), the text is the choice at that index
and every choice becomes its own context ("multiple input", lm-eval's partial scoring).

`FewshotSampler` is lm-eval's `ContextSampler` / `FirstNSampler`: one `random.Random(seed)`
shared by the whole split and consumed item after item, so item k's examples depend on the draws
for items 0..k-1, exactly as lm-eval's `build_all_requests` iterates (a `limit` takes a prefix and
keeps the first items' examples). Excluding the item itself draws n + 1 and drops equal documents.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from groundup.benchmarks.data import sha256_files
from groundup.errors import ConfigError


@dataclass
class MCItem:
    """One multiple-choice (or single-continuation log-likelihood) item.

    `contexts` holds one shared context, or one per choice (Winogrande); `continuations` holds one
    per choice with the target delimiter already prepended, or one shared continuation when the
    contexts differ. `gold` indexes the choices."""

    id: str
    contexts: list[str]
    continuations: list[str]
    gold: int
    choices: list[str] | None = None  # lm-eval's doc_to_choice strings (acc_norm divides by their length)

    @property
    def num_choices(self) -> int:
        return max(len(self.contexts), len(self.continuations))

    def requests(self) -> list[tuple[str, str]]:
        """(context, continuation) per choice, in choice order: lm-eval's loglikelihood requests."""
        n = self.num_choices
        ctx = self.contexts if len(self.contexts) == n else self.contexts * n
        cont = self.continuations if len(self.continuations) == n else self.continuations * n
        return list(zip(ctx, cont))


@dataclass
class GenItem:
    """One generative item: generate from `prompt` until a `stop` string, then check the output."""

    id: str
    prompt: str
    target: str | None
    stop: list[str]
    tests: str | None = None
    entry_point: str | None = None


Item = MCItem | GenItem


@dataclass(frozen=True)
class Template:
    """One lm-eval task definition's prompt functions over a document (a dict)."""

    doc_to_text: Callable[[dict], str | int]
    doc_to_target: Callable[[dict], Any]
    doc_to_choice: Callable[[dict], list[str]] | None = None
    target_delimiter: str = " "
    fewshot_delimiter: str = "\n\n"
    description: str | Callable[[dict], str] = ""

    def describe(self, doc: dict) -> str:
        return self.description(doc) if callable(self.description) else self.description


def _answer_text(choices: list[str] | None, target: Any) -> str:
    if choices and isinstance(target, int):
        return choices[target]
    if isinstance(target, list):
        return target[0]
    return target


def render_shot(tpl: Template, doc: dict) -> str:
    """One few-shot example as lm-eval renders it (`build_qa_turn` with an answer)."""
    q = tpl.doc_to_text(doc)
    c = tpl.doc_to_choice(doc) if tpl.doc_to_choice else None
    a = tpl.doc_to_target(doc)
    if isinstance(q, int):  # multiple input: the text is the choice at that index
        q, c = c[q], None
    if a is None or a == "":
        return q
    return q + tpl.target_delimiter + _answer_text(c, a) + tpl.fewshot_delimiter


def build_context(tpl: Template, doc: dict, shots: Sequence[dict]) -> str | list[str]:
    """The prompt for `doc`: description + shots + text; a list (one per choice) for multiple input."""
    prefix = tpl.describe(doc) + "".join(render_shot(tpl, s) for s in shots)
    q = tpl.doc_to_text(doc)
    if isinstance(q, int):
        return [prefix + c for c in tpl.doc_to_choice(doc)]
    return prefix + q


def mc_item(item_id: str, tpl: Template, doc: dict, shots: Sequence[dict]) -> MCItem:
    """lm-eval's `multiple_choice` requests for one document."""
    ctx = build_context(tpl, doc, shots)
    choices = tpl.doc_to_choice(doc)
    target = tpl.doc_to_target(doc)
    if isinstance(ctx, list):  # choices live in the contexts; the rest of the sentence is shared
        return MCItem(item_id, ctx, [tpl.target_delimiter + target], int(tpl.doc_to_text(doc)), list(choices))
    gold = target if isinstance(target, int) else choices.index(target)
    return MCItem(item_id, [ctx], [tpl.target_delimiter + c for c in choices], gold, list(choices))


class FewshotSampler:
    """lm-eval's few-shot samplers: "default" (seeded random) or "first_n" (in order)."""

    def __init__(self, pool: Sequence[dict], seed: int = 1234, *, first_n=False, exclude_self=False, name=""):
        self.pool = list(pool)
        self.rnd = random.Random(seed)
        self.first_n = first_n
        self.exclude_self = exclude_self
        self.name = name

    def _too_many(self, n: int, available: int) -> ConfigError:
        where = f"{self.name}: " if self.name else ""
        message = f"{where}num_fewshot = {n}: only {available} few-shot examples are available"
        return ConfigError(message, key="num_fewshot")

    def sample(self, n: int, doc: dict) -> list[dict]:
        if n <= 0:
            return []
        if self.first_n:
            pool = [x for x in self.pool if x != doc] if self.exclude_self else self.pool
            if n > len(pool):
                raise self._too_many(n, len(pool))
            return pool[:n]
        if n + int(self.exclude_self) > len(self.pool):
            raise self._too_many(n, len(self.pool) - int(self.exclude_self))
        if not self.exclude_self:
            return self.rnd.sample(self.pool, n)
        res = [x for x in self.rnd.sample(self.pool, n + 1) if x != doc][:n]
        if len(res) < n:  # duplicates of the item were drawn: resample without any of them
            res = self.rnd.sample([x for x in self.pool if x != doc], n)
        return res


def check_fewshot(num_fewshot: Any) -> int:
    if isinstance(num_fewshot, bool) or not isinstance(num_fewshot, int) or num_fewshot < 0:
        raise ConfigError(f"num_fewshot = {num_fewshot!r}: expected an integer >= 0", key="num_fewshot")
    return num_fewshot


def check_limit(limit: Any) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ConfigError(f"limit = {limit!r}: expected an integer >= 0 or None", key="limit")
    return limit


@dataclass
class Task:
    """One benchmark: its items (built on demand) and how lm-eval scores them.

    kind: "multiple_choice" (MCItem per question), "loglikelihood" (MCItem with one continuation:
    LAMBADA's last word, scored for greedy accuracy and perplexity) or "generate" (GenItem).
    `split` and `source` say where the items come from; `notes` says where that differs from the
    data lm-eval would download ("" when it does not). `skipped` lists "file:line: reason" for
    records a custom task could not use."""

    name: str
    kind: str
    metrics: list[str]
    random_baseline: float
    num_fewshot: int
    split: str
    source: str
    build: Callable[[int | None, int, int], list[Item]] = field(repr=False)
    files: Callable[[], list[Path]] = field(repr=False)
    notes: str = ""
    filters: list[str] = field(default_factory=list)
    max_gen_toks: int | None = None
    group: str | None = None
    skipped: list[str] = field(default_factory=list)
    # the documents the items are built from and the few-shot pool, in the shape lm-eval reads them (None: a
    # task built otherwise: mmlu over its subjects, custom tasks); eval/lm_eval_export.py writes them out
    docs: Callable[[], list[dict]] | None = field(default=None, repr=False)
    fewshot_docs: Callable[[], list[dict]] | None = field(default=None, repr=False)
    tools: str | None = None  # a generative task the model answers with tools (calculator,python,...); None: none

    def items(self, limit: int | None = None, num_fewshot: int | None = None, seed: int = 1234) -> list[Item]:
        """The first `limit` items (all when None) with `num_fewshot` examples (the task's default
        when None), few-shot draws seeded with `seed` (lm-eval's default fewshot seed is 1234)."""
        shots = self.num_fewshot if num_fewshot is None else check_fewshot(num_fewshot)
        return self.build(check_limit(limit), shots, seed)

    @property
    def data_hash(self) -> str:
        """sha256 of the bytes of every file the items are read from."""

        return sha256_files(self.files())


def lm_task(
    name: str,
    tpl: Template,
    docs: Callable[[], list[dict]],
    pool: Callable[[], list[dict]],
    files: Callable[[], list[Path]],
    *,
    item: Callable[[str, Template, dict, Sequence[dict]], Item] = mc_item,
    first_n: bool = False,
    exclude_self: bool = False,
    **fields: Any,
) -> Task:
    """A Task whose items are `item(id, tpl, doc, shots)` over `docs()`, shots drawn from `pool()`."""

    def build(limit: int | None, num_fewshot: int, seed: int) -> list[Item]:
        selected = docs()[:limit] if limit is not None else docs()
        pool_docs = pool() if num_fewshot else []
        sampler = FewshotSampler(pool_docs, seed, first_n=first_n, exclude_self=exclude_self, name=name)
        return [item(f"{name}/{i}", tpl, doc, sampler.sample(num_fewshot, doc)) for i, doc in enumerate(selected)]

    return Task(name=name, build=build, files=files, docs=docs, fewshot_docs=pool, **fields)
