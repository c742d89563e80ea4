"""The sandbox: code a model wrote runs here, never in our process (code benchmarks, code rewards, tools).

runner.py   run_program / run_many under limits and isolation layers; check_completion runs a
            completion against its tests
"""

from groundup.sandbox.runner import SandboxResult, check_completion, default_python, isolation_layers, run_many, run_program

__all__ = ["SandboxResult", "check_completion", "default_python", "isolation_layers", "run_many", "run_program"]
