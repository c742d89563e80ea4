"""The `calculator` tool: arithmetic read with the `ast` module and worked out node by node, never `eval`.

What it accepts: int and float literals, + - * / // % **, unary minus and plus, parentheses, and the
functions sqrt, abs, round, min, max. Anything else (a name, an attribute, a subscript, a string, a
comparison, a keyword argument) is refused with the reason. Each operation gives what Python's own
arithmetic gives (the answer is written as `str` of Python's result, except that a float with a whole
value below 2**53 is written as that integer, as a calculator shows 360 / 12: `30`, not `30.0`; the
tool-use chats of `data sample --chat --tools` write results the same way), within bounds that keep one
call cheap: the expression is at most MAX_CHARS characters and nested at most MAX_DEPTH deep, and no
integer, operand or result, grows past MAX_BITS bits, checked before a power is taken (so 9**9**9
is refused at once instead of computed).
"""

from __future__ import annotations

import ast
import math
import operator

from groundup.tools.base import Tool, ToolFailed

MAX_CHARS = 1000
MAX_DEPTH = 64
MAX_BITS = 4000  # about 1200 decimal digits: under Python's 4300-digit str() limit

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_FUNCTIONS = {"sqrt": math.sqrt, "abs": abs, "round": round, "min": min, "max": max}


class CalculatorError(ToolFailed, ValueError):
    """The expression is not one the calculator works out (the message says why)."""


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalculatorError(f"the result is not a real number ({type(value).__name__})")
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise CalculatorError(f"the number is too large (more than {MAX_BITS} bits)")
    return value


def _power(base, exponent):
    # An integer power is as long as exponent * log2|base| bits: refuse it before computing it.
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if exponent * math.log2(abs(base)) > MAX_BITS:
            raise CalculatorError(f"{base}**{exponent} is too large (more than {MAX_BITS} bits)")
    return operator.pow(base, exponent)


def _eval(node: ast.AST, depth: int):
    if depth > MAX_DEPTH:
        raise CalculatorError(f"the expression is nested more than {MAX_DEPTH} deep")
    if isinstance(node, ast.Expression):
        return _eval(node.body, depth + 1)
    if isinstance(node, ast.Constant):
        return _number(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        if isinstance(node.op, ast.Pow):
            return _number(_power(left, right))
        return _number(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _number(_UNARY[type(node.op)](_eval(node.operand, depth + 1)))
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute):
            raise CalculatorError("attribute access is not arithmetic")
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in _FUNCTIONS:
            raise CalculatorError(f"unknown function {ast.unparse(node.func)!r}; the functions are "
                                  + ", ".join(_FUNCTIONS))
        if node.keywords:
            raise CalculatorError(f"{name}() takes positional arguments only")
        return _number(_FUNCTIONS[name](*[_eval(a, depth + 1) for a in node.args]))
    if isinstance(node, ast.Name):
        raise CalculatorError(f"unknown name {node.id!r}: only numbers and the functions " + ", ".join(_FUNCTIONS))
    if isinstance(node, ast.Attribute):
        raise CalculatorError("attribute access is not arithmetic")
    raise CalculatorError(f"{type(node).__name__} is not arithmetic ({ast.unparse(node)[:40]!r})")


def calculate(expression: str) -> str:
    """Work out an arithmetic expression; CalculatorError (a ValueError) says why one is refused, and
    Python's own ZeroDivisionError, OverflowError or ValueError (sqrt(-1)) come through as they are."""
    if not isinstance(expression, str):
        raise CalculatorError("the expression must be a string")
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, RecursionError, MemoryError) as e:
        raise CalculatorError(f"not an expression: {getattr(e, 'msg', type(e).__name__)}") from None
    return _shown(_eval(tree, 0))


def _shown(value) -> str:
    """Python's str of the result, a whole float (exactly an integer: below 2**53) written as that integer."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        return str(int(value))
    return str(value)


def calculator() -> Tool:
    return Tool(
        name="calculator",
        description="Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses, and the "
                    "functions sqrt, abs, round, min, max. Returns the result as a number.",
        parameters={"type": "object",
                    "properties": {"expression": {"type": "string",
                                                  "description": "the expression, e.g. \"(12 + 7) * 3 / 4\""}},
                    "required": ["expression"]},
        fn=calculate,
    )
