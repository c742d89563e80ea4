"""The command-line flags verbs share, declared once so every verb spells them alike.

    add_model_argument(p)          --model MODEL (aliases --checkpoint, --base): the model a verb reads
    add_loading_arguments(p)       --tokenizer, --adapter, --device, --dtype of loading it
    add_progress_argument(p)       --quiet (alias --no-progress): no progress bars
    add_tool_arguments(p)          --tools SPEC and --max-tool-calls N: generation that runs tools
    add_output_arguments(p)        --out DIR and --resume [RUN]: a new run, or continue one
    add_config_arguments(p, cls)   --config FILE, --print-config and trailing key=value overrides

Old spellings stay as aliases, so scripts written for them keep working. Nothing here imports torch:
`groundup VERB --help` answers at once.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from groundup.errors import ConfigError

MODEL_SOURCES = "a model directory, a training run (its newest intact checkpoint), a LoRA adapter or run, or an " \
                "imported Hugging Face / GGUF model"


def add_model_argument(p: argparse.ArgumentParser, *, required: bool = True, help: str | None = None) -> None:
    """`--model` (also spelled `--checkpoint` and `--base`): the model a verb loads, samples or trains."""
    p.add_argument("--model", "--checkpoint", "--base", dest="model", required=required, default=None,
                   metavar="MODEL", help=help or MODEL_SOURCES)


def add_loading_arguments(p: argparse.ArgumentParser, *, adapter: bool = True, dtype: bool = True,
                          dtype_default: str | None = "float32") -> None:
    """How the model is loaded: its tokenizer, an adapter on top, the device and the dtype."""
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: found beside the model)")
    if adapter:
        p.add_argument("--adapter", default=None, help="a LoRA adapter (adapter directory or LoRA run) on the model")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto, CUDA when present)")
    if dtype:
        shown = dtype_default or "as stored"
        p.add_argument("--dtype", default=dtype_default, help=f"float32, bfloat16 or float16 (default: {shown})")


def add_progress_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", "--no-progress", dest="quiet", action="store_true", help="no progress bars")


def add_tool_arguments(p: argparse.ArgumentParser) -> None:
    """--tools calculator,python,module:function and --max-tool-calls N (generate, chat, eval)."""
    p.add_argument("--tools", default=None, metavar="SPEC",
                   help="tools the model may call while it generates (comma-separated): calculator, python (the "
                        "sandbox), or module:function (a Python function; its signature and docstring are the "
                        "schema). Needs a model with a chat format (default: no tools)")
    p.add_argument("--max-tool-calls", type=int, default=4, metavar="N",
                   help="with --tools: calls per reply before the model must answer (default: 4)")


def add_output_arguments(p: argparse.ArgumentParser, what: str = "run directory") -> None:
    """`--out PATH` for a new output, `--resume [PATH]` to continue an unfinished one: `--resume RUN` alone,
    or `--out RUN --resume`. `resolve_output(args)` gives (path, resuming)."""
    p.add_argument("--out", type=Path, default=None, help=f"the new {what} (refused if it already holds one)")
    p.add_argument("--resume", nargs="?", const=True, default=None, metavar="PATH",
                   help=f"continue an unfinished {what} from where it stopped: --resume PATH, or --out PATH --resume")


def resolve_output(args: argparse.Namespace) -> tuple[Path, bool]:
    """(the output path, whether it is resumed) from add_output_arguments' flags; a ConfigError names a
    missing or contradictory pair."""
    out, resume = args.out, args.resume
    if resume is None:
        if out is None:
            raise ConfigError("give --out PATH (a new output) or --resume PATH (continue one)", key="out")
        return Path(out), False
    if resume is True:
        if out is None:
            raise ConfigError("--resume without a path needs --out PATH (or give it as --resume PATH)", key="resume")
        return Path(out), True
    if out is not None and Path(out) != Path(resume):
        raise ConfigError(f"--out {out} and --resume {resume} name two outputs; give one", key="resume")
    return Path(resume), True


def add_config_arguments(p: argparse.ArgumentParser, config_class: str, example: str) -> None:
    """--config FILE, --print-config and key=value overrides of `config_class`, named "module:Class" so that
    `--help` imports nothing (the CLI imports it to print its keys)."""
    p.add_argument("--config", type=Path, default=None, help=f"TOML file of {config_class.split(':')[-1]} keys")
    p.add_argument("--print-config", action="store_true",
                   help="print every key with its value and meaning as TOML (defaults, then --config and the "
                        "overrides), and exit; save it, edit it, pass it with --config")
    p.add_argument("overrides", nargs="*", help=f"key=value over the config, e.g. {example}")
    p.set_defaults(config_class=config_class)


def config_class(args: argparse.Namespace) -> type:
    """The class add_config_arguments named."""
    module, _, name = args.config_class.partition(":")
    return getattr(importlib.import_module(module), name)
