"""Sandboxed programs cannot attack each other (issue 28): three attacks run beside honest programs.

Each attack runs through `run_many`, as `eval` pass@k and the GRPO `code` reward run programs, with
the honest programs started beside (and after) the attacker, which polls until it finds them.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import uuid

import pytest

from groundup.sandbox import default_python, isolation_layers, run_many, run_program, runner

ROOT = os.geteuid() == 0
LAYERS = isolation_layers()
PY = default_python()


def _kernel_allows(*options: str) -> bool:
    """Whether this machine lets us create these namespaces, asked of util-linux, not of the sandbox."""
    try:
        return subprocess.run(["unshare", *options, "--fork", "--mount-proc", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


NAMESPACES = _kernel_allows(*([] if ROOT else ["--user", "--map-root-user"]), "--pid", "--mount", "--ipc", "--net")


def _uids_usable() -> bool:
    """As root: no user has a uid in the reserved range, and this machine maps it (setuid works)."""
    if any(2_000_000_000 <= user.pw_uid < 2_100_000_000 for user in pwd.getpwall()):
        return False
    try:
        return subprocess.run(["true"], user=2_099_999_999, group=2_099_999_999, extra_groups=[]).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


UID_PER_PROGRAM = ROOT and _uids_usable()
needs_pid_namespace = pytest.mark.skipif(not NAMESPACES, reason="this machine allows no PID namespace")


@pytest.fixture(params=["namespaces", "uid-per-program alone"])
def separation(request, monkeypatch):
    """Each attack runs against both ways of keeping programs apart that this machine has: namespaces,
    and (as root) a uid of its own per program, as on a machine where namespaces are refused."""
    if request.param == "namespaces" and not NAMESPACES:
        pytest.skip("this machine allows no namespaces")
    if request.param != "namespaces":
        if not UID_PER_PROGRAM:
            pytest.skip("not root, or the reserved uid range is in use: no uid per program")
        monkeypatch.setattr(runner, "_namespaces_work", lambda python: False)
    return request.param

# Rewrites every other sandbox's program.py it can find to `print('ok')`, for 4 s.
REWRITER = """\
import glob, os, time
mine, found, rewritten = os.getcwd(), set(), set()
patterns = ['/tmp/groundup-sandbox-*/program.py', os.path.dirname(mine) + '/groundup-sandbox-*/program.py']
end = time.monotonic() + 4.0
while time.monotonic() < end:
    paths = [p for pattern in patterns for p in glob.glob(pattern)]
    paths += [f'/proc/{pid}/cwd/program.py' for pid in os.listdir('/proc') if pid.isdigit()]
    for path in paths:
        try:
            if os.path.samefile(os.path.dirname(path), mine) or not os.path.exists(path):
                continue
            key = os.stat(path).st_ino
            found.add(key)
            if key in rewritten:
                continue
            try:
                with open(path, 'w') as f:
                    f.write("print('ok')\\n")
            except PermissionError:  # a file it cannot write, in a folder it can: replace it
                with open(path + '.new', 'w') as f:
                    f.write("print('ok')\\n")
                os.replace(path + '.new', path)
            rewritten.add(os.stat(path).st_ino)
        except OSError:
            pass
    time.sleep(0.002)
print('found', len(found), 'rewritten', len(rewritten))
"""

FAILING = "import time\ntime.sleep(0.5)\nassert 1 == 2, 'honest failure'\n"


def test_a_program_cannot_rewrite_its_neighbours_programs(separation):
    results = run_many([REWRITER] + [FAILING] * 8, workers=3, python=PY, timeout=10.0)
    attacker, honest = results[0], results[1:]
    assert [(r.status, r.detail) for r in honest] == [("failed", "AssertionError: honest failure")] * 8
    assert attacker.passed, attacker.stderr
    assert attacker.stdout == "found 0 rewritten 0\n"


SLEEPER = "import time\ntime.sleep(2.0)\nprint('done')\n"

KILL_ALL = """\
import os, signal, time
time.sleep(0.7)
try:
    os.kill(-1, signal.SIGKILL)
    print('kill(-1) sent')
except OSError as exc:
    print('kill(-1) refused:', exc.strerror)
