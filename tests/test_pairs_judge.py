"""`groundup data pairs --judge`: preference pairs from a tiny policy's samples, ranked by a scripted AI judge.

Pinned: the strict listwise parse; Copeland over both orders of every pair (a judge that always picks position A
ties everything, so gives no pair); the pairs follow the judge's ranking exactly, listwise and pairwise, from the
very samples the reward path draws; the KTO format as TRL unpairs the pairs; malformed verdicts retried then counted (exact request counts); a request
failing for good costs its prompt only; a fatal one stops the run; --judge and --reward exclusive; --judge-rate
spaces the requests; a groundup checkpoint as the judge; a run killed (SIGKILL) and resumed writes the same bytes
as an uninterrupted one, judges no prompt twice, refuses changed settings naming the key, and the API key is sent
to the endpoint and written to no file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("openai")

from groundup.errors import ConfigError, DataError  # noqa: E402
from groundup.judge.ranking import RankingConfig, parse_ranking, rank_candidates  # noqa: E402
from infer_helpers import model_dir, small_tokenizer, tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-judge-5be1c0de-never-written"
WORDS = ("kings", "queens", "ships", "stars")


def merit(text: str) -> int:
    """What the scripted judge thinks of a reply: an arbitrary but fixed order of texts."""
    return zlib.crc32(text.encode("utf-8"))


BAD_RANKINGS = ["I like the second one best.", "[[1, 2]]", "[[1, 1, 2]]", "First [[2, 1, 3]], or rather [[3, 2, 1]]"]


class Scripted:
    """A judge following a rule. "merit": ranks (listwise) or picks (pairwise) by `merit`; "first": always
    prefers position A. `malformed[word]`: replies refused before a good one, per conversation of the prompt
    about `word` (a large number: never good). `status[word]`: the HTTP status the endpoint answers for it."""

    name = "scripted"

    def __init__(self, rule: str = "merit", malformed: dict | None = None, status: dict | None = None):
        self.rule, self.malformed, self.status = rule, malformed or {}, status or {}
        self.seen: dict[str, set] = {}  # prompt -> the candidate texts shown
        self.tries: Counter = Counter()  # first user message -> replies given
        self.log: list[str] = []  # the prompt of each request
        self.systems: set[str] = set()  # the system messages the judge was given
        self.lock = threading.Lock()

    def chat(self, conversations, max_tokens, temperature, seed):
        return [self.answer(c) for c in conversations]

    def prompt_of(self, messages) -> str:
        return re.search(r"\[User request\]\n(.*?)\n\n", messages[1]["content"], re.DOTALL).group(1)

    def answer(self, messages) -> str:
        user = messages[1]["content"]
        prompt = self.prompt_of(messages)
        listwise = "[The start of candidate 1]" in user
        pattern = r"\[The start of candidate (\d+)\]\n(.*?)\n\[The end of candidate \1\]" if listwise else \
            r"\[The start of reply ([AB])\]\n(.*?)\n\[The end of reply \1\]"
        shown = [t for _, t in re.findall(pattern, user, re.DOTALL)]
        with self.lock:
            self.log.append(prompt)
            self.systems.add(messages[0]["content"])
            self.seen.setdefault(prompt, set()).update(shown)
            tries = self.tries[user]
            self.tries[user] += 1
        word = prompt.split()[-1].rstrip(".")
        if tries < self.malformed.get(word, 0):
            return BAD_RANKINGS[tries % len(BAD_RANKINGS)] if listwise else "Reply A is better, I think. [[E]]"
        if listwise:
            order = sorted(range(len(shown)), key=lambda i: -merit(shown[i]))
            return "Reasons.\n[[" + ", ".join(str(i + 1) for i in order) + "]]"
        if self.rule == "first":
            return "A reads better.\n[[A]]"
        a, b = map(merit, shown)
        return "Reasons.\n" + ("[[A]]" if a > b else "[[B]]" if b > a else "[[C]]")


class Endpoint:
    """Scripted behind an OpenAI-compatible /v1/chat/completions in a thread. Requests after the first
    `gate` wait until `opened` is set."""

    def __init__(self, judge: Scripted, gate: int | None = None):
        self.judge, self.gate, self.opened = judge, gate, threading.Event()
        self.auth: set[str] = set()
        self.times: list[float] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with judge.lock:
                    endpoint.auth.add(self.headers.get("Authorization", ""))
                    endpoint.times.append(time.monotonic())
                    n = len(endpoint.times)
                if endpoint.gate is not None and n > endpoint.gate and not endpoint.opened.is_set():
                    endpoint.opened.wait(60)
                    return  # held until the test let go: its client was killed meanwhile
                word = judge.prompt_of(body["messages"]).split()[-1].rstrip(".")
                status = judge.status.get(word, 200)
                if status == 200:
                    content = judge.answer(body["messages"])
                    data = {"id": "c", "object": "chat.completion", "created": 0, "model": "judge",
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": content}}]}
                else:
                    data = {"error": {"message": f"status {status}", "type": "x"}}
                raw = json.dumps(data).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client was killed

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1#judge"

    def close(self):
        self.opened.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("judged")
    model_dir(root / "base", tiny_model(max_seq_len=64), small_tokenizer())
    rows = [{"messages": [{"role": "user", "content": f"Tell me about {w}."}], "topic": w} for w in WORDS]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "principles.txt").write_text("Prefer the reply with more vowels.\n")
    return root


def argv(root, out, judge_url, *extra, samples=3):
    return ["--model", str(root / "base"), "--prompts", str(root / "prompts.jsonl"), "--judge", judge_url,
            "--out", str(out), "--samples", str(samples), "--max-new-tokens", "6", "--batch-size", str(samples),
            "--device", "cpu", "--no-progress", *extra]


def pairs_run(args: list[str]) -> int:
    from groundup.posttrain.data_commands import pairs, pairs_arguments

    parser = argparse.ArgumentParser()
    pairs_arguments(parser)
    return pairs(parser.parse_args(args))


@pytest.fixture
def serve(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    made = []

    def start(judge: Scripted, gate: int | None = None) -> Endpoint:
        made.append(Endpoint(judge, gate))
        return made[-1]

    yield start
    for e in made:
        e.close()


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def no_file_holds(folder: Path, secret: str) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


# ----------------------------------------------------------------------------- parsing and ranking


@pytest.mark.parametrize("reply, expected", [
    ("Reasons.\n[[3, 1, 2]]", [2, 0, 1]),
    ("Reasons.\n**[[2,3,1]]**.", [1, 2, 0]),
    ("[[ 1 , 2 , 3 ]]", [0, 1, 2]),
    ("Reasons.", "no ranking in double square brackets"),
    ("[[1, 2]]", "not each of the candidates 1 to 3 exactly once"),
    ("[[1, 1, 3]]", "not each of the candidates 1 to 3 exactly once"),
    ("[[1, 2, 4]]", "not each of the candidates 1 to 3 exactly once"),
    ("[[1, two, 3]]", "not comma-separated candidate numbers"),
    ("[[1, 2, 3]] is my ranking", "does not end with its ranking"),
    ("[[1, 2, 3]]\nor [[3, 2, 1]]", "2 texts in double square brackets"),
])
def test_a_listwise_ranking_is_parsed_strictly(reply, expected):
    if isinstance(expected, list):
        assert parse_ranking(reply, 3) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            parse_ranking(reply, 3)


def test_pairwise_scores_are_wins_minus_losses_over_both_orders():
    texts = ["alpha", "beta", "gamma", "delta", "beta"]  # "beta" twice: one candidate
    best_first = sorted(set(texts), key=lambda t: -merit(t))
    convo = [{"role": "user", "content": "Tell me about kings."}]
    judge = Scripted()
    got = rank_candidates(judge, [(convo, texts)], "Be good.", RankingConfig(mode="pairwise", batch_rows=5))
    copeland = {t: 3.0 - 2 * best_first.index(t) for t in best_first}  # 4 candidates: 3, 1, -1, -3
    assert got.scores == [[copeland[t] for t in texts]]
    assert got.counts == {"requests": 12, "malformed": 0, "failed": 0, "unjudged": 0, "comparisons": 6,
                          "inconsistent": 0}
    biased = rank_candidates(Scripted("first"), [(convo, texts)], "Be good.", RankingConfig(mode="pairwise"))
    assert biased.scores == [[0.0] * 5]  # position A always wins: every pair a tie across the swap
    assert (biased.counts["comparisons"], biased.counts["inconsistent"]) == (6, 6)
    listwise = rank_candidates(judge, [(convo, texts)], "Be good.", RankingConfig(mode="listwise"))
    assert listwise.scores == [[4.0 - best_first.index(t) for t in texts]]
    one = rank_candidates(judge, [(convo, ["same", "same"])], "Be good.", RankingConfig(mode="listwise"))
    assert one.scores == [[0.0, 0.0]] and one.counts["requests"] == 0  # one distinct text: nothing to ask


# ----------------------------------------------------------------------------- the command


@pytest.mark.parametrize("mode, per_prompt, samples", [("pairwise", 1, 3), ("listwise", 2, 4)])
def test_pairs_follow_the_judges_ranking_of_the_rewards_paths_samples(root, tmp_path, serve, mode, per_prompt,
                                                                      samples):
    from groundup.infer import Generator
    from groundup.loading import load_for_inference
    from groundup.posttrain.pairs import read_pairs
    from groundup.posttrain.rollout import read_prompts, sample_scored

    judge = Scripted()
    e = serve(judge)
    out = tmp_path / "p.jsonl"
    assert pairs_run(argv(root, out, e.url, "--judge-mode", mode, "--pairs-per-prompt", str(per_prompt),
                          "--constitution", str(root / "principles.txt"), samples=samples)) == 0
    model, tok = load_for_inference(root / "base")
    prompts, _, _ = read_prompts([root / "prompts.jsonl"], tok, 64 - 6)
    drawn = sample_scored(Generator(model, tok), prompts, [], samples, batch_rows=samples, seed=0, max_new_tokens=6,
                          temperature=1.0)
    expected = []
    for j, p in enumerate(prompts):
        cands = list(dict.fromkeys(o.text for o in drawn.outs[j * samples : (j + 1) * samples]))
        assert judge.seen[p.text] == set(cands)  # the judge ranked exactly the samples the reward path draws
        best, worst = sorted(cands, key=lambda t: -merit(t)), sorted(cands, key=merit)
        for i in range(min(per_prompt, len(cands) // 2)):
            expected.append((p.messages, best[i], worst[i], i + 1, len(cands) - i, p.fields["topic"]))
    got = records(out)
    assert [(r["prompt"], r["chosen"][0]["content"], r["rejected"][0]["content"], r["chosen_rank"],
             r["rejected_rank"], r["topic"]) for r in got] == expected
    assert len(got) >= len(WORDS)
    assert judge.systems == {"Prefer the reply with more vowels.\n"}  # the constitution, as the system message
    pairs, report = read_pairs([out], tok, 64)  # what DPO (and the reward model) read
    assert len(pairs) == len(got) and not report.skipped


def test_the_kto_format_is_trls_unpairing_of_the_pairs(root, tmp_path, serve):
    from datasets import Dataset
    from trl.data_utils import unpair_preference_dataset

    from groundup.posttrain.pairs import read_feedback

    e = serve(Scripted())
    common = ["--judge-mode", "listwise", "--limit", "2"]
    assert pairs_run(argv(root, tmp_path / "p.jsonl", e.url, *common)) == 0
    assert pairs_run(argv(root, tmp_path / "k.jsonl", e.url, *common, "--format", "kto")) == 0
    pairs, kto = records(tmp_path / "p.jsonl"), records(tmp_path / "k.jsonl")
    trl = unpair_preference_dataset(Dataset.from_list(pairs)).to_list()

    def key(r):
        return json.dumps([r["prompt"], r["completion"], r["label"], r["topic"]])

    assert len(kto) == 2 * len(pairs) >= 4 and sorted(map(key, kto)) == sorted(map(key, trl))
    assert [r["rank"] for r in kto] == [x for r in pairs for x in (r["chosen_rank"], r["rejected_rank"])]
    singles, report = read_feedback([tmp_path / "k.jsonl"], small_tokenizer(), 64)  # what KTO reads
    assert len(singles) == len(kto) and not report.skipped


def test_malformed_rankings_are_retried_then_counted(root, tmp_path, serve, capsys):
    judge = Scripted(malformed={"kings": 2, "queens": 99})
    e = serve(judge)
    out = tmp_path / "p.jsonl"
    assert pairs_run(argv(root, out, e.url, "--judge-mode", "listwise", "--judge-retries", "2")) == 0
    # kings: 2 refused + 1 good; queens: 3 refused, then skipped; ships, stars: 1 each
    assert Counter(p.split()[-1].rstrip(".") for p in judge.log) == {"kings": 3, "queens": 3, "ships": 1, "stars": 1}
    text = capsys.readouterr().out
    assert "not judged: 'Tell me about queens.': malformed ranking after 3 tries: the ranking [[1, 1, 2]] is not " \
           "each of the candidates 1 to 3 exactly once" in text
    assert f"{out}: 3 pairs from 4 prompts (0 had samples the judge found alike; 1 not judged; 8 judge requests; " \
           "5 malformed verdicts; 0 failed requests); 0 prompt records skipped" in text
    assert [r["topic"] for r in records(out)] == ["kings", "ships", "stars"]


def test_a_judge_preferring_position_a_ties_everything_and_writes_nothing(root, tmp_path, serve):
    e = serve(Scripted("first"))
    with pytest.raises(DataError, match=r"p\.jsonl: nothing written: no pair from 4 prompts: the judge found each "
                                        r"prompt's samples alike"):
        pairs_run(argv(root, tmp_path / "p.jsonl", e.url))
    assert list(tmp_path.iterdir()) == []
    assert len(e.times) == 4 * 6  # 3 pairs of 3 samples, both orders, each prompt


def test_a_request_failing_for_good_costs_its_prompt_and_a_fatal_one_stops_the_run(root, tmp_path, serve, capsys):
    e = serve(Scripted(status={"ships": 400}))
    out = tmp_path / "p.jsonl"
    assert pairs_run(argv(root, out, e.url, "--judge-mode", "listwise")) == 0
    text = capsys.readouterr().out
    assert "not judged: 'Tell me about ships.': judge request failed: " in text and "HTTP 400" in text
    assert "3 pairs from 4 prompts (0 had samples the judge found alike; 1 not judged; 4 judge requests; " \
           "0 malformed verdicts; 1 failed requests)" in text
    e = serve(Scripted(status=dict.fromkeys(WORDS, 401)))
    with pytest.raises(DataError, match=r"the judge failed: .*HTTP 401.*refused the API key.*\(nothing was kept\)"):
        pairs_run(argv(root, tmp_path / "q.jsonl", e.url, "--judge-mode", "listwise"))
    assert sorted(f.name for f in tmp_path.iterdir()) == ["p.jsonl"]


@pytest.mark.parametrize("extra, message", [
    (["--reward", "exact_match"], r"--reward and --judge: choose one"),
    (["--judge-mode", "listwise", "--judge", ""], r"--reward or --judge: give one"),
    (["--judge", "", "--constitution", "c.txt"], r"--reward or --judge: give one"),
    (["--reward", "exact_match", "--judge", "", "--constitution", "c.txt"], r"--constitution needs --judge"),
    (["--judge-retries", "-1"], r"judge_retries = -1: expected an integer of at least 0"),
])
def test_judge_flags_are_checked_before_any_work(root, tmp_path, extra, message):
    args = argv(root, tmp_path / "p.jsonl", "http://127.0.0.1:9/v1#judge")
    with pytest.raises(ConfigError, match=message):
        pairs_run(args + extra)
    assert list(tmp_path.iterdir()) == []


def test_the_judge_rate_spaces_the_requests(root, tmp_path, serve):
    e = serve(Scripted())
    assert pairs_run(argv(root, tmp_path / "p.jsonl", e.url, "--judge-rate", "10", "--limit", "1")) == 0
    assert len(e.times) == 6 and e.times[-1] - e.times[0] >= 5 / 10 - 0.15  # unlimited: all within ~0.05 s


def test_a_groundup_checkpoint_can_judge(root, tmp_path):
    with pytest.raises(DataError, match=r"no pair from 2 prompts: the judge ranked none of them \(e\.g\. 'Tell me "
                                        r"about kings\.': malformed ranking after 1 tries: no ranking"):
        pairs_run(argv(root, tmp_path / "p.jsonl", str(root / "base"), "--judge-mode", "listwise", "--limit", "2",
                       "--judge-retries", "0", "--judge-max-tokens", "4"))


# ----------------------------------------------------------------------------- kill and resume


def test_a_killed_run_resumes_to_the_same_file_without_judging_a_prompt_twice(root, tmp_path, serve):
    whole = tmp_path / "whole" / "p.jsonl"
    whole.parent.mkdir()
    e = serve(Scripted())
    common = ["--judge-mode", "listwise", "--chunk", "1", "--constitution", str(root / "principles.txt")]
    assert pairs_run(argv(root, whole, e.url, *common)) == 0

    judge = Scripted()
    gated = serve(judge, gate=2)  # two chunks (one prompt each) are judged, then the third waits
    out = tmp_path / "p.jsonl"
    env = {**os.environ, "OPENAI_API_KEY": SECRET, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "groundup", "data", "pairs", *argv(root, out, gated.url, *common)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    record = tmp_path / "p.jsonl.progress.json"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None and not (
            record.exists() and json.loads(record.read_text())["prompts_done"] == 2 and len(gated.times) == 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert json.loads(record.read_text())["prompts_done"] == 2, proc.stderr.read().decode()[-2000:]
    assert gated.auth == {f"Bearer {SECRET}"}  # the key went to the endpoint, from the environment
    assert no_file_holds(tmp_path, SECRET) == []

    for change, key in ((["--constitution", str(root / "prompts.jsonl")], "constitution_sha256"),
                        (["--judge-mode", "pairwise"], "judge_mode"), (["--chunk", "2"], "chunk")):
        with pytest.raises(DataError, match=rf"cannot resume, the run was started with other settings \({key}: "):
            pairs_run(argv(root, out, gated.url, *common, *change, "--resume"))
    judge.log.clear()
    gated.opened.set()
    assert pairs_run(argv(root, out, gated.url, *common, "--resume")) == 0
    assert out.read_bytes() == whole.read_bytes()
    assert sorted(judge.log) == ["Tell me about ships.", "Tell me about stars."]  # only the prompts not done
    assert sorted(f.name for f in tmp_path.iterdir()) == ["p.jsonl", "whole"]
    assert no_file_holds(tmp_path, SECRET) == []
