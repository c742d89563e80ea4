"""The loop every objective runs: resume, steps, logging, evaluation, checkpoints, rollback, summary.

    with training_session(cfg) as (dist, stop):
        state = build_state(cfg, dist, objective, loader, tokenizer=tok, run_dir=out)
        summary = run(state, resume=False, stop=stop)

SIGINT or SIGTERM finish the current step, save a checkpoint and return (`summary["interrupted"]`
names the signal); a second SIGINT interrupts at once. A resumed run continues from the newest
intact checkpoint and cuts metrics.jsonl back to what that checkpoint had logged, so on CPU it
takes bit-identical steps to a run that was never stopped.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Iterator

import torch

from groundup.config import save_config, saved_config
from groundup.errors import CheckpointError, TrainingError
from groundup.io import atomic_write_json
from groundup.layout import RUN_CONFIG_FILE, SUMMARY_FILE, checkpoint_problem, find_intact_checkpoint, list_checkpoints
from groundup.train import checkpoint as ckpt
from groundup.train.config import check_compatible
from groundup.train.distributed import Dist, init_distributed
from groundup.train.expert_parallel import expert_metrics
from groundup.train.flops import step_flops
from groundup.train.metrics import MetricsLog, Utilization, truncate_metrics
from groundup.train.peak import peak_flops
from groundup.train.state import TrainState, restore_state, save_state
from groundup.train.step import train_step
from groundup.train.threads import ThreadTuner
from groundup.train.time_budget import TimeBudget, apply_plan


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


@contextlib.contextmanager
def training_session(cfg, model_cfg=None) -> Iterator[tuple[Dist, dict]]:
    """The process group (or one process), torch's thread count, and the stop flag the signals set.
    `model_cfg`: the model to be trained, when known before it is built (pretraining), so a tensor-parallel
    layout that cannot shard it is refused before the process group starts."""
    d = init_distributed(cfg, model_cfg)
    threads = torch.get_num_threads()
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    try:
        with _signals() as stop:
            yield d, stop
    finally:
        torch.set_num_threads(threads)
        d.close()


def _resume(state: TrainState, note, damaged_ok: bool = False) -> tuple[int, str | None]:
    """Restore the newest intact checkpoint; returns (metrics.jsonl offset, its name or None).
    `damaged_ok` (train.auto_resume): when every checkpoint is damaged, start again from step 0."""
    d, out = state.dist, state.run_dir
    found = find_intact_checkpoint(out, note) if d.is_main else None
    existed = bool(list_checkpoints(out)) if d.is_main else False
    found, existed = d.broadcast((str(found) if found else None, existed))
    if found is None:
        if existed and not damaged_ok:  # checkpoints were written and every one is damaged: keep the history, refuse
            raise CheckpointError(f"{out}: no intact checkpoint to resume from (the warnings above say why each "
                                  "is unusable); metrics.jsonl and the checkpoints were left as they are")
        note(f"warning: {out}: no intact checkpoint (train.auto_resume); starting it again from step 0" if existed
             else f"note: {out} holds no checkpoint yet; starting it again from step 0")
        return 0, None
    data = ckpt.load_checkpoint(Path(found))
    check_compatible(saved_config(type(state.cfg), data["meta"]["config"]), state.cfg, found)
    restore_state(state, data, note)
    return int(data["meta"]["metrics_offset"]), Path(found).name


def run(state: TrainState, *, resume: bool = False, changes: list[str] | None = None,
        stop: dict | None = None, began: float | None = None, step_done=None) -> dict:
    """Train `state` to `cfg.train.max_steps` in `state.run_dir`; returns the summary (also RUN/summary.json).

    `began`: when the verb started (time.time()), so the summary's wall time includes its setup.
    `step_done(step)`: called as the loop starts and after every step (the hang detector, hang.watch)."""
    d, cfg, out = state.dist, state.cfg, state.run_dir
    note = print if d.is_main else (lambda *_: None)
    began = time.time() if began is None else began
    offset, resumed_from = _resume(state, note, cfg.train.auto_resume) if resume else (0, None)
    if d.is_main:
        truncate_metrics(out, offset)
    log = MetricsLog(out, d.is_main, cfg.train.max_steps, state.step, cfg.log.progress, cfg.log.tensorboard,
                     cfg.log.wandb, cfg.log.wandb_project)
    if resume:
        log.write({"event": "resume", "step": state.step, "from": resumed_from, "world_size": d.world_size,
                   "changed": list(changes or [])})
    try:
        return _loop(state, log, stop if stop is not None else {}, began, step_done or (lambda step: None))
    finally:
        log.close()


def _evaluate(state: TrainState, log: MetricsLog, budget: TimeBudget) -> dict:
    evaluate = getattr(state.objective, "evaluate", None)
    if evaluate is None:
        return {}
    started = time.perf_counter()
    record, message = evaluate(state)
    budget.timed("eval", time.perf_counter() - started)
    log.write(record)
    log.note(message)
    return record


def _save(state: TrainState, log: MetricsLog, budget: TimeBudget):
    """Checkpoint; the seconds the loop waited for it go to `budget.saves` (the summary's checkpoint_saves):
    an asynchronous save's copy to CPU memory, plus any wait for the previous write, not the write itself."""
    started = time.perf_counter()
    saved = save_state(state, log.offset(), log.note)
    took = time.perf_counter() - started
    budget.timed("checkpoint", took)
    budget.saves.append({"step": state.step, "blocked_s": took})
    return saved


def _replan(state: TrainState, log: MetricsLog, budget: TimeBudget, why: str) -> None:
    """Fit max_steps (and the cadences) to the time left; every process takes the main one's plan."""
    d, cfg = state.dist, state.cfg
    plan = d.broadcast(budget.plan(cfg, state.step) if d.is_main else None)
    if budget.plans and not state.schedule.may_change_length(state.step, plan[0]):
        return
    old = cfg.train.max_steps
    state.cfg = cfg = apply_plan(cfg, *plan)
    state.schedule.max_steps = cfg.train.max_steps
    budget.planned()
    if log.bar is not None:
        log.bar.total = cfg.train.max_steps
    if d.is_main:
        save_config(cfg, state.run_dir / RUN_CONFIG_FILE)  # a resume continues with the plan
    left = budget.deadline - time.time()
    log.write({"event": "replan", "step": state.step, "reason": why, "max_steps": cfg.train.max_steps,
               "previous_max_steps": old, "eval_every": cfg.eval.every, "checkpoint_every": cfg.checkpoint.every,
               "step_s": budget.step_time(), "eval_s": budget.eval_s, "checkpoint_s": budget.checkpoint_s,
               "seconds_left": left})
    log.note(f"step {state.step}: {budget.step_time():.3f} s/step, {left:.0f} s left of train.time_limit_s -> "
             f"max_steps {old} -> {cfg.train.max_steps} ({why})")


def _first_plan(state: TrainState, log: MetricsLog, budget: TimeBudget) -> dict:
    """Time one evaluation and one checkpoint (what the plan must leave room for), then plan."""
    record = {}
    if state.cfg.eval.every or state.cfg.eval.at_end:
        record = _evaluate(state, log, budget)
    _save(state, log, budget)
    _replan(state, log, budget, "measured")
    return record


def _diverged(state: TrainState, log: MetricsLog, why: str) -> None:
    rollbacks = [e["step"] for e in state.guard.history]
    log.write({"event": "diverged", "step": state.step, "reason": why, "rollbacks_at": rollbacks,
               "lr_factor": state.schedule.lr_factor})
    raise TrainingError(f"training diverged at step {state.step}: {why}. Rollbacks at steps {rollbacks or 'none'} "
                        f"lowered the learning rate to x{state.schedule.lr_factor:g} of the schedule without "
                        f"recovering; lower schedule.peak_lr (now {state.cfg.schedule.peak_lr:g}) and start again "
                        f"from a checkpoint before the trouble (the run directory keeps them and metrics.jsonl)")


def _roll_back(state: TrainState, log: MetricsLog, reason: str, broken: bool) -> None:
    """Back to the newest intact checkpoint saved before the bad streak, with a lower rate.

    A run that keeps diverging stops after `stability.max_rollbacks` rollbacks (or at once when its
    weights are no longer finite and no checkpoint precedes the trouble), with what was tried."""
    d, cfg = state.dist, state.cfg
    if state.guard.rollbacks >= cfg.stability.max_rollbacks:
        _diverged(state, log, f"{reason} after {state.guard.rollbacks} rollbacks (stability.max_rollbacks)")
    start = state.guard.streak_start
    target = None
    if d.is_main:
        target = next((p for s, p in list_checkpoints(state.run_dir)
                       if s <= start and checkpoint_problem(p) is None), None)
    target = d.broadcast(str(target) if target else None)
    factor = cfg.stability.rollback_lr_factor
    event = {"event": "rollback", "step": state.step, "streak_start": start, "reason": reason}
    if target:
        data = ckpt.load_checkpoint(Path(target))
        lr_factor = state.schedule.lr_factor
        restore_state(state, data, log.note, loader=False, rng=False)  # keep the loader: it is past the bad data
        state.schedule.lr_factor = lr_factor * factor
        event["to_step"] = state.step
    else:
        if broken:
            _diverged(state, log, f"{reason}, and no intact checkpoint precedes step {start}")
        state.schedule.lr_factor *= factor
        event["to_step"] = None  # no checkpoint before the streak: continue with a lower rate
    state.guard.rolled_back(event["step"])
    event["lr_factor"] = state.schedule.lr_factor
    log.write(event)
    log.note(f"rollback after {cfg.stability.rollback_after} bad steps: to step {event['to_step']}, "
             f"learning rate x{state.schedule.lr_factor:g}")


def _document_names(state: TrainState, rows) -> list[str]:
    names = getattr(state.loader, "document_names", None)
    return names(rows) if names is not None else []


def _log_data_events(state: TrainState, log: MetricsLog, r) -> None:
    d = state.dist
    if r.gated:
        names = d.gather([_document_names(state, r.docs[i][row]) for i, row in r.gated_rows])
        log.write({"event": "data_gate", "step": state.step, "sequences": r.gated,
                   "documents": [n for rank in names for n in rank]})
    if r.skipped:
        names = d.gather(sorted({n for docs in r.docs for row in docs for n in _document_names(state, row)}))
        log.write({"event": "skip", "step": state.step, "reason": r.skipped, "loss": r.loss,
                   "grad_norm": r.grad_norm, "documents": sorted({n for rank in names for n in rank})})
        log.note(f"step {state.step}: skipped ({r.skipped})")


def _loop(state: TrainState, log: MetricsLog, stop: dict, began: float, step_done) -> dict:
    cfg, d = state.cfg, state.dist
    compute_dtype = torch.float32 if state.precision.emulate else state.precision.compute_dtype
    # The FLOPs this step does (LoRA, frozen layers, recomputation) over every accelerator's peak, tensor-
    # parallel ones included; the main process alone calibrates a peak, so no two measure at once.
    peak = d.broadcast(peak_flops(d.device, compute_dtype, cfg.log.peak_flops) if d.is_main else None)
    # A pipelined run's processes hold a stage each: the FLOPs per token are the whole model's (its meta copy).
    flops_model = getattr(state.precision.compute, "flops_model", state.precision.compute)
    util = Utilization(step_flops(flops_model, state.seq_len, cfg.train.grad_checkpointing), peak,
                       d.processes, log.note)
    interval_time, interval_tokens, session_time, session_tokens = 0.0, 0, 0.0, 0
    last_eval: dict = {}
    last_loss, interrupted, start_step = float("nan"), None, state.step
    budget, timed_out = TimeBudget(cfg.train.time_limit_s, began, state.step, cfg.train.time_limit_file), False
    tuner = ThreadTuner(cfg.train.threads == -1 and d.device.type == "cpu", state.model_cfg.d_model)
    step_done(state.step)
    while state.step < cfg.train.max_steps:
        started = time.perf_counter()
        moved = budget.refresh()  # train.time_limit_file: another process moved the limit
        if moved:
            log.write({**moved, "step": state.step})
            log.note(f"step {state.step}: " + (f"time limit moved to {budget.limit:g} s" if "time_limit_s" in moved
                                               else f"{moved['file']} ignored: {moved['reason']}"))
        out_of_time = budget.should_stop(cfg.eval.at_end)
        r = train_step(state, bool(stop) or out_of_time)
        took = time.perf_counter() - started
        budget.step_done(state.step + 1, took)
        threads = tuner.after_step(took)
        if threads is not None:  # the machine's load changed: the step times so far no longer apply
            budget.steps.clear()
            log.write({"event": "threads", "step": state.step + 1, "threads": threads})
        state.step += 1
        step_done(state.step)
        state.tokens += r.tokens
        state.elapsed += took
        state.gated += r.gated
        interval_time += took
        interval_tokens += r.tokens
        # The session's first step allocates and warms up kernels: leave it out of the rate unless alone.
        if state.step > start_step + 1 or state.step == cfg.train.max_steps:
            session_time += took
            session_tokens += r.tokens
        last_loss = r.loss
        log.advance()
        _log_data_events(state, log, r)
        # The run's first step is logged too: a short run shows its starting loss, not only its tenth step's.
        if state.step % cfg.log.every == 0 or state.step in (1, cfg.train.max_steps) or r.stop:
            rate = interval_tokens / interval_time if interval_time else 0.0
            log.step({"step": state.step, "tokens": state.tokens, **r.metrics, "lr": r.lr, "grad_norm": r.grad_norm,
                      "grad_norm_clipped": r.grad_norm_clipped, "tokens_per_sec": rate, **util.of(rate),
                      "elapsed_s": state.elapsed, "skipped": state.guard.skipped, "gated": state.gated,
                      **expert_metrics(state.model, d)})
            interval_time, interval_tokens = 0.0, 0
        if r.broken or (r.skipped and state.guard.should_roll_back()):
            _roll_back(state, log, r.skipped, r.broken)
            continue
        if budget.wants_first_plan():
            last_eval = _first_plan(state, log, budget) or last_eval
            cfg = state.cfg
        # r.stop is summed over processes: all of them save and stop here, for a signal or because
        # this process's clock says the next step would not fit in train.time_limit_s.
        time_flag = r.stop and out_of_time and not stop
        timed_out = time_flag and state.step < cfg.train.max_steps
        done = state.step == cfg.train.max_steps or timed_out
        if (cfg.eval.every and state.step % cfg.eval.every == 0 and not done) or (done and cfg.eval.at_end):
            last_eval = _evaluate(state, log, budget)
        if not done and budget.check_due(state.step, cfg.train.max_steps) and \
                d.broadcast(budget.drifted(cfg, state.step) if d.is_main else None):
            _replan(state, log, budget, "step time changed")
            cfg = state.cfg
        if r.stop and not time_flag:
            interrupted = stop.get("signal", "a signal or the time limit of another process")
        if done or r.stop or state.step % cfg.checkpoint.every == 0:
            saved = _save(state, log, budget)
            if timed_out:
                log.write({"event": "time_limit", "step": state.step, "max_steps": cfg.train.max_steps,
                           "time_limit_s": budget.limit})
                log.note(f"train.time_limit_s ({budget.limit:g} s) reached at step {state.step} of "
                         f"{cfg.train.max_steps}: saved {saved or 'a checkpoint'}")
                break
            if r.stop and not time_flag:
                log.write({"event": "interrupt", "step": state.step, "signal": interrupted})
                log.note(f"{interrupted}: saved {saved or 'a checkpoint'}; continue with "
                         f"'groundup {getattr(cfg, 'verb', 'train')} --resume {state.run_dir}'")
                break
    rate = session_tokens / session_time if session_time else 0.0
    summary = {
        "run_dir": str(state.run_dir), "objective": state.objective.name, "steps": state.step, "tokens": state.tokens,
        "train_loss": last_loss, "val_loss": last_eval.get("val_loss"), "val_bpb": last_eval.get("val_bpb"),
        "val_bpb_domains": {k.split("/", 1)[1]: v for k, v in last_eval.items() if k.startswith("val_bpb/")},
        "eval": {k: v for k, v in last_eval.items() if k not in ("step", "tokens")},
        "tokens_per_sec": rate, **util.summary(rate),
        "train_time_s": state.elapsed, "wall_time_s": time.time() - began, "session_steps": state.step - start_step,
        "skipped_steps": state.guard.skipped, "gated_sequences": state.gated, "rollbacks": state.guard.rollbacks,
        "interrupted": interrupted, "precision": state.precision.mode, "world_size": d.world_size,
        "strategy": d.strategy, "tp": d.tp, "processes": d.processes, "max_steps": cfg.train.max_steps,
        "replicas": d.replicas, "pp": d.pp,
        "pp_bubble": getattr(getattr(state.model, "layout", None), "bubble", 0.0),  # pipeline.py's theory
        "time_limit_s": budget.limit, "time_limit_reached": timed_out,
        "replans": budget.plans, "threads": torch.get_num_threads(), "checkpoint_saves": budget.saves,
        "checkpoint_async": d.sharded and bool(getattr(getattr(cfg, "checkpoint", None), "async_save", False)),
    }
    if d.is_main:
        atomic_write_json(state.run_dir / SUMMARY_FILE, summary)
    return summary
