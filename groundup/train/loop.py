"""`train(cfg, out_dir, resume=False)`: build, resume, loop, evaluate, checkpoint, summarise.

    from groundup.train import TrainConfig, train
    cfg = load_config(TrainConfig, "configs/train-tiny.toml", ["data.shards=out/tokens", "train.max_steps=50"])
    summary = train(cfg, "runs/tiny")                  # fresh: refuses a directory that holds a run
    summary = train(cfg, "runs/tiny", resume=True)     # continue from the newest intact checkpoint

Exact resume: everything that decides a later step is in the checkpoint (weights, optimizer,
schedule, loader position, spike-guard history, RNG states), and nothing else carries state
between steps, so on CPU a resumed run takes bit-identical steps. SIGINT or SIGTERM finish the
current step, save a checkpoint and return (`summary["interrupted"]` names the signal).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path

import torch

from groundup.config import from_dict
from groundup.tokens.loader import TokenLoader
from groundup.io import atomic_write_json
from groundup.model.sizing import flops_per_token
from groundup.model.transformer import Transformer
from groundup.train import checkpoint as ckpt
from groundup.train.config import TrainConfig
from groundup.train.distributed import (Dist, full_model_state, full_optimizer_state, init_distributed,
                                        load_model_state, load_optimizer_state, wrap)
from groundup.train.metrics import MetricsLog, peak_flops, truncate_metrics
from groundup.train.optimizers import build_optimizers
from groundup.train.precision import Precision
from groundup.train.run import check_compatible, prepare, write_run_files
from groundup.train.schedules import Schedule
from groundup.train.stability import SpikeGuard
from groundup.train.step import train_step


class Trainer:
    """The state one run carries between steps (a plain namespace; behaviour lives in functions)."""

    step = 0  # optimizer steps completed
    tokens = 0  # tokens consumed (all processes; rollbacks do not give them back)
    elapsed = 0.0  # seconds of training, over all sessions of this run
    gated = 0  # sequences dropped by the data gate


@contextlib.contextmanager
def _signals():
    """SIGINT/SIGTERM set a flag the loop checks after each step; a second SIGINT interrupts at once."""
    stop: dict = {}
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        if stop and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop["signal"] = signal.Signals(signum).name

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def train(cfg: TrainConfig, out_dir: str | Path, resume: bool = False) -> dict:
    """Train per `cfg` into `out_dir`; returns the summary (also written to RUN/summary.json)."""
    d = init_distributed(cfg)
    threads = torch.get_num_threads()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    try:
        with _signals() as stop:
            return _run(cfg, Path(out_dir), resume, d, stop)
    finally:
        torch.set_num_threads(threads)
        d.close()


def build(t: Trainer, cfg: TrainConfig, d: Dist, loader=None) -> None:
    """Model, precision, wrapping, optimizers, schedule, guard and (unless given) the data loader."""
    t.cfg, t.dist = cfg, d
    torch.manual_seed(cfg.train.seed)  # the same initial weights on every process
    meta = d.strategy == "fsdp" and cfg.distributed.meta_init
    with torch.device("meta" if meta else d.device):
        model = Transformer(cfg.model)
    model.grad_checkpointing = cfg.train.grad_checkpointing
    t.precision = Precision(cfg.precision, d.device, fsdp=d.strategy == "fsdp")
    compute = t.precision.setup(model)
    t.model = wrap(compute, d, t.precision.fsdp_policy(), find_unused=cfg.model.n_experts > 0)
    if meta:  # shards exist now: allocate and initialise them in place
        model.to_empty(device=d.device)
        model.reset_buffers()
        if d.device.type == "cpu":
            # DTensor has no RNG tracker on CPU meshes: each process draws its shards from its own
            # generator, which must then differ between processes or the shards would repeat.
            torch.manual_seed(cfg.train.seed + 1 + d.rank)
        with torch.no_grad():
            model.init_weights()
    t.step_model = torch.compile(t.model) if cfg.train.compile else t.model
    t.optimizers = build_optimizers(t.precision.master, cfg.optim)
    t.master_moe, t.compute_moe = t.precision.master.moe_layers(), compute.moe_layers()
    t.schedule = Schedule(cfg.schedule, cfg.train.max_steps)
    t.guard = SpikeGuard(cfg.stability)
    t.loader = loader or TokenLoader(
        cfg.data.shards, "train", cfg.train.seq_len, cfg.train.batch_size, rank=d.rank, world_size=d.world_size,
        seed=cfg.train.seed, domain_weights=cfg.data.domain_weights, bos_aligned=cfg.data.bos_aligned,
        expected_tokenizer_hash=t.tok.hash)
    torch.manual_seed(cfg.train.seed + 1 + d.rank)  # dropout masks differ between processes


def _state_owner(t: Trainer):
    """The module whose weights and optimizer state a checkpoint holds: the fp32 master (FSDP: the sharded model)."""
    return t.model if t.dist.strategy == "fsdp" else t.precision.master


def _restore(t: Trainer, data: dict, note, *, loader: bool = True, rng: bool = True) -> None:
    """Load a checkpoint's state into the trainer (all processes)."""
    d = t.dist
    target = _state_owner(t)
    load_model_state(target, data["model"], d)
    load_optimizer_state(target, t.optimizers, data["optimizer"], d)
    t.precision.master_to_compute()
    state = data["trainer"]
    t.schedule.load_state_dict(state["schedule"])
    t.step = int(state["step"])
    if loader:
        ckpt.restore_loader(t.loader, data["loader"], note)
        t.guard.load_state_dict(state["guard"])
        t.tokens, t.elapsed, t.gated = int(state["tokens"]), float(state["elapsed"]), int(state["gated"])
    if rng and len(state["rng"]) == d.world_size:
        torch.set_rng_state(state["rng"][d.rank]["cpu"])
        if d.device.type == "cuda" and "cuda" in state["rng"][d.rank]:
            torch.cuda.set_rng_state(state["rng"][d.rank]["cuda"], d.device)


