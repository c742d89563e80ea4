"""The code-execution sandbox: statuses, every isolation layer, cleanup, check_completion, pass@k."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from groundup.errors import ConfigError
from groundup.eval.metrics import pass_at_k
from groundup.sandbox.runner import SandboxResult, check_completion, isolation_layers, run_many, run_program

ROOT = os.geteuid() == 0
LAYERS = isolation_layers()
PID_NAMESPACE = "pid-namespace" in LAYERS
SANDBOX_UID = 65534 if "uid-drop" in LAYERS else os.getuid()  # without uid-per-program


def _sandbox_uid(uid: int) -> bool:
    return uid >= 2_000_000_000 if "uid-per-program" in LAYERS else uid == SANDBOX_UID


def _interpreter() -> str:
    """This interpreter if the sandbox user can run it, else the system one (a pyenv under /root is not)."""
    for python in (sys.executable, "/usr/bin/python3"):
        try:
            if run_program("", python=python).passed:
                return python
        except ConfigError:
            pass
    pytest.skip("no interpreter the sandbox user can run", allow_module_level=True)


PY = _interpreter()


def run(source: str, **limits) -> SandboxResult:
    return run_program(source, python=PY, **{"timeout": 5.0, "memory_mb": 256, **limits})


def _gone(pid: int, wait: float = 3.0) -> bool:
    """Dead: no such process, or a killed zombie waiting for init to reap it."""
    end = time.monotonic() + wait
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


def _group_members(pgid: int) -> list[int]:
    """Live processes of the sandbox user in process group `pgid`."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] not in "ZX" and _sandbox_uid(os.stat(f"/proc/{name}").st_uid):
                found.append(int(name))
        except (OSError, IndexError, ValueError):
            pass
    return found


def _namespace_empty(ns: str, wait: float = 3.0) -> bool:
    """No live process left in the PID namespace `ns` (as /proc/self/ns/pid names it inside)."""
    end = time.monotonic() + wait
    while True:
        left = []
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{name}/stat") as f:
                    if os.readlink(f"/proc/{name}/ns/pid") == ns and f.read().rsplit(")", 1)[1].split()[0] not in "ZX":
                        left.append(name)
            except (OSError, IndexError):
                pass
        if not left or time.monotonic() > end:
            return not left
        time.sleep(0.05)


# Printed by a program to name what the test checks afterwards: its PID namespace, or the pids.
WHERE = "print(os.readlink('/proc/self/ns/pid'), flush=True)\n"


def _all_gone(ns: str, *pids: str) -> bool:
    return _namespace_empty(ns) if PID_NAMESPACE else all(_gone(int(pid)) for pid in pids)


def test_passing_program():
    r = run("print('hello')")
    assert (r.status, r.returncode, r.stdout, r.detail, r.truncated) == ("passed", 0, "hello\n", "", False)
    assert r.passed and 0 < r.seconds < 5


def test_failing_assert_has_a_normal_traceback():
    r = run("def f():\n    assert 1 == 2, 'nope'\n\nf()\n")
    assert (r.status, r.returncode) == ("failed", 1)
    assert r.detail == "AssertionError: nope"
    assert r.stderr.startswith("Traceback (most recent call last):\n")
    assert 'program.py", line 4, in <module>' in r.stderr and 'line 2, in f' in r.stderr
    assert "<string>" not in r.stderr  # the bootstrap's own frame is not shown


def test_syntax_error():
    r = run("def f(:\n    pass\n")
    assert r.status == "failed" and r.detail.startswith("SyntaxError")
    assert "program.py" in r.stderr and "Traceback" not in r.stderr  # as plain python prints it


def test_program_runs_as_main_with_exit_codes():
    r = run("import sys\nif __name__ == '__main__':\n    print(sys.argv[0].endswith('program.py'))\n    sys.exit(3)")
    assert (r.status, r.returncode, r.stdout, r.detail) == ("failed", 3, "True\n", "exit status 3")


def test_environment_limits_and_user(monkeypatch):
    monkeypatch.setenv("GROUNDUP_SECRET_TOKEN", "hunter2")
    r = run("import os, sys, resource as r\n"
            "print(sorted(os.environ))\n"
            "print([r.getrlimit(x)[0] for x in (r.RLIMIT_AS, r.RLIMIT_FSIZE, r.RLIMIT_CORE, r.RLIMIT_CPU)])\n"
            "print(os.getuid(), os.getgid(), os.getsid(0) == os.getpid(), sys.stdin.read() == '')\n"
            "print('' in sys.path or os.getcwd() in sys.path, os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR'])\n"
            "print(hash('abc') == hash('abc'), sys.flags.no_user_site, sys.dont_write_bytecode)",
            memory_mb=300, file_size_mb=3, cpu_seconds=7)
    assert r.passed, r.stderr
    env, limits, ids, path, flags = r.stdout.splitlines()
    assert env == str(["HOME", "LANG", "PATH", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "TMPDIR"])
    assert limits == str([300 << 20, 3 << 20, 0, 7])
    uid, gid, rest = ids.split(maxsplit=2)
    if "uid-per-program" in LAYERS:  # a uid (and group) of its own, from the reserved range
        assert 2_000_000_000 <= int(uid) < 2_100_000_000 and gid == uid and rest == "True True"
    else:
        assert ids == (f"{SANDBOX_UID} 65534 True True" if ROOT else f"{os.getuid()} {os.getgid()} True True")
    assert (path, flags) == ("False True", "True 1 True")


