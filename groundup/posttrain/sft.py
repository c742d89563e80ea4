"""`sft(cfg, out, resume=False)`: supervised fine-tuning (full or LoRA) on the shared training core.

    cfg = load_config(SFTConfig, None, ["base=out/model", 'sft.data=["chat/chat-math.jsonl"]', "lora.rank=16"])
    summary = sft(cfg, "runs/sft")

The objective is next-token cross-entropy on the learned tokens only (the chat template's assistant
tokens and end of turn by default, so the model learns to stop), with packed examples kept apart by
segments. Everything else (exact resume, checkpoints, bf16, accumulation, clipping, the spike guard,
DDP) is the training core's. Evaluation: the held-out loss, and greedy replies to held-out
conversations: the share that end their turn, and exact match where the record carries an `answer`
(strict: the `Answer:` line; lenient: the last number).
"""

from __future__ import annotations

from pathlib import Path

import torch

from groundup.data.hashing import document_score
from groundup.data.readers import PROBLEM_KINDS, ReadStats
from groundup.errors import DataError
from groundup.io import atomic_write_json
from groundup.layout import DATA_REPORT_FILE
from groundup.posttrain.config import SFTConfig
from groundup.posttrain.records import Example, iter_examples, no_usable_held_out
from groundup.posttrain.chat_eval import chat_metrics
from groundup.posttrain.sft_data import SFTLoader, collate, pack, tokenize
from groundup.tokens.loader import IGNORE_INDEX, TokenLoader
from groundup.train.distributed import unwrap
from groundup.train.objective import ObjectiveOutput
from groundup.train.session import open_run

class SFTObjective:
    name = "sft"

    def __init__(self, cfg: SFTConfig, val_rows, heldout: list[Example], tokenizer):
        self.cfg, self.val_rows, self.heldout, self.tokenizer = cfg, val_rows, heldout, tokenizer

    def units(self, batch) -> int:
        return int((batch.targets != IGNORE_INDEX).sum())

    def __call__(self, model, batch, device) -> ObjectiveOutput:
        segments = batch.segments.to(device) if self.cfg.sft.packing else None
        out = model(batch.inputs.to(device), batch.targets.to(device), segments=segments)
        replay = sum(d == "replay" for d in batch.domains) / len(batch.domains)
        return ObjectiveOutput(out.loss, {"loss": out.ce_loss, "replay_share": replay})

    @torch.no_grad()
    def evaluate(self, state) -> tuple[dict, str]:
        cfg, model = self.cfg, state.model
        was = model.training
        model.eval()
        loss_sum, n = 0.0, 0
        pad = self.tokenizer.pad_id if self.tokenizer.pad_id is not None else self.tokenizer.eot_id
        for i in range(0, len(self.val_rows), cfg.train.batch_size):
            batch = collate(self.val_rows[i : i + cfg.train.batch_size], pad)
            k = self.units(batch)
            with state.precision.context():
                out = self(model, batch, state.dist.device)
            loss_sum, n = loss_sum + float(out.metrics["loss"]) * k, n + k
        loss_sum, n = state.dist.sum([loss_sum, n])
        record = {"step": state.step, "tokens": state.tokens}
        if n:  # no held-out examples: no held-out loss (the data report says so)
            record["val_loss"] = loss_sum / n
        if cfg.sft.eval_generations and self.heldout and state.dist.strategy != "fsdp":
            record.update(self.generation_metrics(unwrap(model)))
        model.train(was)
        message = f"step {state.step}: " + ", ".join(f"{k.removeprefix('val_')} {v:.4f}" for k, v in record.items()
                                                     if k.startswith("val_")) if len(record) > 2 else "no held-out data"
        return record, message

    def generation_metrics(self, model) -> dict:
        chats = [ex for ex in self.heldout if ex.messages][: self.cfg.sft.eval_generations]
        found = chat_metrics(model, self.tokenizer, chats, self.cfg.sft.eval_max_new_tokens)
        return {f"val_{k}": v for k, v in found.items() if k in ("end_turn", "exact_match_strict",
                                                                  "exact_match_lenient")}


def _is_heldout(ex: Example, cfg: SFTConfig) -> bool:
    if "split" in ex.meta:
        return ex.meta["split"] == "heldout"
    key = ex.id or ex.text or ex.prompt_text or "".join(m["content"] for m in ex.messages)
    return document_score(key, cfg.sft.seed) < cfg.sft.val_fraction


def _skipped(stats: ReadStats) -> int:
    return sum(getattr(stats, kind) for kind in PROBLEM_KINDS)


