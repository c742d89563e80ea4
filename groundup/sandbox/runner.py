"""Run code a model wrote without trusting it: HumanEval/MBPP pass@k and GRPO code rewards.

The promise: a program given to `run_program` never runs in our process. It runs as `python` in a
process of its own, in a session of its own, under limits on wall-clock time, CPU time, memory,
file size, processes and captured output, with no network, in a fresh empty directory that is its
HOME and TMPDIR and is removed afterwards, with stdin at /dev/null and a minimal environment. When
it ends, whatever it started is killed: its process group always, and every process left in its
network namespace, which also catches children that escaped the group with setsid(). As root, the
program runs as the unprivileged user `nobody`, so it cannot touch root's files and RLIMIT_NPROC
holds (the kernel exempts root from it).

    from groundup.sandbox import run_program, check_completion, default_python
    run_program("print(1 + 1)").stdout                   # '2\\n'
    run_program(source, python=default_python())         # sys.executable, or a system python3 nobody can run
    check_completion(prompt, completion, test, entry_point="add").status   # 'passed' or 'failed'

Layers (`isolation_layers()` lists those active on this machine):
- process-group: `start_new_session=True`; SIGKILL to the whole group on timeout and at the end.
- rlimit-cpu, rlimit-memory (RLIMIT_AS), rlimit-file-size, rlimit-core (0), rlimit-nproc.
- uid-drop: as root, setgid/setuid to `nobody` in the child before exec. Note: when this machine
  has no `nobody` user the layer is skipped, and with it rlimit-nproc as root; both then drop out
  of `isolation_layers()`. The dropped user must be able to run `python` (a pyenv under a 0700
  /root is not): that is checked once per interpreter and refused with a ConfigError naming
  `python`, never silently run as root.
- network-namespace: unshare(CLONE_NEWNET) in the child (unprivileged: together with
  CLONE_NEWUSER, mapping the user to itself); the namespace has only a downed loopback.
- network-audit-hook: a bootstrap installs `sys.addaudithook` refusing socket connect, bind,
  send and name lookups, then runs the program as `__main__` with a normal traceback. It only
  guards the program's own interpreter (ctypes or a child process get past it); the namespace
  is the layer that holds.
- temp-home: a fresh `tempfile.mkdtemp()` as cwd, HOME and TMPDIR, removed even after a timeout.
- clean-env: PATH, HOME, TMPDIR, LANG, PYTHONDONTWRITEBYTECODE=1, PYTHONHASHSEED=0 and nothing
  else; python runs with `-s -B` and no cwd on sys.path (what `-I` means, minus ignoring the two
  PYTHON* variables we set).

Not promised: the program can read world-readable files and write in world-writable places such
as /tmp (each file capped by RLIMIT_FSIZE); RLIMIT_NPROC counts all of `nobody`'s processes and
threads, so concurrent sandboxes share headroom; a kernel exploit escapes everything here.
"""

from __future__ import annotations

import ctypes
import math
import os
import pwd
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache


from groundup.errors import ConfigError

_CLONE_NEWNET, _CLONE_NEWUSER = 0x40000000, 0x10000000
_ENV_PATH = "/usr/local/bin:/usr/bin:/bin"
_DENIED_EVENTS = ("socket.bind", "socket.connect", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                  "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo")
_SIGNAL_REASONS = {signal.SIGXCPU: "CPU time limit (RLIMIT_CPU)", signal.SIGXFSZ: "file size limit (RLIMIT_FSIZE)",
                   signal.SIGKILL: "out of memory, or killed from outside", signal.SIGSEGV: "crashed (memory limit?)"}

# Runs the program as __main__ from its file (so tracebacks show its lines), with the network guard.
_BOOTSTRAP = f"""\
import sys
def _guard(event, args, _denied=frozenset({_DENIED_EVENTS!r})):
    if event in _denied:
        raise PermissionError("network access is disabled in the sandbox (" + event + ")")
sys.addaudithook(_guard)
if sys.path and sys.path[0] == "":
    del sys.path[0]
def _main(path):
    module = type(sys)("__main__")
    module.__file__ = path
    sys.modules["__main__"] = module
    sys.argv[:] = [path]
    try:
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec")
        exec(code, module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        exc.__traceback__ = exc.__traceback__.tb_next  # from the program's own frame on
        sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.exit(1)
_main(sys.argv[1])
"""


@dataclass(frozen=True)
class SandboxResult:
    status: str  # "passed" (exit 0), "failed" (exit != 0), "timeout", "killed" (a signal or a limit)
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    detail: str = ""  # why: the exception line, the signal or limit, the timeout
    truncated: bool = False  # stdout or stderr went past max_output_bytes and was cut

    @property
    def passed(self) -> bool:
        return self.status == "passed"


try:  # as root, the user the program runs as: (uid, gid) of nobody, or None (no such user: no uid-drop)
    _SANDBOX_USER = (pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("nobody").pw_gid) if os.geteuid() == 0 else None
