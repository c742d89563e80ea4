"""`groundup demo`: the whole chain on the embedded corpus within a time budget, each stage run by its own verb:
data sample -> curate -> tokenizer -> tokenize -> pretrain -> SFT -> align -> quantize -> scorecard -> report card.

    run.py         Demo and run_demo: the stages in order, the OUT/ layout, OUT/commands.sh
    config.py      DemoConfig: one section per stage, each the stage's own config, and the recipe's defaults
    stages.py      StageRunner: resumable stages, each fingerprinted and timed in OUT/stages.json
    budget.py      DemoBudget: each training stage's `train.time_limit_s`: its least, then a share of the rest
    costs.py       Costs: what the rest of the chain costs on this machine now, from what was measured
    measure.py     measure_machine: a training step and float / int8 forwards of the untrained model
    watch.py       PretrainWatch: re-plans pretraining's limit while it runs, as its steps measure the load
    post.py        PostStages: SFT, GRPO (or data pairs + DPO), int8 quantization and a report-card row per model
    scorecard.py   score_model: one report-card row (bits per byte, exact match, CORE, size, decode speed)
    arena_stage.py the demo's arena: its models judged against each other (`groundup arena`)
    commands.py    `groundup demo` and `groundup report` (the report itself is groundup.report)
"""

from groundup.demo.config import DemoConfig
from groundup.demo.run import Demo, run_demo

__all__ = ["Demo", "DemoConfig", "run_demo"]
