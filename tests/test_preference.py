"""DPO and KTO: losses equal TRL's own on the same exported model and batch; the closed forms; runs on
the training core with exact resume; bad pairs counted."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

from groundup.config import load_config
from groundup.interop import export_hf
from groundup.posttrain.align import dpo, kto
from groundup.posttrain.config import DPOConfig, DPOSection, KTOConfig, KTOSection
from groundup.posttrain.pairs import Feedback, Pair, read_pairs
from groundup.posttrain.preference import PreferenceObjective, dpo_loss, make_batch, reference_logps
from infer_helpers import model_dir, small_tokenizer, tiny_model
from train_helpers import assert_resumes_exactly, metrics

G = torch.Generator().manual_seed(3)


def _ids(n: int) -> list[int]:
    return torch.randint(0, 500, (n,), generator=G).tolist()


def _models(tmp_path):
    """(our policy, our reference, TRL's policy, TRL's reference): the policy is the reference, perturbed."""
    reference = tiny_model()
    with torch.no_grad():
        for p in reference.parameters():
            if p.dim() > 1:
                p.mul_(3.0)
    policy = copy.deepcopy(reference)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=G) * 0.02)
    for name, m in (("ref", reference), ("policy", policy)):
        model_dir(tmp_path / name, m, small_tokenizer())
        export_hf(tmp_path / name, tmp_path / f"hf-{name}")
    from transformers import AutoModelForCausalLM

    return (policy, reference, AutoModelForCausalLM.from_pretrained(tmp_path / "hf-policy"),
            AutoModelForCausalLM.from_pretrained(tmp_path / "hf-ref"))


def _trl_trainer(kind, tmp_path, hf, hf_ref, **args):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig as TRLDPOConfig, DPOTrainer, KTOConfig as TRLKTOConfig, KTOTrainer

    tok = AutoTokenizer.from_pretrained(tmp_path / "hf-policy")
    # fp32 on both sides: TRL otherwise runs the reference model under bf16 autocast
    common = dict(output_dir=str(tmp_path / "trl"), report_to=[], use_cpu=True, per_device_train_batch_size=4, bf16=False)
    if kind == "dpo":
        ds = Dataset.from_list([{"prompt": "To be", "chosen": " or not", "rejected": " a king"}] * 4)
        return DPOTrainer(model=hf, ref_model=hf_ref, args=TRLDPOConfig(**common, **args), train_dataset=ds,
                          processing_class=tok)
    ds = Dataset.from_list([{"prompt": "To be", "completion": " or not", "label": True},
                            {"prompt": "To be", "completion": " a king", "label": False}] * 2)
    return KTOTrainer(model=hf, ref_model=hf_ref, args=TRLKTOConfig(**common, **args), train_dataset=ds,
                      processing_class=tok)


@pytest.mark.parametrize("loss, sft_weight", [("sigmoid", 0.0), ("ipo", 0.0), ("sigmoid", 0.7)])
def test_dpo_loss_equals_trl(tmp_path, loss, sft_weight):
    """sft_weight: RPO, TRL's loss_type [loss, "sft"] with loss_weights [1, w]."""
    policy, reference, hf, hf_ref = _models(tmp_path)
    pairs = [Pair(i, _ids(5 + i), _ids(3 + 2 * i), _ids(6 - i)) for i in range(4)]
    extra = dict(loss_type=[loss, "sft"], loss_weights=[1.0, sft_weight]) if sft_weight else dict(loss_type=[loss])
    trainer = _trl_trainer("dpo", tmp_path, hf, hf_ref, beta=0.1, **extra)
    batch = trainer.data_collator([{"prompt_ids": p.prompt, "chosen_ids": p.chosen, "rejected_ids": p.rejected}
                                   for p in pairs])
    theirs = float(trainer._compute_loss(trainer.model, batch, False))
    ref = reference_logps(reference, pairs, "dpo", 0, "cpu")
    objective = PreferenceObjective("dpo", DPOSection(beta=0.1, loss=loss, sft_weight=sft_weight), ref)
    out = objective(policy.eval(), make_batch(pairs, "dpo", 0, pairs), "cpu")
    ours = float(out.loss)
    assert abs(ours - math.log(2)) > 1e-3 if loss == "sigmoid" else True  # the policy differs from the reference
    assert ours == pytest.approx(theirs, abs=1e-4)
    if sft_weight:  # the added term is large enough that leaving it out would fail the comparison
        assert sft_weight * float(out.metrics["chosen_nll"]) > 1.0


def test_kto_loss_equals_trl(tmp_path):
    policy, reference, hf, hf_ref = _models(tmp_path)
    items = [Feedback(i, _ids(4 + i), _ids(3 + i), label=i % 3 != 1) for i in range(4)]
    trainer = _trl_trainer("kto", tmp_path, hf, hf_ref, beta=0.2, desirable_weight=1.0, undesirable_weight=1.3)
    partners = [items[-1]] + items[:-1]  # TRL's rotation by one within the batch
    batch = trainer.data_collator([{"prompt_ids": x.prompt, "completion_ids": x.completion,
                                    "KL_completion_ids": p.completion, "label": x.label}
                                   for x, p in zip(items, partners)])
    theirs = float(trainer._compute_loss(trainer.model, batch, False))
    ref = reference_logps(reference, items, "kto", 0, "cpu", batch_size=4, chunk=4)
    objective = PreferenceObjective("kto", KTOSection(beta=0.2, desirable_weight=1.0, undesirable_weight=1.3), ref)
    ours = float(objective(policy.eval(), make_batch(items, "kto", 0, items, chunk=4), "cpu").loss)
    assert ours == pytest.approx(theirs, abs=1e-4)


