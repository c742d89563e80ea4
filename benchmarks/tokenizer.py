"""Tokenizer speed against the `tokenizers` library, on the embedded Shakespeare corpus (9.5 MB).

    .venv/bin/python benchmarks/tokenizer.py [--vocab-size 8192] [--repeat 3] [--all-domains]

Prints one JSON object:
- train: our end-to-end `groundup tokenizer train` (reading JSONL, held-out split, training, saving,
  held-out statistics) and `train_tokenizer` on in-memory texts, against the `tokenizers` BPE
  trainer alone on the same in-memory whole texts, with its standard byte-level pre-tokenizer and
  with our split regex. Our trainer is that library: the differences are reading and chunking.
- encode: MB/s of our encoder (tiktoken: thread pool, and the process pool `data tokenize` uses)
  against `tokenizers` batch encoding of the same tokenizer.json, and whether the ids are identical.
- tokenize_to_shards: `data tokenize` end to end (read JSONL, encode, split, write shards) in MB/s.
Each timing is the best of --repeat runs; the load average is printed because the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path


def best(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--all-domains", action="store_true", help="Shakespeare, stdlib code and math (24 MB)")
    args = p.parse_args()

    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import Regex, models, pre_tokenizers, trainers

    from groundup.cli import main as groundup
    from groundup.corpus import iter_corpus
    from groundup.tokens.shards import TokenizeConfig, tokenize_to_shards
    from groundup.tokenizer import Tokenizer, TokenizerConfig, train_tokenizer
    from groundup.tokenizer.hf_format import split_pattern
    from groundup.tokenizer.parallel import map_batches

    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="groundup-bench-"))
    records = list(iter_corpus(["text", "code", "math"] if args.all_domains else ["text"]))
    texts = [r["text"] for r in records]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    data = work / "corpus.jsonl"
    with open(data, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps({k: r[k] for k in ("id", "source", "domain", "text")}, ensure_ascii=False) + "\n")

    # --- training
    def cli_train():
        assert groundup(["tokenizer", "train", "--input", str(data), "--vocab-size", str(args.vocab_size),
                         "--out", str(work / "tok"), "--quiet"]) == 0

    def library_train(pre_tokenizer):
        def run():
            hf = HFTokenizer(models.BPE())
            hf.pre_tokenizer = pre_tokenizer
            trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, show_progress=False,
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
            hf.train_from_iterator(texts, trainer)
        return run

    ours_pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split_pattern("gpt4-fast", 3)), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    cfg = TokenizerConfig(vocab_size=args.vocab_size)

    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        t_cli, _ = best(cli_train, args.repeat)
    t_lib_std, _ = best(library_train(pre_tokenizers.ByteLevel(add_prefix_space=False)), args.repeat)
    t_lib_ours, _ = best(library_train(ours_pre), args.repeat)
    t_ours_mem, _ = best(lambda: train_tokenizer(texts, cfg, progress=False), args.repeat)

    # --- encoding
    tok = Tokenizer.load(work / "tok")
    hf = HFTokenizer.from_file(str(work / "tok" / "tokenizer.json"))
    chunks = [texts[i:i + 8] for i in range(0, len(texts), 8)]
    t_threads, ours = best(lambda: tok.encode_batch(texts), args.repeat)
    t_procs, _ = best(lambda: sum(len(a) for batch in map_batches(tok, chunks) for a in batch), args.repeat)
    t_hf, theirs = best(lambda: [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)], args.repeat)
    t_hf_fast, _ = best(lambda: hf.encode_batch_fast(texts, add_special_tokens=False), args.repeat)

    # --- tokenize to shards, end to end
    t_shards, index = best(lambda: tokenize_to_shards([data], tok, work / "shards", TokenizeConfig(),
                                                      progress=False), args.repeat)

    print(json.dumps({
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU",
        "python": sys.version.split()[0],
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "corpus_mb": round(mb, 2),
        "vocab_size": args.vocab_size,
        "train": {
            "ours_cli_end_to_end_s": round(t_cli, 2),
            "ours_train_tokenizer_in_memory_s": round(t_ours_mem, 2),
            "tokenizers_trainer_bytelevel_s": round(t_lib_std, 2),
            "tokenizers_trainer_our_regex_whole_texts_s": round(t_lib_ours, 2),
        },
        "encode": {
            "ours_tiktoken_threads_mb_s": round(mb / t_threads, 1),
            "ours_tiktoken_processes_mb_s": round(mb / t_procs, 1),
            "tokenizers_encode_batch_mb_s": round(mb / t_hf, 1),
            "tokenizers_encode_batch_fast_mb_s": round(mb / t_hf_fast, 1),
            "identical_ids": ours == theirs,
            "tokens": sum(map(len, ours)),
        },
        "tokenize_to_shards": {
            "mb_s": round(mb / t_shards, 1),
            "seconds": round(t_shards, 2),
            "tokens": index["tokens"],
        },
    }, indent=2))


if __name__ == "__main__":
    main()
