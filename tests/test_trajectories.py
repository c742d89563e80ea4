"""`groundup data trajectories`: agent logs checked call by call, long sessions split at turn boundaries so that
every piece fits, no call is parted from its result, and the loss mask trains exactly the session's assistant
tokens, never a result or a definition."""

from __future__ import annotations

import json

import pytest

from groundup.cli import main
from groundup.posttrain.trajectories import read_trajectories, session_turns
from groundup.tokenizer import TokenizerConfig, train_tokenizer

TOOLS = [{"type": "function", "function": {"name": "python", "description": "run a program", "parameters": {
    "type": "object", "properties": {"code": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    texts = ["def run tests assert print the result of the program python call tool " * 20] * 30
    tok = train_tokenizer(texts, TokenizerConfig(vocab_size=400), progress=False)
    return tok.save(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tok(tok_dir):
    from groundup.tokenizer import load_tokenizer

    return load_tokenizer(tok_dir)


def call(cid: str, code: str) -> dict:
    return {"role": "assistant", "content": f"Running step {cid}.",
            "tool_calls": [{"id": cid, "type": "function", "function": {"name": "python",
                                                                        "arguments": json.dumps({"code": code})}}]}


def result(cid: str, text: str) -> dict:
    return {"role": "tool", "tool_call_id": cid, "content": text}


def session(turns: int, tag: str = "s") -> dict:
    """A system message, a task, `turns` call/result rounds (the last with two calls at once), a final reply."""
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": f"Fix bug {tag}."}]
    for k in range(turns):
        if k == turns - 1:
            two = call(f"{tag}{k}a", f"print({k})")
            two["tool_calls"] += call(f"{tag}{k}b", f"print({k} + 1)")["tool_calls"]
            messages += [two, result(f"{tag}{k}b", f"RESULT-{tag}{k}b"), result(f"{tag}{k}a", f"RESULT-{tag}{k}a")]
        else:
            messages += [call(f"{tag}{k}", f"print({k} * {k})"), result(f"{tag}{k}", f"RESULT-{tag}{k} " * 3)]
        if k == turns // 2:
            messages.append({"role": "user", "content": "Also check the tests."})
            messages.append({"role": "assistant", "content": "Checking them."})
    messages.append({"role": "assistant", "content": f"Done with {tag}."})
    return {"id": tag, "messages": messages, "tools": TOOLS}


def write_jsonl(path, lines) -> None:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


def test_a_missing_result_an_orphan_and_bad_json_are_dropped_with_their_lines(tmp_path, tok):
    missing = session(2, "m")
    del missing["messages"][3]  # the first call's result
    orphan = session(2, "o")
    orphan["messages"].insert(2, result("nobody", "stray"))
    cut_off = session(1, "c")
    cut_off["messages"] = cut_off["messages"][:3]  # the session ends on a call
    path = tmp_path / "logs.jsonl"
    write_jsonl(path, [session(1, "a"), missing, orphan, "{not json", cut_off, session(1, "b")])
    res = read_trajectories([path], tok)
    assert [r["id"] for r in res.records] == ["a", "b"]
    assert {k: v for k, v in res.dropped.items() if v} == {"missing_result": 2, "orphan_result": 1, "bad_json": 1}
    assert res.examples["missing_result"] == [
        f"{path}:2: messages[3]: assistant message before the result of call 'm0' (python)",
        f"{path}:5: call 'c0a' (python) has no result: the session ends first"]
    assert res.examples["orphan_result"] == [f"{path}:3: messages[2]: result for call 'nobody' answers none "
                                             "(no pending call)"]
    assert res.examples["bad_json"][0].startswith(f"{path}:4: invalid JSON")
    assert res.summary(0) == "2 records from 2 sessions; 4 dropped (bad_json 1, missing_result 2, orphan_result 1)"


def test_malformed_sessions_are_counted_never_raised(tmp_path, tok):
    bad_args = session(1, "x")
    bad_args["messages"][2]["tool_calls"][0]["function"]["arguments"] = "{not json"
    no_id = session(1, "y")
    del no_id["messages"][2]["tool_calls"][0]["id"]
    lines = [bad_args, no_id, {"messages": "hello"}, {"messages": [{"role": "user", "content": "hi"}]},
             {"messages": [{"role": "wizard", "content": "x"}]}, {"messages": [{"role": "user", "content": 5}]}]
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, lines)
    res = read_trajectories([path], tok)
    assert res.records == []
    assert {k: v for k, v in res.dropped.items() if v} == {"malformed": 5, "no_assistant": 1}
    assert res.examples["malformed"][0].startswith(f"{path}:1: cannot be rendered: DataError: tool call 'python'")


def test_a_folder_of_json_sessions_and_list_content(tmp_path, tok):
    folder = tmp_path / "sessions"
    folder.mkdir()
    one = session(1, "j1")
    one["messages"][1]["content"] = [{"type": "text", "text": "Fix "}, {"type": "text", "text": "it."}]
    (folder / "a.json").write_text(json.dumps(one))
    (folder / "b.json").write_text(json.dumps(session(1, "j2")["messages"]))  # a bare messages list
    (folder / "c.json").write_text("{broken")
    (folder / "notes.txt").write_text("not a session")
    res = read_trajectories([folder], tok)
    assert res.files_skipped == 1 and res.files_skipped_examples == [f"{folder / 'notes.txt'}: structured records are read from .jsonl or .parquet only"]
    assert res.summary(0) == "2 records from 2 sessions; 1 dropped (bad_json 1); 1 files not read"
    assert [r["origin"] for r in res.records] == [str(folder / "a.json"), str(folder / "b.json")]
    assert res.records[0]["messages"][1]["content"] == "Fix it." and "tools" not in res.records[1]
    assert res.dropped["bad_json"] == 1 and res.examples["bad_json"][0].startswith(f"{folder / 'c.json'}: ")


def _masked_text(tok, ids, mask, keep: int) -> str:
    return tok.decode([i for i, m in zip(ids, mask) if m == keep])


def test_a_long_session_is_split_into_pieces_that_fit_with_calls_kept_with_results(tmp_path, tok):
    long = session(12, "L")
    whole_ids, whole_mask = tok.render_chat(long["messages"], tools=TOOLS)
    head_ids, _ = tok.render_chat(long["messages"][:2], tools=TOOLS)
    limit = len(head_ids) + (len(whole_ids) - len(head_ids)) // 3  # the turns need at least three pieces
    path = tmp_path / "long.jsonl"
    write_jsonl(path, [long, session(1, "short")])
    res = read_trajectories([path], tok, max_tokens=limit)
    pieces = [r for r in res.records if r["id"].startswith("L#")]
    assert len(pieces) >= 3 and res.split == 1 and res.pieces == len(pieces) and res.sessions == 2
    assert [r["piece"] for r in pieces] == list(range(len(pieces))) and {r["pieces"] for r in pieces} == {len(pieces)}
    head, turns = session_turns(long["messages"])
    assert head == long["messages"][:2]
    body = []
    trained = 0
    for r in pieces:
        assert r["tools"] == TOOLS and r["messages"][:2] == head  # each piece keeps the system message and task
        ids, mask = tok.render_chat(r["messages"], tools=r["tools"])
        assert len(ids) <= limit
        trained += sum(mask)
        calls = {c["id"] for m in r["messages"] for c in m.get("tool_calls") or []}
        answers = {m["tool_call_id"] for m in r["messages"] if m["role"] == "tool"}
        assert calls == answers  # no call without its result in the same piece, no result without its call
        learned, unlearned = _masked_text(tok, ids, mask, 1), _masked_text(tok, ids, mask, 0)
        assert "RESULT-" not in learned and "RESULT-" in unlearned  # results masked
        assert "run a program" not in learned and "run a program" in unlearned  # definitions masked
        codes = [json.loads(c["function"]["arguments"])["code"]
                 for m in r["messages"] for c in m.get("tool_calls") or []]
        assert codes and all(code in learned for code in codes)  # the calls are trained on
        body += r["messages"][2:]
    assert body == long["messages"][2:]  # every turn in exactly one piece, in order
    assert trained == sum(whole_mask)  # the assistant tokens trained on are the session's, no more, no fewer
    short = next(r for r in res.records if r["id"] == "short")
    assert "piece" not in short and short["messages"] == session(1, "short")["messages"]


def test_a_turn_longer_than_the_limit_drops_the_session(tmp_path, tok):
    big = session(3, "B")
    big["messages"][3]["content"] = "x " * 2000  # one result far over the limit
    path = tmp_path / "big.jsonl"
    write_jsonl(path, [big])
    res = read_trajectories([path], tok, max_tokens=600)
    assert res.records == [] and res.dropped["too_long"] == 1
    example = res.examples["too_long"][0]
    assert example.startswith(f"{path}:1: the turn from message 2 (2 messages) is ") and example.endswith("over 600")


def test_the_command_writes_records_and_a_summary(tmp_path, tok_dir, capsys):
    logs = tmp_path / "logs.jsonl"
    broken = session(1, "x")
    del broken["messages"][3]
    write_jsonl(logs, [session(12, "L"), broken, session(1, "s")])
    out = tmp_path / "sft.jsonl"
    argv = ["data", "trajectories", str(logs), "--tokenizer", str(tok_dir), "--max-tokens", "700", "--out", str(out)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    n = len(records) - 1
    assert lines[-1] == (f"{out}: {len(records)} records from 2 sessions; 1 longer than --max-tokens 700 split into "
                         f"{n} pieces; 1 dropped (missing_result 1)")
    assert lines[0].startswith(f"  dropped (missing_result) {logs}:2: ")
    assert main(argv) == 2 and "already exists" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0
    assert main([*argv[:-1], str(logs)]) == 2 and "is one of the inputs" in capsys.readouterr().err
