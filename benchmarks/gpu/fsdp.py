"""GPU check, part 3: FSDP2 and DCP on one GPU (world size 1 under torchrun): asynchronous sharded save,
the time the training loop was blocked by it, and a resume that continues bit-exact.

    python benchmarks/gpu/fsdp.py --out DIR [--quick] [--steps 20] [--batch 16]

Two runs of `groundup train` under `torchrun --nproc-per-node 1` with distributed.strategy=fsdp (FSDP2 on a
one-process mesh, checkpoints written by torch.distributed.checkpoint):
1. `async`: --steps steps of a 124M-class Llama shape (vocab 32768, 12 x 768, 12 heads, FFN 2048, tied,
   sequence 1,024, bf16 autocast), checkpoint.async_save=true, a checkpoint at the middle step and at the end;
2. `resumed`: a copy of run 1 as it was right after its middle checkpoint, resumed (`--resume`) with
   checkpoint.async_save=false, so that its final checkpoint is a synchronous save of the same state.
The resumed run must take run 1's steps again bit for bit: the same losses and gradient norms, and equal
final weights (model.safetensors) and optimizer state (the DCP shards). Both runs set
torch.use_deterministic_algorithms(True) (and CUBLAS_WORKSPACE_CONFIG): flash attention's backward is
otherwise non-deterministic, and no rerun, resumed or not, would repeat its steps exactly. Should an op
refuse (no deterministic kernel), both runs are made again with warn_only=True, and a note says so.

Blocked time is what the loop spent inside its checkpoint call (the summary's checkpoint_saves): for an
asynchronous save the copy of the shards to CPU memory, for a synchronous one the whole write (shards,
the consolidated model.safetensors, digests, meta.json). Step times come from metrics.jsonl (log.every=1).
The token shards are made from the embedded Shakespeare text with the project's own tokenizer (vocab 384;
model.vocab_size stays 32768). --quick: the tiny model on the CPU (gloo, fp32), 6 steps.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, device_for, goal, parse_args, write_result

WORKER = "--train-worker"
DETERMINISM = "GPU_CHECK_DETERMINISM"  # "strict" or "warn_only": how the worker asks for deterministic kernels
TOKENIZER_VOCAB = 384
MODELS = {  # model overrides (from groundup's default, tiny), batch, sequence
    "llama-124m": (dict(vocab_size=32768, d_model=768, n_layers=12, n_heads=12, n_kv_heads=12, d_ff=2048,
                        max_seq_len=1024, tie_embeddings=True), 16, 1024),
    "quick": (dict(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=192, max_seq_len=64,
                   tie_embeddings=True), 4, 64),
}
GOAL_BLOCKED_SHARE = 0.2  # an asynchronous save blocks the loop for at most this share of a synchronous one


def worker(argv: list[str]) -> None:
    """Inside torchrun: groundup's CLI (as `python -m groundup`) with deterministic kernels."""
    import torch

    torch.use_deterministic_algorithms(True, warn_only=os.environ.get(DETERMINISM) == "warn_only")
    from groundup.cli import main as cli

    code = cli(argv)
    if "groundup.train.distributed" in sys.modules:  # what groundup/__main__.py does after a process group
        sys.modules["groundup.train.distributed"].exit_process(code)
    raise SystemExit(code)


def make_shards(root: Path, works: int) -> Path:
    """Token shards of `works` Shakespeare works, made by the project's tokenizer and shard writer."""
    from itertools import islice

    from groundup.corpus import chunk_text, iter_shakespeare
    from groundup.tokenizer import TokenizerConfig, train_tokenizer
    from groundup.tokens.shards import TokenizeConfig, tokenize_to_shards

    records = [{"id": f"{w['id']}#{i}", "source": w["source"], "domain": "text", "text": chunk}
               for w in islice(iter_shakespeare(), works) for i, chunk in enumerate(chunk_text(w["text"], 3000))]
    tok = train_tokenizer((r["text"] for r in records), TokenizerConfig(vocab_size=TOKENIZER_VOCAB), progress=False)
    tok_dir = tok.save(root / "tokenizer")
    src = root / "records.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    tokenize_to_shards([src], tok_dir, root / "shards", TokenizeConfig(workers=1, val_fraction=0.05), progress=False)
    return root / "shards"