"""


def test_kill_minus_one_does_not_reach_a_neighbour(separation):
    results = run_many([SLEEPER, KILL_ALL, SLEEPER], workers=3, python=PY, timeout=10.0)
    assert results[1].passed, results[1].stderr
    assert [(r.status, r.stdout) for r in (results[0], results[2])] == [("passed", "done\n")] * 2


# Lists /proc and tries everything on each pid that is not its own: signal it, read its cwd, its
# environment and memory, attach with ptrace. Prints what it saw and what worked.
PROBER = """\
import ctypes, json, os, signal, time
time.sleep(0.7)
libc = ctypes.CDLL(None, use_errno=True)
me = os.getpid()
seen = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
def attach(pid):
    if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), 'ptrace')
    libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
attempts = {
    'cwd': lambda pid: os.listdir(f'/proc/{pid}/cwd'),
    'environ': lambda pid: open(f'/proc/{pid}/environ', 'rb').read(),
    'mem': lambda pid: open(f'/proc/{pid}/mem', 'rb').close(),
    'ptrace': attach,
    'signal': lambda pid: os.kill(pid, signal.SIGKILL),
}
worked = []
for pid in seen:
    for what, attempt in attempts.items():
        if pid != me:
            try:
                attempt(pid)
                worked.append([pid, what])
            except OSError:
                pass
print(json.dumps({'me': me, 'seen': seen, 'worked': worked}))
"""


def test_a_program_cannot_see_signal_or_trace_its_neighbours(separation):
    results = run_many([SLEEPER, PROBER, SLEEPER], workers=3, python=PY, timeout=10.0)
    probe = results[1]
    assert probe.passed, probe.stderr
    report = json.loads(probe.stdout)
    # pid 1 is the program's own init in a PID namespace (a root process, or one with capabilities
    # the program lacks): a signal to it is dropped, but nothing may read it or trace it.
    assert [w for w in report["worked"] if w != [1, "signal"]] == [], report
    if separation == "namespaces":
        assert report["seen"] == [1, report["me"]], report
    assert [(r.status, r.stdout) for r in (results[0], results[2])] == [("passed", "done\n")] * 2


@needs_pid_namespace
def test_a_program_sees_only_its_own_processes_and_an_empty_tmp():
    marker = f"groundup-left-behind-{uuid.uuid4().hex}"
    program = ("import os\n"
               "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), os.getpid())\n"
               "home = os.getcwd()\n"
               "print(sorted(os.listdir(os.path.dirname(home))) == [os.path.basename(home)])\n"
               "others = [d for d in ('/tmp', '/var/tmp', '/dev/shm') if d != os.path.dirname(home)]\n"
               "print([sorted(os.listdir(d)) for d in others])\n"
               f"for d in ('/tmp', '/var/tmp', '/dev/shm'):\n    open(os.path.join(d, {marker!r}), 'w').write('x')\n")
    left = [os.path.join(d, marker) for d in ("/tmp", "/var/tmp", "/dev/shm")]
    try:
        for _ in range(2):  # the second run does not see what the first left
            r = run_program(program, python=PY)
            assert r.passed, r.stderr
            pids, alone, others = r.stdout.splitlines()
            assert pids == "[1, 2] 2" and alone == "True" and others in ("[[], []]", "[[], [], []]"), r.stdout
        assert [path for path in left if os.path.exists(path)] == []
    finally:  # never leave them on the machine, whatever failed
        for path in left:
            if os.path.exists(path):
                os.remove(path)


@pytest.mark.skipif(not UID_PER_PROGRAM, reason="not root, or the reserved uid range is in use")
def test_concurrent_programs_run_as_distinct_unprivileged_users():
    program = "import os, time\ntime.sleep(0.5)\nprint(os.getuid(), os.getgid(), os.getgroups())"
    ids = [r.stdout.split() for r in run_many([program] * 4, workers=4, python=PY)]
    uids = [int(uid) for uid, _, _ in ids]
    assert len(set(uids)) == 4 and all(2_000_000_000 <= uid < 2_100_000_000 for uid in uids), ids
    assert all(int(gid) == int(uid) and groups == "[]" for uid, gid, groups in ids)


def test_isolation_layers_name_what_holds_here():
    namespace_layers = {"pid-namespace", "mount-namespace", "private-tmp", "ipc-namespace"}
    assert namespace_layers <= set(LAYERS) if NAMESPACES else not namespace_layers & set(LAYERS)
    assert ("uid-per-program" in LAYERS) == UID_PER_PROGRAM
    assert "no-new-privs" in LAYERS
    if ROOT:
        assert "uid-drop" in LAYERS
