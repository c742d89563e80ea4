"""`groundup eval` against lm-evaluation-harness: the same model, the same items, the same numbers?

    .venv/bin/python benchmarks/eval_agreement.py                       # ~15 minutes on 2 CPU cores
    .venv/bin/python benchmarks/eval_agreement.py --limit 50 --gsm8k-limit 2   # a quick look

1. A model: random weights scaled up (init_std 0.05, so that choices differ clearly) of 4 layers x
   256 (GQA 4/2, context 2048, 4.2M parameters) over a 4,096-token BPE trained on the embedded corpus
   (`groundup.tokenizer.train_tokenizer`), saved as a groundup model directory and exported with
   `groundup export hf` (a LlamaForCausalLM).
2. groundup: `groundup eval --checkpoint MODEL --tasks arc_easy,hellaswag,piqa,winogrande --limit N
   --batch-size B --out OURS` (a subprocess), then the same for gsm8k.
3. lm-eval in this process, offline (HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1): HFLM on the exported
   directory, fp32, CPU, batch_size B, `prefix_token_id=<|end_of_text|>`, `max_length` = the model's
   context, and add_bos_token left unset: transformers then keeps the exported post-processor, which
   prepends <|end_of_text|> (as Llama 3's prepends <|begin_of_text|>), so lm-eval's `tok_encode` gives
   exactly groundup's prefix_ids + ids. (add_bos_token=True makes transformers rebuild the
   post-processor around bos_token, <|begin_of_text|>: other tokens than the model was trained on.)
   Each task is lm-eval's own YAML (lm_benchmarks/...) with its download replaced by the documents
   groundup reads (`custom_dataset`), run through `simple_evaluate(log_samples=True, limit=N)`.
4. Compared per item: every choice's log-likelihood (max |delta|, absolute and relative), the chosen
   answers (acc and acc_norm; a disagreement lists the gap between lm-eval's top two choices), the
   accuracies. Speed, items per second: end to end per task as each harness reports its own wall
   time (items, requests, scoring, metrics; model loading excluded), and scoring alone (tokenising
   included: lm-eval's `HFLM.loglikelihood` on its Instances against groundup's encode + score on
   the same requests, interleaved, best of --repeats, so a busy machine hurts both alike). GSM8K:
   groundup's extraction on lm-eval's generations must give lm-eval's exact matches (both filters);
   the two engines' greedy generations are compared text for text.

Per-item sums are float32 in lm-eval: a sum of -1,500 nats is representable only to 1.2e-4, so the
absolute delta of long continuations is bounded by float32 spacing, not by the models (per-token
log-probabilities agree to ~2e-6); groundup sums in float64.

Prints one JSON object (the lead copies the numbers into the README).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
MC_TASKS = ["arc_easy", "hellaswag", "piqa", "winogrande"]


def build_model(work: Path, init_std: float, seed: int = 0) -> tuple[Path, Path]:
    import torch

    from groundup.config import from_dict
    from groundup.corpus import iter_corpus
    from groundup.model import ModelConfig, Transformer
    from groundup.model.model_dir import save_model
    from groundup.tokenizer import TokenizerConfig, train_tokenizer

    model_dir, hf_dir = work / "model", work / "hf"
    if not (model_dir / "model.safetensors").is_file():
        texts = [r["text"] for d in ("text", "code", "math")
                 for r in itertools.islice(iter_corpus([d], chunk_chars=20_000), 120)]
        tok = train_tokenizer(texts, TokenizerConfig(vocab_size=4096), progress=False)
        torch.manual_seed(seed)
        cfg = from_dict(ModelConfig, {"preset": "tiny", "vocab_size": tok.vocab_size, "d_model": 256, "n_layers": 4,
                                      "n_heads": 4, "n_kv_heads": 2, "d_ff": 768, "max_seq_len": 2048,
                                      "init_std": init_std})
        save_model(Transformer(cfg), model_dir)
        tok.save(model_dir / "tokenizer")
    if not (hf_dir / "config.json").is_file():
        run([sys.executable, "-m", "groundup", "export", "hf", "--checkpoint", str(model_dir), "--out", str(hf_dir),
             "--overwrite"])
    return model_dir, hf_dir


def run(cmd: list[str]) -> None:
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=sys.stderr)  # stdout carries only the final JSON


def groundup_eval(model_dir: Path, out: Path, tasks: str, limit: int, batch_size: int,
                  threads: int) -> tuple[dict, dict, list]:
    cmd = [sys.executable, "-m", "groundup", "eval", "--checkpoint", str(model_dir), "--tasks", tasks,
           "--limit", str(limit), "--batch-size", str(batch_size), "--threads", str(threads), "--bootstrap-iters",
           "0", "--out", str(out), "--overwrite", "--no-progress"]
    run(cmd)
    results = json.loads((out / "results.json").read_text())
    items = {name: [json.loads(line) for line in (out / "items" / f"{name}.jsonl").read_text().splitlines()]
             for name in results["tasks"]}
    return results, items, cmd


# ----------------------------------------------------------------------------- lm-eval


def lm_eval_task(name: str):
    """lm-eval's own task from its YAML, its dataset replaced by the documents groundup reads."""
    import datasets
    import lm_eval
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks._yaml_loader import load_yaml

    from groundup.benchmarks import generative, multiple_choice as mc

    hf = mc._hf
    # lm-eval builds its few-shot sampler from a train split even at 0-shot: given the split groundup uses
    splits = {
        "arc_easy": ("arc/arc_easy.yaml", lambda: {"test": mc._oe("arc_easy", "test_rc_5shot", mc.arc_from_oe),
                                                   "train": hf("ai2_arc/ARC-Easy", "validation")}),
        "hellaswag": ("hellaswag/hellaswag.yaml", lambda: {"validation": hf("hellaswag/none", "validation"),
                                                           "train": hf("hellaswag/none", "validation")}),
        "piqa": ("piqa/piqa.yaml", lambda: {"validation": hf("piqa/plain_text", "validation"),
                                            "train": hf("piqa/plain_text", "validation")}),
        "winogrande": ("winogrande/default.yaml", lambda: {"validation": hf("winogrande/winogrande_xl", "validation"),
                                                           "train": hf("winogrande/winogrande_xl", "validation")}),
        "gsm8k_cot": ("gsm8k/gsm8k-cot.yaml", lambda: {"test": generative._docs("gsm8k", "gold_bpb_5shot")}),
    }
    yaml, docs = splits[name]
    cfg = load_yaml(Path(lm_eval.__file__).parent / "tasks" / yaml, resolve_func=True)
    for key in ("tag", "group"):
        cfg.pop(key, None)
    converted: dict[int, object] = {}
    for split in docs().values():
        converted.setdefault(id(split), datasets.Dataset.from_list(list(split)))
    dataset = datasets.DatasetDict({k: converted[id(v)] for k, v in docs().items()})
    cfg["custom_dataset"] = lambda **_: dataset
    return ConfigurableTask(config=cfg)


