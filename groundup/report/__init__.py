"""The report card: a Markdown summary with PNG plots of any demo or training run directory."""

from groundup.report.card import write_report

__all__ = ["write_report"]
