"""Evaluation: benchmarks scored as lm-evaluation-harness scores them, bits per byte, contamination.

    groundup eval --checkpoint out/model --tasks core,lambada,gsm8k --out eval/      (commands.py)

    tasks/          the benchmarks: lm-eval's prompts over offline data, custom TOML tasks
    scoring.py      log-likelihoods of (context, continuation) requests, each shared prefix computed once
    metrics.py      acc / acc_norm / acc_bytes, lm-eval's standard errors and bootstrap, CORE centring
    harness.py      `evaluate(model, tokenizer, tasks, EvalSettings)`: every task kind, failures counted
    generation.py   GSM8K exact match, HumanEval/MBPP pass@k (sandbox.py runs the code)
    bpb.py          bits per byte on token shards (perplexity.py) or raw text records, per domain
    results.py      results.json, results.md, items/<task>.jsonl, the printed table
    contamination.py, membership.py   13-gram overlap with training data (data/decontaminate.py);
                    Min-K% Prob and Min-K%++ against unseen text
"""
