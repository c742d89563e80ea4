"""What keeps sandboxed programs apart from us and from each other: namespaces, users, sweeps.

Two ways, chosen once per machine by the runner's probe:
- namespaces: the bootstrap (in the launcher, after exec) unshares PID, mount, IPC and network
  namespaces (and a user namespace when not root, mapping the user to itself), then, still
  privileged, makes every mount private, puts a fresh tmpfs on /tmp, /var/tmp, /dev/shm and
  the temp folder the homes live in, makes the program's home at the same path in it (0700, its
  own) with a copy of program.py, and forks the init:
  PID 1 of the new namespace, which mounts a /proc of that namespace only, forks the program,
  reaps what it leaves and reports its exact wait status on a pipe. When the program ends, the init
  exits and the kernel kills everything left in the namespace. The program drops to its own user
  (root: a uid of its own from a reserved range) or its capabilities (not root), and no_new_privs.
- no namespaces: as root, the launcher switches to the program's own uid before exec; every
  process of that uid is killed when it ends (and before it starts: leftovers of a crashed parent).
  Without that uid (`nobody`, or not root), a network namespace of its own, swept when it ends.

Why not bubblewrap: it is a system package a pip user may not have; as root its --uid needs a user
namespace whose uid maps to root outside (the program would own root's files) or one an
unprivileged user may create; it reports a program killed by signal N as exit code 128 + N (a
SIGXCPU looks like sys.exit(152)); and it is one more exec per program. The same kernel calls here
cost no exec, give the exact wait status, and fall back as described when the kernel refuses them.

The program's uid as root is UID_BASE + the launcher's pid: distinct for every program that runs at
the same time on this machine (a pid is not reused while its process is unreaped, and the runner
reaps the launcher only after the sweep), with no lock and no state. The range is used only when no
user in /etc/passwd (or NSS) has a uid in it and this machine maps it (a container's uid_map may not).
"""

from __future__ import annotations

import ctypes
import os
import pwd
import signal
import time
from functools import lru_cache

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
UID_BASE = 2_000_000_000
_UID_SPAN = 100_000_000  # above any pid_max (at most 4,194,304)


@lru_cache(maxsize=1)
def _libc():
    return ctypes.CDLL(None, use_errno=True)


def resolve_libc() -> None:
    """Look up the C functions here, in the parent: a forked child must not dlopen."""
    for name in ("unshare", "prctl"):
        getattr(_libc(), name)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def enter_namespaces(flags: int) -> None:
    """In the launcher, before exec (the network namespace when the others are refused): new
    namespaces, with a user namespace when not root, the user mapped to itself."""
    uid, gid = os.getuid(), os.getgid()
    userns = os.geteuid() != 0
    _check(_libc().unshare(flags | (CLONE_NEWUSER if userns else 0)), "unshare")
    if userns:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)


