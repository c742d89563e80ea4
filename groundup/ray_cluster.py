"""Running data tasks on Ray: connecting to a cluster, running a stage's tasks, reporting failures.

`data curate` and `data tokenize` with `--executor ray` (data/ray_curate.py, data/ray_dedup.py,
tokens/ray_tokenize.py) use Ray's own scheduler, as datatrove's RayPipelineExecutor does: one Ray
task per unit of work, placed wherever the cluster has a free CPU. What this module adds is the
part a long data job needs around it:

- `ray_session(address)`: None starts a Ray instance on this machine for the run (and stops it
  after); "auto", "HOST:PORT" or "ray://HOST:PORT" connect to a running cluster. An address where
  nothing answers is one line at once (Ray itself retries for minutes); an already connected
  process (a library caller, a notebook) is used as it is and left connected.
- `run_tasks(fn, calls, what)`: every call as one task. A task whose worker dies (killed, out of
  memory, its node lost) is retried by Ray up to `MAX_RETRIES` times; a task that raises is not
  (the same input would raise again). Every other task runs to its end, so its completion marker
  is written, and then one DataError names each failed task, so that relaunching the same command
  redoes exactly those.

Every machine must see the inputs and the output directory at the same paths (a shared
filesystem), as with datatrove on Slurm: tasks read and write files there, not through Ray.
`require_shared(dir)` is the check each task makes first. Ray is an optional dependency
(`pip install 'groundup[ray]'`); without it `--executor ray` stops with that line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import socket
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from groundup.errors import DataError
from groundup.io import read_json

INSTALL_HINT = "pip install 'groundup[ray]'"
MAX_RETRIES = 3  # Ray's default for tasks whose worker died
DEFAULT_GCS_PORT = 6379
DEFAULT_CLIENT_PORT = 10001
PROBE_TIMEOUT_S = 5.0
# Tests make one task fail once: "STAGE:INDEX:raise" (the task raises) or "STAGE:INDEX:exit" (its
# worker process dies, as if killed). Read by the driver and handed to tasks as an argument.
FAULT_ENV = "GROUNDUP_RAY_FAULT"
_remote_cache: dict[Callable, Any] = {}


def import_ray():
    try:
        import ray
    except ImportError:
        raise DataError(f"--executor ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def _host_port(address: str) -> tuple[str, int]:
    """The TCP endpoint behind an address: HOST:PORT, ray://HOST[:PORT] (Ray Client), HOST."""
    client = address.startswith("ray://")
    rest = address.removeprefix("ray://").rstrip("/")
    host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    host = host.strip("[]")
    if not host:
        raise DataError(f"--address {address}: expected auto, HOST:PORT or ray://HOST:PORT")
    if not port:
        return host, DEFAULT_CLIENT_PORT if client else DEFAULT_GCS_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise DataError(f"--address {address}: port {port!r} is not a number from 1 to 65535")
    return host, int(port)


def _auto_address() -> str | None:
    """What `--address auto` means to Ray (RAY_ADDRESS, or the cluster `ray start` began on this
    machine), to probe before connecting; None where this Ray version does not say."""
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:  # a private helper: without it, Ray's own error is all there is
        return None
    try:
        found = canonicalize_bootstrap_address("auto")
    except (ConnectionError, ValueError) as e:
        raise DataError(f"--address auto: no running Ray cluster found on this machine ({e}); start one with "
                        "`ray start --head`, or name its address") from None
    if not found:
        raise DataError("--address auto: no running Ray cluster found on this machine; start one with "
                        "`ray start --head`, or name its address")
    return found


def check_reachable(address: str, where: str | None = None) -> None:
    """One line at once when nothing listens at the address (Ray would retry for minutes)."""
    host, port = _host_port(where or address)
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise DataError(f"--address {address}: no Ray cluster answers at {host}:{port} ({reason}); start one there "
                        f"with `ray start --head --port={port}`, or give the address `ray start` printed") from None


def _connect_error(address: str | None, error: Exception) -> DataError:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    reason = next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else type(error).__name__)
    chain, cause = [], error  # Ray's ConnectionError wraps the reason (an AuthenticationError) in its causes
    while cause is not None and len(chain) < 8:
        chain.append(f"{type(cause).__name__}: {cause}")
        cause = cause.__cause__ or cause.__context__
    hint = ""
    if "auth" in " ".join(chain).lower():
        hint = ("; the cluster uses token authentication: set RAY_AUTH_MODE=token here, with its token in "
                "RAY_AUTH_TOKEN or ~/.ray/auth_token")
    return DataError(f"--address {address or '(local)'}: cannot connect to the Ray cluster: {reason[:400]}{hint}")


