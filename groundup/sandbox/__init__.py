"""The sandbox: code a model wrote runs here, never in our process (code benchmarks, code rewards, tools).

runner.py     run_program / run_many under limits and isolation layers; check_completion runs a
              completion against its tests; isolation_layers() says what holds on this machine
launch.py     one program: start it under the limits, collect its output, kill what it leaves
isolation.py  programs apart from us and from each other: PID/mount/IPC/network namespaces, a
              private /tmp, a uid of its own per program, the sweeps
"""

from groundup.sandbox.runner import SandboxResult, check_completion, default_python, isolation_layers, run_many, run_program

__all__ = ["SandboxResult", "check_completion", "default_python", "isolation_layers", "run_many", "run_program"]
