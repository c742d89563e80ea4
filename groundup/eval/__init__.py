"""Evaluation: benchmarks scored as lm-evaluation-harness scores them, bits per byte, contamination.

    groundup eval --model out/model --tasks core,lambada,gsm8k --out eval/      (commands.py)

    harness.py        `evaluate(model, tokenizer, tasks, EvalSettings)`: every task kind, failures counted, the
                      CORE aggregate
    scoring.py        log-likelihoods of (context, continuation) requests, each shared prefix computed once
    metrics.py        acc / acc_norm / acc_bytes, lm-eval's standard errors and bootstrap, CORE centring, pass@k
    generation.py     generative tasks: GSM8K exact match, HumanEval/MBPP pass@k (groundup.sandbox runs the code)
    bpb.py            bits per byte of a token shard directory or of raw text records, per domain
    perplexity.py     validation loss and bits per byte on token shards (also the training loop's validation)
    results.py        results.json, results.md (with a metric legend), items/<task>.jsonl, the printed table
    lm_eval_export.py `eval --export-lm-eval DIR`: the tasks' offline documents as lm-eval task files
                      (`lm_eval --include_path DIR` scores the same items)
    compare.py        `eval --compare A B`: per-task differences of two evaluations, McNemar / paired bootstrap
    contamination.py  `eval contamination`: benchmark items whose 13-grams occur in training data
                      (data/decontaminate.py's index)
    membership.py     Min-K% Prob and Min-K%++ membership scores, against shuffled items or fresh math problems
    commands.py       `groundup eval` and `groundup eval contamination`
    data_commands.py  `groundup data curate`'s entry: hands eval/bpb.py's scorer to `perplexity.checkpoint`

The benchmark definitions (lm-eval's prompts over offline data, custom TOML tasks) are groundup.benchmarks.
"""
