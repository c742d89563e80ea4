"""Every verb that writes an output folder refuses one that holds another verb's output (layout.claim_output_dir).

One small output folder per verb is made once for the module with the verbs themselves (a tiny corpus, a
tokenizer, a two-step run, each post-training verb for a step, ...); then each writing verb is run
in-process against every other verb's folder and must exit 2 with one line naming the folder, the verb
that made it and the verb asked, leaving the folder exactly as it was. `--resume` into another verb's run
is refused the same way; --overwrite replaces another verb's folder only whole (REPLACED verbs).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from groundup.cli import main
from groundup.layout import FOLDER_VERBS, OUTPUT_MARKER_FILE, REPLACED, REPORTED, RUN, made_by
from annotate_helpers import FakeJudge

LOOP = ["train.threads=1", "log.every=1", "eval.every=0", "checkpoint.every=100", "train.max_steps=1", "--quiet"]
TINY = ["train.batch_size=2", "train.seq_len=32", *LOOP]
POST = [*TINY, "lora.rank=4"]
GRPO = [*LOOP, "lora.rank=4", "grpo.group_size=2", "grpo.max_new_tokens=4", "grpo.prompts_per_batch=1"]


REWARD = "ownership_reward:length"  # a reward that varies, so that sampling verbs have something to learn


def cli(*args) -> int:
    return main([str(a) for a in args])


def ok(*args) -> None:
    code = cli(*args)
    assert code == 0, f"groundup {' '.join(map(str, args))}: exit {code}"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """{verb: the folder it wrote} for every verb of FOLDER_VERBS, plus the inputs the writers read."""
    root = tmp_path_factory.mktemp("owners")
    o = {v: root / v.replace(" ", "-") for v in FOLDER_VERBS if v != "report"}
    inputs = root / "inputs"
    inputs.mkdir()
    (inputs / "ownership_reward.py").write_text("def length(prompt, completion, **fields):\n"
                                               "    return float(len(completion))\n")
    sys.path.insert(0, str(inputs))
    ok("data", "sample", "--out", o["data sample"], "--domains", "math", "--math-count", "300")
    raw = o["data sample"] / "math-synthetic.jsonl"
    ok("data", "curate", "--input", raw, "--out", o["data curate"], "--quiet")
    crawl = inputs / "crawl"
    ok("data", "sample", "--crawl", "--out", crawl, "--pages", "4")
    ok("data", "extract", crawl, "--out", o["data extract"], "--quiet", "--backend", "resiliparse")
    ok("tokenizer", "train", "--input", raw, "--out", o["tokenizer train"], "--vocab-size", "300", "--quiet")
    ok("data", "tokenize", "--tokenizer", o["tokenizer train"], "--input", raw, "--out", o["data tokenize"],
       "--workers", "1", "--quiet", "val_fraction=0.1")
    ok("train", "--config", Path(__file__).parents[1] / "configs" / "train-tiny.toml", "--out", o["train"],
       f"data.shards={o['data tokenize']}", *TINY)
    chat = inputs / "chat.jsonl"
    pairs = inputs / "pairs.jsonl"
    feedback = inputs / "feedback.jsonl"
    prompts = inputs / "prompts.jsonl"
    questions = [(f"What is {i} + {i}?", str(2 * i)) for i in range(4)]
    chat.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q},
                                                     {"role": "assistant", "content": a}]}) + "\n"
                            for q, a in questions))
    pairs.write_text("".join(json.dumps({"prompt": q, "chosen": a, "rejected": "no"}) + "\n" for q, a in questions))
    feedback.write_text("".join(json.dumps({"prompt": q, "completion": a, "label": i % 2 == 0}) + "\n"
                                for i, (q, a) in enumerate(questions)))
    prompts.write_text("".join(json.dumps({"prompt": q, "answer": a}) + "\n" for q, a in questions[:2]))
    run = o["train"]
    ok("sft", "--model", run, "--data", chat, "--out", o["sft"], *POST)
    ok("dpo", "--model", run, "--data", pairs, "--out", o["dpo"], *POST)
    ok("kto", "--model", run, "--data", feedback, "--out", o["kto"], *POST)
    ok("rm", "--model", run, "--data", pairs, "--out", o["rm"], *TINY)
    ok("grpo", "--model", run, "--prompts", prompts, "--reward", REWARD, "--out", o["grpo"], *GRPO)
    ok("rft", "--model", run, "--prompts", prompts, "--reward", REWARD, "--out", o["rft"], *POST,
       "rft.rounds=1", "rft.samples=2", "rft.max_new_tokens=4", "rft.eval_count=0")
    ok("merge-lora", "--adapter", o["sft"], "--out", o["merge-lora"])
    ok("quantize", "--model", run, "--method", "int8", "--out", o["quantize"])
    ok("export", "hf", "--model", run, "--out", o["export hf"])
    ok("import", "hf", "--model", o["export hf"], "--out", o["import hf"])
    gguf = inputs / "model.gguf"
    ok("export", "gguf", "--model", run, "--out", gguf, "--type", "f32")
    ok("import", "gguf", gguf, "--out", o["import gguf"])
    ok("eval", "--model", run, "--bpb", raw, "--out", o["eval"])
    task = inputs / "task.toml"
    (inputs / "items.jsonl").write_text(json.dumps({"q": "1 + 1", "a": "2"}) + "\n")
    task.write_text('name = "sums"\ndata = "items.jsonl"\nkind = "generate"\ncontext = "{q} ="\ntarget = "a"\n')
    ok("eval", "contamination", "--tasks", task, "--data", raw, "--out", o["eval contamination"], "--quiet")
    ok("eval", "--model", run, "--tasks", task, "--out", inputs / "sums-eval", "--quiet")  # what --compare reads
    ok("eval", "--compare", inputs / "sums-eval", inputs / "sums-eval", "--out", o["eval --compare"])
    ok("eval", "--tasks", "arc_easy", "--export-lm-eval", o["eval --export-lm-eval"])
    judge = FakeJudge()  # data annotate's endpoint: a local fake OpenAI-compatible server
    try:
        ok("data", "annotate", "--input", raw, "--endpoint", judge.url, "--model", "judge", "--out",
           o["data annotate"], "--sample", "20", "--bits", "8", "--quiet")
    finally:
        judge.close()
    battles = inputs / "battles.jsonl"  # a battle log in FastChat's columns, rated by `arena --battles`
    battles.write_text("".join(json.dumps({"model_a": a, "model_b": b, "winner": w}) + "\n"
                               for a, b, w in (("x", "y", "model_a"), ("y", "x", "tie"), ("x", "y", "model_b"))))
    ok("arena", "--battles", battles, "--out", o["arena"], "--bootstrap", "0", "--quiet")
    # The demo runs the whole chain for minutes: its folder is the one it claims before its first stage.
    import groundup.demo.run as demo_run

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(demo_run.Demo, "run", lambda self: None)
        ok("demo", "--out", o["demo"])
    yield {"out": o, "run": run, "raw": raw, "chat": chat, "pairs": pairs, "feedback": feedback,
            "prompts": prompts, "gguf": gguf, "task": task, "crawl": crawl,
            "battles": battles}
    sys.path.remove(str(inputs))


def writer_argv(verb: str, out: Path, m: dict, resume: bool = False) -> list:
    """The verb writing to `out` (or resuming it) with the tiniest inputs."""
    run, o = m["run"], m["out"]
    dest = ["--resume", out] if resume else ["--out", out]
    return {
        "data sample": ["data", "sample", "--out", out, "--domains", "math", "--math-count", "5"],
        "data curate": ["data", "curate", "--input", m["raw"], "--out", out, "--quiet"],
        "data extract": ["data", "extract", m["crawl"], "--out", out, "--quiet", "--backend", "resiliparse"],
        "tokenizer train": ["tokenizer", "train", "--input", m["raw"], "--out", out, "--vocab-size", "300", "--quiet"],
        "data tokenize": ["data", "tokenize", "--tokenizer", o["tokenizer train"], "--input", m["raw"], "--out", out,
                          "--workers", "1", "--quiet"],
        "train": ["train", "--config", Path(__file__).parents[1] / "configs" / "train-tiny.toml", *dest,
                  f"data.shards={o['data tokenize']}", *TINY],
        "sft": ["sft", "--model", run, "--data", m["chat"], *dest, *POST],
        "dpo": ["dpo", "--model", run, "--data", m["pairs"], *dest, *POST],
        "kto": ["kto", "--model", run, "--data", m["feedback"], *dest, *POST],
        "rm": ["rm", "--model", run, "--data", m["pairs"], *dest, *TINY],
        "grpo": ["grpo", "--model", run, "--prompts", m["prompts"], "--reward", REWARD, *dest, *GRPO],
        "rft": ["rft", "--model", run, "--prompts", m["prompts"], "--reward", REWARD, "--out", out, *POST,
                "rft.rounds=1", "rft.samples=2", "rft.max_new_tokens=4"],
        "data trajectories": ["data", "trajectories", m["chat"], "--tokenizer", o["tokenizer train"], "--out", out],
        "data pairs": ["data", "pairs", "--model", run, "--prompts", m["prompts"], "--reward", REWARD, *dest,
                       "--samples", "2", "--max-new-tokens", "4", "--quiet"],
        "merge-lora": ["merge-lora", "--adapter", o["sft"], "--out", out],
        "quantize": ["quantize", "--model", run, "--method", "int8", "--out", out],
        "export hf": ["export", "hf", "--model", run, "--out", out],
        "export gguf": ["export", "gguf", "--model", run, "--out", out],
        "import hf": ["import", "hf", "--model", o["export hf"], "--out", out],
        "import gguf": ["import", "gguf", m["gguf"], "--out", out],
        "eval": ["eval", "--model", run, "--bpb", m["raw"], "--out", out],
        "eval contamination": ["eval", "contamination", "--tasks", m["task"], "--data", m["raw"], "--out", out,
                               "--quiet"],
        "eval --compare": ["eval", "--compare", m["task"].parent / "sums-eval", m["task"].parent / "sums-eval",
                           "--out", out],
        "eval --export-lm-eval": ["eval", "--tasks", "arc_easy", "--export-lm-eval", out],
        "data annotate": ["data", "annotate", "--input", m["raw"], "--endpoint", "http://127.0.0.1:9/v1", "--model", "m",
                          "--out", out, "--quiet"],
        "data train-classifier": ["data", "train-classifier", "--positive", m["raw"], "--negative", m["raw"],
                                  "--out", out, "--epochs", "1", "--bits", "8"],
        "report": ["report", out],
        "arena": ["arena", "--battles", m["battles"], "--out", out, "--bootstrap", "0", "--quiet"],
        "demo": ["demo", "--out", out],
    }[verb]


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


FILE_WRITERS = ["data pairs", "export gguf", "data train-classifier", "data trajectories"]  # one file at --out: a folder is refused
WRITERS = [*FOLDER_VERBS, *FILE_WRITERS]
RESUMERS = [v for v, how in FOLDER_VERBS.items() if how == RUN] + ["data pairs"]


def refusals(made, verb: str, capsys, resume: bool = False) -> list[str]:
    """What went wrong when `verb` wrote to (or resumed) each other verb's folder: [] when each was refused."""
    problems = []
    for maker, folder in made["out"].items():
        if maker == verb or (verb == "report" and maker in REPORTED):
            continue  # its own folder; report writes report.md into a training run or a demo
        before = snapshot(folder)
        capsys.readouterr()
        code = cli(*writer_argv(verb, folder, made, resume))
        err = capsys.readouterr().err.strip().splitlines()
        line = err[-1] if err else ""
        asked = f"'groundup {verb}'" if not resume or verb == "data pairs" else f"'groundup {verb}' run"
        named = str(folder) in line and f"'groundup {maker}'" in line and asked in line
        if code != 2 or not line.startswith("error: ") or not named or any("Traceback" in e for e in err):
            problems.append(f"{verb} -> {maker}: exit {code}: {line or '(nothing on stderr)'}")
        if snapshot(folder) != before:
            problems.append(f"{verb} -> {maker}: the folder changed")
    return problems


