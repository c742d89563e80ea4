"""`groundup eval` and `groundup eval contamination`: the evaluation harness behind two commands.

    groundup eval --model out/model --tasks core --limit 200 --out eval/
    groundup eval --model out/model --tasks gsm8k,humaneval --samples 10 --k 1,10
    groundup eval --model out/model --bpb out/tokens heldout.jsonl
    groundup eval contamination --data out/curated --tasks core,gsm8k --out contam/
    groundup eval contamination --model out/model --tasks arc_easy --reference shuffled
    groundup eval --tasks arc_easy,gsm8k --export-lm-eval lm_tasks/    (lm_eval --include_path lm_tasks: no model)
    groundup eval --compare eval/base eval/sft --out compare/           (paired tests per task: no model)

Everything a user can get wrong (an unknown task, a custom task file with a missing field, a
missing benchmark package, an --out that holds something) is checked before the model is loaded
and reported as one line (groundup.errors).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from groundup.arguments import add_loading_arguments, add_model_argument, add_progress_argument, add_tool_arguments
from groundup.errors import ConfigError, DataError


def _ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(k) for k in text.split(",") if k.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers such as 1,10") from None
    if not ks or any(k < 1 for k in ks):
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers >= 1")
    return ks


def _model_arguments(p: argparse.ArgumentParser, required: bool) -> None:
    add_model_argument(p, required=required)
    add_loading_arguments(p)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


def _out_arguments(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--out", type=Path, default=None, help=f"directory for {what} (default: print only)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object instead of a table")
    add_progress_argument(p)


def evaluate_arguments(p: argparse.ArgumentParser) -> None:
    _model_arguments(p, required=False)  # required unless --export-lm-eval alone or --compare
    p.add_argument("--tasks", default=None,
                   help="comma-separated tasks, groups (core, generative, mmlu_stem, ...) or custom task .toml files")
    p.add_argument("--limit", type=int, default=None, help="first N items of each task (mmlu: of each subject)")
    p.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples (default: each task's, lm-eval's)")
    p.add_argument("--batch-size", type=int, default=32, help="continuation rows per forward pass (default: 32)")
    p.add_argument("--gen-batch-size", type=int, default=8, help="prompts generated together (default: 8)")
    p.add_argument("--bpb", nargs="+", default=[], metavar="PATH",
                   help="bits per byte on token shard directories or text record files (JSONL, Parquet, text)")
    p.add_argument("--bpb-split", default="val", help="split of token shards for --bpb (default: val)")
    g = p.add_argument_group("generative tasks")
    g.add_argument("--samples", type=int, default=1, help="generations per item (default: 1, greedy)")
    g.add_argument("--k", type=_ks, default=(1,), help="pass@k values, each <= --samples (default: 1)")
    g.add_argument("--temperature", type=float, default=None, help="default: 0 (greedy) for 1 sample, else 0.8")
    g.add_argument("--max-gen-tokens", type=int, default=None, help="default: each task's (lm-eval's 256)")
    g.add_argument("--seed", type=int, default=1234, help="sampling seed; --compare: the bootstrap's (default: 1234)")
    g.add_argument("--sandbox-timeout", type=float, default=10.0, help="seconds per program (default: 10)")
    g.add_argument("--workers", type=int, default=None, help="sandbox processes (default: one per CPU)")
    add_tool_arguments(g)
    p.add_argument("--bootstrap-iters", type=int, default=100_000,
                   help="resamples for bootstrapped standard errors, as lm-eval (default: 100000; 0: none)")
    r = p.add_argument_group("reproducing and comparing (no model needed)")
    r.add_argument("--export-lm-eval", type=Path, default=None, metavar="DIR",
                   help="write the --tasks' offline items as lm-eval task files in DIR: `lm_eval --include_path DIR` "
                        "then scores the same items (with --model, the evaluation runs too)")
    r.add_argument("--compare", nargs=2, type=Path, default=None, metavar=("A", "B"),
                   help="compare two `groundup eval --out` folders (or results.json files) task by task with paired "
                        "tests (McNemar, paired bootstrap seeded with --seed); --out gets compare.json, compare.md")
    _out_arguments(p, "results.json, results.md and items/<task>.jsonl (--compare: compare.json, compare.md)")


def _resolve(spec: str | None):
    """Tasks resolved and their data located, before any model is loaded."""
    from groundup.benchmarks import resolve_tasks

    if spec is None:
        return []
    tasks = resolve_tasks(spec)
    for task in tasks:
        task.files()  # a missing benchmark package or file: its DataError now
        if task.skipped:  # a custom task's bad records: said here, not only in results.json
            more = f" (and {len(task.skipped) - 3} more)" if len(task.skipped) > 3 else ""
            print(f"note: task {task.name}: skipped {len(task.skipped)} record(s) of {task.source}: "
                  f"{'; '.join(task.skipped[:3])}{more}", file=sys.stderr)
        if task.kind == "generate" and any(item.tests is not None for item in task.items(limit=1)):
            from groundup.sandbox.runner import default_python

            default_python()  # no interpreter the sandbox can run: say so before generating anything
    return tasks


def _load(args):
    import torch

    from groundup.loading import load_for_inference

    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads {args.threads}: expected a positive integer", key="threads")
        torch.set_num_threads(args.threads)
    return load_for_inference(args.model, args.device, args.dtype, args.tokenizer, adapter=args.adapter)


def model_info(path, model, tokenizer, device: str, dtype: str) -> dict:
    from groundup.eval.scoring import prefix_ids
    from groundup.layout import CHECKPOINT_META_FILE, WEIGHTS_FILE, file_digest, read_checkpoint_meta, resolve_model_dir

    model_dir = resolve_model_dir(path, note=lambda _: None)
    digest = None
    if (model_dir / CHECKPOINT_META_FILE).is_file():
        digest = read_checkpoint_meta(model_dir).get("files", {}).get(WEIGHTS_FILE)
    if digest is None and (model_dir / WEIGHTS_FILE).is_file():
        digest = file_digest(model_dir / WEIGHTS_FILE)
    return {"path": str(path), "model_dir": str(model_dir), "weights_digest": digest,
            "params": sum(p.numel() for p in model.parameters()), "vocab_size": model.cfg.vocab_size,
            "max_seq_len": model.cfg.max_seq_len, "dtype": dtype, "device": device,
            "tokenizer_hash": tokenizer.hash, "tokenizer_backend": getattr(tokenizer, "backend", None),
            "prefix_ids": prefix_ids(tokenizer)}


def _environment() -> dict:
    import platform

    import torch

    from groundup import __version__

    return {"groundup": __version__, "torch": torch.__version__, "python": platform.python_version(),
            "threads": torch.get_num_threads()}


def _finish(args, results: dict, records: dict, text: str, name: str = "results", markdown: str | None = None,
            verb: str = "eval") -> None:
    import json

    from groundup.eval.results import _clean, write_results

    if args.json:
        print(json.dumps(_clean(results), ensure_ascii=False))
    else:
        print(text)
    if args.out is not None:
        write_results(args.out, results, records, overwrite=args.overwrite, name=name, markdown=markdown, verb=verb)
        print(f"wrote {args.out}/{name}.json, {name}.md, items/", file=sys.stderr)


def evaluate(args: argparse.Namespace) -> int:
    from groundup.eval.harness import EvalSettings
    from groundup.eval.harness import evaluate as run
    from groundup.eval.results import render_table
    from groundup.layout import claim_output_dir

    if args.compare is not None:
        return compare(args)
    if args.model is None and args.export_lm_eval is None:
        raise ConfigError("--model is required (--export-lm-eval DIR and --compare A B need none)", key="model")
    if not args.tasks and not args.bpb:
        raise ConfigError("nothing to evaluate: pass --tasks (names, groups or .toml files) and/or --bpb PATH",
                          key="tasks")
    if args.export_lm_eval is not None:
        _check_export(args)
    settings = EvalSettings(limit=args.limit, num_fewshot=args.num_fewshot, batch_size=args.batch_size,
                            gen_batch_size=args.gen_batch_size, bootstrap_iters=args.bootstrap_iters,
                            samples=args.samples, ks=args.k, temperature=args.temperature,
                            max_gen_tokens=args.max_gen_tokens, seed=args.seed, sandbox_timeout=args.sandbox_timeout,
                            workers=args.workers, tools=args.tools, max_tool_calls=args.max_tool_calls)
    settings.validate()
    if args.limit is not None and args.limit < 0:
        raise ConfigError(f"--limit {args.limit}: expected an integer >= 0", key="limit")
    if any(k > args.samples for k in args.k):
        raise ConfigError(f"--k {','.join(map(str, args.k))}: each k must be <= --samples {args.samples}", key="k")
    for path in args.bpb:
        if not Path(path).exists():
            raise DataError(f"--bpb {path}: no such file or directory")
    if args.out is not None:
        claim_output_dir(args.out, "eval", overwrite=args.overwrite, sources=[args.model])
    tasks = _resolve(args.tasks)
    _check_tools(args.tools, tasks)
    if args.export_lm_eval is not None:
        from groundup.eval.lm_eval_export import export_lm_eval, summary

        manifest = export_lm_eval(tasks, args.export_lm_eval, num_fewshot=args.num_fewshot, limit=args.limit,
                                  max_gen_tokens=args.max_gen_tokens, overwrite=args.overwrite)
        print(summary(manifest, args.export_lm_eval), file=sys.stdout if args.model is None else sys.stderr)
        if args.model is None:
            return 0
    started = time.perf_counter()
    model, tok = _load(args)
    if any(args.tools or t.tools for t in tasks if t.kind == "generate") and tok.chat_template is None:
        raise ConfigError(f"tools: {args.model}'s tokenizer has no chat format (no chat_template), so it cannot "
                          "write tool calls or read their results; evaluate a chat model", key="tools")
    results: dict = {"version": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "command": ["groundup", "eval", *sys.argv[2:]] if sys.argv[1:2] == ["eval"] else None,
                     "model": model_info(args.model, model, tok, args.device, args.dtype)}

    def done(r: dict) -> None:
        main = ", ".join(f"{m} {v['value']:.4f}" for m, v in r["metrics"].items()
                         if isinstance(v["value"], float) and v["value"] == v["value"])
        extra = (f"; {r['failed']} failed, first: {r['failures'][0]['reason']}" if r["failed"] else "") + (
            f"; {r['truncated']} truncated" if r["truncated"] else "")
        print(f"{r['name']}: {main} ({r['items']} items, {r['seconds']:.1f}s{extra})", file=sys.stderr)

    out = run(model, tok, tasks, settings, progress=not args.quiet, on_task=done) if tasks else \
        {"tasks": {}, "records": {}, "aggregate": None, "settings": settings.__dict__}
    records = out.pop("records")
    for r in out["tasks"].values():  # each task's numbers name the weights and tokenizer they came from
        r["model_digest"], r["tokenizer_hash"] = results["model"]["weights_digest"], results["model"]["tokenizer_hash"]
    results.update(out)
    if args.bpb:
        from groundup.eval.bpb import bits_per_byte

        results["bpb"] = {str(p): bits_per_byte(model, tok, p, split=args.bpb_split, batch_size=args.batch_size)
                          for p in args.bpb}
    results["seconds"] = round(time.perf_counter() - started, 3)
    results["environment"] = _environment()
    _finish(args, results, records, render_table(results))
    dead = [r for r in out["tasks"].values() if r["items"] and not r["scored"]]
    if dead:  # numbers of nothing: the run failed, whatever was written
        r = dead[0]
        raise DataError(f"task {r['name']}: none of its {r['items']} items could be scored (first: "
                        f"{r['failures'][0]['reason']})")
    return 0


def _check_tools(spec: str | None, tasks) -> None:
    """Every tool spec (--tools, a custom task's `tools`) resolved before the model loads: a bad one fails now."""
    from groundup.tools import resolve_tools

    for given in {spec, *(t.tools for t in tasks if t.kind == "generate")} - {None}:
        resolve_tools(given)
    if spec is not None and not any(t.kind == "generate" for t in tasks):
        print("note: --tools applies to generative tasks only; none of these --tasks generates", file=sys.stderr)


def _check_export(args) -> None:
    if not args.tasks:
        raise ConfigError("--export-lm-eval writes tasks: pass --tasks", key="tasks")
    if args.samples != 1:
        raise ConfigError(f"--export-lm-eval: lm-eval's task definitions decode greedily, one sample per item; "
                          f"--samples {args.samples} has no lm-eval counterpart to export", key="samples")
    if args.model is None and (args.out is not None or args.bpb):
        flag = "--out" if args.out is not None else "--bpb"
        raise ConfigError(f"{flag} is for an evaluation, which needs --model; --export-lm-eval alone writes only its "
                          "DIR", key="out" if args.out is not None else "bpb")
    if args.out is not None and Path(args.out).resolve() == Path(args.export_lm_eval).resolve():
        raise ConfigError(f"--out and --export-lm-eval are the same folder ({args.out}): give each its own",
                          key="export_lm_eval")


def compare(args: argparse.Namespace) -> int:
    """`groundup eval --compare A B`: no model, no tasks; two finished evaluations in, a table out."""
    import json

    from groundup.eval.compare import CompareSettings, compare_runs, load_run, render_compare, write_compare
    from groundup.eval.results import _clean
    from groundup.layout import claim_output_dir

    given = [flag for flag, value in (("--model", args.model), ("--tasks", args.tasks), ("--bpb", args.bpb),
                                      ("--export-lm-eval", args.export_lm_eval)) if value]
    if given:
        raise ConfigError(f"--compare reads two finished evaluations; {given[0]} does not go with it (run "
                          "`groundup eval` for each model first, with --out)", key="compare")
    settings = CompareSettings(seed=args.seed)
    settings.validate()
    if args.out is not None:
        claim_output_dir(args.out, "eval --compare", overwrite=args.overwrite, sources=args.compare)
    report = compare_runs(load_run(args.compare[0]), load_run(args.compare[1]), settings)
    print(json.dumps(_clean(report), ensure_ascii=False) if args.json else render_compare(report))
    if args.out is not None:
        write_compare(args.out, report, overwrite=args.overwrite)
        print(f"wrote {args.out}/compare.json, compare.md", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------- contamination


def contamination_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", required=True, help="comma-separated tasks, groups or custom task .toml files")
    p.add_argument("--data", nargs="+", default=[], metavar="PATH",
                   help="training data: token shard directories, curated directories, JSONL/Parquet/text files")
    p.add_argument("--limit", type=int, default=None, help="first N items of each task")
    p.add_argument("--ngram", type=int, default=13, help="word n-gram length (default: 13, lm-eval's)")
    p.add_argument("--max-ids", type=int, default=10, help="matching document ids kept per item (default: 10)")
    p.add_argument("--data-tokenizer", default=None,
                   help="tokenizer of token shards (default: the one their index names)")
    g = p.add_argument_group("membership scores (with --model)")
    _model_arguments(g, required=False)
    g.add_argument("--reference", default="shuffled", choices=("shuffled", "math"),
                   help="unseen text to compare with: each item's words shuffled, or fresh math problems")
    g.add_argument("--min-k", type=float, default=0.2, help="fraction of lowest tokens averaged (default: 0.2)")
    g.add_argument("--batch-size", type=int, default=8, help="texts per forward pass (default: 8)")
    _out_arguments(p, "contamination.json, contamination.md and items/<task>.jsonl")


def contamination(args: argparse.Namespace) -> int:
    from groundup.data.decontaminate import task_texts
    from groundup.layout import claim_output_dir

    if not args.data and not args.model:
        raise ConfigError("nothing to check: pass --data PATH (training data) and/or --model M (membership scores)",
                          key="data")
    if args.ngram < 1:
        raise ConfigError(f"--ngram {args.ngram}: expected at least 1", key="ngram")
    if not 0 < args.min_k <= 1:
        raise ConfigError(f"--min-k {args.min_k}: expected a fraction in (0, 1]", key="min_k")
    for path in args.data:
        if not Path(path).exists():
            raise DataError(f"--data {path}: no such file or directory")
    if args.out is not None:
        claim_output_dir(args.out, "eval contamination", overwrite=args.overwrite,
                         sources=[*args.data, *([args.model] if args.model else [])])
    _resolve(args.tasks)
    started = time.perf_counter()
    results: dict = {"version": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    records: dict = {}
    lines = []
    if args.data:
        from tqdm import tqdm

        from groundup.eval.contamination import contamination as run, render_contamination

        with tqdm(desc="training documents", unit=" docs", disable=args.quiet, leave=False) as bar:
            report = run(args.data, args.tasks, limit=args.limit, tokenizer=args.data_tokenizer, ngram=args.ngram,
                         max_ids=args.max_ids, progress=bar.update)
        records = report.pop("records")
        results["contamination"] = report
        lines.append(render_contamination(report))
    if args.model:
        from groundup.eval.membership import membership

        model, tok = _load(args)
        texts = {name: item_texts for name, _, item_texts in task_texts(args.tasks, args.limit)}
        found = membership(model, tok, texts, reference=args.reference, k=args.min_k, batch_size=args.batch_size)
        results["model"] = model_info(args.model, model, tok, args.device, args.dtype)
        for name, entry in found["tasks"].items():
            for rec, scores in zip(records.setdefault(name, [{} for _ in entry["items"]]), entry.pop("items")):
                rec.update(scores)
        results["membership"] = found
        lines.append(render_membership(found))
    results["seconds"] = round(time.perf_counter() - started, 3)
    text = "\n\n".join(lines)
    _finish(args, results, records, text, name="contamination", verb="eval contamination",
            markdown=f"# Contamination\n\n```\n{text}\n```\n\nDetails: contamination.json, items/<task>.jsonl.\n")
    return 0


def render_membership(found: dict) -> str:
    lines = [f"membership scores (k = {found['k']:.0%}; reference: {found['reference']}; higher = more likely seen)",
             f"{'task':<20} {'score':<16} {'task mean':>10} {'ref mean':>10} {'AUC':>6}"]
    for name, entry in found["tasks"].items():
        for label in ("min_k_prob", "min_k_plus_plus"):
            e = entry[label]
            lines.append(f"{name:<20} {label:<16} {e['task'].get('mean', float('nan')):>10.3f} "
                         f"{e['reference'].get('mean', float('nan')):>10.3f} {e['auc']:>6.3f}")
    return "\n".join(lines)
