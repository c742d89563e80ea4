"""The code rewards' programs: a completion and its record's tests, run in the evaluation sandbox.

    code_program(prompt, completion)          # the code a completion stands for
    passed, total = count_passed(prompt, completion, tests, entry_point)

A completion's code is the last fenced block of a chat reply (```python ... ```) when it has one,
else `prompt + completion` (a code prompt continued, as HumanEval and MBPP build it). `count_passed`
splits `tests` (one string, or a list of strings such as MBPP's `test_list`) into tests with `ast`:
each top-level statement holding an `assert` is one test (several assert lines: one test each), the
other statements are setup. HumanEval's form (`def check(candidate):` holding the asserts, with
`entry_point`) counts the statements of check's body the same way, `candidate` bound to the entry
point. Tests without any assert are one test: the whole program passes or not (the `code` reward).

The program runs ONCE in the sandbox (never in this process): the code, then each test in order in
its namespace, every test caught on its own and its outcome printed on a line tagged with a random
nonce; a test whose line never comes (a crash, the time limit, output cut at the sandbox's cap)
failed. A setup statement that raises fails every test after it. Not promised: a completion that
reads its own program (and so the nonce) or exits 0 before the tests can fool this reward, as it can
the `code` reward.
"""

from __future__ import annotations

import ast
import re
import secrets

from groundup.sandbox import run_program

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)


def code_program(prompt: str, completion: str) -> str:
    """The code of a completion: its last fenced block (a chat reply), else `prompt + completion`."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else prompt + completion


def _has_assert(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(node))


def _is_test(statement: ast.stmt) -> bool:
    """A statement that checks something when run (a definition holding asserts checks nothing yet)."""
    return not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _has_assert(statement)


def split_tests(tests: str | list[str], entry_point: str | None = None) -> tuple[list[tuple[str, bool]], int]:
    """The statements to run in order, each (source, is_test), and the number of tests; SyntaxError for
    tests that are not Python."""
    source = "\n".join(tests) if isinstance(tests, list) else tests
    body = ast.parse(source).body
    if any(_is_test(s) for s in body):
        steps = [(ast.unparse(s), _is_test(s)) for s in body]
    else:
        check = next((s for s in body if isinstance(s, ast.FunctionDef) and s.name == "check"), None)
        if check is None or not entry_point or not check.args.args or not _has_assert(check):
            return [(source, False)], 0  # no assert to count: the program as a whole is the one test
        if not entry_point.isidentifier():
            raise ValueError(f"entry_point {entry_point!r} is not a Python name")
        setup = [(ast.unparse(s), False) for s in body if s is not check]
        bind = [(f"{check.args.args[0].arg} = {entry_point}", False)]
        steps = setup + bind + [(ast.unparse(s), _is_test(s)) for s in check.body]
    return steps, sum(is_test for _, is_test in steps)


_HARNESS = '''
def _groundup_run_tests(_steps, _tag):
    import sys as _sys
    _n = 0
    for _src, _is_test in _steps:
        try:
            exec(compile(_src, "<test>", "exec"), globals())
            _ok = True
        except BaseException:  # a failed assert, an error, sys.exit: this test failed, the next still runs
            _ok = False
        if _is_test:
            _sys.__stdout__.write(f"{_tag} {_n} {int(_ok)}\\n")
            _sys.__stdout__.flush()
            _n += 1
        elif not _ok:
            return  # setup failed: the tests after it cannot run
_groundup_run_tests(STEPS, TAG)
'''


def count_passed(prompt: str, completion: str, tests: str | list[str], entry_point: str | None = None,
                 **limits) -> tuple[int, int]:
    """(tests passed, tests) of a completion, run once in the sandbox with `limits` (run_program's)."""
    steps, total = split_tests(tests, entry_point)
    program = code_program(prompt, completion)
    if not total:  # tests with no assert: the program passes (exit 0) or not, as the `code` reward
        return int(run_program(program + "\n" + steps[0][0], **limits).passed), 1
    tag = "groundup-test-" + secrets.token_hex(8)
    result = run_program(program + "\n" + _HARNESS.replace("STEPS, TAG", f"{steps!r}, {tag!r}"), **limits)
    outcome: dict[int, bool] = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == tag and parts[1].isdigit() and parts[2] in ("0", "1"):
            outcome.setdefault(int(parts[1]), parts[2] == "1")
    return sum(outcome.get(i, False) for i in range(total)), total