except KeyError:
    _SANDBOX_USER = None


@lru_cache(maxsize=1)
def _unshare():
    return ctypes.CDLL(None, use_errno=True).unshare


def _enter_network_namespace() -> None:
    """In the child: a network namespace of its own (with a user namespace when not root)."""
    uid, gid = os.getuid(), os.getgid()
    if os.geteuid() == 0:
        if _unshare()(_CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
        return
    if _unshare()(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER|CLONE_NEWNET)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


@lru_cache(maxsize=1)
def _netns_available() -> bool:
    try:
        _unshare()  # resolved here, in the parent: a forked child must not dlopen
        subprocess.run([sys.executable, "-S", "-c", ""], preexec_fn=_enter_network_namespace, check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
    except (OSError, subprocess.SubprocessError, AttributeError):
        return False
    return True


def isolation_layers() -> list[str]:
    """The isolation layers active on this machine, for this user."""
    layers = ["process-group", "rlimit-cpu", "rlimit-memory", "rlimit-file-size", "rlimit-core"]
    if os.geteuid() != 0 or _SANDBOX_USER is not None:
        layers.append("rlimit-nproc")
    if _SANDBOX_USER is not None:
        layers.append("uid-drop")
    if _netns_available():
        layers.append("network-namespace")
    return layers + ["network-audit-hook", "temp-home", "clean-env"]


def _tasks_of(uid: int) -> int:
    """Processes and threads (RLIMIT_NPROC counts both) that `uid` runs now."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                pass  # it ended while we looked
    return count


def _exited(pid: int) -> bool:
    """Whether the child exited, leaving it unreaped so its pid (the group id) stays reserved."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _sweep_namespace(netns: str) -> None:
    """SIGKILL every process left in the sandbox's own network namespace (setsid() escapees)."""
    if not netns or netns == os.readlink("/proc/self/ns/net"):
        return
    for _ in range(10):
        found = 0
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.readlink(f"/proc/{name}/ns/net") != netns:
                    continue
                fd = os.pidfd_open(int(name))
            except OSError:
                continue
            try:  # the pidfd pins the pid: check again, then it cannot be a stranger we signal
                if os.readlink(f"/proc/{name}/ns/net") == netns:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    found += 1
            except OSError:
                pass
            finally:
                os.close(fd)
        if not found:
            return
        time.sleep(0.01)


def _remove_tree(path: str) -> None:
    """Remove the sandbox directory; touch nothing outside it, never follow a link it left."""
    if not os.path.lexists(path):
        return
    if os.geteuid() != 0:  # root needs no permissions; we may: the program can chmod its dirs to 0
        os.chmod(path, 0o700)
        for parent, dirs, _ in os.walk(path):  # top-down: each dir is opened up before it is entered
            for name in dirs:
                if not os.path.islink(os.path.join(parent, name)):
                    os.chmod(os.path.join(parent, name), 0o700)
    shutil.rmtree(path, ignore_errors=True)


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
def _usable_python(python: str) -> str:
    """The interpreter's path, once checked that the sandbox user runs it with its own stdlib."""
    found = shutil.which(python, path=_ENV_PATH) if os.sep not in python else python
    if not found or not os.access(found, os.X_OK):
        raise ConfigError(f"sandbox: python = {python!r} is not an executable interpreter", key="python")
    ask = "import sys; print(sys.version, sys.base_prefix)"
    expected = subprocess.run([found, "-s", "-c", ask], env={"PATH": _ENV_PATH}, capture_output=True, text=True,
                              timeout=60).stdout
    try:
        got = _launch(ask, found, **{**_DEFAULTS, "timeout": 30.0})
        problem = None
        if not got.passed:
            problem = (got.stderr.strip().splitlines() or [got.detail])[-1]
        elif got.stdout != expected:
            problem = f"it finds another standard library ({got.stdout.strip()}, not {expected.strip()})"
    except (OSError, subprocess.SubprocessError) as exc:
        problem = str(exc)
    if problem:
        who = f"the sandbox user nobody (uid {_SANDBOX_USER[0]})" if _SANDBOX_USER else "the sandbox"
        raise ConfigError(f"sandbox: python = {found!r} cannot run under {who}: {problem}. Pass python= an "
                          "interpreter whose installation every user can read (such as /usr/bin/python3), "
                          "or make this one's directories world-readable", key="python")
    return found


_FALLBACK_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


@lru_cache(maxsize=1)
def default_python() -> str:
    """The interpreter programs run with: this one (`sys.executable`) when the sandbox user can run it,
    else the first of /usr/bin/python3, /usr/local/bin/python3 that it can (checked once, cached).
    A virtual environment under a 0700 /root cannot be run by `nobody`; a system python can, and
    HumanEval and MBPP need only the standard library. ConfigError when none works."""
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


def _launch(source: str, python: str, *, timeout, memory_mb, cpu_seconds, file_size_mb, max_processes,
            max_output_bytes) -> SandboxResult:
    cpu = math.ceil(cpu_seconds if cpu_seconds is not None else timeout + 1)
    limits = [(resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, (int(memory_mb * 2**20),) * 2),
              (resource.RLIMIT_FSIZE, (int(file_size_mb * 2**20),) * 2), (resource.RLIMIT_CORE, (0, 0))]
    user = _SANDBOX_USER
    if os.geteuid() != 0 or user is not None:
        running = _tasks_of(user[0] if user else os.getuid())
        limits.append((resource.RLIMIT_NPROC, (running + max_processes,) * 2))
    netns = _netns_available()
    home = tempfile.mkdtemp(prefix="groundup-sandbox-")
    report_r, report_w = os.pipe()  # the child names its network namespace through it

    def child_setup():  # in the forked child, before exec: plain system calls only, nothing to import
        for which, value in limits:
            resource.setrlimit(which, value)
        if netns:
            _enter_network_namespace()
            os.write(report_w, os.readlink("/proc/self/ns/net").encode())
        if user is not None:
            os.setgroups([])
            os.setgid(user[1])
            os.setuid(user[0])

    proc = None
    try:
        path = os.path.join(home, "program.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(source)
        os.chmod(path, 0o644)
        if user is not None:
            os.chown(home, *user)
        env = {"PATH": _ENV_PATH, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
        start = time.monotonic()
        proc = subprocess.Popen([python, "-s", "-B", "-c", _BOOTSTRAP, path], cwd=home, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=child_setup)
        namespace = os.read(report_r, 256).decode() if netns else ""  # written before exec, so there now
        out, err, err_tail, truncated = _collect(proc, start + timeout, max_output_bytes, namespace)
        exited = _wait_exit(proc.pid, start + timeout)
        _kill_group(proc.pid)  # the unreaped leader keeps the group id ours until now
        returncode = proc.wait()
        seconds = time.monotonic() - start
        _sweep_namespace(namespace)
    finally:
        os.close(report_r)
        os.close(report_w)
        if proc is not None:
            if proc.returncode is None:  # an error of ours while it ran
                _kill_group(proc.pid)
                proc.wait()
            proc.stdout.close()  # only now: a write to a closed pipe would end it with status 1, not "timeout"
            proc.stderr.close()
        _remove_tree(home)
    stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    if not exited:
        status, detail = "timeout", f"wall-clock timeout after {timeout:g} s"
    elif returncode == 0:
        status, detail = "passed", ""
    elif returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        status, detail = "killed", f"killed by {name}: {_SIGNAL_REASONS.get(-returncode, 'signal')}"
    else:
        lines = err_tail.decode("utf-8", "replace").strip().splitlines()
        status, detail = "failed", lines[-1] if lines else f"exit status {returncode}"
    return SandboxResult(status, returncode, stdout, stderr, round(seconds, 4), detail, truncated)


def _collect(proc, deadline: float, cap: int, namespace: str):
    """Read both pipes as they fill, keeping the first `cap` bytes of each (and stderr's tail)."""
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    kept = {out_fd: bytearray(), err_fd: bytearray()}
    tail, truncated, exited, grace = b"", False, False, None
    with selectors.DefaultSelector() as sel:
        for fd in kept:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            now = time.monotonic()
            if not exited and _exited(proc.pid):  # leftovers may hold the pipes open: end them
                exited, grace = True, now + 1.0
                _kill_group(proc.pid)
                _sweep_namespace(namespace)
            end = grace if exited else deadline
            if now >= end:
                break
            for key, _ in sel.select(min(end - now, 0.05)):
                try:
                    chunk = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                room = cap - len(kept[key.fd])
                kept[key.fd] += chunk[:max(room, 0)]
                truncated |= len(chunk) > room
                if key.fd == err_fd:
                    tail = (tail + chunk)[-4096:]
    return bytes(kept[out_fd]), bytes(kept[err_fd]), tail, truncated


def _wait_exit(pid: int, deadline: float) -> bool:
    while not _exited(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def run_program(source: str, *, timeout: float = 10.0, memory_mb: int = 1024, cpu_seconds: float | None = None,
                file_size_mb: int = 16, max_processes: int = 16, max_output_bytes: int = 64 * 1024,
                python: str = sys.executable) -> SandboxResult:
    """Run `source` as a Python program in the sandbox; never raises for anything the program does."""
    _check_limits(timeout, memory_mb, cpu_seconds, file_size_mb, max_processes, max_output_bytes)
    return _launch(source, _usable_python(python), timeout=timeout, memory_mb=memory_mb, cpu_seconds=cpu_seconds,
                   file_size_mb=file_size_mb, max_processes=max_processes, max_output_bytes=max_output_bytes)


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