MODEL_SECONDS = {"s": 0.0}


def time_requests(lm) -> None:
    """Count the time lm-eval spends inside its model's request methods (scoring or generating)."""
    for method in ("loglikelihood", "generate_until"):
        bound = getattr(lm, method)

        def timed(*a, _bound=bound, **k):
            t0 = time.perf_counter()
            try:
                return _bound(*a, **k)
            finally:
                MODEL_SECONDS["s"] += time.perf_counter() - t0

        setattr(lm, method, timed)


def lm_eval_run(lm, name: str, limit: int) -> tuple[dict, list, float, float]:
    """(metrics, samples, seconds of the whole task, seconds inside the model's request methods)."""
    from lm_eval import simple_evaluate

    task = lm_eval_task(name)
    MODEL_SECONDS["s"] = 0.0
    start = time.perf_counter()
    out = simple_evaluate(model=lm, tasks=[task], limit=limit, log_samples=True, bootstrap_iters=0)
    seconds = time.perf_counter() - start
    key = next(iter(out["results"]))
    return out["results"][key], out["samples"][key], seconds, MODEL_SECONDS["s"]


# ----------------------------------------------------------------------------- comparison


def compare_mc(name: str, ours: list[dict], theirs: list[dict], our_result: dict, their_metrics: dict) -> dict:
    """Per item: every choice's log-likelihood, the chosen answers, then the accuracies."""
    theirs = sorted(theirs, key=lambda s: s["doc_id"])
    assert len(ours) == len(theirs), (name, len(ours), len(theirs))
    max_delta = max_rel = max_small = 0.0
    disagree = {"acc": [], "acc_norm": []}
    for mine, s in zip(ours, theirs):
        lls = [float(r[0][0]) for r in s["resps"]]
        for a, b in zip(mine["lls"], lls):
            max_delta = max(max_delta, abs(a - b))
            max_rel = max(max_rel, abs(a - b) / max(1.0, abs(b)))
            if abs(b) < 512:  # where float32 steps are at most 6e-5
                max_small = max(max_small, abs(a - b))
        for metric in disagree:
            if metric in s and float(s[metric]) != mine[metric]:
                ranked = sorted(lls, reverse=True)
                disagree[metric].append({"item": mine["id"], "top_two_gap": ranked[0] - ranked[1]})
    accuracies = {m: {"groundup": our_result["metrics"][m]["value"], "lm_eval": their_metrics.get(f"{m},none")}
                  for m in ("acc", "acc_norm") if f"{m},none" in their_metrics}
    return {"items": len(ours), "max_abs_delta_logprob": max_delta, "max_rel_delta_logprob": max_rel,
            "max_abs_delta_logprob_below_512": max_small,
            "choice_disagreements": disagree, "accuracy": accuracies,
            "accuracy_equal": all(abs(v["groundup"] - v["lm_eval"]) < 1e-12 for v in accuracies.values())}


