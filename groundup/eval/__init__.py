"""Evaluation: perplexity and bits-per-byte per domain (perplexity.py), and the task evaluations."""
