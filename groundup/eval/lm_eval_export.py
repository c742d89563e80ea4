"""`groundup eval --export-lm-eval DIR`: each task's offline documents as lm-evaluation-harness task files.

    export_lm_eval(resolve_tasks("arc_easy,gsm8k"), "lm_tasks/")
    # then, with no Hub access, lm-eval itself scores the same items:
    HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 lm_eval --model hf --model_args pretrained=<groundup export hf dir> \\
        --include_path lm_tasks --tasks groundup_arc_easy,groundup_gsm8k_cot

The promise: lm-eval run on DIR builds the very requests `groundup eval` builds (the same documents, in the
same order, through lm-eval's own prompt code and few-shot sampler with its default seed, 1234) and so reports
the same numbers for the same model; tests/test_eval_export.py runs lm-eval itself to check it.

    DIR/<task>/<split>.jsonl    the documents groundup builds the task's items from, one JSON object a line, in
                                the shape lm-eval downloads them; a second split when the few-shot examples come
                                from another split than the items (see the task's `notes`)
    DIR/<task>/<task>.yaml      `include:` lm-eval's own YAML for the task (an absolute path into the installed
                                lm_eval), then overrides only where the data lives and what groundup reports:
                                task groundup_<task> (a name of its own, so that a broken include can never fall
                                back to lm-eval's Hub task), tag [] (lm-eval's groups and tags never pick it up),
                                dataset_path json with data_files naming the files above, test_split = the items'
                                split whatever its name (lm-eval leaves the item out of its own few-shot examples
                                exactly when fewshot_split equals test_split, as groundup does when the examples
                                come from the items' split), fewshot_split = the examples' split, no other split,
                                num_fewshot (groundup's count), and for multiple-choice tasks
                                metric_list = the metrics groundup reports (lm-eval computes acc_bytes, and
                                acc_norm where its YAML omits it, when the list names them)
    DIR/groundup_mmlu.yaml      with mmlu: lm-eval's group over the 57 subject tasks, weighted by size (groundup's
                                mmlu numbers are over all items)
    DIR/export.json, README.md  what was exported, from which files (sha256), and the command to run

Paths in the YAML files are absolute (lm-eval resolves data files against its working directory): export again
where lm-eval runs; it needs no model. Custom TOML tasks have no lm-eval definition to include: they are
skipped and listed. Generation settings other than lm-eval's (--max-gen-tokens) go on lm-eval's command line
(`--gen_kwargs`), which the README shows.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path
from typing import Sequence

from groundup import __version__
from groundup.benchmarks import MCItem, get_task
from groundup.benchmarks.multiple_choice import MMLU_SUBJECTS
from groundup.errors import DataError
from groundup.eval.harness import choice_metric_names
from groundup.io import atomic_dir, atomic_write_json, atomic_write_text
from groundup.layout import claim_output_dir, mark_output_dir

VERB = "eval --export-lm-eval"
PREFIX = "groundup_"
MANIFEST_FILE = "export.json"
MMLU_GROUP_FILE = "groundup_mmlu.yaml"

# groundup task -> (lm-eval YAML under lm_eval/tasks/, split of the items, split of the few-shot pool or None
# when lm-eval's YAML carries its examples itself: gsm8k-cot's and mbpp's fixed ones)
LM_EVAL_TASKS: dict[str, tuple[str, str, str | None]] = {
    "arc_easy": ("arc/arc_easy.yaml", "test", "validation"),
    "arc_challenge": ("arc/arc_challenge.yaml", "test", "validation"),
    "hellaswag": ("hellaswag/hellaswag.yaml", "validation", "validation"),
    "piqa": ("piqa/piqa.yaml", "validation", "validation"),
    "sciq": ("sciq/sciq.yaml", "validation", "validation"),
    "winogrande": ("winogrande/default.yaml", "validation", "validation"),
    "boolq": ("super_glue/boolq/default.yaml", "validation", "validation"),
    "openbookqa": ("openbookqa/openbookqa.yaml", "test", "validation"),
    "commonsense_qa": ("commonsense_qa/default.yaml", "validation", "validation"),
    "social_iqa": ("siqa/siqa.yaml", "validation", "validation"),
    "lambada_openai": ("lambada/lambada_openai.yaml", "test", "test"),
    "gsm8k_cot": ("gsm8k/gsm8k-cot.yaml", "test", None),
    "humaneval": ("humaneval/humaneval.yaml", "test", "test"),
    "mbpp": ("mbpp/mbpp.yaml", "test", None),
    **{f"mmlu_{s}": (f"mmlu/default/mmlu_{s}.yaml", "test", "dev") for s in MMLU_SUBJECTS},
}


def lm_eval_tasks_dir() -> Path:
    """lm_eval/tasks of the installed lm-evaluation-harness, found without importing it."""
    try:
        spec = importlib.util.find_spec("lm_eval")
    except (ImportError, ValueError):
        spec = None
    for location in list(spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(location) / "tasks").is_dir():
            return Path(location) / "tasks"
    raise DataError("--export-lm-eval: lm-evaluation-harness is not installed; its task definitions are what the "
                    "exported files include (pip install lm_eval, or the bench extra: pip install -e '.[bench]')")


def _yaml(value) -> str:
    """A YAML value: JSON is YAML (flow style, double-quoted strings with JSON's escapes)."""
    return json.dumps(value, ensure_ascii=False)


def _jsonl(docs: Sequence[dict]) -> str:
    return "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)


def _comment(text: str) -> list[str]:
    return [f"# {line}".rstrip() for line in text.splitlines()]


def task_yaml(task, include: Path, data_files: dict[str, Path], eval_split: str, fewshot_split: str | None,
              num_fewshot: int, metrics: Sequence[str] | None) -> str:
    """One task's YAML: lm-eval's definition included, then the overrides (see the module docstring)."""
    # lm-eval evaluates its test_split, and leaves the item out of its own few-shot examples exactly when
    # fewshot_split equals test_split: so the items' split is the test_split whatever its name, and groundup's
    # "never the item itself" (a pool that is the items' split) is lm-eval's rule too
    splits = {"training_split": None, "validation_split": None, "test_split": eval_split}
    lines = [f"# {PREFIX}{task.name}: {task.name} as `groundup eval` scores it, over the documents beside this file.",
             *_comment(task.notes), f"include: {_yaml(str(include))}", f"task: {_yaml(PREFIX + task.name)}",
             "tag: []", 'dataset_path: "json"', "dataset_name: null",
             f"dataset_kwargs: {_yaml({'data_files': {k: str(v) for k, v in data_files.items()}})}",
             *(f"{k}: {_yaml(v)}" for k, v in splits.items())]
    if fewshot_split is not None:
        lines.append(f"fewshot_split: {_yaml(fewshot_split)}")
    lines.append(f"num_fewshot: {num_fewshot}")
    if metrics is not None:
        listed = [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in metrics]
        lines.append(f"metric_list: {_yaml(listed)}")
    return "\n".join(lines) + "\n"


def mmlu_group_yaml(subjects: Sequence[str], metrics: Sequence[str]) -> str:
    aggregate = [{"metric": m, "aggregation": "mean", "weight_by_size": True} for m in metrics]
    return "\n".join([
        "# groundup_mmlu: groundup's mmlu, every subject's items together (lm-eval's size-weighted group mean).",
        f"group: {_yaml(PREFIX + 'mmlu')}", f"task: {_yaml([PREFIX + 'mmlu_' + s for s in subjects])}",
        f"aggregate_metric_list: {_yaml(aggregate)}", 'metadata: {"version": 1.0}']) + "\n"


def _expand(tasks: Sequence) -> tuple[list, bool, list[dict]]:
    """(exportable tasks, whether mmlu was asked for as a whole, skipped [{task, reason}])."""
    out, whole_mmlu, skipped = [], False, []
    for task in tasks:
        if task.name == "mmlu":
            whole_mmlu = True
            out += [get_task(f"mmlu_{s}") for s in MMLU_SUBJECTS if all(t.name != f"mmlu_{s}" for t in out)]
        elif task.name in LM_EVAL_TASKS and task.docs is not None:
            if all(t.name != task.name for t in out):
                out.append(task)
        else:
            skipped.append({"task": task.name, "reason": "a custom task: lm-eval has no definition of it to include"})
    return out, whole_mmlu, skipped


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _write_task(task, tmp: Path, final: Path, tasks_dir: Path, num_fewshot: int | None) -> dict:
    """One task's JSONL files and YAML under `tmp` (naming their paths under `final`); its manifest entry."""
    yaml_rel, eval_split, fewshot_split = LM_EVAL_TASKS[task.name]
    shots = task.num_fewshot if num_fewshot is None else num_fewshot
    docs = {eval_split: task.docs()}
    if fewshot_split is not None and fewshot_split != eval_split:
        docs[fewshot_split] = task.fewshot_docs()
    elif fewshot_split == eval_split and task.fewshot_docs is not task.docs:
        raise DataError(f"task {task.name}: its few-shot pool is not its item split; LM_EVAL_TASKS is wrong")
    files, entry = {}, {"lm_eval_task": PREFIX + task.name, "include": str(tasks_dir / yaml_rel),
                        "num_fewshot": shots, "notes": task.notes, "splits": {}}
    for split, rows in docs.items():
        text = _jsonl(rows)
        atomic_write_text(tmp / task.name / f"{split}.jsonl", text)
        files[split] = final / task.name / f"{split}.jsonl"
        entry["splits"][split] = {"file": f"{task.name}/{split}.jsonl", "docs": len(rows), "sha256": _sha256(text)}
    metrics = None
    if task.kind == "multiple_choice":  # what groundup reports, acc_bytes included (lm-eval computes it if named)
        items = [i for i in task.items(limit=1, num_fewshot=0) if isinstance(i, MCItem)]
        metrics = list(choice_metric_names(items))
    entry["metrics"] = metrics
    atomic_write_text(tmp / task.name / f"{task.name}.yaml",
                      task_yaml(task, tasks_dir / yaml_rel, files, eval_split, fewshot_split, shots, metrics))
    entry["yaml"] = f"{task.name}/{task.name}.yaml"
    return entry


def export_lm_eval(tasks: Sequence, out: str | Path, *, num_fewshot: int | None = None, limit: int | None = None,
                   max_gen_tokens: int | None = None, overwrite: bool = False) -> dict:
    """Write DIR (see the module docstring) and return its manifest (also DIR/export.json).

    `num_fewshot` (None: each task's default) goes into each YAML; `limit` and `max_gen_tokens` are lm-eval
    command-line settings (`--limit`, `--gen_kwargs max_gen_toks=N`) and only shape the printed command: the
    files always hold whole splits, as lm-eval's --limit takes the first items of them, as groundup's does."""
    tasks_dir = lm_eval_tasks_dir()
    exportable, whole_mmlu, skipped = _expand(tasks)
    if not exportable:
        raise DataError("--export-lm-eval: none of the tasks has an lm-eval definition ("
                        + "; ".join(f"{s['task']}: {s['reason']}" for s in skipped) + ")")
    for task in exportable:
        include = tasks_dir / LM_EVAL_TASKS[task.name][0]
        if not include.is_file():
            raise DataError(f"task {task.name}: lm-eval's definition {include} is missing from the installed lm_eval "
                            f"({_lm_eval_version()}); groundup's tasks follow lm_eval 0.4.x")
    out = claim_output_dir(out, VERB, overwrite=overwrite)
    final = out.resolve()
    manifest: dict = {"version": 1, "groundup": __version__, "lm_eval": _lm_eval_version(), "tasks": {},
                      "skipped": skipped, "group": f"{PREFIX}mmlu" if whole_mmlu else None}
    with atomic_dir(out) as tmp:
        mark_output_dir(tmp, VERB)
        for task in exportable:
            manifest["tasks"][task.name] = _write_task(task, tmp, final, tasks_dir, num_fewshot)
        if whole_mmlu:
            subjects = list(MMLU_SUBJECTS)
            metrics = manifest["tasks"][f"mmlu_{subjects[0]}"]["metrics"]
            atomic_write_text(tmp / MMLU_GROUP_FILE, mmlu_group_yaml(subjects, metrics))
        names = [f"{PREFIX}mmlu"] if whole_mmlu else []
        names += [e["lm_eval_task"] for n, e in manifest["tasks"].items() if not (whole_mmlu and n.startswith("mmlu_"))]
        manifest["command"] = lm_eval_command(final, names, limit=limit, max_gen_tokens=max_gen_tokens,
                                              code=any(n in manifest["tasks"] for n in ("humaneval", "mbpp")))
        atomic_write_json(tmp / MANIFEST_FILE, manifest)
        atomic_write_text(tmp / "README.md", readme(manifest))
    return manifest


def lm_eval_command(path: Path, names: Sequence[str], *, limit: int | None, max_gen_tokens: int | None,
                    code: bool) -> str:
    parts = ["HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1"] + (["HF_ALLOW_CODE_EVAL=1"] if code else []) + [
        "lm_eval --model hf --model_args pretrained=HF_MODEL_DIR", f"--include_path {path}",
        f"--tasks {','.join(names)}"]
    if limit is not None:
        parts.append(f"--limit {limit}")
    if max_gen_tokens is not None:
        parts.append(f"--gen_kwargs max_gen_toks={max_gen_tokens}")
    if code:
        parts.append("--confirm_run_unsafe_code")
    return " ".join(parts)


def readme(manifest: dict) -> str:
    def splits(e: dict) -> str:
        return ", ".join(f"{s} ({v['docs']:,})" for s, v in e["splits"].items())

    rows = [f"| {e['lm_eval_task']} | {splits(e)} | "
            f"{e['num_fewshot']} | {', '.join(e['metrics'] or ['as lm-eval'])} |" for e in manifest["tasks"].values()]
    skipped = [f"- {s['task']}: {s['reason']}" for s in manifest["skipped"]]
    return "\n".join([
        "# groundup's evaluation items as lm-evaluation-harness tasks", "",
        f"Exported by groundup {manifest['groundup']} against lm_eval {manifest['lm_eval']}. Each YAML includes "
        "lm-eval's own task definition and overrides only where the documents live (the JSONL files here) and "
        "the metrics listed; lm-eval then scores the same items `groundup eval` scores, with no Hub access:", "",
        "```", manifest["command"], "```", "",
        "HF_MODEL_DIR: the model in Hugging Face format (`groundup export hf --model M --out HF_MODEL_DIR`). "
        "Paths are absolute: export again where lm-eval runs (no model needed).", "",
        "| lm-eval task | splits (documents) | few-shot | metrics |", "| --- | --- | --- | --- |", *rows, "",
        *(["Not exported:", "", *skipped, ""] if skipped else []),
        *(["HumanEval and MBPP: lm-eval scores them with Hugging Face evaluate's `code_eval` metric, which it loads "
           "from the Hub (once, then cached): run them once with Hub access.", ""]
          if any(n in manifest["tasks"] for n in ("humaneval", "mbpp")) else []),
        "Details, with each file's sha256: export.json.", ""])


def _lm_eval_version() -> str:
    try:
        return importlib.metadata.version("lm_eval")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def summary(manifest: dict, out: Path) -> str:
    """The lines `groundup eval --export-lm-eval` prints."""
    lines = [f"wrote {out}: {len(manifest['tasks'])} lm-eval task(s) ({MANIFEST_FILE}, README.md)"]
    lines += [f"skipped {s['task']}: {s['reason']}" for s in manifest["skipped"]]
    lines.append(f"reproduce with: {manifest['command']}")
    return "\n".join(lines)