def _report_skipped(flag: str, stats: ReadStats, note) -> None:
    """What reading `flag`'s files skipped (unreadable files, invalid JSON, records of no known format), said
    on the console where the user looks, not only in data_report.json."""
    if _skipped(stats):
        note(f"{flag}: skipped {_skipped(stats):,} input problem(s) ({stats.summary()}); first: "
             + "; ".join(stats.examples(3)))


def load_examples(cfg: SFTConfig, note=print) -> tuple[list[Example], list[Example], ReadStats]:
    """(training examples, held-out examples, what reading saw). Skipped input is reported through `note`;
    --eval-data that yields no usable example is a DataError naming its files, never "no held-out data"."""
    if not cfg.sft.data:
        raise DataError("no fine-tuning data: pass --data FILE... (JSONL or Parquet)")
    stats = ReadStats()
    train, heldout = [], []
    for ex in iter_examples(cfg.sft.data, stats):
        (heldout if not cfg.sft.eval_data and _is_heldout(ex, cfg) else train).append(ex)
    _report_skipped("--data", stats, note)
    if cfg.sft.eval_data:
        held_stats = ReadStats()
        heldout = list(iter_examples(cfg.sft.eval_data, held_stats))
        _report_skipped("--eval-data", held_stats, note)
        if not heldout:
            raise no_usable_held_out("--eval-data", cfg.sft.eval_data, "held-out example", held_stats.summary(),
                                     held_stats.examples(3))
        stats.merge(held_stats)
    return train, heldout, stats


def sft(cfg: SFTConfig, out_dir: str | Path, resume: bool = False) -> dict:
    """Fine-tune `cfg.base` on `cfg.sft.data` into `out_dir`; returns the training summary."""
    with open_run(cfg, out_dir, resume, base=cfg.base) as run:
        cfg, d, tok = run.cfg, run.dist, run.tokenizer
        train_ex, heldout, stats = load_examples(cfg, run.note)
        pad = tok.pad_id if tok.pad_id is not None else tok.eot_id
        rows, report = pack([tokenize(e, tok, cfg.sft.loss_on, i) for i, e in enumerate(train_ex)], cfg.train.seq_len,
                            pad, cfg.sft.packing)
        val_rows, val_report = pack([tokenize(e, tok, cfg.sft.loss_on, i) for i, e in enumerate(heldout)],
                                    cfg.train.seq_len, pad, cfg.sft.packing)
        if cfg.sft.eval_data and not val_rows:
            raise DataError(f"--eval-data {', '.join(map(str, cfg.sft.eval_data))}: none of its {len(heldout):,} "
                            f"examples can be scored ({val_report['dropped_examples']:,} longer than train.seq_len "
                            f"{cfg.train.seq_len}, {val_report['no_target_examples']:,} with no learned token)")
        replay_rows = round(cfg.sft.replay_fraction * cfg.train.batch_size) if cfg.sft.replay_fraction else 0
        replay = None
        if replay_rows:
            replay = TokenLoader(cfg.sft.replay_shards, "train", cfg.train.seq_len, replay_rows, rank=d.rank,
                                 world_size=d.world_size, seed=cfg.train.seed, expected_tokenizer_hash=tok.hash)
        loader = SFTLoader(rows, cfg.train.batch_size, pad, seed=cfg.sft.seed, rank=d.rank, world_size=d.world_size,
                           replay=replay, replay_rows=replay_rows)
        run.steps_from_epochs(cfg.sft.epochs, len(rows), loader.batch_size)
        run.commit()
        cfg = run.cfg
        run.note(f"{len(train_ex):,} examples ({len(heldout):,} held out) -> {report['rows']:,} rows of "
                 f"{cfg.train.seq_len} tokens; {report['learned_tokens']:,} learned tokens, "
                 f"{report['padding_tokens']:,} padding, {report['dropped_examples']:,} examples dropped (longer "
                 f"than a row), {cfg.train.max_steps:,} steps"
                 + (f"; {replay_rows} of {cfg.train.batch_size} rows per batch replay pretraining data"
                    if replay_rows else ""))
        if d.is_main and not resume:
            _write_data_report(run.out, report, stats, replay_rows, cfg)
        return run.train(SFTObjective(cfg, val_rows, heldout, tok), loader)


def _write_data_report(out: Path, report: dict, stats: ReadStats, replay_rows: int, cfg: SFTConfig) -> None:
    atomic_write_json(out / DATA_REPORT_FILE, {**report, "read": stats.to_dict(), "replay_rows_per_batch": replay_rows,
                                                 "replay_share": replay_rows / cfg.train.batch_size,
                                                 "loss_on": cfg.sft.loss_on, "packing": cfg.sft.packing})
