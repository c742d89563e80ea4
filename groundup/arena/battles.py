"""Battles between models, judged by an AI judge both ways round: the log `groundup arena` rates.

    cfg = BattleConfig(battles_per_pair=20, max_tokens=256)
    log = run_battles({"base": "out/base", "sft": "out/sft", "gpt": "http://host/v1#gpt"}, Path("prompts.jsonl"),
                      judge="http://localhost:8000/v1#judge", out=Path("arena"), cfg=cfg)

    OUT/settings.json     what defines the battles (models, prompt file hash, judge, rubric hash, sampling):
                          a rerun must keep them (the budget may grow); a change is refused naming the key
    OUT/plan.jsonl        the battles planned, in order (battle_plan.py says how they are chosen)
    OUT/answers.jsonl     {model, question_id, answer, tstamp}: each model answers each prompt once
    OUT/battles.jsonl     one row per judged order (FastChat's columns and more, below)
    OUT/unparsable.jsonl  the orders whose verdict stayed malformed after every retry (winner null, error)
    OUT/judging.json      counts: battles, orders judged, unparsable, malformed replies, agreement across the swap

A battles.jsonl row (arena/battle_log.py reads it): battle_id, question_id, category, model_a, model_b (the
planned order, the same in both rows of a battle), winner (model_a, model_b, tie or "tie (bothbad)": this
row's verdict in those columns), judge, swap (false: model_a's answer was shown first, as A; true: model_b's
was), prompt (the last user turn), answer_a (model_a's answer), answer_b, verdict_raw (the judge's last reply,
whose [[A]] names the answer shown first), attempts (replies asked for) and tstamp.

The promises:
- Every battle is judged in both orders (verdict.py); both rows are kept, so the report can show how often
  the judge agrees with itself across the swap, and `combined_battles` gives FastChat's one-row-per-battle
  view (the same winner both ways wins, anything else is a tie).
- Resumable: every answer and row is on disk (flush + fsync) before the next, and a rerun (same settings)
  judges only the orders not yet logged, answers only what is not cached, and drops (and counts) a torn
  last line. A killed and rerun arena ends with the same rows as one that ran through: each model's answer
  to prompt i is seeded `seed + i`, and each judged order `seed + its position in the plan`.
- An endpoint that fails for good stops the run with its reason after the answers that came back are
  saved: a rerun continues. A contestant or judge is opened (a checkpoint loaded) only when needed.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from groundup.arena.battle_plan import (Battle, LogStats, LogWriter, Prompt, active_round, model_pairs, pair_of,
                                        read_log, read_prompts, uniform_plan)
from groundup.config import fail
from groundup.data.annotate import shown_url
from groundup.errors import DataError
from groundup.io import atomic_write_json, read_json, sha256_bytes, sha256_file, writer_lock
from groundup.judge.sources import ChatSource, SourceError, is_endpoint, open_source
from groundup.judge.verdict import (A, B, BOTHBAD, TIE, VERDICT_ONLY, PairwiseJudge, combine, is_consistent,
                                    load_rubric)

SETTINGS_FILE, PLAN_FILE, ANSWERS_FILE = "settings.json", "plan.jsonl", "answers.jsonl"
BATTLES_FILE, UNPARSABLE_FILE, SUMMARY_FILE = "battles.jsonl", "unparsable.jsonl", "judging.json"
WINNER = {A: "model_a", B: "model_b", TIE: "tie", BOTHBAD: "tie (bothbad)"}  # a verdict, model_a shown first
SWAPPED = {A: "model_b", B: "model_a", TIE: "tie", BOTHBAD: "tie (bothbad)"}  # model_b's answer shown first
# May differ on a rerun: the budget (it may only grow) and how requests are sent.
FREE_KEYS = ("battles_per_pair", "battles", "batch_size", "concurrency", "rate", "timeout", "api_key_env", "device",
             "dtype")
# What each log's rows must hold to be read back (other lines are skipped and counted).
_ORDER_KEYS = {"battle_id": str, "swap": bool, "model_a": str, "model_b": str, "attempts": int}
_KEYS = {PLAN_FILE: {"battle_id": str, "question_id": str, "model_a": str, "model_b": str, "round": int},
         ANSWERS_FILE: {"model": str, "question_id": str, "answer": str},
         BATTLES_FILE: {**_ORDER_KEYS, "winner": str}, UNPARSABLE_FILE: _ORDER_KEYS}


@dataclass
class BattleConfig:
    """What `groundup arena` runs when it fights battles (rating them is arena/ratings.py)."""

    battles_per_pair: int = 10  # battles each pair of models fights; 0: the total `battles` decides
    battles: int = 0  # total battles over all pairs (overrides battles_per_pair x pairs); 0: per pair
    # uniform: every pair gets its share in turn; active: a round at a time, to the pairs whose win rate is
    # least certain (battle_plan.py)
    sampler: str = "uniform"
    max_tokens: int = 256  # longest answer of a contestant, in tokens
    temperature: float = 0.0  # contestants' sampling temperature; 0: greedy
    seed: int = 0  # battle choice, answer and judge sampling
    judge_max_tokens: int = 512  # longest judge reply
    judge_temperature: float = 0.0  # the judge's temperature; 0: greedy (MT-Bench's choice)
    judge_retries: int = 2  # further asks after a malformed verdict before it is counted unparsable; 0: none
    # an in-process judge answers with the verdict alone, its decoding constrained to [[A]], [[B]], [[C]] or
    # [[D]], so a small model's verdict always parses (no reasoning is written); false: free reasoning, then
    # the verdict. Endpoints are asked as usual.
    judge_verdict_only: bool = False
    rubric: str = ""  # the judge's rubric or constitution, a text file; "": the built-in DEFAULT_RUBRIC
    categories: list[str] = field(default_factory=list)  # prompt categories to use; []: all
    batch_size: int = 16  # conversations per call to a model or the judge
    concurrency: int = 8  # requests in flight at once to one endpoint
    rate: float = 0.0  # requests per second to one endpoint; 0: no limit
    timeout: float = 120.0  # seconds to wait for one endpoint answer (the client retries 3 times)
    api_key_env: str = "OPENAI_API_KEY"  # environment variable holding endpoints' API key (never a flag)
    device: str = "cpu"  # where in-process checkpoints run
    dtype: str = "float32"  # their weights' dtype

    def validate(self) -> None:
        for key, low in (("battles_per_pair", 0), ("battles", 0), ("max_tokens", 1), ("judge_max_tokens", 1),
                         ("judge_retries", 0), ("batch_size", 1), ("concurrency", 1), ("seed", 0)):
            if getattr(self, key) < low:
                fail(key, getattr(self, key), f"an integer of at least {low}")
        if not self.battles_per_pair and not self.battles:
            fail("battles", self.battles, "a positive total, or battles_per_pair > 0")
        if self.sampler not in ("uniform", "active"):
            fail("sampler", self.sampler, "'uniform' or 'active'")
        for key in ("temperature", "judge_temperature", "rate"):
            if not getattr(self, key) >= 0:
                fail(key, getattr(self, key), "a number of at least 0")
        if not self.timeout > 0:
            fail("timeout", self.timeout, "seconds, more than 0")


def run_battles(models: dict[str, str], prompts: Path, judge: str, out: Path, cfg: BattleConfig,
                progress: bool = True) -> Path:
    """Plan, answer and judge the battles (what OUT does not hold yet); returns OUT/battles.jsonl."""
    cfg.validate()
    if len(models) < 2:
        fail("models", sorted(models), "at least two NAME=SOURCE")
    for name in models:
        if not name.strip() or name != name.strip():
            fail("models", name, "a model name without surrounding spaces")
    rubric = load_rubric(cfg.rubric)
    plist, bad_prompts = read_prompts(prompts, cfg.categories)
    if not plist:
        which = f" of categories {', '.join(cfg.categories)}" if cfg.categories else ""
        raise DataError(f"{prompts}: no usable prompt{which}"
                        + (f" ({len(bad_prompts)} lines skipped, first: {bad_prompts[0]})" if bad_prompts else ""))
    out = Path(out)
    with writer_lock(out, ".arena.lock"):
        _check_settings(out, _settings(models, prompts, judge, cfg, rubric))
        arena = _Arena(models, plist, judge, out, cfg, rubric, progress)
        try:
            arena.run()
        finally:
            arena.close()
            summary = arena.summary()
            summary["prompts_skipped"] = len(bad_prompts)
            summary["prompts_skipped_examples"] = bad_prompts[:20]
            atomic_write_json(out / SUMMARY_FILE, summary)
    return out / BATTLES_FILE


def _shown(spec: str) -> str:
    """A source as it may be written down: an endpoint without credentials (its #model kept)."""
    if not is_endpoint(spec):
        return spec
    url, _, model = spec.partition("#")
    return shown_url(url) + (f"#{model}" if model else "")


def _settings(models: dict[str, str], prompts: Path, judge: str, cfg: BattleConfig, rubric: str) -> dict:
    fixed = {k: v for k, v in asdict(cfg).items() if k not in FREE_KEYS and k != "rubric"}
    return {"format": "groundup-arena-battles-1", "models": {n: _shown(s) for n, s in sorted(models.items())},
            "prompts_sha256": sha256_file(prompts), "judge": _shown(judge),
            "rubric_sha256": sha256_bytes(rubric.encode()), **fixed}


def _check_settings(out: Path, settings: dict) -> None:
    path = out / SETTINGS_FILE
    if path.exists():
        saved = read_json(path, dict)
        for key, value in settings.items():
            if saved.get(key) != value:
                fail(key, value, f"{saved.get(key)!r}, the value {out} was started with (choose another --out "
                                 "to change it)")
    atomic_write_json(path, settings)


class _Arena:
    def __init__(self, models: dict[str, str], prompts: list[Prompt], judge: str, out: Path, cfg: BattleConfig,
                 rubric: str, progress: bool):
        self.models, self.prompts, self.judge_spec, self.out, self.cfg = models, prompts, judge, out, cfg
        self.rubric, self.progress = rubric, progress
        self.by_qid = {p.question_id: p for p in prompts}
        self.pairs = model_pairs(list(models))
        self.total = cfg.battles or cfg.battles_per_pair * len(self.pairs)
        self.stats = LogStats()
        plan_rows = self._read(PLAN_FILE)
        self.plan = [Battle(**{k: r[k] for k in ("battle_id", "question_id", "model_a", "model_b", "round")})
                     for r in plan_rows]
        if len(self.plan) > self.total:
            key = "battles" if cfg.battles else "battles_per_pair"
            fail(key, getattr(cfg, key), f"a budget of at least the {len(self.plan)} battles {out} already planned")
        logged = self._read(BATTLES_FILE) + self._read(UNPARSABLE_FILE)
        self.done = {(r["battle_id"], r["swap"]): r for r in logged}
        self.answers = {(r["model"], r["question_id"]): r["answer"] for r in self._read(ANSWERS_FILE)}
        self.writers = {name: LogWriter(out / name) for name in _KEYS}
        self.sources: dict[str, ChatSource] = {}
        self.judge: PairwiseJudge | None = None

    def _read(self, name: str) -> list[dict]:
        rows, stats = read_log(self.out / name, _KEYS[name])
        self.stats.torn += stats.torn
        self.stats.bad += stats.bad
        return rows

    def close(self) -> None:
        for w in self.writers.values():
            w.close()

    def run(self) -> None:
        while True:
            pending = [i for i, b in enumerate(self.plan)
                       if (b.battle_id, False) not in self.done or (b.battle_id, True) not in self.done]
            if pending:
                self._answer(pending)
                self._judge(pending)
                continue
            new = self._plan_more()
            if not new:
                return
            for b in new:
                self.writers[PLAN_FILE].write(b.to_dict())
            self.plan += new

    def _plan_more(self) -> list[Battle]:
        planned = Counter(pair_of(b) for b in self.plan)
        left = self.total - len(self.plan)
        if left <= 0:
            return []
        if self.cfg.sampler == "uniform":
            return uniform_plan(self.pairs, self.prompts, self.total, self.cfg.seed, planned)
        score: dict[tuple[str, str], tuple[float, int]] = {}
        for battle in combined_battles(list(self.done.values())):
            pair = pair_of(Battle(battle["battle_id"], battle["question_id"], battle["model_a"], battle["model_b"]))
            wins, n = score.get(pair, (0.0, 0))
            w = battle["winner"]
            first_won = 0.5 if w not in ("model_a", "model_b") else float(battle[w] == pair[0])
            score[pair] = (wins + first_won, n + 1)
        round_no = max((b.round for b in self.plan), default=-1) + 1
        return active_round(self.pairs, self.prompts, min(left, len(self.pairs)), self.cfg.seed, round_no, planned,
                            score)

    # ------------------------------------------------------------------ answers

    def _source(self, name: str) -> ChatSource:
        if name not in self.sources:
            cfg = self.cfg
            self.sources[name] = open_source(self.models[name], cfg.device, dtype=cfg.dtype,
                                             api_key_env=cfg.api_key_env, timeout=cfg.timeout, rate=cfg.rate,
                                             concurrency=cfg.concurrency, name=name)
        return self.sources[name]

    def _answer(self, pending: list[int]) -> None:
        """Every answer the pending battles need that is not cached, each model's prompts in index order."""
        need: dict[str, set[int]] = {}
        for i in pending:
            b = self.plan[i]
            for model in (b.model_a, b.model_b):
                if (model, b.question_id) not in self.answers:
                    need.setdefault(model, set()).add(self.by_qid[b.question_id].index)
        total = sum(map(len, need.values()))
        with tqdm(total=total, desc="answers", unit="answer", disable=not self.progress or not total) as bar:
            for model in sorted(need):
                for run in _runs(sorted(need[model]), self.cfg.batch_size):
                    convs = [self.prompts[k].messages for k in run]
                    try:
                        replies = self._source(model).chat(convs, self.cfg.max_tokens, self.cfg.temperature,
                                                           self.cfg.seed + run[0])
                    except SourceError as e:
                        for k, reply in zip(run, e.results):
                            if reply is not None:
                                self._keep_answer(model, self.prompts[k], reply)
                        raise
                    for k, reply in zip(run, replies):
                        self._keep_answer(model, self.prompts[k], reply)
                    bar.update(len(run))

    def _keep_answer(self, model: str, prompt: Prompt, answer: str) -> None:
        self.answers[(model, prompt.question_id)] = answer
        self.writers[ANSWERS_FILE].write({"model": model, "question_id": prompt.question_id, "answer": answer,
                                          "tstamp": time.time()})

    # ------------------------------------------------------------------ judging

    def _judge(self, pending: list[int]) -> None:
        """Judge every order of the pending battles not yet logged; order (i, swap) is seeded seed + 2i + swap."""
        if self.judge is None:
            cfg = self.cfg
            source = open_source(self.judge_spec, cfg.device, dtype=cfg.dtype, api_key_env=cfg.api_key_env,
                                 timeout=cfg.timeout, rate=cfg.rate, concurrency=cfg.concurrency,
                                 name=_shown(self.judge_spec),
                                 structured=VERDICT_ONLY if cfg.judge_verdict_only else None)
            self.judge = PairwiseJudge(source, self.rubric, cfg.judge_retries, cfg.judge_max_tokens,
                                       cfg.judge_temperature)
        orders = [2 * i + s for i in pending for s in (0, 1) if (self.plan[i].battle_id, bool(s)) not in self.done]
        with tqdm(total=len(orders), desc="judging", unit="order", disable=not self.progress) as bar:
            for run in _runs(orders, 2 * self.cfg.batch_size):
                items, shown = [], []
                for o in run:
                    b, swap = self.plan[o // 2], bool(o % 2)
                    first, second = (b.model_b, b.model_a) if swap else (b.model_a, b.model_b)
                    prompt = self.by_qid[b.question_id]
                    items.append((prompt.messages, self.answers[(first, b.question_id)],
                                  self.answers[(second, b.question_id)]))
                    shown.append((b, swap, first, second, prompt))
                for (b, swap, first, second, prompt), item, j in zip(shown, items,
                                                                      self.judge.judge(items, self.cfg.seed + run[0])):
                    answer_a, answer_b = (item[2], item[1]) if swap else (item[1], item[2])
                    row = {"battle_id": b.battle_id, "question_id": b.question_id, "category": prompt.category,
                           "model_a": b.model_a, "model_b": b.model_b,
                           "winner": (SWAPPED if swap else WINNER)[j.verdict] if j.verdict is not None else None,
                           "judge": self.judge.name, "swap": swap, "prompt": prompt.text, "answer_a": answer_a,
                           "answer_b": answer_b, "verdict_raw": j.raw, "attempts": j.attempts, "tstamp": time.time()}
                    if j.verdict is None:
                        row["error"] = j.error
                    self.writers[BATTLES_FILE if j.verdict is not None else UNPARSABLE_FILE].write(row)
                    self.done[(b.battle_id, swap)] = row
                bar.update(len(run))

    def summary(self) -> dict:
        rows = list(self.done.values())
        judged = [r for r in rows if r.get("winner") is not None]
        combined = combined_battles(rows)
        return {"judge": _shown(self.judge_spec), "models": sorted(self.models), "battles_planned": len(self.plan),
                "orders_judged": len(judged), "unparsable": len(rows) - len(judged),
                "malformed_replies": sum(r["attempts"] - (r.get("winner") is not None) for r in rows),
                "battles_both_orders": len(combined),
                "consistent": sum(c["consistent"] for c in combined),
                "inconsistent": sum(not c["consistent"] for c in combined),
                "answers": len(self.answers), "torn_lines": self.stats.torn, "bad_lines": len(self.stats.bad),
                "bad_line_examples": self.stats.bad[:20]}


def _runs(indices: list[int], limit: int) -> list[list[int]]:
    """Sorted indices cut into runs of consecutive values, at most `limit` long (one seeded call each)."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1 and len(runs[-1]) < limit:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def combined_battles(rows: list[dict]) -> list[dict]:
    """One row per battle judged in both orders with a parsed verdict, in the planned order's columns:
    battle_id, question_id, category, model_a, model_b, winner (the same model both ways wins; two "both
    bad" stay "tie (bothbad)"; anything else is a tie, as FastChat's MT-Bench pairwise rule has it),
    consistent (whether the two orders named the same outcome)."""
    orders: dict[str, dict[bool, dict]] = {}
    for r in rows:
        if r.get("winner") in WINNER.values() and r.get("battle_id"):
            orders.setdefault(r["battle_id"], {})[bool(r["swap"])] = r
    out = []
    for battle_id, both in orders.items():
        if len(both) != 2:
            continue
        first, second = both[False], both[True]
        one = {w: v for v, w in WINNER.items()}[first["winner"]]
        two = {w: v for v, w in SWAPPED.items()}[second["winner"]]  # the verdict as given, A = model_b
        winner = combine(one, two)
        out.append({"battle_id": battle_id, "question_id": first["question_id"], "category": first.get("category"),
                    "model_a": first["model_a"], "model_b": first["model_b"],
                    "winner": {"first": "model_a", "second": "model_b"}.get(winner, winner),
                    "consistent": is_consistent(one, two)})
    return out
