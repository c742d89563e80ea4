"""The built-in benchmarks by name: lm-evaluation-harness's task names, a few aliases, and groups.

A custom task (custom.py) may not take one of these names; the registry (registry.py) resolves them.
"""

from __future__ import annotations

from groundup.benchmarks import generative, multiple_choice

FACTORIES = {**multiple_choice.TASKS, **generative.TASKS}
ALIASES = {
    "gsm8k": "gsm8k_cot",
    "siqa": "social_iqa",
    "socialiqa": "social_iqa",
    "csqa": "commonsense_qa",
    "obqa": "openbookqa",
    "lambada": "lambada_openai",
}
CORE = [
    "arc_easy", "arc_challenge", "hellaswag", "piqa", "sciq", "winogrande",
    "boolq", "openbookqa", "commonsense_qa", "social_iqa", "mmlu",
]  # fmt: skip
GROUPS = {
    "core": CORE,
    "generative": ["gsm8k_cot", "humaneval", "mbpp"],
    **{
        f"mmlu_{category}": [f"mmlu_{s}" for s, c in multiple_choice.MMLU_SUBJECTS.items() if c == category]
        for category in ("stem", "other", "social_sciences", "humanities")
    },
}
