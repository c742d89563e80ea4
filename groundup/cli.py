"""The `groundup` command: one sub-command per stage, nothing else.

Each entry below names the function behind a verb as `module:function`; the module also defines
`function_arguments(parser)`. Modules are imported only when their verb runs, so `groundup --help`
answers at once without importing torch. `groundup VERB --print-config` prints a configurable verb's
keys (its parser declares the config class through arguments.add_config_arguments).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

# Before torch loads OpenMP: idle OpenMP threads sleep instead of spinning, unless the user chose.
# With as many threads as cores and another busy process, a spinning thread holds the core that the
# thread it waits for needs: small matmuls ran 10-100x slower here (README: Threads).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from dataclasses import dataclass

from groundup.arguments import config_class
from groundup.config import config_template, did_you_mean, load_config
from groundup.errors import GroundupError
from groundup.io import full_disk_reason

@dataclass(frozen=True)
class Command:
    words: tuple[str, ...]  # what the user types: ("data", "curate")
    target: str  # "module:function"; the module also defines function_arguments(parser)
    help: str
    aliases: tuple[tuple[str, ...], ...] = ()  # older names that keep working


# In data-flow order: `groundup --help` lists them so.
COMMANDS: list[Command] = [
    Command(("data", "sample"), "groundup.corpus.commands:sample", "write the embedded corpus (Shakespeare, stdlib code, math) as JSONL"),
    Command(("data", "extract"), "groundup.data.web.commands:extract", "HTML pages of a web crawl (WARC, ARC, WET) as text records, unfiltered"),
    Command(("data", "curate"), "groundup.eval.data_commands:curate", "filter, deduplicate, redact and mix raw data into curated shards"),
    Command(("data", "annotate"), "groundup.data.annotate_commands:annotate", "score a sample with an LLM judge (any OpenAI-compatible endpoint) and train the quality classifier on it"),
    Command(("data", "train-classifier"), "groundup.data.commands:train_classifier", "train the fastText-style quality classifier"),
    Command(("tokenizer", "train"), "groundup.tokenizer.commands:train", "train the byte-level BPE tokenizer on text records"),
    Command(("tokenizer", "stats"), "groundup.tokenizer.commands:stats", "bytes per token per domain, vocabulary use, longest tokens"),
    Command(("data", "tokenize"), "groundup.tokens.commands:tokenize", "encode text records into token shards with a train/val split"),
    Command(("model", "info"), "groundup.model.commands:info", "parameters, FLOPs, weight and KV-cache bytes of a preset or config"),
    Command(("plan",), "groundup.plan.commands:plan", "memory per GPU, the largest micro-batch that fits, time and GPU hours of a training run"),
    Command(("train",), "groundup.train.commands:train", "pretrain on token shards: exact resume, stability guards, DDP/FSDP2/TP under torchrun"),
    Command(("sft",), "groundup.posttrain.commands:sft", "supervised fine-tuning (full or LoRA) on chat, prompt-completion, ShareGPT or Alpaca data"),
    Command(("data", "pairs"), "groundup.posttrain.data_commands:pairs", "preference pairs from a model's own samples, ranked by a reward"),
    Command(("data", "trajectories"), "groundup.posttrain.data_commands:trajectories", "agent logs (OpenAI messages with tools) checked and split to the context, as SFT records"),
    Command(("dpo",), "groundup.posttrain.commands:dpo", "direct preference optimisation on prompt/chosen/rejected pairs (sigmoid, IPO, hinge)"),
    Command(("kto",), "groundup.posttrain.commands:kto", "Kahneman-Tversky optimisation on unpaired prompt/completion/label feedback"),
    Command(("reward-model",), "groundup.posttrain.commands:reward_model", "train a reward model (Bradley-Terry on preference pairs; --process: per step, Math-Shepherd labels) for GRPO and best-of-n", (("rm",),)),
    Command(("grpo",), "groundup.posttrain.commands:grpo", "reinforcement learning with verifiable rewards: group relative policy optimisation"),
    Command(("rft",), "groundup.posttrain.commands:rft", "rejection-sampling fine-tuning: sample, keep the best by reward, fine-tune; in rounds"),
    Command(("launch",), "groundup.launch.commands:launch", "run any training verb on N nodes x K GPUs under torchrun, Slurm or Ray Train; restarted attempts resume"),
    Command(("merge-lora",), "groundup.posttrain.commands:merge_lora", "fold a LoRA adapter into its base model", (("merge",),)),
    Command(("generate",), "groundup.infer.commands:generate", "complete prompts with a model (batched, streamed, sampled)"),
    Command(("chat",), "groundup.infer.commands:chat", "chat with a model in the terminal (chat template, /reset, /exit)"),
    Command(("serve",), "groundup.serve.commands:serve", "an OpenAI-compatible server with continuous batching, LoRA adapters and a chat page"),
    Command(("eval",), "groundup.eval.commands:evaluate", "score a model on real benchmarks (lm-eval's definitions), bits per byte, contamination"),
    Command(("eval", "contamination"), "groundup.eval.commands:contamination", "share of benchmark items whose 13-grams occur in training data; Min-K% membership scores"),
    Command(("arena",), "groundup.arena.commands:arena", "models answer the same prompts, a judge picks the better answer: Bradley-Terry ratings (FastChat's) with intervals"),
    Command(("quantize",), "groundup.quant.commands:quantize", "int8 / int4 / GPTQ weight-only quantization of a model"),
    Command(("export", "hf"), "groundup.interop.commands:export_hf", "write a model as a Hugging Face model directory"),
    Command(("export", "gguf"), "groundup.interop.commands:export_gguf", "write a model as a llama.cpp GGUF file (f32, f16, q8_0, q4_0)"),
    Command(("import", "hf"), "groundup.interop.commands:import_hf", "turn a local Hugging Face model directory into a groundup model"),
    Command(("import", "gguf"), "groundup.interop.commands:import_gguf", "turn a llama.cpp GGUF file (Llama, Mistral, Qwen2/3, SmolLM) into a groundup model"),
    Command(("report",), "groundup.demo.commands:report", "write report.md and plots for a demo or training run directory"),
    Command(("demo",), "groundup.demo.commands:demo", "run the whole chain on the embedded corpus within a time budget"),
]  # fmt: skip

GROUP_HELP = {
    "data": "data stages: sample, extract, curate, annotate, train-classifier, tokenize, pairs, trajectories",
    "tokenizer": "train and inspect the BPE tokenizer",
    "model": "inspect model presets and configs",
    "export": "export a model to another format",
    "import": "import a model from another format",
}


def _groups() -> dict[str, list[Command]]:
    groups: dict[str, list[Command]] = {}
    for c in COMMANDS:
        if len(c.words) > 1:
            groups.setdefault(c.words[0], []).append(c)
    return groups


def _print_overview(prog: str, only: str | None = None) -> None:
    if only:
        print(f"usage: {prog} {only} <command> [options]\n\n{GROUP_HELP.get(only, '')}\n\ncommands:")
        for c in _groups()[only]:
            print(f"  {' '.join(c.words[1:]):<18} {c.help}")
        return
    print(f"usage: {prog} <command> [options]\n")
    print("groundup builds a language model from the ground up. Commands, in data-flow order:\n")
    for c in COMMANDS:
        print(f"  {' '.join(c.words):<22} {c.help}")
    print(f"\nRun '{prog} <command> --help' for a command's options, '{prog} <command> --print-config' for a "
          "training or data verb's keys.")


def find_command(argv: list[str]) -> tuple[Command, int] | None:
    """The command `argv` starts with (by its name or an alias) and how many words name it; the longest
    match wins (`eval contamination` before `eval`)."""
    best = None
    for c in COMMANDS:
        for words in (c.words, *c.aliases):
            if tuple(argv[: len(words)]) == words and (best is None or len(words) > best[1]):
                best = (c, len(words))
    return best


def _load(target: str):
    module_name, func_name = target.split(":")
    module = importlib.import_module(module_name)
    return getattr(module, func_name), getattr(module, f"{func_name}_arguments")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = "groundup"
    if not argv or argv[0] in ("-h", "--help"):
        _print_overview(prog)
        return 0
    if argv[0] == "--version":
        from groundup import __version__

        print(f"groundup {__version__}")
        return 0
    found = find_command(argv)
    if found is None:
        groups = _groups()
        if argv[0] in groups and (len(argv) == 1 or argv[1] in ("-h", "--help")):
            _print_overview(prog, only=argv[0])
            return 0
        names = [" ".join(w) for c in COMMANDS for w in (c.words, *c.aliases)]
        wanted = " ".join(argv[:2]) if argv[0] in groups else argv[0]
        hint = did_you_mean(wanted, names, cutoff=0.5)
        print(f"error: unknown command '{wanted}'{hint}; run '{prog} --help' for the list", file=sys.stderr)
        return 2
    command, n_words = found
    run, add_arguments = _load(command.target)
    parser = argparse.ArgumentParser(prog=f"{prog} {' '.join(command.words)}", description=command.help)
    add_arguments(parser)
    if "--print-config" in argv[n_words:]:  # print the keys without asking for the verb's inputs first
        for action in parser._actions:
            action.required = False
    args, extra = parser.parse_known_args(argv[n_words:])
    # argparse takes positionals in one run; `--out D k=v` after `k=v --quiet` is the same intent
    if extra:
        if not hasattr(args, "overrides") or any(a.startswith("-") or "=" not in a for a in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides or []) + extra
    if getattr(args, "print_config", False):
        try:
            cls = config_class(args)
            cfg = load_config(cls, args.config, args.overrides)
        except GroundupError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"# groundup {' '.join(command.words)}: every key, its value and what it means "
              f"({cls.__name__}).\n# Save this, edit it and pass it back with --config FILE.\n")
        print(config_template(cfg), end="")
        return 0
    try:
        result = run(args)
    except GroundupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `groundup ... | head` closing the pipe is not an error
        return 0
    except Exception as e:  # noqa: BLE001 - a bug: show the full traceback
        reason = full_disk_reason(e)  # a writer that does not name its file (io.py's writers do: DiskFullError)
        if reason is not None:
            where = f" writing {e.filename}" if isinstance(e, OSError) and e.filename else ""
            print(f"error: disk full{where}: {reason}; free some space and run it again", file=sys.stderr)
            return 2
        traceback.print_exc()
        return 1
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