def _save(t: Trainer, log: MetricsLog) -> Path | None:
    """Checkpoint the current step (every process takes part; the main one writes)."""
    d, cfg = t.dist, t.cfg
    target = _state_owner(t)
    model_state = full_model_state(target, d)
    optim_state = full_optimizer_state(target, t.optimizers, d)
    rng = {"cpu": torch.get_rng_state()}
    if d.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(d.device)
    rngs, loaders = d.gather(rng), d.gather(t.loader.state_dict())
    path = None
    if d.is_main:
        trainer_state = {"step": t.step, "tokens": t.tokens, "elapsed": t.elapsed, "gated": t.gated,
                         "schedule": t.schedule.state_dict(), "guard": t.guard.state_dict(), "rng": rngs}
        meta = {"tokens": t.tokens, "world_size": d.world_size, "metrics_offset": log.offset(),
                "tokenizer_hash": t.tok.hash}
        path = ckpt.save_checkpoint(t.run_dir, t.step, cfg, model_state, optim_state, loaders, trainer_state, meta)
        ckpt.rotate(t.run_dir, cfg.checkpoint.every, cfg.checkpoint.keep_last, cfg.checkpoint.keep_every)
    d.barrier()
    return path


def _evaluate(t: Trainer, log: MetricsLog) -> dict:
    from groundup.eval.perplexity import evaluate

    cfg, d = t.cfg, t.dist
    result = evaluate(t.model, cfg.data.shards, "val", seq_len=cfg.train.seq_len,
                      batch_size=cfg.eval.batch_size or cfg.train.batch_size, max_batches=cfg.eval.max_batches or None,
                      tokenizer=t.tok, rank=d.rank, world_size=d.world_size, reduce=d.sum,
                      context=t.precision.context, bos_aligned=cfg.data.bos_aligned)
    record = {"step": t.step, "tokens": t.tokens, "val_loss": result["loss"], "val_bpb": result["bpb"],
              **{f"val_bpb/{name}": r["bpb"] for name, r in result["domains"].items()}}
    log.write(record)
    log.note(f"step {t.step}: val loss {result['loss']:.4f}, bpb {result['bpb']:.4f} ("
             + ", ".join(f"{n} {r['bpb']:.3f}" for n, r in result["domains"].items()) + ")")
    return record


