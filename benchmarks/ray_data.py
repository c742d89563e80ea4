"""`data curate` and `data tokenize` through a local Ray cluster against the single-machine run.

    .venv/bin/python benchmarks/ray_data.py [--repeat 3] [--cpus 2] [--vocab-size 4096] > ray_data.json

Needs the `ray` extra. In one process: `groundup data sample` writes the embedded corpus (three
JSONL files), one local curation trains the tokenizer (4,096 tokens, not timed), and `ray start
--head --num-cpus CPUS` starts a cluster on loopback (its start-up is timed on its own: a cluster is
started once and then serves many runs). Then two phases of --repeat rounds, each round running
both executors into fresh directories (which goes first alternates, so that neither always meets
the machine's other load first):

- local: `data curate --workers CPUS`, then `data tokenize --workers CPUS` (processes on this machine);
- ray (phase 1, the process connected to the cluster once, its worker processes started and the
  task code imported before the rounds, as in a session that runs several steps): the same two
  verbs with `--executor ray`;
- ray_cli (phase 2, as a shell runs it): the same two verbs with `--executor ray --address
  127.0.0.1:PORT`; each verb connects, is a Ray job of its own and so starts its own worker
  processes, which is counted in its time.

Prints one JSON object: `identical` (how compared: the SHA-256 of every curated shard and every
token file, and report.json / index.json apart from their timings, for every round of every
executor), the median wall time of each verb per executor and every round (the machine is shared:
the load average is printed too), `overhead`: Ray's median time over the local one of the same
phase, minus one, per verb and for both together, and whether the goal (under 20%) is met.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def digests(root: Path, subdirs: tuple[str, ...]) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for d in subdirs for p in sorted((root / d).rglob("*")) if p.is_file()}


def plain_report(path: Path) -> dict:
    """report.json without the clock: timing, and each stage's seconds and rates."""
    report = json.loads(path.read_text())
    report.pop("timing")
    for stage in report["stages"]:
        for key in ("seconds", "docs_per_s", "mb_per_s"):
            stage.pop(key)
    return report


