"""Run code a model wrote without trusting it: HumanEval/MBPP pass@k and GRPO code rewards.

The promise: a program given to `run_program` never runs in our process, and programs run at the
same time cannot see or touch each other. Each runs as `python` in a process of its own, in a
session of its own, under limits on wall-clock time, CPU time, memory, file size, processes and
captured output, with no network, in a fresh empty directory that is its HOME and TMPDIR and is
removed afterwards, with stdin at /dev/null and a minimal environment. Where the kernel allows
namespaces (`isolation_layers()` says), it runs in PID, mount, IPC and network namespaces of its
own: it sees only its own processes in /proc and can signal or trace nothing else, its /tmp,
/var/tmp and /dev/shm are fresh and empty and vanish with it, its home is at the same path in a
fresh tmpfs of its own, and the other programs' folders are not there at all. As root it runs as a
uid of its own (isolation.UID_BASE + its launcher's pid), never shared with a program running at
the same time, so RLIMIT_NPROC is its own and its folder (0700) is closed to every other program
even without namespaces. When it ends, whatever it started
is killed: the init of its PID namespace exits and the kernel kills the rest; without namespaces,
its process group, every process in its network namespace (setsid() escapees) and every process
of its own uid.

    from groundup.sandbox import run_program, check_completion, default_python
    run_program("print(1 + 1)").stdout                   # '2\\n'
    run_program(source, python=default_python())         # sys.executable, or a system python3 it can run
    check_completion(prompt, completion, test, entry_point="add").status   # 'passed' or 'failed'

Layers (`isolation_layers()` lists those active on this machine; isolation.py does the namespaces):
- process-group: `start_new_session=True`; SIGKILL to the whole group on timeout and at the end.
- rlimit-cpu, rlimit-memory (RLIMIT_AS), rlimit-file-size, rlimit-core (0), rlimit-nproc.
- uid-drop: as root, the program never runs as root. uid-per-program: the uid is its own (above);
  when /etc/passwd has a user in that range or the machine does not map it, it is `nobody`, shared.
  Without either (no `nobody`), the program runs as root: both layers and rlimit-nproc drop out.
  The program's user must be able to read `python`'s standard library (a pyenv under a 0700 /root
  is not): checked once per interpreter and refused with a ConfigError naming `python`.
- pid-namespace, mount-namespace, private-tmp, ipc-namespace: see above (isolation.py). The probe
  runs one program this way per interpreter; if anything fails (no CAP_SYS_ADMIN, no unprivileged
  user namespaces, a /proc the container will not let us mount), these four are absent, and
  isolation between programs rests on uid-per-program (as root) or is absent (not root). A setup
  that fails after the probe passed raises OSError: never a silent score.
- network-namespace: the program has only a downed loopback (with a user namespace when not root).
- network-audit-hook: a bootstrap installs `sys.addaudithook` refusing socket connect, bind,
  send and name lookups, then runs the program as `__main__` with a normal traceback. It only
  guards the program's own interpreter (ctypes or a child process get past it); the namespace
  is the layer that holds.
- no-new-privs: no setuid binary or file capability gives the program more than it has.
- temp-home: a fresh `tempfile.mkdtemp()` as cwd, HOME and TMPDIR, removed even after a timeout
  (with namespaces the program works in its copy in the private tmpfs, gone with the namespace).
- clean-env: PATH, HOME, TMPDIR, LANG, PYTHONDONTWRITEBYTECODE=1, PYTHONHASHSEED=0 and nothing
  else; python runs with `-s -B` and no cwd on sys.path (what `-I` means, minus ignoring the two
  PYTHON* variables we set).

Not promised: the program can read world-readable files and write in world-writable places other
than those named (such as /run/lock; sticky, so not in another uid's files), each file capped by
RLIMIT_FSIZE (with namespaces each fresh tmpfs, home included, holds 4 x file_size_mb, at most
memory_mb); not root and without namespaces, programs share the user and can attack each other
(no layer above claims otherwise); with `nobody` as the user, RLIMIT_NPROC counts all of nobody's
processes; a kernel exploit escapes everything here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

from groundup.errors import ConfigError
from groundup.sandbox import isolation
from groundup.sandbox.launch import ENV_PATH, ROOT, SandboxResult, launch, netns_available, program_user

__all__ = ["SandboxResult", "check_completion", "default_python", "isolation_layers", "run_many", "run_program"]

_DEFAULTS = {"timeout": 10.0, "memory_mb": 1024, "cpu_seconds": None, "file_size_mb": 16, "max_processes": 16,
             "max_output_bytes": 64 * 1024}


def _check_limits(timeout, memory_mb, cpu_seconds, file_size_mb, max_processes, max_output_bytes) -> None:
    rules = {"timeout": (timeout, timeout > 0, "> 0"), "memory_mb": (memory_mb, memory_mb >= 16, ">= 16"),
             "cpu_seconds": (cpu_seconds, cpu_seconds is None or cpu_seconds > 0, "> 0 or None"),
             "file_size_mb": (file_size_mb, file_size_mb >= 0, ">= 0"),
             "max_processes": (max_processes, max_processes >= 1, ">= 1"),
             "max_output_bytes": (max_output_bytes, max_output_bytes >= 0, ">= 0")}
    for key, (value, ok, want) in rules.items():
        if not ok:
            raise ConfigError(f"sandbox: {key} = {value!r} must be {want}", key=key)


@lru_cache(maxsize=16)
def _namespaces_work(python: str) -> bool:
    """Whether a program run with `python` in namespaces of its own is PID 2 there (its init is 1)."""
    try:
        isolation.resolve_libc()
        got = launch("import os\nprint(os.getpid())", python, namespaces=True, **{**_DEFAULTS, "timeout": 30.0})
    except (OSError, subprocess.SubprocessError, AttributeError):
        return False
    return got.passed and got.stdout == "2\n"


def isolation_layers(python: str | None = None) -> list[str]:
    """The isolation layers active on this machine, for this user (and `python`: sys.executable)."""
    user = program_user()
    layers = ["process-group", "rlimit-cpu", "rlimit-memory", "rlimit-file-size", "rlimit-core"]
    if not ROOT or user is not None:
        layers.append("rlimit-nproc")
    if user is not None:
        layers.append("uid-drop")
    if user is not None and user[0] == "own":
        layers.append("uid-per-program")
    if _namespaces_work(python or sys.executable):
        layers += ["pid-namespace", "mount-namespace", "private-tmp", "ipc-namespace", "network-namespace"]
    elif netns_available():
        layers.append("network-namespace")
    return layers + ["no-new-privs", "network-audit-hook", "temp-home", "clean-env"]


@lru_cache(maxsize=16)
def _usable_python(python: str) -> str:
    """The interpreter's path, once checked that the sandbox user runs it with its own stdlib."""
    found = shutil.which(python, path=ENV_PATH) if os.sep not in python else python
    if not found or not os.access(found, os.X_OK):
        raise ConfigError(f"sandbox: python = {python!r} is not an executable interpreter", key="python")
    # With namespaces the interpreter starts as root and only the program runs as its user: so the
    # check imports from the standard library (pure and compiled) and asks that it can exec python.
    ask = ("import sys, os\nlib = os.path.dirname(os.__file__)\n"
           "assert os.access(lib, os.R_OK | os.X_OK), 'cannot read the standard library in ' + lib\n"
           "assert os.access(sys.executable, os.X_OK), 'cannot exec ' + sys.executable\n"
           "import json, decimal\nprint(sys.version, sys.base_prefix)")
    expected = subprocess.run([found, "-s", "-c", ask], env={"PATH": ENV_PATH}, capture_output=True, text=True,
                              timeout=60).stdout
    try:
        got = launch(ask, found, namespaces=_namespaces_work(found), **{**_DEFAULTS, "timeout": 30.0})
        problem = None
        if not got.passed:
            problem = (got.stderr.strip().splitlines() or [got.detail])[-1]
        elif got.stdout != expected:
            problem = f"it finds another standard library ({got.stdout.strip()}, not {expected.strip()})"
    except (OSError, subprocess.SubprocessError) as exc:
        problem = str(exc)
    if problem:
        user = program_user()
        who = {None: "the sandbox", "own": "the sandbox's unprivileged users (uids from "
               f"{isolation.UID_BASE})"}.get(user and user[0], f"the sandbox user nobody (uid {user and user[1]})")
        raise ConfigError(f"sandbox: python = {found!r} cannot run under {who}: {problem}. Pass python= an "
                          "interpreter whose installation every user can read (such as /usr/bin/python3), "
                          "or make this one's directories world-readable", key="python")
    return found


