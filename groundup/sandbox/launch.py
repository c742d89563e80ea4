"""Start one program in the sandbox and collect what it did: the mechanics behind runner.py.

launch() writes the program into a fresh home, starts the bootstrap under the limits (in namespaces
of its own, or as its own uid, per isolation.py), reads its output as it comes with a cap, kills
what it leaves and removes the home; SandboxResult says how it ended and why.
"""

from __future__ import annotations

import math
import os
import resource
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache

from groundup.sandbox import isolation
from groundup.sandbox.isolation import ISOLATE_SOURCE, kill_group

ENV_PATH = "/usr/local/bin:/usr/bin:/bin"
_DENIED_EVENTS = ("socket.bind", "socket.connect", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                  "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo")
_SIGNAL_REASONS = {signal.SIGXCPU: "CPU time limit (RLIMIT_CPU)", signal.SIGXFSZ: "file size limit (RLIMIT_FSIZE)",
                   signal.SIGKILL: "out of memory, or killed from outside", signal.SIGSEGV: "crashed (memory limit?)"}

# Runs the program as __main__ from its file (so tracebacks show its lines), with the network guard;
# with namespaces, _isolate (isolation.py) first sets them up and returns only in the program's process.
_BOOTSTRAP = f"""\
import sys
def _guard(event, args, _denied=frozenset({_DENIED_EVENTS!r})):
    if event in _denied:
        raise PermissionError("network access is disabled in the sandbox (" + event + ")")
sys.addaudithook(_guard)
if sys.path and sys.path[0] == "":
    del sys.path[0]
{ISOLATE_SOURCE}def _main(path):
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
if sys.argv[2]:
    _isolate(sys.argv[1], sys.argv[2])
del _isolate
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

ROOT = os.geteuid() == 0


@lru_cache(maxsize=1)
def program_user() -> tuple[str, int, int] | None:
    """As root, who the program runs as: ("own", -, -) a uid of its own, ("fixed", uid, gid) nobody,
    or None (not root, or root with no user to drop to)."""
    if not ROOT:
        return None
    if isolation.uid_range_free():
        return ("own", 0, 0)
    fixed = isolation.nobody()
    return ("fixed", *fixed) if fixed else None


@lru_cache(maxsize=1)
def netns_available() -> bool:
    try:
        isolation.resolve_libc()
        subprocess.run([sys.executable, "-S", "-c", ""], preexec_fn=lambda: isolation.enter_namespaces(
            isolation.CLONE_NEWNET), check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, timeout=30)
    except (OSError, subprocess.SubprocessError, AttributeError):
        return False
    return True


def _exited(pid: int) -> bool:
    """Whether the child exited, leaving it unreaped so its pid (the group id) stays reserved."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _remove_tree(path: str) -> None:
    """Remove the sandbox directory; touch nothing outside it, never follow a link it left."""
    if not os.path.lexists(path):
        return
    if not ROOT:  # root needs no permissions; we may: the program can chmod its dirs to 0
        os.chmod(path, 0o700)
        for parent, dirs, _ in os.walk(path):  # top-down: each dir is opened up before it is entered
            for name in dirs:
                if not os.path.islink(os.path.join(parent, name)):
                    os.chmod(os.path.join(parent, name), 0o700)
    shutil.rmtree(path, ignore_errors=True)


