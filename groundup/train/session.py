"""One run session for every training verb: pretraining and each post-training objective.

    with open_run(cfg, out, resume) as run:                   # pretraining: the tokenizer of cfg.data.shards
    with open_run(cfg, out, resume, base=cfg.base) as run:    # post-training: the base model and its tokenizer
        run.cfg, run.dist, run.tokenizer, run.model, run.note  # what the verb reads its data with
        loader, objective = ...                               # the verb's own part: its data and its loss
        run.steps_from_epochs(epochs, len(rows), rows_per_step)    # post-training: train.max_steps = 0
        return run.train(objective, loader)                   # config committed, LoRA, state, the loop

`open_run` holds, for the whole run, what every verb needs before its first step: the process group
and the stop flag the signals set (loop.training_session), the writer lock (RUN/.lock, one writer at a
time), and the checks that run before anything is written (layout.claim_output_dir: a fresh run refuses
a directory that holds a run, and neither a start nor a resume writes into another verb's folder); a
resume needs RUN/config.toml. Pretraining takes its tokenizer from the shards (run.py checks them);
post-training loads the base model (`load_base`). The main process then marks the folder as the verb's
and writes the tokenizer copy. `commit` checks a resume against the saved config by key and writes
RUN/config.toml; `train` commits if the verb has not (a verb commits early when a resume must be
refused before costly work, such as DPO's reference log-likelihoods).

Recovery is here too, once for every verb: `train.auto_resume` turns a start into a resume when the
run directory already holds this verb's run (a restarted attempt under `groundup launch`), and
`train` runs the loop inside hang.watch (the hang detector, train.hang_timeout_s).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from groundup.config import load_saved_config, save_config
from groundup.errors import CheckpointError, ConfigError
from groundup.interop.peft_format import adapter_config
from groundup.io import atomic_dir, writer_lock
from groundup.layout import (LOCK_FILE, RUN_CONFIG_FILE, TOKENIZER_DIR, claim_output_dir, is_adapter_dir, made_by,
                             mark_output_dir, resolve_model_dir)
from groundup.loading import load_for_inference
from groundup.model.lora import apply_lora
from groundup.quant.quantized_dir import is_quantized, read_quant_spec
from groundup.train.config import check_compatible, resume_differences
from groundup.train.distributed import Dist
from groundup.train.hang import watch
from groundup.train.loop import run as run_loop
from groundup.train.loop import training_session
from groundup.train.metrics import check_trackers
from groundup.train.run import prepare_pretraining
from groundup.train.state import TrainState, build_state


@dataclass
class Run:
    cfg: Any  # the verb's config, resolved as far as the start allows (the verb may resolve more)
    dist: Dist
    stop: dict  # set by SIGINT/SIGTERM: the loop finishes the step, checkpoints and returns
    out: Path
    resume: bool
    tokenizer: Any
    model: nn.Module | None = None  # post-training: the base model (fp32, CPU, train mode); pretraining: None
    base_dir: Path | None = None  # post-training: the base model's directory (recorded with adapters)
    saved: Any = None  # a resumed run's saved config
    changes: list[str] = field(default_factory=list)  # allowed differences from `saved`, logged at resume
    began: float = field(default_factory=time.time)
    committed: bool = False

    def note(self, text: str) -> None:
        if self.dist.is_main:
            print(text, flush=True)

    def steps_from_epochs(self, epochs: float, rows: int, rows_per_step: int) -> None:
        """Post-training: `train.max_steps = 0` means `epochs` passes over `rows` rows, `rows_per_step` a step
        on each data-parallel process."""
        if self.cfg.train.max_steps:
            return
        steps = max(1, math.ceil(epochs * rows / (rows_per_step * self.cfg.train.grad_accum * self.dist.world_size)))
        self.cfg = dataclasses.replace(self.cfg, train=dataclasses.replace(self.cfg.train, max_steps=steps))

    def commit(self) -> None:
        """Check a resume against the saved config (by key), then write RUN/config.toml (main process)."""
        if self.saved is not None:
            check_compatible(self.saved, self.cfg, str(self.out / RUN_CONFIG_FILE))
            self.changes = resume_differences(self.saved, self.cfg)[1]
        if self.dist.is_main and (self.saved is None or self.changes):
            save_config(self.cfg, self.out / RUN_CONFIG_FILE)
        self.dist.barrier()
        self.committed = True

    def build(self, objective, loader, *, model: nn.Module | None = None) -> TrainState:
        """The training state: `model` (default: the base; pretraining builds cfg.model), with LoRA adapters
        when `lora.rank` is set (their initial A matrices drawn from train.seed)."""
        if not self.committed:
            self.commit()
        cfg = self.cfg
        model = model if model is not None else self.model
        lora = getattr(cfg, "lora", None)
        if lora is not None and lora.enabled:
            torch.manual_seed(cfg.train.seed)
            apply_lora(model, lora)
        return build_state(cfg, self.dist, objective, loader, tokenizer=self.tokenizer, run_dir=self.out, model=model,
                           lora=lora if lora is not None and lora.enabled else None,
                           base=str(self.base_dir) if self.base_dir is not None else None)

    def train(self, objective, loader, *, model: nn.Module | None = None,
              on_start: Callable[[TrainState], None] | None = None) -> dict:
        """Build the state and run the loop to train.max_steps; returns the summary (RUN/summary.json).
        `on_start(state)`: what the verb binds to the built state before the first step (GRPO's sampler)."""
        state = self.build(objective, loader, model=model)
        if on_start is not None:
            on_start(state)
        with watch(self.out, self.dist.global_rank, self.cfg.train.hang_timeout_s) as step_done:
            return run_loop(state, resume=self.resume, changes=self.changes, stop=self.stop, began=self.began,
                            step_done=step_done)


def load_base(cfg, note: Callable[[str], None] = print) -> tuple[nn.Module, Any, Path]:
    """(fp32 model on the CPU in train mode, tokenizer, base model directory) of `cfg.base`.

    A quantized base (`groundup quantize` output) stays quantized (QLoRA): its integer weights are
    frozen, so only LoRA can train on it; full fine-tuning is refused. A LoRA run whose base is
    quantized is merged into the dequantized base (see model/lora.py): training goes on in full precision."""
    if not cfg.base:
        raise ConfigError("base is not set: pass --model MODEL (a model directory, a run, an imported model)",
                          key="base")
    model_dir = resolve_model_dir(cfg.base, note)
    lora = getattr(cfg, "lora", None)
    if is_quantized(model_dir) and not (lora is not None and lora.enabled):
        spec = read_quant_spec(model_dir, strict=False)
        raise ConfigError(f"{model_dir} is quantized ({spec.describe() if spec else 'integer weights'}): its weights "
                          "cannot train; use LoRA (lora.rank) on a quantized base (QLoRA), or fine-tune the "
                          "full-precision model it was quantized from", key="lora.rank")
    model, tok = load_for_inference(cfg.base, device="cpu", dtype="float32", merge=True)
    if model.linear_types != (nn.Linear,):
        note(f"base {model_dir}: quantized ({model.quant_spec.describe()}); its weights stay frozen integers and "
             "only the LoRA adapters train (QLoRA)")
    elif is_adapter_dir(model_dir) and is_quantized(resolve_model_dir(adapter_config(model_dir)[1].get("base") or
                                                                      model_dir, lambda *_: None)):
        note(f"base {model_dir}: a LoRA adapter on a quantized model, merged into the dequantized weights; "
             "training goes on in full precision")
    return model.train(), tok, model_dir


def _fit_context(cfg, model: nn.Module):
    """Post-training's `train.seq_len = 0` is the base model's context; a longer one is refused."""
    loop = cfg.train
    if not hasattr(loop, "seq_len"):
        return cfg
    if loop.seq_len == 0:
        return dataclasses.replace(cfg, train=dataclasses.replace(loop, seq_len=model.cfg.max_seq_len))
    if loop.seq_len > model.cfg.max_seq_len:
        raise ConfigError(f"train.seq_len = {loop.seq_len}: the base model's context is {model.cfg.max_seq_len}",
                          key="train.seq_len")
    return cfg


@contextlib.contextmanager
def open_run(cfg, out: str | Path, resume: bool = False, *, base: str | None = None) -> Iterator[Run]:
    """Everything before the first step of a training run, held for the whole run (see the module docstring).

    `base`: post-training's starting model (on a resume, the one the run's saved config names)."""
    out, verb = Path(out), getattr(cfg, "verb", "train")
    began = time.time()
    # train.auto_resume: a restarted attempt (or a relaunch) continues the run it finds, else starts it
    resume = resume or (cfg.train.auto_resume and (out / RUN_CONFIG_FILE).is_file())
    check_trackers(cfg.log.tensorboard, cfg.log.wandb)  # refused before the run directory is created
    if made_by(out) not in (None, verb):  # another verb's folder is refused before the lock touches it
        claim_output_dir(out, verb, resume=resume)
    with training_session(cfg, cfg.model if base is None else None) as (d, stop), (writer_lock(out, LOCK_FILE, create=not resume) if d.is_main
                                              else contextlib.nullcontext()):
        saved, model, base_dir = None, None, None
        if resume and not (out / RUN_CONFIG_FILE).is_file():
            raise CheckpointError(f"{out}: no {RUN_CONFIG_FILE}, so not a training run directory to resume")
        claim_output_dir(out, verb, resume=resume)  # again under the lock: a run another process started meanwhile
        if base is None:  # pretraining: the shards name the tokenizer; the model is built from cfg.model
            cfg, tok, tok_dir = prepare_pretraining(cfg, out, resume, d.is_main)
        else:
            if resume:
                saved = load_saved_config(type(cfg), out / RUN_CONFIG_FILE)
                cfg = dataclasses.replace(cfg, base=saved.base)
            model, tok, base_dir = load_base(cfg, print if d.is_main else (lambda *_: None))
            cfg, tok_dir = _fit_context(cfg, model), None
        if resume and saved is None:
            saved = load_saved_config(type(cfg), out / RUN_CONFIG_FILE)
        d.barrier()  # every process has checked the directory before the main one writes into it
        if d.is_main:
            mark_output_dir(out, verb)
        if d.is_main and not resume:
            with atomic_dir(out / TOKENIZER_DIR) as tmp:
                if tok_dir is not None:  # the shards' tokenizer directory, copied as it is
                    shutil.copytree(tok_dir, tmp, dirs_exist_ok=True)
                else:
                    tok.save(tmp)
        d.barrier()
        yield Run(cfg, d, stop, out, resume, tok, model, base_dir.resolve() if base_dir is not None else None, saved,
                  began=began)