_FALLBACK_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


@lru_cache(maxsize=1)
def default_python() -> str:
    """The interpreter programs run with: this one (`sys.executable`) when the sandbox user can run it,
    else the first of /usr/bin/python3, /usr/local/bin/python3 that it can (checked once, cached).
    A virtual environment under a 0700 /root cannot be run by the sandbox's users; a system python
    can, and HumanEval and MBPP need only the standard library. ConfigError when none works."""
    problems = []
    for python in (sys.executable, *_FALLBACK_PYTHONS):
        if python != sys.executable and not os.path.exists(python):
            continue
        try:
            return _usable_python(python)
        except ConfigError as e:
            problems.append(str(e))
    raise ConfigError("sandbox: no interpreter the sandbox can run (tried " + ", ".join(
        [sys.executable, *_FALLBACK_PYTHONS]) + "): " + (problems[0] if problems else "none found"), key="python")


def run_program(source: str, *, timeout: float = 10.0, memory_mb: int = 1024, cpu_seconds: float | None = None,
                file_size_mb: int = 16, max_processes: int = 16, max_output_bytes: int = 64 * 1024,
                python: str = sys.executable) -> SandboxResult:
    """Run `source` as a Python program in the sandbox; never raises for anything the program does."""
    _check_limits(timeout, memory_mb, cpu_seconds, file_size_mb, max_processes, max_output_bytes)
    python = _usable_python(python)
    return launch(source, python, namespaces=_namespaces_work(python), timeout=timeout, memory_mb=memory_mb,
                  cpu_seconds=cpu_seconds, file_size_mb=file_size_mb, max_processes=max_processes,
                  max_output_bytes=max_output_bytes)


def run_many(sources, *, workers: int | None = None, **limits) -> list[SandboxResult]:
    """Run programs concurrently (default: one per CPU), results in input order."""
    sources = list(sources)
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 1:
        raise ConfigError(f"sandbox: workers = {workers!r} must be >= 1", key="workers")
    unknown = set(limits) - set(_DEFAULTS) - {"python"}
    if unknown:
        raise TypeError(f"run_many: unknown limit(s) {sorted(unknown)}; expected some of {[*_DEFAULTS, 'python']}")
    _check_limits(**{**_DEFAULTS, **{k: v for k, v in limits.items() if k != "python"}})  # fail once, up front
    _usable_python(limits.get("python", sys.executable))
    if not sources:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(sources))) as pool:
        return list(pool.map(lambda source: run_program(source, **limits), sources))


def check_completion(prompt: str, completion: str, test: str, entry_point: str | None = None,
                     **limits) -> SandboxResult:
    """Run a completion against its tests, the program built exactly as HumanEval (or MBPP) builds it."""
    program = prompt + completion + "\n" + test
    if entry_point is not None:
        program += "\n" + f"check({entry_point})"
    return run_program(program, **limits)