def test_every_verb_with_an_out_flag_is_in_the_matrix():
    """A new verb that writes --out must be registered in layout.FOLDER_VERBS (or write one file), so that the
    matrix below runs it against every other verb's folder."""
    import argparse

    from groundup.cli import COMMANDS, _load

    unregistered = []
    for command in COMMANDS:
        parser = argparse.ArgumentParser()
        _load(command.target)[1](parser)
        names = {" ".join(words) for words in (command.words, *command.aliases)}
        if any("--out" in a.option_strings for a in parser._actions) and not names & {*FOLDER_VERBS, *FILE_WRITERS}:
            unregistered.append(" ".join(command.words))
    assert unregistered == []


def test_every_verb_records_that_it_made_its_folder(made):
    assert {verb: made_by(folder) for verb, folder in made["out"].items()} == {v: v for v in made["out"]}


@pytest.mark.parametrize("verb", WRITERS)
def test_a_writing_verb_refuses_every_other_verbs_folder(made, verb, capsys, monkeypatch):
    import groundup.demo.run as demo_run

    monkeypatch.setattr(demo_run.Demo, "run", lambda self: pytest.fail("the demo started in another verb's folder"))
    assert refusals(made, verb, capsys) == []


@pytest.mark.parametrize("verb", RESUMERS)
def test_resume_refuses_another_verbs_run(made, verb, capsys):
    problems = refusals(made, verb, capsys, resume=True)
    assert problems == []