def _drop_to(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def launch(source: str, python: str, *, namespaces: bool, timeout, memory_mb, cpu_seconds,
           file_size_mb, max_processes, max_output_bytes) -> SandboxResult:
    isolation.resolve_libc()  # the forked child only calls what is looked up here
    cpu = math.ceil(cpu_seconds if cpu_seconds is not None else timeout + 1)
    limits = [(resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, (int(memory_mb * 2**20),) * 2),
              (resource.RLIMIT_FSIZE, (int(file_size_mb * 2**20),) * 2), (resource.RLIMIT_CORE, (0, 0))]
    user = program_user()
    own_uid = user is not None and user[0] == "own"
    if not ROOT:  # the launcher and the init (namespaces) count as this user's too
        nproc = isolation.tasks_of(os.getuid()) + max_processes + (2 if namespaces else 0)
        limits.append((resource.RLIMIT_NPROC, (nproc,) * 2))
    elif user is not None:  # root's launcher and init are exempt; a uid of its own runs nothing yet
        limits.append((resource.RLIMIT_NPROC, ((0 if own_uid else isolation.tasks_of(user[1])) + max_processes,) * 2))
    netns = not namespaces and netns_available()
    home = tempfile.mkdtemp(prefix="groundup-sandbox-")
    report_r, report_w = os.pipe()  # without namespaces the child names its network namespace; with them
    status_fds = [report_w] if namespaces else []  # the init reports the program's wait status, or an error

    def child_setup():  # in the forked child, before exec: plain system calls only, nothing to import
        for which, value in limits:
            resource.setrlimit(which, value)
        if namespaces:  # the rest happens in the bootstrap (isolation.ISOLATE_SOURCE)
            isolation.die_with_parent()
            return
        uid, gid = (isolation.program_uid(os.getpid()),) * 2 if own_uid else (user[1:] if user else (-1, -1))
        if uid >= 0:
            os.chown(home, uid, gid)
        if netns:
            isolation.enter_namespaces(isolation.CLONE_NEWNET)
            os.write(report_w, os.readlink("/proc/self/ns/net").encode())
        if own_uid:
            isolation.sweep_uid(uid)  # leftovers of a parent that crashed with this pid
        if uid >= 0:
            _drop_to(uid, gid)
        isolation.die_with_parent()  # after the uid change, which clears it
        isolation.no_new_privs()

    if namespaces:
        uid_spec = f"+{isolation.UID_BASE},0" if own_uid else (f"{user[1]},{user[2]}" if user else "-1,-1")
        tmp_mb = min(memory_mb, 4 * file_size_mb) or 1  # each fresh tmpfs (0 would mean no limit)
        spec = f"{uid_spec},{int(not ROOT)},{report_w},{tmp_mb * 1024}"
    else:
        spec = ""
    proc, pin = None, None
    try:
        path = os.path.join(home, "program.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(source)
        os.chmod(path, 0o644)
        env = {"PATH": ENV_PATH, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
        start = time.monotonic()
        proc = subprocess.Popen([python, "-s", "-B", "-c", _BOOTSTRAP, path, spec], cwd=home, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=child_setup, pass_fds=status_fds)
        os.close(report_w)
        report_w = -1
        namespace = os.read(report_r, 256).decode() if netns else ""  # written before exec, so there now
        uid = isolation.program_uid(proc.pid) if own_uid and not namespaces else -1
        if namespace and uid < 0:  # a uid of its own catches every escapee; else its network namespace
            pin = isolation.pin_network_namespace(proc.pid, namespace)
            namespace = namespace if pin is not None else ""

        def sweep():  # what is left when the program has ended; before the launcher is reaped
            kill_group(proc.pid)  # the unreaped leader keeps the group id ours until now
            if uid >= 0:
                isolation.sweep_uid(uid)
            elif namespace:
                isolation.sweep_network_namespace(namespace)

        out, err, err_tail, truncated = _collect(proc, start + timeout, max_output_bytes, sweep)
        exited = _wait_exit(proc.pid, start + timeout)
        sweep()
        returncode = proc.wait()
        seconds = time.monotonic() - start
        if namespaces:
            returncode, problem = _init_report(report_r, returncode)
            if problem:
                raise OSError(f"sandbox: could not isolate the program: {problem}")
    finally:
        for fd in (report_r, report_w, -1 if pin is None else pin):
            if fd >= 0:
                os.close(fd)
        if proc is not None:
            if proc.returncode is None:  # an error of ours while it ran
                kill_group(proc.pid)
                proc.wait()
            proc.stdout.close()  # only now: a write to a closed pipe would end it with status 1, not "timeout"
            proc.stderr.close()
        _remove_tree(home)
    stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    if not exited:
        status, detail = "timeout", f"wall-clock timeout after {timeout:g} s"
    elif returncode is None:
        status, detail = "killed", "the sandbox's init ended without the program's status"
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


def _init_report(fd: int, launcher_returncode: int) -> tuple[int | None, str]:
    """The program's exit code as its init reported it, and any error of the setup. Killed from outside
    (a timeout), the launcher's own code; ended without a report, None."""
    os.set_blocking(fd, False)
    try:
        lines = os.read(fd, 4096).decode("utf-8", "replace").splitlines()
    except BlockingIOError:  # the init was killed and has not quite gone
        lines = []
    errors = [line[6:] for line in lines if line.startswith("error ")]
    statuses = [int(line[7:]) for line in lines if line.startswith("status ")]
    if errors:
        return launcher_returncode, errors[0]
    if statuses:
        return os.waitstatus_to_exitcode(statuses[0]), ""
    return (launcher_returncode if launcher_returncode < 0 else None), ""


def _collect(proc, deadline: float, cap: int, sweep):
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
                sweep()
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
    """Wait until the child exits (unreaped) or the deadline passes; woken by its pidfd, not a poll."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # reaped already, or a kernel before 5.3: poll
        pidfd = None
    try:
        while not _exited(pid):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if pidfd is None:
                time.sleep(min(left, 0.01))
            else:
                select.select([pidfd], [], [], left)
        return True
    finally:
        if pidfd is not None:
            os.close(pidfd)