def _roll_back(t: Trainer, log: MetricsLog, reason: str) -> None:
    """Back to the newest intact checkpoint saved before the bad streak, with a lower rate."""
    d, cfg = t.dist, t.cfg
    start = t.guard.streak_start
    target = None
    if d.is_main:
        target = next((p for s, p in ckpt.list_checkpoints(t.run_dir) if s <= start and ckpt.problem(p) is None), None)
    target = d.broadcast(str(target) if target else None)
    factor = cfg.stability.rollback_lr_factor
    event = {"event": "rollback", "step": t.step, "streak_start": start, "reason": reason}
    if target:
        data = ckpt.load_checkpoint(Path(target))
        lr_factor = t.schedule.lr_factor
        _restore(t, data, log.note, loader=False, rng=False)  # keep the loader: it is past the bad data
        t.schedule.lr_factor = lr_factor * factor
        event["to_step"] = t.step
    else:
        t.schedule.lr_factor *= factor
        event["to_step"] = None  # no checkpoint before the streak: continue with a lower rate
    t.guard.rolled_back()
    event["lr_factor"] = t.schedule.lr_factor
    log.write(event)
    log.note(f"rollback after {cfg.stability.rollback_after} bad steps: to step {event['to_step']}, "
             f"learning rate x{t.schedule.lr_factor:g}")


def _run(cfg: TrainConfig, out: Path, resume: bool, d: Dist, stop: dict) -> dict:
    t = Trainer()
    t.began = time.time()
    t.dist, t.run_dir = d, out
    note = print if d.is_main else (lambda *_: None)
    cfg, t.tok, changes, tok_dir = prepare(cfg, out, resume, d.is_main)
    t.cfg = cfg
    d.barrier()  # every process has checked the directory before the main one writes into it
    if d.is_main:
        write_run_files(cfg, out, tok_dir, resume, changes)
    d.barrier()
    build(t, cfg, d)
    offset, resumed_from = 0, None
    if resume:
        found = ckpt.find_resumable(out, note) if d.is_main else None
        found = d.broadcast(str(found) if found else None)
        if found:
            data = ckpt.load_checkpoint(Path(found))
            check_compatible(from_dict(TrainConfig, data["meta"]["config"]), cfg, found)
            _restore(t, data, note)
            offset, resumed_from = int(data["meta"]["metrics_offset"]), Path(found).name
        else:
            note(f"note: {out} holds no intact checkpoint; starting it again from step 0")
    if d.is_main:
        truncate_metrics(out, offset)
    log = MetricsLog(out, d.is_main, cfg.train.max_steps, t.step, cfg.log.progress, cfg.log.tensorboard,
                     cfg.log.wandb, cfg.log.wandb_project)
    if resume:
        log.write({"event": "resume", "step": t.step, "from": resumed_from, "world_size": d.world_size,
                   "changed": changes})
    try:
        return _loop(t, log, stop)
    finally:
        log.close()


