"""The report card: a Markdown summary with PNG plots of any demo or training run directory, built from the
files the stages wrote. The `groundup report` verb is in demo/commands.py.

    card.py            write_report: ROOT/report.md and ROOT/plots/, each section there when its input is
    sections.py        the sections of any run: stages, curation, tokenizer, model, training, samples
    demo_sections.py   the demo's own sections: models table, time budget, held-out works, post-training curves,
                       conversations before and after alignment
    plots.py           metrics.jsonl read and drawn: loss, learning rate, gradient norm, throughput (matplotlib Agg)
"""

from groundup.report.card import write_report

__all__ = ["write_report"]