def test_dpo_closed_forms():
    c, r = torch.tensor([1.0, -0.5]), torch.tensor([0.2, 0.3])
    lengths = torch.tensor([[2.0, 4.0], [1.0, 3.0]])
    beta = 0.5
    d = c - r
    assert torch.allclose(dpo_loss(c, r, lengths, "sigmoid", beta), torch.log1p(torch.exp(-beta * d)))
    smooth = dpo_loss(c, r, lengths, "sigmoid", beta, label_smoothing=0.1)
    assert torch.allclose(smooth, -0.9 * F.logsigmoid(beta * d) - 0.1 * F.logsigmoid(-beta * d))
    ipo = (c / lengths[:, 0] - r / lengths[:, 1] - 1 / (2 * beta)) ** 2
    assert torch.allclose(dpo_loss(c, r, lengths, "ipo", beta), ipo)
    assert torch.allclose(dpo_loss(c, r, lengths, "hinge", beta), torch.clamp(1 - beta * d, min=0))


def _pairs_file(path, n=40):
    """Pairs a tiny model learns in a few steps: "yes" always chosen over "no" (TRL conversational format)."""
    rows = []
    for i in range(n):
        prompt = [{"role": "user", "content": f"Is {3 + i} more than {2 + i}?"}]
        rows.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": "Answer: yes"}],
                     "rejected": [{"role": "assistant", "content": "Answer: no"}]})
    rows.append({"prompt": "same", "chosen": "x", "rejected": "x"})  # identical: skipped and counted
    rows.append({"prompt": "p", "chosen": "", "rejected": "y"})  # empty: skipped
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bad_pairs_are_counted_with_file_and_line(tmp_path):
    pairs, report = read_pairs([_pairs_file(tmp_path / "p.jsonl")], small_tokenizer(), 64)
    assert len(pairs) == 40 and len(report.skipped) == 2
    assert "identical" in report.skipped[0] and report.skipped[0].startswith(f"{tmp_path / 'p.jsonl'}:41")
    short, report = read_pairs([tmp_path / "p.jsonl"], small_tokenizer(), 14)
    assert report.truncated_prompts > 0 and all(len(p.prompt) + max(len(p.chosen), len(p.rejected)) <= 14
                                                for p in short)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("pref")
    model_dir(root / "base", tiny_model(max_seq_len=128), small_tokenizer())
    return root


def _cfg(cls, section, base, data, *extra):
    return load_config(cls, None, [f"base={json.dumps(str(base / 'base'))}", f"{section}.data={json.dumps([str(data)])}",
                                   "train.seq_len=64", "train.batch_size=4", "train.threads=2", "log.every=1",
                                   "log.progress=false", "eval.every=0", "checkpoint.every=3",
                                   "schedule.peak_lr=1e-2", "schedule.warmup_steps=0", *extra])


@pytest.mark.parametrize("lora", [False, True])
def test_dpo_learns_the_preference_and_resumes_exactly(base, tmp_path, lora):
    data = _pairs_file(tmp_path / "pairs.jsonl")
    extra = ["train.max_steps=6", "dpo.val_fraction=0.2"] + (["lora.rank=4", "schedule.peak_lr=3e-2"] if lora else [])
    summary = dpo(_cfg(DPOConfig, "dpo", base, data, *extra), tmp_path / "run")
    steps, _ = metrics(tmp_path / "run")
    assert steps[-1]["margin"] > 0.1 and steps[-1]["loss"] < steps[0]["loss"] and summary["eval"]["val_accuracy"] == 1
    assert "val_accuracy" in summary["eval"] and (tmp_path / "run" / "reference_logps.safetensors").is_file()
    name = "adapter_model.safetensors" if lora else "model.safetensors"
    assert_resumes_exactly(tmp_path / "run", lambda run: dpo(_cfg(DPOConfig, "dpo", base, data, *extra), run, resume=True),
                           6, name)


def test_kto_runs_on_unpaired_feedback_and_resumes_exactly(base, tmp_path):
    rows = []
    for i in range(24):
        good = i % 2 == 0
        rows.append({"prompt": f"What is {i} + 1?", "completion": f" Answer: {i + 1 if good else i + 5}", "label": good})
    (tmp_path / "f.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _cfg(KTOConfig, "kto", base, tmp_path / "f.jsonl", "train.max_steps=6", "kto.beta=0.2")
    summary = kto(cfg, tmp_path / "run")
    steps, _ = metrics(tmp_path / "run")
    assert summary["steps"] == 6 and all(s["kl"] >= 0 for s in steps)
    assert_resumes_exactly(tmp_path / "run", lambda run: kto(cfg, run, resume=True), 6)
