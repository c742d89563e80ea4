"""`groundup generate` and `groundup chat`: the generation engine behind two commands.

With `--tools calculator,python,module:function` both run the tool loop (tool_loop.py): `generate` sends each
prompt as a user message and prints the calls, results and final answer; `chat` shows each call and result as
it happens. Tools need a model with a chat format.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from groundup.arguments import add_loading_arguments, add_model_argument, add_tool_arguments
from groundup.errors import ConfigError, DataError
from groundup.io import read_text


def _model_arguments(p: argparse.ArgumentParser) -> None:
    add_model_argument(p)
    add_loading_arguments(p)
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the decode step (about a minute on CPU, then ~2x faster decoding)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 is often fastest for small models "
                        "on a busy machine)")
    from groundup.infer.speculative import add_speculative_arguments

    add_speculative_arguments(p)


def _sampling_arguments(p: argparse.ArgumentParser, max_new_tokens: int) -> None:
    from groundup.infer.sampling import SamplingConfig

    d = SamplingConfig()
    g = p.add_argument_group("sampling")
    g.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help=f"(default: {max_new_tokens})")
    g.add_argument("--temperature", type=float, default=d.temperature, help=f"0 = greedy (default: {d.temperature})")
    g.add_argument("--top-k", type=int, default=d.top_k, help="keep the k most likely tokens; 0 = off (default)")
    g.add_argument("--top-p", type=float, default=d.top_p, help="nucleus sampling, in (0, 1]; 1 = off (default)")
    g.add_argument("--min-p", type=float, default=d.min_p, help="drop tokens below min_p x the top probability; 0 = off")
    g.add_argument("--repetition-penalty", type=float, default=d.repetition_penalty, help="> 1 discourages repeats; 1 = off")
    g.add_argument("--seed", type=int, default=d.seed, help=f"(default: {d.seed})")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable); cut from the output")
    g.add_argument("--truncate", action="store_true",
                   help="drop tokens from the start of a prompt too long for the context (default: error)")


def _sampling(args: argparse.Namespace):
    from groundup.infer.sampling import SamplingConfig

    return SamplingConfig.make(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                               top_p=args.top_p, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                               seed=args.seed, stop=args.stop, overflow="truncate" if args.truncate else "error",
                               structured=_structured(args))


def _structured(args: argparse.Namespace):
    """The structured output the flags ask for (generate's --json-schema, --regex, ...), checked, or None."""
    from groundup.errors import ConfigError
    from groundup.infer.structured import Structured
    from groundup.io import read_json

    given = {k: v for k, v in (("json", getattr(args, "json_schema", None)),
                               ("json_object", getattr(args, "json_object", False) or None),
                               ("regex", getattr(args, "regex", None)), ("choice", getattr(args, "choice", None)),
                               ("grammar", getattr(args, "grammar", None))) if v is not None}
    if not given:
        return None
    if len(given) > 1:
        raise ConfigError(f"give one structured output flag, not {' and '.join(f'--{k}' for k in given)}",
                          key=next(iter(given)))
    kind, value = next(iter(given.items()))
    if kind == "json":
        value = read_json(value, expect=dict)  # names the file and the reason
    elif kind == "grammar":
        value = read_text(value)
    spec = Structured("json_object") if kind == "json_object" else Structured(kind, value).checked()
    spec.validate()
    return spec


def _tool_runner(args: argparse.Namespace):
    """--tools resolved (a bad spec fails before the model loads), or None."""
    from groundup.tools import ToolRunner, resolve_tools

    if args.max_tool_calls < 1:
        raise ConfigError(f"--max-tool-calls {args.max_tool_calls}: expected at least 1", key="max_tool_calls")
    return None if args.tools is None else ToolRunner(resolve_tools(args.tools))


def _require_chat(gen, model) -> None:
    """A model calls tools in its chat format: one without is refused, naming why."""
    if gen.tokenizer.chat_template is None:
        raise ConfigError(f"--tools: {model}'s tokenizer has no chat format (no chat_template), so it cannot "
                          "write tool calls or read their results; use a chat model", key="tools")


def _generator(args: argparse.Namespace):
    import torch

    from groundup.infer.engine import Generator

    if args.threads is not None:
        if args.threads < 1:
            raise DataError(f"--threads {args.threads}: expected a positive integer")
        torch.set_num_threads(args.threads)

    from groundup.infer.speculative import speculator_from_args

    g = Generator.from_checkpoint(args.model, device=args.device, dtype=args.dtype, compile=args.compile,
                                  tokenizer=args.tokenizer, adapter=args.adapter)
    speculator = speculator_from_args(args, g.tokenizer, g.device, g.dtype)
    return Generator(g.model, g.tokenizer, compile=args.compile, speculator=speculator) if speculator else g


# ---------------------------------------------------------------------- generate


def generate_arguments(p: argparse.ArgumentParser) -> None:
    _model_arguments(p)
    src = p.add_argument_group("prompts (one or both)")
    src.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    src.add_argument("--prompts-file", type=Path, default=None, help="a text file: one prompt per line; blank lines are skipped")
    p.add_argument("--batch-size", type=int, default=8, help="prompts decoded together (default: 8)")
    p.add_argument("--json", action="store_true", help="print one JSON object per completion instead of text")
    p.add_argument("--best-of", type=int, default=None, metavar="N", help="sample N completions per prompt and keep "
                   "the one the --reward scores highest")
    p.add_argument("--reward", action="append", default=None, metavar="NAME[=WEIGHT]",
                   help="with --best-of: rm:PATH (a reward model), a shipped reward or module:function")
    _sampling_arguments(p, max_new_tokens=128)
    s = p.add_argument_group("structured output (one of)")
    s.add_argument("--json-schema", type=Path, default=None, metavar="FILE", help="a JSON schema file: every "
                   "completion is JSON that validates against it")
    s.add_argument("--json-object", action="store_true", help="every completion is a JSON object")
    s.add_argument("--regex", default=None, help="every completion matches this regular expression")
    s.add_argument("--choice", action="append", default=None, help="the completion is one of these (repeatable)")
    s.add_argument("--grammar", type=Path, default=None, metavar="FILE", help="a Lark or GBNF grammar file")
    add_tool_arguments(p.add_argument_group("tools (each prompt is a user message of a chat)"))


def _read_prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt)
    if args.prompts_file is not None:
        if not args.prompts_file.exists():
            raise DataError(f"{args.prompts_file}: prompts file not found")
        lines = read_text(args.prompts_file).splitlines()  # DataError: a directory, unreadable, not UTF-8
        blank = sum(1 for line in lines if not line.strip())
        prompts += [line for line in lines if line.strip()]
        if blank:
            print(f"{args.prompts_file}: skipped {blank} blank lines", file=sys.stderr)
    if not prompts:
        raise DataError("no prompts: pass --prompt TEXT or --prompts-file FILE")
    return prompts


