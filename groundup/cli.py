"""The `groundup` command: one sub-command per stage, nothing else.

Each entry below names the function behind a verb as `module:function`; the module also defines
`function_arguments(parser)`. Modules are imported only when their verb runs, so `groundup --help`
answers at once without importing torch.
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

from groundup.errors import GroundupError

# (words, "module:function", one-line help). Keep in data-flow order.
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    (("data", "sample"), "groundup.corpus.commands:sample", "write the embedded corpus (Shakespeare, stdlib code, math) as JSONL"),
    (("data", "curate"), "groundup.data.commands:curate", "filter, deduplicate, redact and mix raw data into curated shards"),
    (("data", "train-classifier"), "groundup.data.commands:train_classifier", "train the fastText-style quality classifier"),
    (("data", "pairs"), "groundup.posttrain.data_commands:pairs", "preference pairs from a model's own samples, ranked by a reward"),
    (("tokenizer", "train"), "groundup.tokenizer.commands:train", "train the byte-level BPE tokenizer on text records"),
    (("tokenizer", "stats"), "groundup.tokenizer.commands:stats", "bytes per token per domain, vocabulary use, longest tokens"),
    (("data", "tokenize"), "groundup.tokens.commands:tokenize", "encode text records into token shards with a train/val split"),
    (("model", "info"), "groundup.model.commands:info", "parameters, FLOPs, weight and KV-cache bytes of a preset or config"),
    (("plan",), "groundup.plan.commands:plan", "memory per GPU, the largest micro-batch that fits, time and GPU hours of a training run"),
    (("train",), "groundup.train.commands:train", "pretrain on token shards: exact resume, stability guards, DDP/FSDP2 under torchrun"),
    (("sft",), "groundup.posttrain.commands:sft", "supervised fine-tuning (full or LoRA) on chat, prompt-completion, ShareGPT or Alpaca data"),
    (("dpo",), "groundup.posttrain.commands:dpo", "direct preference optimisation on prompt/chosen/rejected pairs (sigmoid, IPO, hinge)"),
    (("kto",), "groundup.posttrain.commands:kto", "Kahneman-Tversky optimisation on unpaired prompt/completion/label feedback"),
    (("grpo",), "groundup.posttrain.commands:grpo", "reinforcement learning with verifiable rewards: group relative policy optimisation"),
    (("rft",), "groundup.posttrain.commands:rft", "rejection-sampling fine-tuning: sample, keep the best by reward, fine-tune; in rounds"),
    (("rm",), "groundup.posttrain.commands:rm", "train a reward model (Bradley-Terry on preference pairs) for GRPO and best-of-n"),
    (("merge",), "groundup.posttrain.commands:merge", "fold a LoRA adapter into its base model"),
    (("generate",), "groundup.infer.commands:generate", "complete prompts with a checkpoint (batched, streamed, sampled)"),
    (("chat",), "groundup.infer.commands:chat", "chat with a checkpoint in the terminal (chat template, /reset, /exit)"),
    (("serve",), "groundup.serve.commands:serve", "an OpenAI-compatible server with continuous batching, LoRA adapters and a chat page"),
    (("eval", "contamination"), "groundup.eval.commands:contamination", "share of benchmark items whose 13-grams occur in training data; Min-K% membership scores"),
    (("eval",), "groundup.eval.commands:evaluate", "score a model on real benchmarks (lm-eval's definitions), bits per byte, contamination"),
    (("export", "hf"), "groundup.interop.commands:export_hf", "write a checkpoint as a Hugging Face model directory"),
    (("export", "gguf"), "groundup.interop.commands:export_gguf", "write a model as a llama.cpp GGUF file (f32, f16, q8_0, q4_0)"),
    (("quantize",), "groundup.quant.commands:quantize", "int8 / int4 / GPTQ weight-only quantization of a model"),
    (("import", "hf"), "groundup.interop.commands:import_hf", "turn a local Hugging Face model directory into a groundup model"),
    (("import", "gguf"), "groundup.interop.commands:import_gguf", "turn a llama.cpp GGUF file (Llama, Mistral, Qwen2/3, SmolLM) into a groundup model"),
    (("report",), "groundup.demo.commands:report", "write report.md and plots for a demo or training run directory"),
    (("demo",), "groundup.demo.commands:demo", "run the whole chain on the embedded corpus within a time budget"),
]

GROUP_HELP = {
    "data": "data stages: sample, curate, tokenize",
    "tokenizer": "train and inspect the BPE tokenizer",
    "model": "inspect model presets and configs",
    "export": "export a checkpoint to another format",
    "import": "import a model from another format",
}


def _groups() -> dict[str, list[tuple[tuple[str, ...], str, str]]]:
    groups: dict[str, list] = {}
    for words, target, help_ in COMMANDS:
        groups.setdefault(words[0], []).append((words, target, help_))
    return groups


def _print_overview(prog: str, only: str | None = None) -> None:
    groups = _groups()
    if only:
        print(f"usage: {prog} {only} <command> [options]\n\n{GROUP_HELP.get(only, '')}\n\ncommands:")
        for words, _, help_ in groups[only]:
            print(f"  {' '.join(words[1:]):<18} {help_}")
        return
    print(f"usage: {prog} <command> [options]\n")
    print("groundup builds a language model from the ground up. Commands, in data-flow order:\n")
    for name, entries in groups.items():
        for words, _, help_ in entries:
            print(f"  {' '.join(words):<22} {help_}")
    print(f"\nRun '{prog} <command> --help' for a command's options.")


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
    groups = _groups()
    entry = None
    for words, target, help_ in COMMANDS:
        if tuple(argv[: len(words)]) == words:
            entry = (words, target, help_)
            break
    if entry is None:
        if argv[0] in groups and (len(argv) == 1 or argv[1] in ("-h", "--help")):
            _print_overview(prog, only=argv[0])
            return 0
        from groundup.config import did_you_mean

        names = [" ".join(w) for w, _, _ in COMMANDS]
        wanted = " ".join(argv[:2]) if argv[0] in groups else argv[0]
        hint = did_you_mean(wanted, names, cutoff=0.5)
        print(f"error: unknown command '{wanted}'{hint}; run '{prog} --help' for the list", file=sys.stderr)
        return 2
    words, target, help_ = entry
    run, add_arguments = _load(target)
    parser = argparse.ArgumentParser(prog=f"{prog} {' '.join(words)}", description=help_)
    add_arguments(parser)
    args, extra = parser.parse_known_args(argv[len(words):])
    # argparse takes positionals in one run; `--out D k=v` after `k=v --quiet` is the same intent
    if extra:
        if not hasattr(args, "overrides") or any(a.startswith("-") or "=" not in a for a in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides or []) + extra
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
    except Exception:  # noqa: BLE001 - a bug: show the full traceback
        traceback.print_exc()
        return 1
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
