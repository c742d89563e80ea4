"""What every post-training verb does before its first step: the base model, the tokenizer, the run.

    with posttrain_session(cfg, out, resume) as session:      # lock, checks, base model, tokenizer copy
        session.model, session.tokenizer, session.cfg, session.dist, session.stop
        cfg = ...resolve what depends on the data (steps from epochs)...
        session.commit(cfg)                                    # resume checks by key; config.toml

The base (`cfg.base`: a model directory, a training run, an imported Hugging Face or GGUF model, or a
LoRA run, whose adapter is merged into its base) is loaded in fp32 on the CPU; `cfg.model` becomes
its config, so checkpoints and FLOP counts describe the real model. A fresh run refuses a directory
that holds a run; a resume must find the run's config and refuses incompatible changes by key; one
process writes the run at a time (RUN/.lock).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from groundup.config import ConfigError, load_config, save_config
from groundup.errors import CheckpointError, DataError
from groundup.interop.peft_format import adapter_config
from groundup.io import atomic_dir, writer_lock
from groundup.layout import LOCK_FILE, RUN_CONFIG_FILE, TOKENIZER_DIR, is_adapter_dir, is_run_dir, resolve_model_dir
from groundup.loading import load_for_inference
from groundup.quant.modules import QuantWeight
from groundup.quant.quantized_dir import is_quantized, read_quant_spec
from groundup.train.config import check_compatible, resume_differences
from groundup.train.loop import training_session
from groundup.train.metrics import check_trackers


@dataclass
class Session:
    cfg: Any
    model: Any  # the base model (fp32, CPU), before any adapter
    tokenizer: Any
    base_dir: Path  # the base model's directory (recorded with adapters)
    dist: Any
    stop: dict
    out: Path
    saved: Any = None  # the run's saved config when resuming
    changes: list[str] = field(default_factory=list)
    began: float = field(default_factory=time.time)

    def commit(self, cfg) -> None:
        """Check a resume against the saved config (by key), then write the resolved config."""
        if self.saved is not None:
            check_compatible(self.saved, cfg, str(self.out / RUN_CONFIG_FILE))
            self.changes = resume_differences(self.saved, cfg)[1]
        self.cfg = cfg
        if self.dist.is_main and (self.saved is None or self.changes):
            save_config(cfg, self.out / RUN_CONFIG_FILE)
        self.dist.barrier()


def load_base(cfg, note=print):
    """(fp32 model on the CPU in train mode, tokenizer, base model directory) of `cfg.base`.

    A quantized base (`groundup quantize` output) stays quantized (QLoRA): its integer weights are
    frozen, so only LoRA can train on it; full fine-tuning is refused. A LoRA run whose base is
    quantized is merged into the dequantized base (see model/lora.py): training goes on in full precision."""

    if not cfg.base:
        raise ConfigError("base is not set: pass --base MODEL (a model directory, a run, an imported model)", key="base")
    model_dir = resolve_model_dir(cfg.base, note)
    lora = getattr(cfg, "lora", None)
    if is_quantized(model_dir) and not (lora is not None and lora.enabled):
        spec = read_quant_spec(model_dir, strict=False)
        raise ConfigError(f"{model_dir} is quantized ({spec.describe() if spec else 'integer weights'}): its weights "
                          "cannot train; use LoRA (lora.rank) on a quantized base (QLoRA), or fine-tune the "
                          "full-precision model it was quantized from", key="lora.rank")
    model, tok = load_for_inference(cfg.base, device="cpu", dtype="float32", merge=True)
    if any(isinstance(m, QuantWeight) for m in model.modules()):
        note(f"base {model_dir}: quantized ({model.quant_spec.describe()}); its weights stay frozen integers and "
             "only the LoRA adapters train (QLoRA)")
    elif is_adapter_dir(model_dir) and is_quantized(resolve_model_dir(adapter_config(model_dir)[1].get("base") or
                                                                      model_dir, lambda *_: None)):
        note(f"base {model_dir}: a LoRA adapter on a quantized model, merged into the dequantized weights; "
             "training goes on in full precision")
    if cfg.train.seq_len > model.cfg.max_seq_len:
        raise ConfigError(f"train.seq_len = {cfg.train.seq_len}: the base model's context is {model.cfg.max_seq_len}",
                          key="train.seq_len")
    return model.train(), tok, model_dir


@contextlib.contextmanager
def posttrain_session(cfg, out: Path, resume: bool) -> Iterator[Session]:
    """Everything before the first step of a post-training run, held for the whole run (see above)."""
    out = Path(out)
    began = time.time()
    check_trackers(cfg.log.tensorboard, cfg.log.wandb)
    with training_session(cfg) as (d, stop), (writer_lock(out, LOCK_FILE, create=not resume) if d.is_main
                                              else contextlib.nullcontext()):
        saved = None
        if resume:
            if not (out / RUN_CONFIG_FILE).is_file():
                raise CheckpointError(f"{out}: no {RUN_CONFIG_FILE}, so not a run directory to resume")
            saved = load_config(type(cfg), out / RUN_CONFIG_FILE)
            cfg = dataclasses.replace(cfg, model=saved.model, base=saved.base)
        elif is_run_dir(out):
            raise DataError(f"{out} already holds a run: resume it with --resume {out} or choose another --out")
        model, tok, base_dir = load_base(cfg, print if d.is_main else (lambda *_: None))
        cfg = dataclasses.replace(cfg, model=model.cfg)
        d.barrier()  # every process has checked the directory before the main one writes into it
        if d.is_main and not resume:
            with atomic_dir(out / TOKENIZER_DIR) as tmp:
                tok.save(tmp)
        d.barrier()
        yield Session(cfg, model, tok, base_dir.resolve(), d, stop, out, saved, began=began)
