"""`data curate` and `data tokenize` with `--executor ray`, on a local 2-CPU Ray cluster this module
starts (`ray start --head --block`, stopped at the end): the output is byte-identical to the local
run's; a task killed mid-run (its worker dies with no retry left) or one that raises is redone on
relaunch, and nothing that finished runs again; a killed worker with retries left is retried by Ray
in the same launch; nothing is lost or duplicated; a missing Ray or a wrong --address is one line. Ray is optional (`pip install 'groundup[ray]'`): without it the cluster tests skip and the
"Ray is not installed" message is still checked.

Every command that connects to Ray runs in a child process (`_on_ray`), never in pytest's: a
process that was a Ray driver keeps gRPC threads, and a later fork in it (the local tokenizer's
worker pool, in other test modules) can hang on a lock one of them held.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from infer_helpers import small_tokenizer  # noqa: E402

from groundup.cli import main  # noqa: E402
from groundup.config import load_config  # noqa: E402
from groundup.corpus import iter_corpus  # noqa: E402
from groundup.data import ray_curate  # noqa: E402
from groundup.data.curate_config import CurateConfig  # noqa: E402
from groundup.data.pipeline import curate  # noqa: E402
from groundup.data.input_tasks import plan_tasks  # noqa: E402
from groundup.errors import DataError  # noqa: E402
from groundup.io import writer_lock  # noqa: E402
from groundup.ray_cluster import FAULT_ENV  # noqa: E402
from groundup.tokens.shards import TokenizeConfig, tokenize_to_shards  # noqa: E402

try:
    import ray  # importing starts no thread; only connecting does
except ImportError:
    ray = None

RAY_BIN = Path(sys.executable).with_name("ray")
ROOT = Path(__file__).resolve().parents[1]
# Every input file its own task and several shards per task (and four key buckets, below): every
# distributed stage has more than one task, so an ordering mistake between them would show.
SETTINGS = ["read.task_bytes=1", "output.shard_docs=12"]
BUCKETS = 4
# A child process running `groundup ARGV` as a Ray driver, with this module's settings: BUCKETS key
# buckets, and on request Ray's retries (MAX_RETRIES), the tasks' files kept after tokenize, or a
# connection made before the command (which must use it and leave it open).
DRIVER = """
import json, sys
spec = json.loads(sys.argv[1])
import groundup.data.dedup, groundup.ray_cluster, groundup.tokens.shards
groundup.data.dedup.buckets_for = lambda n_docs, memory_mb: spec["buckets"]
if spec["retries"] is not None:
    groundup.ray_cluster.MAX_RETRIES = spec["retries"]
if spec["keep_work"]:
    groundup.tokens.shards.discard_work = lambda out: None
if spec["connect"]:
    import ray
    ray.init(address=spec["connect"])
from groundup.cli import main
code = main(spec["argv"])
if spec["connect"]:
    print("still connected:", ray.is_initialized())