def generate(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise DataError(f"--batch-size {args.batch_size}: expected a positive integer")
    prompts = _read_prompts(args)
    sampling = _sampling(args)
    runner = _tool_runner(args)
    if runner is not None:
        return _generate_with_tools(args, prompts, sampling, runner)
    if args.best_of is not None:
        return _best_of(args, prompts, sampling)
    gen = _generator(args)
    start, n_tokens = time.perf_counter(), 0
    if len(prompts) == 1 and not args.json:  # one prompt: stream it as it is written
        sys.stdout.write(prompts[0])
        for piece in gen.stream(prompts[0], sampling):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        n_tokens = None
    else:
        for first in range(0, len(prompts), args.batch_size):
            batch = prompts[first : first + args.batch_size]
            for i, (prompt, c) in enumerate(zip(batch, gen.complete(batch, sampling)), start=first):
                n_tokens += len(c.token_ids)
                if args.json:
                    print(json.dumps({"index": i, "prompt": prompt, "completion": c.text,
                                      "finish_reason": c.finish_reason, "prompt_tokens": c.prompt_tokens,
                                      "completion_tokens": len(c.token_ids)}, ensure_ascii=False), flush=True)
                else:
                    print(f"{'' if i == 0 else chr(10)}--- {i}\n{prompt}{c.text}", flush=True)
    seconds = time.perf_counter() - start
    tokens = "" if n_tokens is None else f", {n_tokens} tokens ({n_tokens / seconds:.0f}/s)"
    print(f"{len(prompts)} completion{'s' if len(prompts) > 1 else ''}{tokens} in {seconds:.1f}s", file=sys.stderr)
    return 0


def _generate_with_tools(args: argparse.Namespace, prompts: list[str], sampling, runner) -> int:
    """Each prompt a user message; its calls, results and final answer printed (one prompt: as they happen)."""
    from groundup.infer.chat import EventPrinter
    from groundup.infer.tool_loop import generate_with_tools

    if args.best_of is not None or sampling.structured is not None:
        flag = "--best-of" if args.best_of is not None else "a structured output flag"
        raise ConfigError(f"--tools does not go with {flag}: the tool loop writes calls and text", key="tools")
    gen = _generator(args)
    _require_chat(gen, args.model)
    start, calls, errors = time.perf_counter(), 0, 0
    live = len(prompts) == 1 and not args.json
    for first in range(0, len(prompts), args.batch_size):
        batch = prompts[first : first + args.batch_size]
        shown: list[list[str]] = [[] for _ in batch]  # per row, the transcript as the live view writes it
        printers = [EventPrinter(rows.append) for rows in shown]
        if live:
            print(f"user> {batch[0]}\nassistant> ", end="", flush=True)
            printers = [EventPrinter(lambda text: (sys.stdout.write(text), sys.stdout.flush()))]
        rollouts = generate_with_tools(gen, [[{"role": "user", "content": p}] for p in batch], runner,
                                       max_tool_calls=args.max_tool_calls, seed=sampling.seed + first,
                                       on_event=lambda row, kind, payload: printers[row](row, kind, payload),
                                       sampling=sampling)
        for i, (prompt, r) in enumerate(zip(batch, rollouts), start=first):
            calls, errors = calls + r.tool_calls, errors + r.tool_errors
            if args.json:
                print(json.dumps({"index": i, "prompt": prompt, "completion": r.text, "messages": r.messages,
                                  "tool_calls": r.tool_calls, "tool_errors": r.tool_errors,
                                  "finish_reason": r.finish_reason}, ensure_ascii=False), flush=True)
            elif live:
                print(flush=True)
            else:
                print(f"{'' if i == 0 else chr(10)}--- {i}\nuser> {prompt}\nassistant> {''.join(shown[i - first])}",
                      flush=True)
    seconds = time.perf_counter() - start
    print(f"{len(prompts)} repl{'ies' if len(prompts) > 1 else 'y'}, {calls} tool call{'s' if calls != 1 else ''} "
          f"({errors} failed) in {seconds:.1f}s", file=sys.stderr)
    return 0


def _best_of(args: argparse.Namespace, prompts: list[str], sampling) -> int:
    """Best-of-n sampling: n completions per prompt, the highest-scored printed with its score."""
    from groundup.errors import ConfigError
    from groundup.rewards.functions import load_rewards, parse_reward_args, score

    if args.best_of < 1 or not args.reward:
        raise ConfigError("--best-of N needs N >= 1 and at least one --reward", key="best_of")
    if sampling.temperature == 0 and args.best_of > 1:
        raise ConfigError("--best-of with --temperature 0 samples the same completion N times", key="temperature")
    rewards = load_rewards(*parse_reward_args(args.reward))
    gen = _generator(args)
    for i, prompt in enumerate(prompts):
        outs = gen.complete([prompt] * args.best_of, sampling)
        scored = [(score(rewards, prompt, c.text, {})[0], -k, c) for k, c in enumerate(outs)]
        best, _, c = max(scored, key=lambda x: x[:2])
        if args.json:
            print(json.dumps({"index": i, "prompt": prompt, "completion": c.text, "score": best,
                              "scores": [s for s, _, _ in scored]}, ensure_ascii=False), flush=True)
        else:
            print(f"{'' if i == 0 else chr(10)}--- {i} (best of {args.best_of}, score {best:.4g})\n{prompt}{c.text}")
    return 0


# ---------------------------------------------------------------------- chat


def chat_arguments(p: argparse.ArgumentParser) -> None:
    _model_arguments(p)
    p.add_argument("--system", default=None, help="a system message that starts every conversation")
    _sampling_arguments(p, max_new_tokens=256)
    add_tool_arguments(p.add_argument_group("tools"))


def chat(args: argparse.Namespace) -> int:
    from groundup.infer.chat import ChatSession, run_chat

    sampling = _sampling(args)
    runner = _tool_runner(args)
    gen = _generator(args)
    if runner is not None:
        _require_chat(gen, args.model)
    session = ChatSession(gen, sampling, system=args.system, runner=runner, max_tool_calls=args.max_tool_calls)
    run_chat(session, sys.stdin, sys.stdout)
    return 0