def test_process_limit_is_set_relative_to_the_users_processes():
    assert "rlimit-nproc" in LAYERS
    r = run("import resource; print(resource.getrlimit(resource.RLIMIT_NPROC)[0])", max_processes=5)
    assert r.passed and 5 <= int(r.stdout) < 5 + 10_000


def test_infinite_loop_times_out_and_its_whole_group_dies():
    program = ("import os, subprocess, time\n" + WHERE +
               "child = subprocess.Popen(['sleep', '60'])\n"
               "pid = os.fork()\n"
               "if pid == 0:\n"
               "    time.sleep(60)\n"
               "    os._exit(0)\n"
               "print(child.pid, pid, os.getcwd(), flush=True)\n"
               "while True:\n"
               "    pass\n")
    r = run(program, timeout=2.0)
    assert r.status == "timeout" and r.returncode == -signal.SIGKILL and "timeout" in r.detail
    assert 2.0 <= r.seconds < 6.0
    ns, sleeper, forked, home = r.stdout.split()
    assert _all_gone(ns, sleeper, forked)
    assert not os.path.exists(home)


@pytest.mark.skipif("network-namespace" not in LAYERS, reason="no network namespace: setsid() escapees are not swept")
def test_children_that_leave_the_group_are_killed_too():
    program = ("import os, time\n" + WHERE +
               "pid = os.fork()\n"
               "if pid == 0:\n"
               "    os.setsid()\n"
               "    time.sleep(60)\n"
               "    os._exit(0)\n"
               "print(pid)\n")
    r = run(program)
    ns, pid = r.stdout.split()
    assert r.passed and _all_gone(ns, pid)


def test_fork_bomb_is_contained():
    program = "import os\n" + WHERE + "print(os.getpgid(0), flush=True)\nwhile True:\n    os.fork()\n"
    pgid = None
    try:
        r = run(program, timeout=5.0, max_processes=8)
        ns, pgid = r.stdout.split()[0], int(r.stdout.split()[1])  # in a PID namespace, pgid is 0 (outside it)
        assert r.status in ("failed", "killed") and r.seconds < 5.0, r
        assert "BlockingIOError" in r.stderr or r.status == "killed"
    finally:  # never leave a bomb behind, whatever failed above
        for _ in range(5):
            for pid in _group_members(pgid) if pgid else []:
                os.kill(pid, signal.SIGKILL)
    assert _group_members(pgid) == [] and (not PID_NAMESPACE or _namespace_empty(ns))
    assert subprocess.run(["true"]).returncode == 0  # the host still has process slots


def test_huge_allocation_fails_with_memory_error():
    r = run("x = bytearray(10 * 1024**3)", memory_mb=256)
    assert r.status in ("failed", "killed") and "MemoryError" in r.stderr
    assert run("print(len(bytearray(10**6)))", memory_mb=256).stdout == "1000000\n"  # the next one is fine


def test_cpu_time_limit_kills():
    r = run("while True:\n    pass", cpu_seconds=1, timeout=10.0)
    assert r.status == "killed" and "SIGXCPU" in r.detail and r.seconds < 10


def test_home_removal_and_root_files_survive(tmp_path):
    canary = tmp_path / "canary.txt"
    canary.write_text("still here")
    program = ("import os, shutil\n"
               "home = os.path.expanduser('~')\n"
               "print(home)\n"
               "shutil.rmtree(home)\n"
               f"try:\n    os.remove({str(canary)!r})\n    print('removed')\n"
               "except OSError as exc:\n    print(type(exc).__name__)\n")
    r = run(program)
    home, outcome = r.stdout.split()
    assert os.path.basename(home).startswith("groundup-sandbox-") and not os.path.exists(home)
    if not ROOT:
        pytest.skip("not root: the sandbox runs as this user, so it can delete this user's files")
    # With a private /tmp, the canary (under this /tmp) is not even there to try.
    assert outcome == ("FileNotFoundError" if "private-tmp" in LAYERS else "PermissionError")
    assert canary.read_text() == "still here"