def test_a_folder_made_before_markers_is_known_by_its_layout(made, tmp_path, capsys):
    """A run from before this change has no marker: its config.toml says which verb made it."""
    old = tmp_path / "old-sft"
    shutil.copytree(made["out"]["sft"], old)
    (old / OUTPUT_MARKER_FILE).unlink()
    assert made_by(old) == "sft"
    assert cli(*writer_argv("rft", old, made)) == 2
    assert f"{old} holds the output of 'groundup sft'; 'groundup rft'" in capsys.readouterr().err
    assert cli(*writer_argv("dpo", old, made, resume=True)) == 2
    assert f"cannot resume {old}: it holds the output of 'groundup sft', not a 'groundup dpo' run" in \
        capsys.readouterr().err


def test_overwrite_replaces_another_verbs_folder_only_whole(made, tmp_path, capsys):
    """--overwrite is an explicit replacement, for the verbs that rename a complete folder into place."""
    target = tmp_path / "was-eval"
    shutil.copytree(made["out"]["eval"], target)
    assert cli(*writer_argv("export hf", target, made)) == 2
    assert "or pass --overwrite to replace it whole" in capsys.readouterr().err
    assert cli(*writer_argv("export hf", target, made), "--overwrite") == 0
    assert made_by(target) == "export hf" and not (target / "results.json").exists()
    assert FOLDER_VERBS["export hf"] == REPLACED
    # A verb that writes as it goes has no whole replacement: the folder of another verb stays refused.
    assert cli(*writer_argv("data sample", target, made), "--overwrite") == 2
    assert f"{target} holds the output of 'groundup export hf'" in capsys.readouterr().err
