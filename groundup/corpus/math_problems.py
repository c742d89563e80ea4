"""Seeded arithmetic and word problems with worked solutions and checkable integer answers.

Every record's text has the same three-part shape, so a model's answer can be checked by exact
match (evaluation) or rewarded (GRPO):

    Question: Ava has 12 apples. She buys 5 more and gives 3 to Liam. How many apples ...?
    Solution: 12 + 5 = 17. 17 - 3 = 14.
    Answer: 14
"""

from __future__ import annotations

import random
import re
from typing import Callable, Iterator

NAMES = [("Ava", "she"), ("Liam", "he"), ("Noah", "he"), ("Emma", "she"), ("Mia", "she"), ("Omar", "he"),
         ("Priya", "she"), ("Kenji", "he"), ("Sofia", "she"), ("Lucas", "he"), ("Zara", "she"), ("Ivan", "he")]
ITEMS = ["apples", "pencils", "marbles", "stickers", "books", "cookies", "stamps", "shells", "cards", "coins"]
VEHICLES = ["train", "car", "bus", "cyclist", "boat"]
ANSWER_RE = re.compile(r"Answer:\s*(-?\d+)")

Problem = tuple[str, str, int]  # question, worked solution, answer


class OperandRandom(random.Random):
    """A Random whose `randint` draws at most `max_operand` (0: no bound): every problem keeps its
    shape with smaller numbers, e.g. within the times tables a small model can learn."""

    def __init__(self, seed: int, max_operand: int = 0):
        super().__init__(seed)
        self.max_operand = max_operand

    def randint(self, a: int, b: int) -> int:
        if self.max_operand:
            a, b = min(a, self.max_operand), min(b, self.max_operand)
        return super().randint(a, b)


def _arithmetic(rng: random.Random) -> Problem:
    kind = rng.choice(["add", "sub", "mul", "div", "mixed", "mixed2"])
    a, b, c = rng.randint(2, 999), rng.randint(2, 999), rng.randint(2, 20)
    if kind == "add":
        return f"What is {a} + {b}?", f"{a} + {b} = {a + b}.", a + b
    if kind == "sub":
        a, b = max(a, b), min(a, b)
        return f"What is {a} - {b}?", f"{a} - {b} = {a - b}.", a - b
    if kind == "mul":
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        return f"What is {a} * {b}?", f"{a} * {b} = {a * b}.", a * b
    if kind == "div":
        q, d = rng.randint(2, 99), rng.randint(2, 30)
        return f"What is {q * d} / {d}?", f"{q * d} / {d} = {q}.", q
    if kind == "mixed":
        s = a + b
        return f"What is ({a} + {b}) * {c}?", f"{a} + {b} = {s}. {s} * {c} = {s * c}.", s * c
    p = rng.randint(2, 40) * c
    return (f"What is {p} / {c} - {b}?", f"{p} / {c} = {p // c}. {p // c} - {b} = {p // c - b}.", p // c - b)


def _buy_give(rng: random.Random) -> Problem:
    (name, pron), (other, _) = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    a, b = rng.randint(5, 60), rng.randint(2, 40)
    c = rng.randint(1, a + b)
    q = (f"{name} has {a} {item}. {pron.capitalize()} buys {b} more and gives {c} to {other}. "
         f"How many {item} does {name} have now?")
    return q, f"{a} + {b} = {a + b}. {a + b} - {c} = {a + b - c}.", a + b - c


def _boxes(rng: random.Random) -> Problem:
    item = rng.choice(ITEMS)
    a, b = rng.randint(3, 48), rng.randint(2, 25)
    return f"A box holds {a} {item}. How many {item} are in {b} boxes?", f"{a} * {b} = {a * b}.", a * b


def _share(rng: random.Random) -> Problem:
    name, _ = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    each, friends = rng.randint(2, 30), rng.randint(2, 12)
    total = each * friends
    q = f"{name} shares {total} {item} equally among {friends} friends. How many {item} does each friend get?"
    return q, f"{total} / {friends} = {each}.", each


def _travel(rng: random.Random) -> Problem:
    vehicle = rng.choice(VEHICLES)
    speed, hours = rng.randint(10, 120), rng.randint(2, 9)
    q = f"A {vehicle} travels at {speed} kilometres per hour for {hours} hours. How many kilometres does it travel?"
    return q, f"{speed} * {hours} = {speed * hours}.", speed * hours


def _change(rng: random.Random) -> Problem:
    name, pron = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    n, price = rng.randint(2, 9), rng.randint(1, 12)
    cost = n * price
    note = next(v for v in (10, 20, 50, 100, 200) if v >= cost)
    q = (f"{name} buys {n} {item} at {price} dollars each and pays with a {note} dollar note. "
         f"How much change does {pron} get?")
    return q, f"{n} * {price} = {cost}. {note} - {cost} = {note - cost}.", note - cost


def _ages(rng: random.Random) -> Problem:
    (name, _), (other, _) = rng.sample(NAMES, 2)
    a, b, c = rng.randint(3, 60), rng.randint(1, 30), rng.randint(1, 20)
    q = f"{name} is {a} years old. {other} is {b} years older. How old will {other} be in {c} years?"
    return q, f"{a} + {b} = {a + b}. {a + b} + {c} = {a + b + c}.", a + b + c


def _chairs(rng: random.Random) -> Problem:
    rows, per_row = rng.randint(2, 30), rng.randint(2, 30)
    taken = rng.randint(0, rows * per_row)
    q = f"A hall has {rows} rows of {per_row} chairs. {taken} chairs are taken. How many chairs are free?"
    total = rows * per_row
    return q, f"{rows} * {per_row} = {total}. {total} - {taken} = {total - taken}.", total - taken


def _discount(rng: random.Random) -> Problem:
    pct = rng.choice([10, 20, 25, 50, 75])
    price = rng.randint(1, 40) * 20  # a multiple of 20 keeps every listed percentage exact
    off = price * pct // 100
    q = f"A coat costs {price} dollars. It is on sale for {pct}% off. What is the sale price in dollars?"
    return q, f"{pct}% of {price} is {off}. {price} - {off} = {price - off}.", price - off


GENERATORS: list[Callable[[random.Random], Problem]] = [
    _arithmetic, _arithmetic, _buy_give, _boxes, _share, _travel, _change, _ages, _chairs, _discount,
]


def format_problem(question: str, solution: str, answer: int) -> str:
    return f"Question: {question}\nSolution: {solution}\nAnswer: {answer}"


def extract_answer(text: str) -> int | None:
    """The integer after the first `Answer:` in `text`, or None."""
    match = ANSWER_RE.search(text)
    return int(match.group(1)) if match else None


def generate_math_records(count: int, seed: int = 0, max_operand: int = 0,
                          exclude: Callable[[str], bool] | None = None) -> Iterator[dict]:
    """Yield `count` problems; the same seed always gives the same problems. `max_operand` bounds
    every number drawn (0: the full ranges, up to 999); a question `exclude` accepts is drawn again."""
    rng = OperandRandom(seed, max_operand)
    for i in range(count):
        question, solution, answer = rng.choice(GENERATORS)(rng)
        while exclude is not None and exclude(question):
            question, solution, answer = rng.choice(GENERATORS)(rng)
        yield {
            "id": f"math/{seed}/{i:07d}",
            "source": "math-synthetic",
            "domain": "math",
            "text": format_problem(question, solution, answer),
            "question": question,
            "answer": str(answer),
        }