@contextlib.contextmanager
def ray_session(address: str | None) -> Iterator[Any]:
    """Ray, connected to the cluster at `address` for the block (None: a new instance on this machine)."""
    ray = import_ray()
    if ray.is_initialized():  # the caller connected already: use that cluster and leave it connected
        yield ray
        return
    if address == "auto":
        found = _auto_address()
        if found:
            check_reachable(address, found)
    elif address not in (None, "local"):
        check_reachable(address)
    try:
        if address in (None, "local"):
            ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING)
        else:
            ray.init(address=address, logging_level=logging.WARNING)
    except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError, its own types
        raise _connect_error(address, e) from None
    try:
        yield ray
    finally:
        ray.shutdown()


def require_shared(directory: str | Path) -> None:
    """In a task: DataError when this machine does not see `directory` (made by the driver)."""
    if not Path(directory).is_dir():
        raise DataError(f"{directory}: not found on node {platform.node()}: every machine of the Ray cluster must "
                        "see the inputs and --out at the same paths (a shared filesystem)")


def remove_temporaries(directory: Path, names: str = "*") -> None:
    """Half-written files (io.atomic_open's temporaries) of the files matching `names`, left by an
    attempt whose worker was killed. Only a task's own files: others may be writing beside them."""
    for path in Path(directory).glob(f".{names}.tmp-*"):
        path.unlink(missing_ok=True)


def start_task(files, directory: Path, done_file: str) -> dict | None:
    """In a task: its marker when an earlier attempt finished it (its result was lost with its worker);
    else None, once this machine sees the inputs and `directory` is ready and free of half-written files."""
    done = directory / done_file
    if done.exists():
        return read_json(done, expect=dict)
    require_shared(directory.parent)
    for file in files:
        if not file.path.exists():
            raise DataError(f"{file.path}: not found on node {platform.node()}: every machine of the Ray cluster "
                            "must see the inputs at the same paths (a shared filesystem)")
    directory.mkdir(exist_ok=True)
    remove_temporaries(directory)
    return None


def finished_task(directory: Path, done_file: str, task, remedy: str) -> dict | None:
    """On the driver: a task's completion marker from an earlier run, or None. A marker whose task
    read other files than `task` does now is refused (`remedy` says what to do): its outputs belong
    to another plan."""
    path = directory / done_file
    if not path.exists():
        return None
    marker = read_json(path, expect=dict)
    if marker.get("files") != [str(f.path) for f in task.files]:
        raise DataError(f"{path}: this completed task read other files than task {task.name} of this run "
                        f"({task.describe()}); {remedy}")
    return marker


def fault_spec() -> str | None:
    spec = os.environ.get(FAULT_ENV) or None
    if spec is not None:
        parts = spec.split(":")
        if len(parts) != 3 or not parts[1].isdigit() or parts[2] not in ("raise", "exit"):
            raise DataError(f"{FAULT_ENV}={spec!r}: expected STAGE:INDEX:raise or STAGE:INDEX:exit")
    return spec


def maybe_fault(spec: str | None, stage: str, index: int, directory: Path) -> None:
    """The fault `spec` names, once (a marker file in `directory` remembers that it fired)."""
    if not spec:
        return
    name, number, kind = spec.split(":")
    fired = Path(directory) / f".fault-{name}-{int(number):05d}"
    if name != stage or int(number) != index or fired.exists():
        return
    fired.write_text(kind)
    if kind == "exit":
        os._exit(1)  # no cleanup, no exception: what a killed worker looks like to Ray
    raise RuntimeError(f"injected fault in {stage} task {index}")


def _reason(ray, error: Exception) -> str:
    cause = getattr(error, "cause", None) if isinstance(error, ray.exceptions.RayTaskError) else None
    if isinstance(cause, DataError):
        return str(cause)
    if cause is not None:
        return f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0].strip() if lines else ''}"


def run_tasks(fn: Callable, calls: Sequence[tuple[str, tuple]], what: str, progress: bool = False) -> list:
    """`fn(*args)` for each (name, args) of `calls` as one Ray task each; the results in call order.

    Raises DataError after every task has ended when any failed, naming each with its reason."""
    from tqdm import tqdm

    ray = import_ray()
    if not calls:
        return []
    if fn not in _remote_cache:
        _remote_cache[fn] = ray.remote(fn)
    remote = _remote_cache[fn].options(max_retries=MAX_RETRIES, retry_exceptions=False)  # read now: tests set 0
    refs = {remote.remote(*args): i for i, (_, args) in enumerate(calls)}
    results: list = [None] * len(calls)
    failures: list[str] = []
    pending = list(refs)
    with tqdm(total=len(calls), desc=what, unit=" tasks", disable=not progress) as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                i = refs[ref]
                try:
                    results[i] = ray.get(ref)
                except ray.exceptions.RayError as e:
                    failures.append(f"{calls[i][0]}: {_reason(ray, e).rstrip('.')}")
                bar.update(1)
    if failures:
        shown = "; ".join(failures[:5]) + (f"; and {len(failures) - 5} more" if len(failures) > 5 else "")
        raise DataError(f"{len(failures)} of {len(calls)} {what} failed: {shown}. The {len(calls) - len(failures)} "
                        "others finished and are kept: run the same command again to redo only the failed ones")
    return results
