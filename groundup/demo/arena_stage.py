"""The demo's arena: its models (untrained, base, SFT, aligned) answer the same held-out chat prompts, a
judge compares each pair's answers in both orders, and `groundup arena` fits Bradley-Terry ratings with
bootstrap intervals (OUT/arena/ratings.json, report.md). The report card shows the table.

By default the judge is the demo's own aligned model, held to the verdict alone (`judge_verdict_only`): a
model of this size cannot follow a judging rubric, so its verdicts say more about position bias than about
quality, and the report shows how often it agreed with itself across the swap. `arena.judge` names a real
judge (an OpenAI-compatible endpoint, `URL#model`, or a larger checkpoint), which then judges freely.
"""

from __future__ import annotations

import json
from pathlib import Path

from groundup.demo.config import ArenaDemoConfig
from groundup.io import atomic_write_text

CONTESTANTS = ("untrained", "base", "sft", "aligned")
DOMAINS = ("math", "code", "text")


def write_prompts(chat: Path, dest: Path, per_domain: int) -> Path:
    """The first user turn of the first `per_domain` held-out conversations of each domain, with its category."""
    lines = []
    for domain in DOMAINS:
        path = chat / f"chat-{domain}.heldout.jsonl"
        if not path.is_file():
            continue
        taken = 0
        for line in path.read_text(encoding="utf-8").splitlines():
            messages = json.loads(line).get("messages") or []
            first = next((m for m in messages if m.get("role") == "user"), None)
            if first is None:
                continue
            lines.append(json.dumps({"question_id": f"{domain}-{taken}", "category": domain,
                                     "messages": [{"role": "user", "content": first["content"]}]}))
            taken += 1
            if taken >= per_domain:
                break
    atomic_write_text(dest, "\n".join(lines) + "\n")
    return dest


def arena_arguments(out: Path, cfg: ArenaDemoConfig, prompts: Path) -> list:
    """`groundup arena` run on the demo's models: what the demo runs, and commands.sh records."""
    models = [f"{name}={out / 'models' / name}" for name in CONTESTANTS]
    judge = cfg.judge or str(out / "models" / "aligned")
    overrides = [f"battles_per_pair={cfg.battles_per_pair}", f"max_tokens={cfg.max_tokens}", "judge_max_tokens=16",
                 f"judge_verdict_only={'false' if cfg.judge else 'true'}"]
    return ["arena", "--models", *models, "--prompts", prompts, "--judge", judge, "--out", out / "arena",
            "--baseline", "base", "--bootstrap", cfg.bootstrap, "--quiet", *overrides]