def compare_gsm8k(ours: list[dict], theirs: list[dict], their_metrics: dict) -> dict:
    """groundup's extraction and exact match on lm-eval's own generations, and the two engines' texts."""
    from groundup.benchmarks import exact_match, extract_flexible, extract_strict

    by_doc: dict[int, dict] = {}
    for s in theirs:
        by_doc.setdefault(s["doc_id"], {})[s["filter"]] = s
    same_em, identical_text = 0, 0
    for i, mine in enumerate(ours):
        samples = by_doc[i]
        raw = next(iter(samples.values()))["resps"][0][0]
        target = next(iter(samples.values()))["target"]
        ok = (exact_match(extract_strict(raw), target) == bool(samples["strict-match"]["exact_match"])
              and exact_match(extract_flexible(raw), target) == bool(samples["flexible-extract"]["exact_match"]))
        same_em += ok
        identical_text += mine["outputs"][0] == raw
    return {"items": len(ours), "exact_match_equal_on_lm_eval_generations": same_em,
            "identical_generations": identical_text,
            "lm_eval_exact_match": {"strict-match": their_metrics.get("exact_match,strict-match"),
                                    "flexible-extract": their_metrics.get("exact_match,flexible-extract")}}


def scoring_speed(lm, model, tok, name: str, limit: int, batch_size: int, repeats: int) -> dict:
    """Items per second of scoring alone (tokenising included), interleaved, best of `repeats`:
    lm-eval's `HFLM.loglikelihood` on its Instances, groundup's encode + score on the same requests;
    by wall clock and by this process's CPU time (which another process's load disturbs less)."""
    from lm_eval.api.instance import Instance

    from groundup.eval.scoring import encode_requests, score_requests
    from groundup.benchmarks import get_task

    items = get_task(name).items(limit=limit)
    requests, groups = [], []
    for item in items:
        groups.append(list(range(len(requests), len(requests) + item.num_choices)))
        requests += item.requests()
    instances = [Instance("loglikelihood", {}, r, i) for i, r in enumerate(requests)]
    runs = {
        "lm_eval": lambda: lm.loglikelihood(instances, disable_tqdm=True),
        "groundup": lambda: score_requests(model, encode_requests(tok, requests, model.cfg.max_seq_len), batch_size,
                                           groups=groups, greedy=False),
    }
    wall = {k: float("inf") for k in runs}
    cpu = {k: float("inf") for k in runs}
    for _ in range(repeats):
        for key, fn in runs.items():
            w, c = time.perf_counter(), time.process_time()
            fn()
            wall[key] = min(wall[key], time.perf_counter() - w)
            cpu[key] = min(cpu[key], time.process_time() - c)
    out = {}
    for label, best in (("wall", wall), ("cpu", cpu)):
        out[label] = {k: round(len(items) / v, 1) for k, v in best.items()}
        out[label]["ratio"] = round(out[label]["groundup"] / out[label]["lm_eval"], 2)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/groundup-eval-agreement"))
    p.add_argument("--limit", type=int, default=300, help="items per multiple-choice task")
    p.add_argument("--gsm8k-limit", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="timed scoring runs per harness and task (best kept)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads for both harnesses (default 1: on a shared 2-core machine two threads "
                        "wait on each other whenever another process takes a core)")
    p.add_argument("--init-std", type=float, default=0.05, help="weight scale of the random model (default 0.05)")
    args = p.parse_args()
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    args.work.mkdir(parents=True, exist_ok=True)
    model_dir, hf_dir = build_model(args.work, args.init_std)
    ours, our_items, cmd = groundup_eval(model_dir, args.work / "ours", ",".join(MC_TASKS), args.limit,
                                         args.batch_size, args.threads)
    ours_gsm, our_gsm_items, _ = groundup_eval(model_dir, args.work / "ours-gsm8k", "gsm8k", args.gsm8k_limit,
                                               args.batch_size, args.threads)

    import datasets
    import torch
    from lm_eval.models.huggingface import HFLM

    from groundup.loading import load_for_inference

    datasets.disable_progress_bars()
    torch.set_num_threads(args.threads)
    model, tok = load_for_inference(model_dir)
    # add_bos_token left unset: transformers keeps the exported post-processor, which prepends
    # <|end_of_text|> exactly as groundup's prefix_ids; add_bos_token=True would make it rebuild the
    # post-processor around bos_token <|begin_of_text|>, a token the model never saw before a document.
    lm = HFLM(pretrained=str(hf_dir), device="cpu", dtype="float32", batch_size=args.batch_size,
              prefix_token_id=tok.eot_id, max_length=model.cfg.max_seq_len)
    time_requests(lm)
    report: dict = {
        "model": {"params": ours["model"]["params"], "d_model": 256, "layers": 4, "heads": "4 (2 kv)",
                  "vocab": tok.vocab_size, "context": model.cfg.max_seq_len,
                  "weights": f"random, init_std {args.init_std}", "dtype": "float32"},
        "machine": f"CPU, torch threads {torch.get_num_threads()}", "batch_size": args.batch_size,
        "lm_eval": {"version": __import__("lm_eval").__version__, "model": "hf", "dtype": "float32",
                    "add_bos_token": "unset (the tokenizer's post-processor prepends <|end_of_text|>)",
                    "prefix_token_id": tok.eot_id, "max_length": model.cfg.max_seq_len},
        "groundup_command": " ".join(["groundup", *cmd[3:]]), "tasks": {}}
    for name in MC_TASKS:
        metrics, samples, seconds, _ = lm_eval_run(lm, name, args.limit)
        r = ours["tasks"][name]
        entry = compare_mc(name, our_items[name], samples, r, metrics)
        entry["end_to_end_items_per_s"] = {"groundup": round(r["items"] / r["seconds"], 1),
                                           "lm_eval": round(len(samples) / seconds, 1)}
        entry["end_to_end_items_per_s"]["ratio"] = round(
            entry["end_to_end_items_per_s"]["groundup"] / entry["end_to_end_items_per_s"]["lm_eval"], 2)
        entry["scoring_items_per_s"] = scoring_speed(lm, model, tok, name, args.limit, args.batch_size, args.repeats)
        report["tasks"][name] = entry
        print(name, json.dumps(entry), file=sys.stderr, flush=True)
    metrics, samples, seconds, _ = lm_eval_run(lm, "gsm8k_cot", args.gsm8k_limit)
    gsm = compare_gsm8k(our_gsm_items["gsm8k_cot"], samples, metrics)
    gsm["groundup_exact_match"] = {k.split(",")[1]: v["value"]
                                   for k, v in ours_gsm["tasks"]["gsm8k_cot"]["metrics"].items()}
    gsm["items_per_s"] = {"groundup": ours_gsm["tasks"]["gsm8k_cot"]["items_per_s"],
                          "lm_eval": round(args.gsm8k_limit / seconds, 3)}
    report["gsm8k_cot"] = gsm
    tasks = list(report["tasks"].values())
    n_items = sum(t["items"] for t in tasks)

    def overall(pick) -> dict:
        out = {h: round(n_items / sum(t["items"] / pick(t)[h] for t in tasks), 1) for h in ("groundup", "lm_eval")}
        out["ratio"] = round(out["groundup"] / out["lm_eval"], 2)
        return out

    report["summary"] = {
        "max_abs_delta_logprob": max(t["max_abs_delta_logprob"] for t in tasks),
        "max_rel_delta_logprob": max(t["max_rel_delta_logprob"] for t in tasks),
        "max_abs_delta_logprob_below_512": max(t["max_abs_delta_logprob_below_512"] for t in tasks),
        "choice_disagreements": sum(len(v) for t in tasks for v in t["choice_disagreements"].values()),
        "accuracies_equal": all(t["accuracy_equal"] for t in tasks),
        "scoring_items_per_s_wall": overall(lambda t: t["scoring_items_per_s"]["wall"]),
        "scoring_items_per_s_cpu": overall(lambda t: t["scoring_items_per_s"]["cpu"]),
        "end_to_end_items_per_s": overall(lambda t: t["end_to_end_items_per_s"]),
        "gsm8k_exact_match_equal": gsm["exact_match_equal_on_lm_eval_generations"] == gsm["items"],
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