sys.exit(code)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", autouse=True)
def four_buckets():
    """Key buckets are sized for memory (dedup.buckets_for); these inputs would fit in one. The
    driver decides the count, for the local and the Ray run alike."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("groundup.data.dedup.buckets_for", lambda n_docs, memory_mb: BUCKETS)
        yield


@pytest.fixture(scope="module")
def cluster():
    """The address of a local Ray cluster of 2 CPUs, started for this module."""
    if ray is None:
        pytest.skip("Ray is not installed: pip install 'groundup[ray]' (or 'ray>=2.9') to run the Ray tests")
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="gu-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    log = Path(temp) / "head.log"
    with open(log, "w") as f:  # a file, not a pipe: nobody reads the head's output after it started
        head = subprocess.Popen([str(RAY_BIN), "start", "--head", "--block", "--num-cpus=2", f"--port={port}",
                                 "--node-ip-address=127.0.0.1", "--include-dashboard=false", f"--temp-dir={temp}"],
                                env=env, stdout=f, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while "Ray runtime started" not in log.read_text():
        if head.poll() is not None or time.monotonic() > deadline:
            head.kill()
            pytest.fail("ray start --head did not start:\n" + log.read_text()[-3000:])
        time.sleep(0.2)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        head.terminate()  # --block: the head stops the processes it started, then exits
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """Four input files (Shakespeare in two, stdlib code, math) with planted duplicates and a bad line."""
    root = tmp_path_factory.mktemp("raw")
    text = list(itertools.islice(iter_corpus(["text"], chunk_chars=3000), 60))
    code = list(itertools.islice(iter_corpus(["code"]), 30))
    math = list(iter_corpus(["math"], math_count=160))
    copy = {**text[5], "id": "copy-of-5", "source": "mirror"}  # exact duplicate, in another file
    near = {**text[6], "id": "near-6", "source": "mirror", "text": text[6]["text"][:-200] + " an edited ending"}
    files = {"a-text.jsonl": text[:30], "b-text.jsonl": text[30:] + [copy, near], "c-code.jsonl": code,
             "d-math.jsonl": math}
    for name, records in files.items():
        with open(root / name, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    with open(root / "b-text.jsonl", "a") as f:
        f.write('{"text": "broken\n')
    return root


@pytest.fixture(scope="module")
def reference(raw, tmp_path_factory) -> Path:
    """The local run everything is compared with."""
    out = tmp_path_factory.mktemp("reference") / "curated"
    assert main(["data", "curate", "--input", str(raw), "--out", str(out), "--no-progress", *SETTINGS]) == 0
    return out


def _on_ray(*argv, fault: str | None = None, retries: int | None = None, keep_work: bool = False,
            connect: str | None = None) -> subprocess.CompletedProcess:
    """`groundup ARGV` in a child process (see the module docstring); `fault` is FAULT_ENV's value."""
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    env.update({"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **({FAULT_ENV: fault} if fault else {})})
    spec = {"argv": [str(a) for a in argv], "buckets": BUCKETS, "retries": retries, "keep_work": keep_work,
            "connect": connect}
    return subprocess.run([sys.executable, "-c", DRIVER, json.dumps(spec)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def _curate_on_ray(raw: Path, out: Path, address: str, **kwargs) -> subprocess.CompletedProcess:
    return _on_ray("data", "curate", "--input", raw, "--out", out, "--no-progress", "--executor", "ray",
                   "--address", address, *SETTINGS, **kwargs)


def _parts(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "shards").glob("part-*"))}


def _report(out: Path) -> dict:
    """report.json without what depends on the clock or on what a relaunch found done."""
    report = json.loads((out / "report.json").read_text())
    report.pop("timing")
    report["shards"].pop("skipped_complete_work_shards")
    for stage in report["stages"]:
        stage.pop("seconds"), stage.pop("docs_per_s"), stage.pop("mb_per_s")
    return report


def _markers(out: Path) -> dict[str, tuple[int, str]]:
    """Every task's completion marker and finished shard, with its modification time and content."""
    work = out / ".work"
    paths = [*work.glob("tasks/*/done.json"), *work.glob("tasks/*/stats-*.json"), *work.glob("dedup/*.npz")]
    return {str(p.relative_to(work)): (p.stat().st_mtime_ns, p.read_bytes().hex()[:64]) for p in paths}


def test_the_inputs_make_several_tasks_and_dedup_has_work(raw, reference):
    assert len(plan_tasks([raw], 1)) == 4  # one task per input file
    assert len(plan_tasks([raw], 4 << 20)) == 1  # small files grouped
    report = json.loads((reference / "report.json").read_text())
    assert report["shards"]["count"] >= 20 and report["read"]["bad_json"] == 1
    assert report["dedup"]["exact"]["removed_docs"] >= 1 and report["dedup"]["minhash"]["clusters"] >= 1


def test_curate_on_ray_is_byte_identical_to_the_local_run(cluster, raw, reference, tmp_path):
    out = tmp_path / "ray"
    done = _curate_on_ray(raw, out, cluster)
    assert done.returncode == 0, done.stderr
    assert "documents" in done.stdout
    assert _parts(out) == _parts(reference)
    assert _report(out) == _report(reference)
    done = json.loads((out / ".work" / "tasks" / "00001" / "done.json").read_text())
    assert done["files"] == [str(raw / "b-text.jsonl")] and done["read"]["bad_json"] == 1
    assert len(list((out / ".work" / "dedup").glob("band-*.npz"))) == 14 * BUCKETS  # bands x key buckets


def test_a_task_killed_mid_run_is_redone_on_relaunch_and_nothing_finished_runs_again(cluster, raw, reference,
                                                                                     tmp_path):
    out = tmp_path / "ray"
    # task 2's worker dies after the task's first shard, and Ray has no retry left: the launch fails
    first = _curate_on_ray(raw, out, cluster, fault="curate:2:exit", retries=0)
    assert first.returncode == 2, first.stderr
    err = first.stderr
    assert "1 of 4 curate tasks failed: curate task 00002" in err and "worker died unexpectedly" in err
    assert "run the same command again" in err and not (out / "report.json").exists()
    tasks = out / ".work" / "tasks"
    assert sorted(p.parent.name for p in tasks.glob("*/done.json")) == ["00000", "00001", "00003"]
    assert (tasks / "00002" / "stats-00000.json").exists()  # its first shard was complete
    before = _markers(out)
    time.sleep(0.01)  # a rewritten marker would get a later modification time
    assert _curate_on_ray(raw, out, cluster).returncode == 0  # no fault, Ray's retries back
    after = _markers(out)
    assert {k: v for k, v in after.items() if k in before} == before  # nothing finished was redone
    assert "tasks/00002/done.json" in after and len(after) > len(before)
    assert _parts(out) == _parts(reference) and _report(out) == _report(reference)
    report = json.loads((out / "report.json").read_text())
    skipped = sum(len(json.loads((tasks / t / "done.json").read_text())["shards"]) for t in ("00000", "00001", "00003"))
    assert report["shards"]["skipped_complete_work_shards"] == skipped


def test_a_killed_worker_is_retried_by_ray_with_nothing_lost_or_duplicated(cluster, raw, reference, tmp_path):
    out = tmp_path / "ray"
    done = _curate_on_ray(raw, out, cluster, fault="curate:3:exit")  # task 3's worker process dies mid-task
    assert done.returncode == 0, done.stderr  # Ray retries it; one launch is enough
    assert (out / ".work" / ".fault-curate-00003").exists()  # the fault did fire
    assert _parts(out) == _parts(reference) and _report(out) == _report(reference)
    assert not list((out / ".work").rglob(".*.tmp-*"))  # the killed attempt's half files are gone


def test_a_failed_dedup_stage_is_relaunched_from_its_markers(cluster, raw, reference, tmp_path):
    out = tmp_path / "ray"
    first = _curate_on_ray(raw, out, cluster, fault=f"band:{5 * BUCKETS + 1}:raise")  # MinHash band 5, key bucket 1
    assert first.returncode == 2
    assert "1 of 56 MinHash bucket tasks failed: MinHash band 5 bucket 1" in first.stderr
    dedup = out / ".work" / "dedup"
    assert len(list(dedup.glob("band-*.npz"))) == 55 and not (dedup / "clusters.npz").exists()
    before = _markers(out)
    assert _curate_on_ray(raw, out, cluster).returncode == 0
    after = _markers(out)
    assert {k: v for k, v in after.items() if k in before} == before
    assert _parts(out) == _parts(reference) and _report(out) == _report(reference)


def test_tokenize_on_ray_is_byte_identical_and_relaunches(cluster, reference, tmp_path):
    tok_dir = small_tokenizer().save(tmp_path / "tokenizer")
    shards = reference / "shards"
    local, remote = tmp_path / "local", tmp_path / "ray"
    args = ["data", "tokenize", "--tokenizer", str(tok_dir), "--input", str(shards), "--quiet",
            "val_fraction=0.05", "shard_tokens=20000", "task_bytes=1"]
    assert main([*args, "--out", str(local)]) == 0
    on_ray = [*args, "--out", remote, "--executor", "ray", "--address", cluster]
    first = _on_ray(*on_ray, fault="tokenize:1:raise")
    assert first.returncode == 2 and "tokenize task 00001" in first.stderr and not (remote / "index.json").exists()
    assert _on_ray(*on_ray).returncode == 0
    files = sorted(p.relative_to(local) for p in local.rglob("*") if p.is_file() and p.name != ".lock")
    assert len(files) > 6 and files == sorted(p.relative_to(remote) for p in remote.rglob("*")
                                               if p.is_file() and p.name != ".lock")
    for name in files:
        if name.name != "index.json":
            assert (local / name).read_bytes() == (remote / name).read_bytes(), name
    index = [json.loads((d / "index.json").read_text()) for d in (local, remote)]
    for i in index:
        i.pop("seconds")
    assert index[0] == index[1]
    assert not (remote / ".work").exists()  # the tasks' files go once the index is written
    with pytest.raises(DataError, match="only --executor ray"):
        tokenize_to_shards([shards], small_tokenizer(), tmp_path / "x", TokenizeConfig(), progress=False,
                           address=cluster)


def test_a_relaunch_skips_finished_tokenize_tasks(cluster, reference, tmp_path):
    tok_dir = small_tokenizer().save(tmp_path / "tokenizer")
    out = tmp_path / "ray"
    parts = len(list((reference / "shards").glob("part-*")))
    # a caller connected already (no --address): the run uses that connection and leaves it open
    args = ["data", "tokenize", "--tokenizer", tok_dir, "--input", reference / "shards", "--out", out, "--quiet",
            "--executor", "ray", "val_fraction=0.05", "task_bytes=1"]
    first = _on_ray(*args, fault="tokenize:2:raise", connect=cluster)
    assert first.returncode == 2 and f"1 of {parts} tokenize tasks failed" in first.stderr
    assert "still connected: True" in first.stdout
    done = {p: p.stat().st_mtime_ns for p in (out / ".work" / "tasks").glob("*/done.json")}
    assert len(done) == parts - 1
    second = _on_ray(*args, keep_work=True, connect=cluster)  # keep the tasks' files to look
    assert second.returncode == 0 and "still connected: True" in second.stdout, second.stderr
    assert all(p.stat().st_mtime_ns == stamp for p, stamp in done.items())
    assert len(list((out / ".work" / "tasks").glob("*/done.json"))) == parts


def test_a_worker_killed_while_writing_leaves_no_half_file(cluster, reference, tmp_path):
    tok_dir = small_tokenizer().save(tmp_path / "tokenizer")
    args = ["data", "tokenize", "--tokenizer", str(tok_dir), "--input", str(reference / "shards"), "--quiet",
            "val_fraction=0.05", "task_bytes=1", "batch_bytes=2000"]  # several batches per task
    assert main([*args, "--out", str(tmp_path / "local")]) == 0
    out = tmp_path / "ray"
    # task 1's worker dies after its first batch, its files half written; keep the tasks' files to look
    done = _on_ray(*args, "--out", out, "--executor", "ray", "--address", cluster, fault="tokenize:1:exit",
                   keep_work=True)
    assert done.returncode == 0, done.stderr
    assert (out / ".work" / ".fault-tokenize-00001").exists()  # the worker did die; Ray ran the task again
    assert not list(out.rglob(".*.tmp-*"))  # the dead attempt's temporaries were removed by the retry
    index, local = (json.loads((d / "index.json").read_text()) for d in (out, tmp_path / "local"))
    index.pop("seconds"), local.pop("seconds")
    assert index == local
    for path in (tmp_path / "local").rglob("*.bin"):
        assert path.read_bytes() == (out / path.relative_to(tmp_path / "local")).read_bytes()


def test_errors_name_the_fix(raw, tmp_path, monkeypatch, capsys):
    out = tmp_path / "never"
    if ray is not None:
        port = _free_port()  # nothing listens there
        assert main(["data", "curate", "--input", str(raw), "--out", str(out), "--executor", "ray",
                     "--address", f"127.0.0.1:{port}"]) == 2
        err = capsys.readouterr().err
        assert f"--address 127.0.0.1:{port}: no Ray cluster answers at 127.0.0.1:{port}" in err
        assert "ray start --head" in err and not out.exists()  # nothing was created for a run that could not start
    assert main(["data", "curate", "--input", str(raw), "--out", str(out), "--address", "127.0.0.1:1"]) == 2
    assert "only --executor ray connects to a cluster" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    assert main(["data", "curate", "--input", str(raw), "--out", str(out), "--executor", "ray"]) == 2
    assert "--executor ray needs Ray, which is not installed: pip install 'groundup[ray]'" in capsys.readouterr().err
    tok_dir = small_tokenizer().save(tmp_path / "tokenizer")
    assert main(["data", "tokenize", "--tokenizer", str(tok_dir), "--input", str(raw), "--out", str(out),
                 "--executor", "ray"]) == 2
    assert "pip install 'groundup[ray]'" in capsys.readouterr().err and not out.exists()


def test_one_writer_per_run_and_a_task_sees_the_shared_directory(raw, tmp_path):
    cfg = load_config(CurateConfig, None, SETTINGS)
    out = tmp_path / "out"
    with writer_lock(out):
        with pytest.raises(DataError, match="being written by another process"):
            curate([raw], out, cfg, progress=False)
    task = plan_tasks([raw], 1)[0]
    with pytest.raises(DataError, match="shared filesystem"):  # a node that does not see --out
        ray_curate.curate_task(task, cfg, str(tmp_path / "elsewhere" / "tasks" / "00000"), None)


def test_a_completion_marker_of_other_inputs_is_refused(raw, tmp_path):
    """A task directory finished by a run over other files must not be taken as this task's result."""
    from groundup.ray_cluster import finished_task

    first, second = plan_tasks([raw], 1)[:2]
    assert finished_task(tmp_path, "done.json", first, "use a new --out directory") is None
    (tmp_path / "done.json").write_text(json.dumps({"files": [str(f.path) for f in first.files], "shards": 3}))
    assert finished_task(tmp_path, "done.json", first, "use a new --out directory")["shards"] == 3
    with pytest.raises(DataError, match=r"done\.json: this completed task read other files than task 00001 .*"
                                        r"use a new --out directory"):
        finished_task(tmp_path, "done.json", second, "use a new --out directory")


def test_curate_of_a_crawl_on_ray_is_byte_identical_to_the_local_run(cluster, tmp_path):
    """WARC input: pages extracted (trafilatura, with its cross-page deduplication) and language-filtered
    in the Ray tasks give the local run's bytes, damaged records counted the same."""
    pytest.importorskip("fastwarc", reason="the web extra is not installed")
    crawl = tmp_path / "crawl"
    assert main(["data", "sample", "--crawl", "--out", str(crawl), "--pages", "30", "--pages-per-file", "10",
                 "--hostile"]) == 0
    settings = [*SETTINGS, "language.enabled=true"]
    local = tmp_path / "local"
    assert main(["data", "curate", "--input", str(crawl), "--out", str(local), "--no-progress", *settings]) == 0
    done = _on_ray("data", "curate", "--input", crawl, "--out", tmp_path / "ray", "--no-progress", "--executor",
                   "ray", "--address", cluster, *settings)
    assert done.returncode == 0, done.stderr
    assert _parts(tmp_path / "ray") == _parts(local) and len(_parts(local)) >= 3
    assert _report(tmp_path / "ray") == _report(local)
    assert _report(local)["read"]["crawl"]["truncated"] == 2