def _loop(t: Trainer, log: MetricsLog, stop: dict) -> dict:
    cfg, d = t.cfg, t.dist
    per_step = cfg.train.batch_size * cfg.train.grad_accum * cfg.train.seq_len * d.world_size
    fpt = flops_per_token(cfg.model, cfg.train.seq_len)
    peak, peak_source = peak_flops(d.device, torch.float32 if t.precision.emulate else t.precision.compute_dtype,
                                   cfg.log.peak_flops)
    peak *= d.world_size
    interval_time, interval_tokens, session_time, session_tokens = 0.0, 0, 0.0, 0
    last_eval: dict = {}
    last_loss, interrupted, start_step = float("nan"), None, t.step
    while t.step < cfg.train.max_steps:
        began = time.perf_counter()
        r = train_step(t, t.step, bool(stop))
        took = time.perf_counter() - began
        t.step += 1
        t.tokens += per_step
        t.elapsed += took
        t.gated += r.gated
        interval_time += took
        interval_tokens += per_step
        # The session's first step allocates and warms up kernels: leave it out of the rate unless alone.
        if t.step > start_step + 1 or t.step == cfg.train.max_steps:
            session_time += took
            session_tokens += per_step
        last_loss = r.loss
        log.advance()
        if r.gated:
            names = d.gather([t.loader.document_names(r.docs[i][row]) for i, row in r.gated_rows])
            log.write({"event": "data_gate", "step": t.step, "sequences": r.gated,
                       "documents": [n for rank in names for n in rank]})
        if r.skipped:
            names = d.gather(sorted({n for docs in r.docs for row in docs for n in t.loader.document_names(row)}))
            log.write({"event": "skip", "step": t.step, "reason": r.skipped, "loss": r.loss,
                       "grad_norm": r.grad_norm, "documents": sorted({n for rank in names for n in rank})})
            log.note(f"step {t.step}: skipped ({r.skipped})")
        if t.step % cfg.log.every == 0 or t.step == cfg.train.max_steps or r.stop:
            rate = interval_tokens / interval_time if interval_time else 0.0
            log.step({"step": t.step, "tokens": t.tokens, "loss": r.loss, "z_loss": r.z_loss, "lr": r.lr,
                      "grad_norm": r.grad_norm, "grad_norm_clipped": r.grad_norm_clipped, "tokens_per_sec": rate,
                      "mfu": rate * fpt / peak, "elapsed_s": t.elapsed, "skipped": t.guard.skipped,
                      "gated": t.gated})
            interval_time, interval_tokens = 0.0, 0
        if r.skipped and t.guard.should_roll_back():
            _roll_back(t, log, r.skipped)
            continue
        done = t.step == cfg.train.max_steps
        if cfg.eval.every and t.step % cfg.eval.every == 0 and not done:
            last_eval = _evaluate(t, log)
        if done and cfg.eval.at_end:
            last_eval = _evaluate(t, log)
        if r.stop:  # r.stop is summed over processes: all of them save and stop here
            interrupted = stop.get("signal", "a signal to another process")
        if done or r.stop or t.step % cfg.checkpoint.every == 0:
            saved = _save(t, log)
            if r.stop:
                log.write({"event": "interrupt", "step": t.step, "signal": interrupted})
                log.note(f"{interrupted}: saved {saved or 'a checkpoint'}; continue with "
                         f"'groundup train --resume {t.run_dir}'")
                break
    rate = session_tokens / session_time if session_time else 0.0
    summary = {
        "run_dir": str(t.run_dir), "steps": t.step, "tokens": t.tokens, "train_loss": last_loss,
        "val_loss": last_eval.get("val_loss"), "val_bpb": last_eval.get("val_bpb"),
        "val_bpb_domains": {k.split("/", 1)[1]: v for k, v in last_eval.items() if k.startswith("val_bpb/")},
        "tokens_per_sec": rate, "mfu": rate * fpt / peak, "peak_flops": peak, "peak_flops_source": peak_source,
        "train_time_s": t.elapsed, "wall_time_s": time.time() - t.began, "session_steps": t.step - start_step,
        "skipped_steps": t.guard.skipped,
        "gated_sequences": t.gated, "rollbacks": t.guard.rollbacks, "interrupted": interrupted,
        "precision": t.precision.mode, "world_size": d.world_size, "strategy": d.strategy,
    }
    if d.is_main:
        atomic_write_json(t.run_dir / "summary.json", summary)
    return summary
