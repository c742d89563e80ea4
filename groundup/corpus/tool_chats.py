"""Tool-use conversations from the embedded corpus, in OpenAI's format, for SFT and its evaluation.

    for record in iter_tool_chats(("math", "code"), math_count=5000, code_count=2000, seed=0):
        record["tools"]      # JSON-schema definitions of `calculator` {expression} and `python` {code}
        record["messages"]   # user, assistant {tool_calls: [{id, type, function: {name, arguments}}]},
                             # tool {tool_call_id, name, content}, ..., the final assistant reply
        record["split"]      # "train" or "heldout", by a hash of the prompt (as corpus/chat.py)
        record["answer"]     # math: what exact_match compares with the reply's `Answer: N` line
        record["tests"], record["entry_point"]   # code: what the `code` reward runs (HumanEval's check())

- math: the same problems, split and system prompts as corpus/chat.py's math chats of the same seed and
  `max_operand` (so tool and plain SFT are measured on the same held-out questions), solved by one
  `calculator` call on the whole expression (most), one call per step (some) or a `python` program that
  prints it (some); the final reply restates the result and ends with `Answer: N`. The results are the
  true ones: the calculator's exact value (an integer, written as one), python's what `print` writes
  (`/` makes a float: 28.0); tests/test_tool_chats.py runs a sample through the sandbox.
- code: small function tasks (corpus/code_tasks.py: parametrised kinds, so held-out tasks are new
  functions of trained kinds; split by the function, not its tests, and only among parametrised families).
  The assistant writes the function, runs it with the tests through `python`, reads the result, and
  finishes with the function. About half get it right first; the others first write a realistic bug, read
  the real traceback, and fix it (two or three attempts). Every program runs once in the evaluation
  sandbox (run_many, cached by text) and the tool message holds what it printed: stdout, then stderr,
  with the sandbox's random scratch folder taken out of the paths (`File "program.py", line 7`) so the
  same seed gives the same records. The final reply holds the function in a ```python block.

Everything is seeded: the same arguments give the same records in the same order.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import operator
import random
import re
from fractions import Fraction
from typing import Iterable, Iterator

from groundup.corpus.chat import math_chats
from groundup.corpus.code_tasks import Bug, CodeTask, draw_task
from groundup.data.hashing import document_score
from groundup.errors import ConfigError, DataError
from groundup.sandbox import SandboxResult, default_python, run_many

TOOL_CHAT_DOMAINS = ("math", "code")
CODE_SEED_OFFSET = 104_729  # code tasks draw from a stream of their own
CODE_HELDOUT_FRACTION = 0.2  # of the parametrised functions: ~8% of the records (150 of 2,000), the pass@1 set
PASSED_LINE = "all tests passed"

CALCULATOR_TOOL = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression exactly (+, -, *, /, parentheses).",
    "parameters": {"type": "object", "required": ["expression"],
                   "properties": {"expression": {"type": "string", "description": "e.g. (12 + 5) * 3"}}}}}
PYTHON_TOOL = {"type": "function", "function": {
    "name": "python", "description": "Run a Python program in a sandbox; returns what it printed (stdout, stderr).",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "the program"}},
                   "required": ["code"]}}}
TOOLS = [CALCULATOR_TOOL, PYTHON_TOOL]

_STEP = re.compile(r"(-?\d+) ([-+*/]) (-?\d+) = (-?\d+)\.|(\d+)% of (\d+) is (\d+)\.")
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_SCRATCH = re.compile(r'(/[^\s"\']*)?/groundup-sandbox-[^/\s"\']+/')
_FRAME = re.compile(r'^  File "program\.py", line \d+, in <module>$')
OPENERS = ["I'll write the function and run the tests.", "Here is a first version; let me run the tests on it.",
           "Let me write `{name}` and check it against the tests.", "I'll implement it and test it with python."]
RETRY = ["Let me fix it and run the tests again.", "Fixing that and running the tests again.",
         "I'll correct it and test again."]


def _call_id(rid: str, k: int) -> str:
    return "call_" + hashlib.sha256(f"{rid}/{k}".encode()).hexdigest()[:24]


def _call(rid: str, k: int, name: str, arguments: dict, content: str | None = None) -> tuple[dict, str]:
    """An assistant message with one call, and the call's id (what the result answers)."""
    cid = _call_id(rid, k)
    fn = {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
    calls = [{"id": cid, "type": "function", "function": fn}]
    return {"role": "assistant", "content": content, "tool_calls": calls}, cid


def _result(cid: str, name: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": cid, "name": name, "content": content}


# ---- arithmetic ----

def solution_steps(solution: str) -> list[tuple[str, object, object, int]]:
    """The worked steps of a math_problems solution as (op, left, right, result); a left or right that is
    the previous step's result is that step (a tuple), so the last step is the whole expression's tree."""
    steps: list = []
    for m in _STEP.finditer(solution):
        if m.group(2):
            op, left, right, value = m.group(2), int(m.group(1)), int(m.group(3)), int(m.group(4))
        else:  # "20% of 200 is 40": 200 * 20 / 100
            pct, whole, value = int(m.group(5)), int(m.group(6)), int(m.group(7))
            op, left, right = "/", ("*", whole, pct, whole * pct), 100
        if steps and left == steps[-1][3]:
            left = steps[-1]
        elif steps and right == steps[-1][3]:
            right = steps[-1]
        steps.append((op, left, right, value))
    return steps


def render_expression(node, parent: int = 0, right_side: bool = False) -> str:
    """A step tree as text with only the parentheses precedence needs (left-associative operators)."""
    if not isinstance(node, tuple):
        return f"({node})" if node < 0 else str(node)
    op, left, right, _ = node
    text = f"{render_expression(left, _PRECEDENCE[op])} {op} {render_expression(right, _PRECEDENCE[op], True)}"
    wrap = _PRECEDENCE[op] < parent or (right_side and _PRECEDENCE[op] == parent)
    return f"({text})" if wrap else text


def evaluate(node, number=int):
    """The tree's value with Python's arithmetic (`number=int`: what python prints, `/` a float) or exact
    (`number=Fraction`: the calculator's)."""
    if not isinstance(node, tuple):
        return number(node)
    return _OPS[node[0]](evaluate(node[1], number), evaluate(node[2], number))


def calculator_text(value: Fraction) -> str:
    """The calculator's result: an integer as an integer, anything else as a float would print."""
    return str(value.numerator) if value.denominator == 1 else repr(float(value))


def _math_record(record: dict, index: int, seed: int, rng: random.Random) -> dict:
    steps = solution_steps(record["messages"][-1]["content"])
    answer = int(record["answer"])
    rid = f"chat-tools-math/{seed}/{index:07d}"
    if not steps or evaluate(steps[-1], Fraction) != answer:
        raise DataError(f"{record['id']}: its worked solution does not give the answer {answer}")
    head = record["messages"][:-1]  # the system prompt (if any) and the question
    tree, style = steps[-1], rng.random()
    out: list[dict] = []
    if style < 0.15 and len(steps) > 1:  # one calculator call per step, each on the numbers so far
        said = []
        for k, step in enumerate(steps):
            op, left, right, value = step
            if k:  # the previous step's result as the number the calculator gave
                left, right = (steps[k - 1][3] if x is steps[k - 1] else x for x in (left, right))
            expression = render_expression((op, left, right, value))
            message, cid = _call(rid, k, "calculator", {"expression": expression})
            result = calculator_text(evaluate((op, left, right, value), Fraction))
            out += [message, _result(cid, "calculator", result)]
            said.append(f"{expression} = {result}.")
        final = " ".join(said)
    elif style < 0.30:  # a python program that prints the expression
        expression = render_expression(tree)
        message, cid = _call(rid, 0, "python", {"code": f"print({expression})"})
        out += [message, _result(cid, "python", f"{evaluate(tree)}\n")]
        final = f"{expression} = {answer}."
    else:
        expression = render_expression(tree)
        message, cid = _call(rid, 0, "calculator", {"expression": expression})
        out += [message, _result(cid, "calculator", calculator_text(evaluate(tree, Fraction)))]
        final = f"{expression} = {answer}."
    messages = head + out + [{"role": "assistant", "content": f"{final}\nAnswer: {answer}"}]
    return {"id": rid, "source": "chat-tools-math", "domain": "math", "tools": TOOLS, "messages": messages,
            "split": record["split"], "answer": record["answer"]}


def tool_math_chats(count: int, seed: int = 0, max_operand: int = 0) -> Iterator[dict]:
    """corpus/chat.py's math chats of this seed, each solved through a tool (see the module docstring)."""
    rng = random.Random(f"tool-math/{seed}")  # a stream apart from the problems', which stay chat.py's
    for i, record in enumerate(math_chats(count, seed, max_operand)):
        yield _math_record(record, i, seed, rng)


# ---- code ----

def tool_output(result: SandboxResult) -> str:
    """What the python tool returns for a run: stdout then stderr, the scratch folder out of the paths;
    a run stopped by a limit also says why."""
    text = _SCRATCH.sub("", result.stdout + result.stderr)
    return text if result.status in ("passed", "failed") else text + f"[{result.status}: {result.detail}]\n"


def program(task: CodeTask, bugs: tuple[Bug, ...] = ()) -> str:
    """The attempt the assistant runs: the function, the tests as asserts, and a line that says they passed."""
    return task.attempt(bugs) + "\n\n" + "\n".join(task.asserts()) + f'\nprint("{PASSED_LINE}")\n'


def failure_text(output: str) -> str:
    """What the assistant reads off a failed run: the test that failed and the error."""
    lines = output.rstrip("\n").splitlines()
    error = lines[-1] if lines else "no output"
    frames = [i for i, line in enumerate(lines) if _FRAME.match(line)]
    line = lines[frames[-1] + 1].strip() if frames and frames[-1] + 1 < len(lines) else None
    if line and line.startswith("assert") and error.startswith("AssertionError"):
        return f"The test `{line}` failed."
    return f"`{line}` raised {error}." if line else f"The run failed with {error}."


def _code_plan(rng: random.Random) -> tuple[CodeTask, list[tuple[Bug, ...]]]:
    """A task and the bugs of each attempt: none (right first time), one, or two fixed one at a time. The
    bugs of an attempt are a superset of the next one's, the last attempt has none (the reference)."""
    task = draw_task(rng)
    r = rng.random()
    if r < 0.5:
        return task, [()]
    bugs = rng.sample(task.bugs, min(2, len(task.bugs)))
    if r < 0.8 or len(bugs) < 2 or not task.fits_together(bugs):
        return task, [(bugs[0],), ()]
    return task, [tuple(bugs), (bugs[1],), ()]


def _code_record(task: CodeTask, attempts: list[tuple[Bug, ...]], outputs: dict[str, SandboxResult], rid: str,
                 seed: int, rng: random.Random) -> dict:
    final = outputs[program(task)]
    if not final.passed:
        raise DataError(f"{rid}: the reference {task.name} fails its own tests in the sandbox: "
                        f"{final.detail or final.status} ({tool_output(final)[-300:]!r})")
    # An attempt whose bugs the tests miss is no lesson (and its code would be the answer): it is left out,
    # and the next failing attempt's note fixes its bugs too.
    runs = [(bugs, outputs[program(task, bugs)]) for bugs in attempts[:-1]]
    runs = [(bugs, result) for bugs, result in runs if result.status == "failed"] + [((), final)]
    prompt = (f"Write a Python function `{task.name}({task.params})` that {task.description}. "
              "It must pass these tests:\n" + "\n".join(task.asserts()))
    messages: list[dict] = [{"role": "user", "content": prompt}]
    note = rng.choice(OPENERS).format(name=task.name)
    for k, (bugs, result) in enumerate(runs):
        message, cid = _call(rid, k, "python", {"code": program(task, bugs)}, note)
        output = tool_output(result)
        messages += [message, _result(cid, "python", output)]
        if bugs:
            fixed = [b.note for b in bugs if b not in runs[k + 1][0]]
            note = " ".join([failure_text(output), *fixed, rng.choice(RETRY)])
    reply = f"All {len(task.cases)} tests pass.\n\n```python\n{task.source}```"
    messages.append({"role": "assistant", "content": reply})
    held = task.family and document_score(task.key, seed) < CODE_HELDOUT_FRACTION  # code_tasks.py: why family
    split = "heldout" if held else "train"
    return {"id": rid, "source": "chat-tools-code", "domain": "code", "tools": TOOLS, "messages": messages,
            "split": split, "tests": task.check_tests(), "entry_point": task.name, "kind": task.kind,
            "attempts": len(runs)}


def tool_code_chats(count: int, seed: int = 0, chunk: int = 500, workers: int | None = None,
                    python: str | None = None) -> Iterator[dict]:
    """`count` code conversations (see the module docstring); the programs of `chunk` tasks run together."""
    rng = random.Random(seed + CODE_SEED_OFFSET)
    python = python or default_python()  # the interpreter the `code` reward and the python tool use
    outputs: dict[str, SandboxResult] = {}
    for start in range(0, count, chunk):
        plans = [_code_plan(rng) for _ in range(min(chunk, count - start))]
        todo = [p for p in dict.fromkeys(program(t, b) for t, attempts in plans for b in attempts) if p not in outputs]
        outputs.update(zip(todo, run_many(todo, workers=workers, python=python, timeout=30.0)))
        for j, (task, attempts) in enumerate(plans):
            rid = f"chat-tools-code/{seed}/{start + j:07d}"
            yield _code_record(task, attempts, outputs, rid, seed, random.Random(rid))  # wording: not chunk-bound


def iter_tool_chats(domains: Iterable[str] = TOOL_CHAT_DOMAINS, *, math_count: int = 20_000, code_count: int = 2_000,
                    seed: int = 0, max_operand: int = 0) -> Iterator[dict]:
    """Tool-use conversations of the domains asked for among math and code (text has none)."""
    domains = tuple(domains)
    unknown = set(domains) - {"math", "code", "text"}
    if unknown:
        raise ConfigError(f"unknown chat domain(s) {sorted(unknown)}: tool chats exist for {list(TOOL_CHAT_DOMAINS)}",
                          key="domains")
    if not set(domains) & set(TOOL_CHAT_DOMAINS):
        raise ConfigError(f"--domains {' '.join(domains)}: tool chats exist for math and code only", key="domains")
    makers = {"math": lambda: tool_math_chats(math_count, seed, max_operand),
              "code": lambda: tool_code_chats(code_count, seed)}
    yield from itertools.chain.from_iterable(makers[d]() for d in TOOL_CHAT_DOMAINS if d in domains)