def die_with_parent() -> None:
    """SIGKILL this process when the thread that started it ends (the runner, if it is itself killed)."""
    _check(_libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def no_new_privs() -> None:
    """No exec from here on gains privileges (setuid binaries, file capabilities)."""
    _check(_libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


@lru_cache(maxsize=1)
def uid_range_free() -> bool:
    """Whether no known user has a uid in [UID_BASE, UID_BASE + span) and this machine maps the range."""
    if any(UID_BASE <= user.pw_uid < UID_BASE + _UID_SPAN for user in pwd.getpwall()):
        return False
    try:
        with open("/proc/self/uid_map") as f:
            ranges = [tuple(map(int, line.split())) for line in f if line.strip()]
    except OSError:
        return False
    return any(inside <= UID_BASE and UID_BASE + _UID_SPAN <= inside + count for inside, _, count in ranges)


def program_uid(launcher_pid: int) -> int:
    return UID_BASE + launcher_pid


def nobody() -> tuple[int, int] | None:
    try:
        user = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return user.pw_uid, user.pw_gid


def tasks_of(uid: int) -> int:
    """Processes and threads (RLIMIT_NPROC counts both) that `uid` runs now."""
    count = 0
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{name}").st_uid == uid:
                count += len(os.listdir(f"/proc/{name}/task"))
        except OSError:
            pass  # it ended while we looked
    return count


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _sweep(belongs) -> None:
    """SIGKILL every process for which belongs(pid) holds, until none is left (at most 10 rounds)."""
    for _ in range(10):
        found = 0
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                if not belongs(name):
                    continue
                fd = os.pidfd_open(int(name))
            except OSError:
                continue
            try:  # the pidfd pins the pid: check again, then it cannot be a stranger we signal
                if belongs(name):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    found += 1
            except OSError:
                pass
            finally:
                os.close(fd)
        if not found:
            return
        time.sleep(0.01)


def pin_network_namespace(pid: int, netns: str) -> int | None:
    """An fd that keeps the launcher's network namespace alive, so that its name (an inode number the
    kernel hands out again as soon as it is freed) names no other sandbox's while we sweep by it.
    None if the launcher has already exited: then the name may be stale, and we do not sweep by it."""
    try:
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    if os.readlink(f"/proc/self/fd/{fd}") != netns:
        os.close(fd)
        return None
    return fd


def sweep_network_namespace(netns: str) -> None:
    """SIGKILL every process left in the sandbox's own network namespace (setsid() escapees); only
    while pin_network_namespace holds it."""
    if netns and netns != os.readlink("/proc/self/ns/net"):
        _sweep(lambda name: os.readlink(f"/proc/{name}/ns/net") == netns)


def sweep_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (a program's own uid: nothing else runs as it)."""
    if uid >= UID_BASE:
        _sweep(lambda name: os.stat(f"/proc/{name}").st_uid == uid)


# The bootstrap's part (it runs in the launcher, after exec, still privileged; see the docstring).
# Defines _isolate(path, spec); spec is "uid,gid,userns,status_fd,tmp_kb", uid "+N" meaning N + pid.
ISOLATE_SOURCE = f"""\
def _isolate(path, spec):
    import ctypes, os
    uid, gid, userns, status_fd, tmp_kb = spec.split(",")
    if uid.startswith("+"):
        uid = gid = int(uid) + os.getpid()
    uid, gid, userns, status_fd = int(uid), int(gid), userns == "1", int(status_fd)
    libc = ctypes.CDLL(None, use_errno=True)
    def call(result, what):
        if result != 0:
            raise OSError(ctypes.get_errno(), what + ": " + os.strerror(ctypes.get_errno()))
    def mount(source, target, fstype, flags, data=None):
        enc = lambda s: None if s is None else os.fsencode(s)
        call(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), "mount " + target)
    def report(text):
        os.write(status_fd, text.encode()[:2000] + b"\\n")
    def quiet():
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
    home = os.path.dirname(path)
    try:
        with open(path, "rb") as f:
            source = f.read()
        # Here, after exec, not before: an exec inside a user namespace would drop the capabilities.
        real_uid, real_gid = os.getuid(), os.getgid()
        flags = {CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET} | ({CLONE_NEWUSER} if userns else 0)
        call(libc.unshare(flags), "unshare")
        if userns:  # the user mapped to itself; full capabilities in the new namespace, until dropped below
            for name, text in (("setgroups", "deny"), ("uid_map", f"{{real_uid}} {{real_uid}} 1"),
                               ("gid_map", f"{{real_gid}} {{real_gid}} 1")):
                with open("/proc/self/" + name, "w") as f:
                    f.write(text)
        mount(None, "/", None, {1 << 14 | 1 << 18})  # MS_REC | MS_PRIVATE: nothing propagates out
        for target in dict.fromkeys(("/tmp", "/var/tmp", "/dev/shm", os.path.dirname(home))):
            if target != "/" and (os.path.isdir(target) or target == os.path.dirname(home)):
                os.makedirs(target, exist_ok=True)
                mount("tmpfs", target, "tmpfs", {2 | 4}, "mode=1777,size=" + tmp_kb + "k")  # nosuid, nodev
        os.mkdir(home, 0o700)  # the same path, now in the fresh tmpfs: its own, gone with the namespace
        with open(path, "wb") as f:
            f.write(source)
        if uid >= 0 and not userns:
            os.chown(home, uid, gid)
        os.chdir(home)
        init = os.fork()
    except OSError as exc:
        report("error " + str(exc))
        os._exit(127)
    if init:  # the launcher, outside the namespace: ends as the init does
        quiet()
        os.close(status_fd)
        status = os.waitpid(init, 0)[1]
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
    try:  # PID 1 of the new namespace
        call(libc.prctl({PR_SET_PDEATHSIG}, 9, 0, 0, 0), "prctl")
        mount("proc", "/proc", "proc", {2 | 4 | 8})  # nosuid, nodev, noexec
        program = os.fork()
    except OSError as exc:
        report("error " + str(exc))
        os._exit(127)
    if program:
        quiet()
        while True:  # reap whatever is orphaned to us, until the program itself has ended
            pid, status = os.wait()
            if pid == program:
                report("status " + str(status))
                os._exit(0)  # and the kernel kills everything left in the namespace
    try:  # the program: a session of its own (its init's group dies on timeout), its own user, no privileges
        os.setsid()
        if userns:
            class Header(ctypes.Structure):
                _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
            call(libc.capset(ctypes.byref(Header(0x20080522, 0)), (ctypes.c_uint32 * 6)()), "capset")
        elif uid >= 0:  # -1: root, with no user to drop to (no such layer then)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        call(libc.prctl({PR_SET_NO_NEW_PRIVS}, 1, 0, 0, 0), "prctl")
    except OSError as exc:
        report("error " + str(exc))
        os._exit(127)
    os.close(status_fd)  # the program cannot forge its own status
"""