def torchrun(args: list[str], log: Path, timeout: float, determinism: str) -> tuple[float, str | None]:
    """`groundup ARGS` as the one process of torchrun; (seconds, None) or (seconds, why it failed)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           str(Path(__file__).resolve()), WORKER, *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "CUBLAS_WORKSPACE_CONFIG": ":4096:8", DETERMINISM: determinism}
    env.setdefault("OMP_NUM_THREADS", "2")
    began = time.perf_counter()
    try:
        with open(log, "w") as out:
            code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return time.perf_counter() - began, f"timed out after {timeout:.0f} s: {tail(log)}"
    seconds = time.perf_counter() - began
    return seconds, None if code == 0 else f"exit code {code}: {tail(log)}"


def tail(log: Path, chars: int = 3000) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return " ".join(text[-chars:].split())


def rewind(src: Path, dst: Path, step: int) -> None:
    """A copy of run `src` as it was right after its step-`step` checkpoint (later checkpoints left out)."""
    def later(directory: str, names: list[str]) -> list[str]:
        if Path(directory).name != "checkpoints":
            return []
        return [n for n in names if n.startswith("step_") and int(n.split("_")[1]) > step]

    shutil.copytree(src, dst, ignore=later)
    (dst / "checkpoints" / "latest").write_text(f"step_{step:07d}\n")


def read_run(run: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((run / "summary.json").read_text())
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return summary, [r for r in lines if "loss" in r and "event" not in r]


def max_abs_diff(a: dict, b: dict) -> tuple[bool, float | None]:
    """(every tensor bit-identical, the largest absolute difference); (False, None) when the keys differ."""
    import torch

    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        return False, None
    equal = all(torch.equal(a[k], b[k]) for k in a)
    diff = max((float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel()), default=0.0)
    return equal, diff


def compare(run: Path, resumed: Path, steps: int, save_at: int) -> dict:
    """Steps save_at+1..steps of the resumed run against the uninterrupted one, and their final state."""
    from safetensors.torch import load_file

    from groundup.train.dcp import read_full

    (_, a), (_, b) = read_run(run), read_run(resumed)
    pick = lambda rows: {r["step"]: (r["loss"], r["grad_norm"]) for r in rows if r["step"] > save_at}  # noqa: E731
    la, lb = pick(a), pick(b)
    shared = sorted(set(la) & set(lb))
    final = f"checkpoints/step_{steps:07d}"
    w_equal, w_diff = max_abs_diff(load_file(run / final / "model.safetensors"),
                                   load_file(resumed / final / "model.safetensors"))
    o_equal, o_diff = max_abs_diff(read_full(run / final, "optim/"), read_full(resumed / final, "optim/"))
    losses_equal = len(shared) == steps - save_at and all(la[s] == lb[s] for s in shared)
    return {"steps_compared": len(shared), "losses_equal": losses_equal,
            "loss_max_abs_diff": max((abs(la[s][0] - lb[s][0]) for s in shared), default=None),
            "weights_equal": w_equal, "weights_max_abs_diff": w_diff,
            "optimizer_equal": o_equal, "optimizer_max_abs_diff": o_diff,
            "bit_exact": bool(losses_equal and w_equal and o_equal)}


def step_times(rows: list[dict]) -> dict[int, float]:
    """Each logged step's seconds (metrics.jsonl's elapsed_s counts step time only, saves excluded)."""
    out, last = {}, 0.0
    for r in sorted(rows, key=lambda r: r["step"]):
        out[r["step"]] = r["elapsed_s"] - last
        last = r["elapsed_s"]
    return out


def blocked(summary: dict, step: int) -> float | None:
    seconds = next((s["blocked_s"] for s in summary.get("checkpoint_saves", []) if s["step"] == step), None)
    return None if seconds is None else round(seconds, 4)


def timings(async_run: Path, resumed: Path | None, batch: int, seq: int, steps: int, save_at: int) -> dict:
    summary, rows = read_run(async_run)
    each = step_times(rows)
    steady = [t for s, t in each.items() if s > 1]  # the first step allocates and warms up
    after = [each[s] for s in range(save_at + 1, min(save_at + 3, steps) + 1) if s in each]
    before = [each[s] for s in range(2, save_at + 1) if s in each]
    out = {"strategy": summary["strategy"], "world_size": summary["world_size"], "processes": summary["processes"],
           "precision": summary["precision"], "checkpoint_async": summary.get("checkpoint_async"),
           "step_s_median": round(statistics.median(steady), 4) if steady else None,
           "step_s_first": round(each.get(1, 0.0), 4),
           "step_s_before_save": round(statistics.median(before), 4) if before else None,
           "step_s_after_async_save": round(statistics.median(after), 4) if after else None,
           "tokens_per_step": batch * seq, "tokens_per_s": round(summary["tokens_per_sec"], 1),
           "mfu": round(summary["mfu"], 4), "async_save_blocked_s": blocked(summary, save_at),
           "async_final_save_blocked_s": blocked(summary, steps),
           "checkpoint_saves": {"async": summary.get("checkpoint_saves")}}
    if resumed is not None and (resumed / "summary.json").exists():
        resumed_summary, _ = read_run(resumed)
        out["sync_save_s"] = blocked(resumed_summary, steps)
        out["checkpoint_saves"]["resumed_sync"] = resumed_summary.get("checkpoint_saves")
        if out["async_save_blocked_s"] is not None and out["sync_save_s"]:
            out["blocked_share_of_sync"] = round(out["async_save_blocked_s"] / out["sync_save_s"], 4)
    return out


def checkpoint_gib(step_dir: Path) -> float:
    return round(sum(p.stat().st_size for p in step_dir.iterdir() if p.is_file()) / 2**30, 3)


def measure(results: dict, work: Path, quick: bool, steps: int, batch: int | None) -> list[str]:
    """Fills `results` as it goes (what was measured survives a failure); returns the notes."""
    name = "quick" if quick else "llama-124m"
    model, default_batch, seq = MODELS[name]
    batch = batch or default_batch
    save_at = steps // 2
    results.update(model=name, batch=batch, seq_len=seq, steps=steps, save_at=save_at)
    from groundup.config import from_dict
    from groundup.model.config import ModelConfig
    from groundup.model.sizing import param_counts

    results["params"] = param_counts(from_dict(ModelConfig, {"name": name, **model}))["params_total"]
    began = time.perf_counter()
    shards = make_shards(work, 1 if quick else 4)
    results["shards_s"] = round(time.perf_counter() - began, 1)
    device = ["train.device=cpu", "distributed.backend=gloo", "precision.mode=fp32", "train.threads=2"] if quick \
        else ["train.device=cuda", "distributed.backend=nccl", "precision.mode=bf16-autocast"]
    common = [f"data.shards={shards}", "data.match_vocab=false", f"model.name={name}",
              *(f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in model.items()),
              f"train.batch_size={batch}", f"train.seq_len={seq}", f"train.max_steps={steps}",
              f"checkpoint.every={save_at}", "checkpoint.keep_last=5", "eval.every=0", "eval.at_end=false",
              "log.every=1", "distributed.strategy=fsdp", *device, "--quiet"]
    notes: list[str] = []
    for determinism in ("strict", "warn_only"):
        results["deterministic"] = determinism
        more, notes, refused = two_runs(work / determinism, common, 180 if quick else 300, determinism,
                                        (batch, seq, steps, save_at))
        results.update(more)
        if not refused:
            break
        notes.append("an op has no deterministic kernel (use_deterministic_algorithms refused it): "
                     "both runs again with warn_only=True")
    return notes


def two_runs(work: Path, common: list[str], timeout: float, determinism: str, shape: tuple
             ) -> tuple[dict, list[str], bool]:
    """The asynchronous run and the resumed copy: (results, notes, whether determinism refused an op)."""
    batch, seq, steps, save_at = shape
    work.mkdir()
    run, resumed = work / "async", work / "resumed"
    seconds, failed = torchrun(["train", "--out", str(run), *common, "checkpoint.async_save=true"],
                               work / "async.log", timeout, determinism)
    results: dict = {"run_s": {"async": round(seconds, 1)}}
    if failed:
        log = (work / "async.log").read_text(errors="replace") if (work / "async.log").exists() else ""
        refused = determinism == "strict" and "does not have a deterministic implementation" in log
        return results, [f"failed: the asynchronous FSDP2 run: {failed}"], refused
    results["checkpoint_gib"] = checkpoint_gib(run / "checkpoints" / f"step_{save_at:07d}")
    rewind(run, resumed, save_at)
    seconds, failed = torchrun(["train", "--resume", str(resumed), "checkpoint.async_save=false", "--quiet"],
                               work / "resumed.log", timeout, determinism)
    results["run_s"]["resumed"] = round(seconds, 1)
    results.update(timings(run, None if failed else resumed, batch, seq, steps, save_at))
    notes = []
    if results["strategy"] != "fsdp" or results["processes"] != 1:
        notes.append(f"failed: the run trained as {results['strategy']} on {results['processes']} processes, "
                     "not FSDP2 on one")
    if failed:
        return results, [*notes, f"failed: the resumed run: {failed}"], False
    results.update(compare(run, resumed, steps, save_at))
    if not results["bit_exact"]:
        notes.append("the resumed run did not repeat the uninterrupted run's steps bit for bit")
    return results, notes, False


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--steps", type=int, default=None, help="steps per run (default 20; --quick 6)"),
        p.add_argument("--batch", type=int, default=None, help="sequences per step (default 16)"),
        p.add_argument("--keep", action="store_true", help="keep the runs' directory (printed) for a look")))
    began = time.perf_counter()
    device = device_for(args.quick)
    steps = args.steps or (6 if args.quick else 20)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-fsdp-"))
    results, goals, notes = {}, [], []
    try:
        notes = measure(results, work, args.quick, max(2, steps), args.batch)
    except Exception as e:  # noqa: BLE001 - a result with the reason, never a traceback alone
        notes.append(f"failed: {type(e).__name__}: {str(e)[:800]}")
    finally:
        if args.keep:
            notes.append(f"runs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    goals.append(goal("resume after an async sharded save continues bit-exact", True, results.get("bit_exact")))
    goals.append(goal("async save blocks the loop / synchronous save time", GOAL_BLOCKED_SHARE,
                      results.get("blocked_share_of_sync"), higher_is_better=False))
    write_result(args.out, "fsdp", device, args.quick, began, results, goals, notes)


if __name__ == "__main__":
    if sys.argv[1:2] == [WORKER]:
        worker(sys.argv[2:])
    else:
        main()