def plain_index(path: Path) -> dict:
    """index.json without the clock and without `inputs`, which names each executor's own curated shards."""
    index = json.loads(path.read_text())
    index.pop("seconds"), index.pop("inputs")
    return index


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def start_head(cpus: int) -> tuple[subprocess.Popen, str, str, float]:
    """`ray start --head --block` on loopback: the process, its address, its temp dir, seconds to start."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="gu-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    log = Path(temp) / "head.log"
    started = time.perf_counter()
    with open(log, "w") as f:
        head = subprocess.Popen([str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
                                 f"--num-cpus={cpus}", f"--port={port}", "--node-ip-address=127.0.0.1",
                                 "--include-dashboard=false", f"--temp-dir={temp}"],
                                env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}, stdout=f, stderr=subprocess.STDOUT)
    while "Ray runtime started" not in log.read_text():
        if head.poll() is not None:
            sys.exit("ray start --head failed:\n" + log.read_text()[-3000:])
        time.sleep(0.1)
    return head, f"127.0.0.1:{port}", temp, time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cpus", type=int, default=2, help="worker processes (local) and CPUs of the Ray cluster")
    p.add_argument("--vocab-size", type=int, default=4096)
    args = p.parse_args()

    # The head and this process must agree on Ray's token authentication: off unless asked for (a
    # token in ~/.ray/auth_token would switch it on for `ray start` but not for a connecting driver).
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from groundup.cli import main as groundup

    def run(*words) -> None:
        with contextlib.redirect_stdout(sys.stderr):  # the verbs' summaries: stdout is the JSON alone
            failed = groundup([str(w) for w in words])
        if failed:
            sys.exit(f"failed: groundup {' '.join(map(str, words))}")

    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="groundup-ray-bench-"))
    raw, tokenizer = work / "raw", work / "tokenizer"
    run("data", "sample", "--out", raw)
    run("data", "curate", "--input", raw, "--out", work / "tokenizer-data", "--workers", args.cpus, "--no-progress")
    run("tokenizer", "train", "--input", work / "tokenizer-data" / "shards", "--vocab-size", args.vocab_size,
        "--out", tokenizer, "--quiet")
    head, address, temp, head_s = start_head(args.cpus)

    rounds: dict[str, list[dict]] = {"local": [], "ray": [], "local_2": [], "ray_cli": []}

    def one_round(r: int, names: tuple[str, str], flags: dict[str, list]) -> None:
        for name in (names if r % 2 == 0 else names[::-1]):
            out = work / f"{name}-{r}"
            curate_s = timed(lambda: run("data", "curate", "--input", raw, "--out", out / "curated", "--no-progress",
                                         *flags[name]))
            tokenize_s = timed(lambda: run("data", "tokenize", "--tokenizer", tokenizer, "--input",
                                           out / "curated" / "shards", "--out", out / "tokens", "--quiet",
                                           "--val-fraction", "0.02", *flags[name]))
            rounds[name].append({"curate_s": round(curate_s, 2), "tokenize_s": round(tokenize_s, 2),
                                 "total_s": round(curate_s + tokenize_s, 2)})

    local_flags = ["--workers", args.cpus]
    try:
        started = time.perf_counter()
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)  # quiet: workers' exit messages
        connect_s = time.perf_counter() - started

        @ray.remote(num_cpus=1)
        def warm(_):
            import importlib

            for module in ("groundup.data.ray_curate", "groundup.data.ray_dedup", "groundup.tokens.ray_tokenize"):
                importlib.import_module(module)  # what the tasks import
            time.sleep(0.5)  # held, so that each CPU's task lands in a worker of its own
            return os.getpid()

        started = time.perf_counter()
        workers = len(set(ray.get([warm.remote(i) for i in range(args.cpus)])))
        workers_s = time.perf_counter() - started - 0.5
        for r in range(args.repeat):  # phase 1: connected once, workers warm
            one_round(r, ("local", "ray"), {"local": local_flags, "ray": ["--executor", "ray"]})
        ray.shutdown()
        for r in range(args.repeat):  # phase 2: each verb a Ray job of its own, as from a shell
            one_round(r, ("local_2", "ray_cli"), {"local_2": local_flags,
                                                  "ray_cli": ["--executor", "ray", "--address", address]})
    finally:
        ray.shutdown()
        head.terminate()  # --block: the head stops the processes it started, then exits
        head.wait(60)
        shutil.rmtree(temp, ignore_errors=True)

    local = work / "local-0"
    shard_files = digests(local / "curated", ("shards",))
    token_files = digests(local / "tokens", ("train", "val"))
    dirs = [work / f"{n}-{r}" for n in rounds for r in range(args.repeat)]
    identical = {
        "curated_shards": all(digests(d / "curated", ("shards",)) == shard_files for d in dirs),
        "curation_report": all(plain_report(d / "curated" / "report.json") == plain_report(local / "curated" / "report.json")
                               for d in dirs),
        "token_files": all(digests(d / "tokens", ("train", "val")) == token_files for d in dirs),
        "token_index": all(plain_index(d / "tokens" / "index.json") == plain_index(local / "tokens" / "index.json")
                           for d in dirs),
    }
    keys = ("curate_s", "tokenize_s", "total_s")
    median = {name: {k: round(statistics.median(x[k] for x in runs), 2) for k in keys} for name, runs in rounds.items()}

    def overhead(ray_name: str, local_name: str) -> dict:
        return {k.removesuffix("_s"): round(median[ray_name][k] / median[local_name][k] - 1, 3) for k in keys}

    over = {"ray": overhead("ray", "local"), "ray_cli": overhead("ray_cli", "local_2")}
    start_s = head_s + connect_s + workers_s
    with_start = round((median["ray"]["total_s"] + start_s) / median["local"]["total_s"] - 1, 3)
    report = json.loads((local / "curated" / "report.json").read_text())
    index = json.loads((local / "tokens" / "index.json").read_text())
    print(json.dumps({
        "benchmark": "data curate + data tokenize, --executor local vs --executor ray (local Ray cluster)",
        "command": "python benchmarks/ray_data.py " + " ".join(sys.argv[1:]),
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU, Python {platform.python_version()}, "
                   f"Ray {ray.__version__}",
        "cpus": args.cpus,
        "load_average_before_after": [round(x, 2) for x in load_before + os.getloadavg()],
        "corpus": {"documents_in": report["totals"]["docs_in"], "mb_in": round(report["totals"]["bytes_in"] / 1e6, 1),
                   "documents_out": report["totals"]["docs_out"], "curated_shards": len(shard_files),
                   "tokens": index["tokens"], "token_files": len(token_files)},
        "identical": identical,
        "same_output": "byte-identical" if all(identical.values()) else "DIFFERENT",
        "compared": "SHA-256 of every file under curated/shards and tokens/{train,val} of every round of every "
                    "executor against local round 0; report.json without timing, index.json without seconds "
                    "and inputs (each run's own directory)",
        "cluster_start_s": {"ray_start_head": round(head_s, 2), "connect": round(connect_s, 2),
                            "worker_processes": round(workers_s, 2), "workers": workers, "total": round(start_s, 2)},
        "rounds_median_of": args.repeat,
        "seconds_median": median,
        "overhead": over,
        "overhead_ray_with_cluster_start": with_start,
        "goal": {"target": "Ray's run time under 1.2x the local run's, 2 cores",
                 "met_connected": over["ray"]["total"] < 0.2, "met_cli_new_job_per_verb": over["ray_cli"]["total"] < 0.2,
                 "met_with_cluster_start": with_start < 0.2},
        "rounds": rounds,
    }, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
