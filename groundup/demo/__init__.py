"""`groundup demo`: curate -> tokenizer -> tokenize -> pretrain -> evaluate -> sample -> report card."""

from groundup.demo.config import DemoConfig
from groundup.demo.run import Demo, run_demo

__all__ = ["Demo", "DemoConfig", "run_demo"]