def test_file_size_limit():
    program = ("import os\nwith open('big', 'wb') as f:\n    f.write(b'x' * (100 << 20))\n")
    r = run(program, file_size_mb=1, memory_mb=512)
    assert r.status in ("failed", "killed")
    assert "File too large" in r.stderr or "SIGXFSZ" in r.detail


def test_output_is_capped():
    r = run("import sys\nsys.stdout.write('x' * 1_000_000)\nsys.stderr.write('e' * 50_000)", max_output_bytes=1000)
    assert r.passed and r.truncated and r.stdout == "x" * 1000 and r.stderr == "e" * 1000
    r = run("while True:\n    print('spam' * 1000)", max_output_bytes=2000, timeout=2.0)
    assert r.status == "timeout" and r.truncated and len(r.stdout) == 2000


@pytest.fixture
def server():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        yield listener


def _no_connection_arrived(listener) -> bool:
    try:
        listener.accept()[0].close()
        return False
    except BlockingIOError:
        return True


def test_network_is_refused_in_process(server):
    port = server.getsockname()[1]
    r = run(f"import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', {port}))\nprint('connected')")
    assert r.status == "failed" and "network access is disabled in the sandbox (socket.connect)" in r.detail
    assert _no_connection_arrived(server)


@pytest.mark.skipif("network-namespace" not in LAYERS, reason="no network namespace on this machine")
def test_network_namespace_holds_without_the_audit_hook(server):
    port = server.getsockname()[1]
    child = f"import socket; s = socket.socket(); s.settimeout(2); s.connect(('127.0.0.1', {port}))"
    r = run(f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {child!r}], check=True)")
    assert r.status == "failed" and "Network is unreachable" in r.stderr
    assert _no_connection_arrived(server)


def test_temp_dir_removed_after_success():
    r = run("import os\nopen('scratch.txt', 'w').write('x')\nprint(os.getcwd())")
    assert r.passed and not os.path.exists(r.stdout.strip())
    assert os.path.dirname(r.stdout.strip()) == tempfile.gettempdir()


def test_run_many_keeps_input_order():
    sources = [f"import time\ntime.sleep({0.3 if i % 2 == 0 else 0})\nprint({i})" for i in range(6)]
    results = run_many(sources, workers=3, python=PY, timeout=5.0)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]
    assert run_many([], python=PY) == []


HUMANEVAL = {
    "prompt": 'def add(a: int, b: int) -> int:\n    """Return the sum of a and b."""\n',
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
    "entry_point": "add",
}


def test_check_completion_humaneval_and_mbpp():
    item = HUMANEVAL
    good = check_completion(item["prompt"], "    return a + b\n", item["test"], item["entry_point"], python=PY)
    bad = check_completion(item["prompt"], "    return a - b\n", item["test"], item["entry_point"], python=PY)
    assert good.passed and bad.status == "failed" and "AssertionError" in bad.stderr
    tests = "assert square(3) == 9\nassert square(-2) == 4"
    assert check_completion("", "def square(x):\n    return x * x", tests, python=PY).passed
    assert check_completion("", "def square(x):\n    return x + x", tests, python=PY).status == "failed"


@pytest.mark.parametrize("n, c, k", [(10, 0, 1), (10, 3, 1), (10, 3, 5), (20, 5, 10), (200, 13, 100), (5, 4, 2), (5, 5, 5)])
def test_pass_at_k_matches_the_combinatorial_definition(n, c, k):
    expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_pass_at_k_edges():
    assert pass_at_k(10, 0, 3) == 0.0
    assert pass_at_k(5, 4, 2) == 1.0  # n - c < k: every draw of k holds a correct one
    with pytest.raises(ValueError, match="k = 6"):
        pass_at_k(5, 1, 6)


@pytest.mark.parametrize("limits, key", [({"timeout": 0}, "timeout"), ({"memory_mb": -1}, "memory_mb"),
                                         ({"cpu_seconds": 0}, "cpu_seconds"), ({"max_processes": 0}, "max_processes"),
                                         ({"python": "/no/such/python"}, "python")])
def test_bad_limits_raise_config_error(limits, key):
    with pytest.raises(ConfigError, match=key) as info:
        run_program("print(1)", **limits)
    assert info.value.key == key
    with pytest.raises(ConfigError, match="workers"):
        run_many(["print(1)"], workers=0)


def test_isolation_layers():
    always = {"process-group", "rlimit-cpu", "rlimit-memory", "rlimit-file-size", "rlimit-core",
              "network-audit-hook", "temp-home", "clean-env"}
    assert always <= set(LAYERS)
    if ROOT:
        assert "uid-drop" in LAYERS  # this machine has a nobody user
