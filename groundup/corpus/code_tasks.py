"""Small Python function tasks drawn from parametrised kinds, each with a reference solution, realistic buggy
first tries, and tests whose expected values the reference computes.

    task = draw_task(rng)     # CodeTask: name, params, description, source, bugs, cases
    task.asserts()            # ["assert sum_of_squares(3) == 14", ...]  what the prompt shows and the tool runs
    task.check_tests()        # the same as HumanEval's `check(candidate)`, what the `code` reward runs
    task.attempt([bug])       # the source with bugs in it

A kind is a family: `sum_of_squares` and `sum_of_cubes_of_multiples_of_5` are two functions of one kind,
and `task.key` (signature and description) names the function, so a split by its hash holds out new
functions of kinds trained on, never new tests of a function trained on. Only functions of a parametrised
`family` (count_digit_{d}, clamp_{lo}_to_{hi}, ...) are held out: a fixed one (fibonacci) held out would
take its kind's only examples of it away from training. Each bug is an edit of the
reference (an off-by-one, a wrong operator, a missing case) with the note a programmer writes on finding
it; the cases include one meant to catch it (tool_chats.py runs every attempt in the sandbox and drops a
bug its tests do not catch). The references here are our own code, run in-process only for the expected
values; the sources are what the sandbox runs, so a reference that disagreed with its source would show
as a failing final attempt (tests/test_tool_chats.py runs them).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Sequence

WORDS = ["apple", "tree", "sun", "ocean", "idea", "bike", "red", "umbrella", "cat", "moon", "echo", "garden",
         "sky", "orange", "up", "river", "ink", "stone", "eagle", "book", "yes", "island", "window", "a", "zebra",
         "under", "night", "owl", "road", "anchor", "level", "ice", "music", "bridge", "elm", "top", "area"]
PALINDROMES = ["level", "Racecar", "noon", "Refer", "madam", "Stats", "rotor", "kayak"]
PHRASES = ["nurses run", "Step on no pets", "Never odd or even", "top spot", "Was it a rat I saw"]
FIZZ_WORDS = [("Fizz", "Buzz"), ("Foo", "Bar"), ("Ping", "Pong"), ("Tick", "Tock")]


@dataclass(frozen=True)
class Bug:
    old: str  # text of the reference source the bug replaces (it occurs there)
    new: str
    note: str  # what the programmer says on finding it


@dataclass
class CodeTask:
    kind: str
    name: str
    params: str  # "n", "text, k"
    description: str  # "returns ..."
    source: str  # the reference solution, a whole `def`
    bugs: list[Bug]
    cases: list[tuple[tuple, object]]  # (arguments, expected value)
    family: str = ""  # the parametrised function it is one of ("count_digit_{d}"); "" when it has no parameters

    @property
    def key(self) -> str:
        """The function itself, without its tests: what the held-out split hashes."""
        return f"{self.name}({self.params}): {self.description}"

    def call(self, args: tuple, name: str | None = None) -> str:
        return f"{name or self.name}({', '.join(map(repr, args))})"

    def asserts(self) -> list[str]:
        return [f"assert {self.call(args)} == {expected!r}" for args, expected in self.cases]

    def check_tests(self) -> str:
        """HumanEval's form, run by the `code` reward as completion + tests + `check(entry_point)`."""
        return "def check(candidate):\n" + "".join(f"    assert {self.call(a, 'candidate')} == {e!r}\n"
                                                   for a, e in self.cases)

    def attempt(self, bugs: Sequence[Bug] = ()) -> str:
        """The source with these bugs in it, made in order (ValueError when one's text is gone)."""
        source = self.source
        for bug in bugs:
            if bug.old not in source:
                raise ValueError(f"{self.name}: bug text {bug.old!r} is not in the source")
            source = source.replace(bug.old, bug.new, 1)
        return source

    def fits_together(self, bugs: Sequence[Bug]) -> bool:
        """Whether these bugs can all be made at once (no edit removes another's text)."""
        try:
            self.attempt(bugs)
        except ValueError:
            return False
        return True


def _cases(ref: Callable, inputs: list[tuple], rng: random.Random, least: int = 3, most: int = 5) -> list:
    """3-5 distinct inputs, the first ones (those meant to catch bugs) always kept, in a shuffled order."""
    seen, unique = set(), []
    for args in inputs:
        if repr(args) not in seen:
            seen.add(repr(args))
            unique.append(args)
    chosen = unique[: rng.randint(least, most)]
    rng.shuffle(chosen)
    return [(args, ref(*args)) for args in chosen]


def _sentence(rng: random.Random, words: int | None = None, capital: bool = False) -> str:
    picked = [rng.choice(WORDS) for _ in range(words or rng.randint(2, 5))]
    if capital:
        picked = [w.capitalize() if rng.random() < 0.5 or i == 0 else w for i, w in enumerate(picked)]
    return " ".join(picked)


def _sum_powers(rng: random.Random) -> CodeTask:
    power, filt, m = rng.choice([1, 2, 3]), rng.choice(["all", "even", "odd", "multiples"]), rng.randint(3, 7)
    conds = {"all": None, "even": "i % 2 == 0", "odd": "i % 2 == 1", "multiples": f"i % {m} == 0"}
    test = {"all": lambda i: True, "even": lambda i: i % 2 == 0, "odd": lambda i: i % 2 == 1,
            "multiples": lambda i: i % m == 0}[filt]
    of = {"all": "the integers", "even": "the even integers", "odd": "the odd integers",
          "multiples": f"the multiples of {m}"}[filt]
    suffix = {"all": "", "even": "_of_evens", "odd": "_of_odds", "multiples": f"_of_multiples_of_{m}"}[filt]
    if power == 1:
        name = {"all": "sum_to_n", "even": "sum_of_evens", "odd": "sum_of_odds",
                "multiples": f"sum_of_multiples_of_{m}"}[filt]
        what = f"the sum of {of} from 1 to n"
    else:
        name = f"sum_of_{'squares' if power == 2 else 'cubes'}{suffix}"
        what = f"the sum of the {'squares' if power == 2 else 'cubes'} of {of} from 1 to n"
    term = "i" if power == 1 else f"i ** {power}"
    body = f"        if {conds[filt]}:\n            total += {term}\n" if conds[filt] else f"        total += {term}\n"
    source = f"def {name}(n):\n    total = 0\n    for i in range(1, n + 1):\n{body}    return total\n"
    bugs = [Bug("range(1, n + 1)", "range(1, n)", "`range(1, n)` stops before n, so n itself is left out: the "
                "range must end at `n + 1`.")]
    if power > 1:
        bugs.append(Bug(term, f"i * {power}", f"`i * {power}` multiplies by {power} instead of raising to the "
                        f"power {power}: it must be `{term}`."))
    if filt != "all":
        wrong = {"even": "i % 2 == 1", "odd": "i % 2 == 0", "multiples": f"i % {m} == 1"}[filt]
        bugs.append(Bug(conds[filt], wrong, f"The condition `{wrong}` picks the wrong numbers: {of} are those "
                        f"with `{conds[filt]}`."))
    hits = [k for k in range(2, 16) if test(k)]
    inputs = [(rng.choice(hits),), (rng.choice(hits),)] + [(rng.randint(0, 20),) for _ in range(4)]
    return CodeTask("sum_powers", name, "n", f"returns {what} (0 when there are none)", source, bugs,
                    _cases(lambda n: sum(i ** power for i in range(1, n + 1) if test(i)), inputs, rng),
                    "sum_of_{powers}_of_{numbers}")


def _count_in_text(rng: random.Random) -> CodeTask:
    variant = rng.choice(["vowels", "letter", "digits", "upper", "longer"])
    if variant == "vowels":
        name, params = "count_vowels", "text"
        desc = "returns how many vowels (a, e, i, o, u, in either case) text contains"
        source = 'def count_vowels(text):\n    return sum(1 for ch in text.lower() if ch in "aeiou")\n'
        bugs = [Bug(".lower()", "", "Capital vowels are not counted: lower the text first with `text.lower()`.")]
        ref = lambda text: sum(ch in "aeiou" for ch in text.lower())  # noqa: E731
    elif variant == "letter":
        c = rng.choice("abcdefghiklmnoprstuwy")
        name, params = f"count_letter_{c}", "text"
        desc = f"returns how many times the letter {c!r} appears in text, in either case"
        source = f'def {name}(text):\n    return text.lower().count("{c}")\n'
        bugs = [Bug(".lower()", "", f"A capital {c.upper()!r} is not counted: lower the text first.")]
        ref = lambda text: text.lower().count(c)  # noqa: E731
    elif variant == "digits":
        name, params, desc = "count_digits", "text", "returns how many characters of text are digits"
        source = "def count_digits(text):\n    return sum(1 for ch in text if ch.isdigit())\n"
        bugs = [Bug("isdigit", "isalnum", "`isalnum()` counts letters as well; digits are `isdigit()`.")]
        ref = lambda text: sum(ch.isdigit() for ch in text)  # noqa: E731
    elif variant == "upper":
        name, params, desc = "count_uppercase", "text", "returns how many characters of text are upper-case letters"
        source = "def count_uppercase(text):\n    return sum(1 for ch in text if ch.isupper())\n"
        bugs = [Bug("isupper", "isalpha", "`isalpha()` counts every letter; upper-case ones are `isupper()`.")]
        ref = lambda text: sum(ch.isupper() for ch in text)  # noqa: E731
    else:
        k = rng.randint(2, 6)
        name, params = f"count_words_longer_than_{k}", "text"
        desc = f"returns how many words of text (separated by whitespace) have more than {k} characters"
        source = f"def {name}(text):\n    return sum(1 for word in text.split() if len(word) > {k})\n"
        bugs = [Bug(f"> {k}", f">= {k}", f"`>= {k}` also counts words of exactly {k} characters: it must be `> {k}`.")]
        ref = lambda text: sum(len(w) > k for w in text.split())  # noqa: E731
        exact = [w for w in WORDS if len(w) == k] or ["x" * k]
        inputs = [(f"{rng.choice(exact)} {_sentence(rng)}",)] + [(_sentence(rng),) for _ in range(4)]
        return CodeTask("count_in_text", name, params, desc, source, bugs, _cases(ref, inputs, rng),
                        "count_words_longer_than_{k}")
    capital = rng.choice(["Apple", "Echo", "Ice", "Owl", "Umbrella", "Area", "Eagle"])
    tricky = f"{capital} {_sentence(rng)} {rng.randint(1, 999)}"
    inputs = [(tricky,)] + [(_sentence(rng, capital=True) + (f" {rng.randint(0, 99)}" if rng.random() < 0.5 else ""),)
                            for _ in range(4)]
    if variant == "letter":
        inputs.insert(0, (f"{c.upper()}{c} {_sentence(rng)}",))
    return CodeTask("count_in_text", name, params, desc, source, bugs, _cases(ref, inputs, rng),
                    "count_letter_{c}" if variant == "letter" else "")


def _words(rng: random.Random) -> CodeTask:
    variant = rng.choice(["reverse_words", "reverse_each_word", "capitalize_words", "longest_word", "acronym"])
    if variant == "reverse_words":
        desc = "returns the words of text (separated by whitespace) in reverse order, joined by single spaces"
        source = 'def reverse_words(text):\n    return " ".join(reversed(text.split()))\n'
        bugs = [Bug('" ".join(reversed(text.split()))', "text[::-1]", "`text[::-1]` reverses the characters, not the "
                    "words: split into words, reverse them, and join them with spaces.")]
        ref = lambda text: " ".join(reversed(text.split()))  # noqa: E731
    elif variant == "reverse_each_word":
        desc = "returns text with the letters of each word reversed, the words kept in order, joined by single spaces"
        source = 'def reverse_each_word(text):\n    return " ".join(word[::-1] for word in text.split())\n'
        bugs = [Bug("word[::-1] for word in text.split()", "reversed(text.split())", "That reverses the order of the "
                    "words; each word's letters must be reversed instead, with `word[::-1]`.")]
        ref = lambda text: " ".join(w[::-1] for w in text.split())  # noqa: E731
    elif variant == "capitalize_words":
        desc = "returns text with each word's first letter upper-case and the rest lower-case, joined by single spaces"
        source = 'def capitalize_words(text):\n    return " ".join(word.capitalize() for word in text.split())\n'
        bugs = [Bug("word.capitalize()", "word.upper()", "`upper()` makes every letter upper-case; only the first "
                    "should be: `capitalize()`.")]
        ref = lambda text: " ".join(w.capitalize() for w in text.split())  # noqa: E731
    elif variant == "longest_word":
        desc = 'returns the longest word of text (the first one when several are as long; "" when there is none)'
        source = ('def longest_word(text):\n    best = ""\n    for word in text.split():\n'
                  '        if len(word) > len(best):\n            best = word\n    return best\n')
        bugs = [Bug("len(word) > len(best)", "len(word) >= len(best)", "With `>=` a later word of the same length "
                    "replaces the first one: it must be `>`.")]
        ref = lambda text: max(text.split(), key=len, default="")  # noqa: E731
        inputs = [("red sun cat",), ("",)] + [(_sentence(rng),) for _ in range(4)]
        return CodeTask("words", variant, "text", desc, source, bugs, _cases(ref, inputs, rng))
    else:
        desc = "returns the first letters of the words of text, upper-case, joined together"
        source = 'def acronym(text):\n    return "".join(word[0].upper() for word in text.split())\n'
        bugs = [Bug("word[0].upper()", "word[0]", "Lower-case initials stay lower-case: each must be `.upper()`.")]
        ref = lambda text: "".join(w[0].upper() for w in text.split())  # noqa: E731
    inputs = [(_sentence(rng, 3),)] + [(_sentence(rng, capital=rng.random() < 0.5),) for _ in range(4)]
    return CodeTask("words", variant, "text", desc, source, bugs, _cases(ref, inputs, rng))


def _num(v: int) -> str:
    return f"minus_{-v}" if v < 0 else str(v)


def _clamp(rng: random.Random) -> CodeTask:
    lo = rng.randint(-20, 10)
    hi = lo + rng.randint(5, 100)
    name = f"clamp_{_num(lo)}_to_{_num(hi)}"
    desc = f"returns x limited to the range {lo} to {hi}: {lo} when x is below it, {hi} when above, else x"
    expr = f"max({lo}, min(x, {hi}))"
    source = f"def {name}(x):\n    return {expr}\n"
    bugs = [Bug(expr, f"min({lo}, max(x, {hi}))", "I swapped `min` and `max`: the inner one must cap x at "
                f"{hi} (`min(x, {hi})`) and the outer one raise it to {lo} (`max({lo}, ...)`)."),
            Bug(expr, f"min(x, {hi})", f"The lower bound is missing: numbers below {lo} must become {lo}.")]
    inputs = [(lo - rng.randint(1, 50),), (hi + rng.randint(1, 50),), (rng.randint(lo, hi),), (lo,), (hi,)]
    return CodeTask("clamp", name, "x", desc, source, bugs, _cases(lambda x: max(lo, min(x, hi)), inputs, rng),
                    "clamp_{lo}_to_{hi}")


def _fizzbuzz(rng: random.Random) -> CodeTask:
    a, b = rng.choice([(a, b) for a in range(2, 9) for b in range(a + 1, 10) if b % a])
    w1, w2 = rng.choice(FIZZ_WORDS)
    name = f"{w1.lower()}{w2.lower()}_{a}_{b}"
    desc = (f'returns "{w1}{w2}" if n is divisible by both {a} and {b}, "{w1}" if only by {a}, "{w2}" if only by '
            f"{b}, and otherwise n as a string")
    both = f'    if n % {a} == 0 and n % {b} == 0:\n        return "{w1}{w2}"\n'
    source = (f"def {name}(n):\n{both}    if n % {a} == 0:\n        return \"{w1}\"\n"
              f"    if n % {b} == 0:\n        return \"{w2}\"\n    return str(n)\n")
    bugs = [Bug(both, "", f'Numbers divisible by both {a} and {b} stop at the check for {a} and return "{w1}": the '
                "case for both has to come first."),
            Bug("return str(n)", "return n", "Other numbers must come back as strings: `str(n)`, not n.")]
    lcm = math.lcm(a, b)
    only = lambda d, o: rng.choice([k for k in range(1, 100) if k % d == 0 and k % o])  # noqa: E731
    neither = rng.choice([k for k in range(1, 100) if k % a and k % b])
    inputs = [(lcm * rng.randint(1, 4),), (only(a, b),), (only(b, a),), (neither,), (rng.randint(1, 100),)]
    ref = lambda n: f"{w1}{w2}" if n % lcm == 0 else w1 if n % a == 0 else w2 if n % b == 0 else str(n)  # noqa: E731
    return CodeTask("fizzbuzz", name, "n", desc, source, bugs, _cases(ref, inputs, rng, least=4), "{w1}{w2}_{a}_{b}")


def _running(rng: random.Random) -> CodeTask:
    variant = rng.choice(["max", "min", "sum"])
    if variant == "sum":
        name, desc = "running_sum", "returns the list of running totals of xs: element i is the sum of xs[0] to xs[i]"
        loop = "        total += x\n        result.append(total)\n"
        source = f"def running_sum(xs):\n    result = []\n    total = 0\n    for x in xs:\n{loop}    return result\n"
        bugs = [Bug(loop, "        result.append(total)\n        total += x\n", "The total is appended before x is "
                    "added, so every entry lags one step behind: add first, then append.")]
        ref = lambda xs: [sum(xs[: i + 1]) for i in range(len(xs))]  # noqa: E731
    else:
        op, word = (">", "largest") if variant == "max" else ("<", "smallest")
        name, desc = f"running_{variant}", f"returns the list whose element i is the {word} of xs[0] to xs[i]"
        source = (f"def {name}(xs):\n    result = []\n    best = None\n    for x in xs:\n"
                  f"        if best is None or x {op} best:\n            best = x\n        result.append(best)\n"
                  "    return result\n")
        other = "<" if op == ">" else ">"
        sign = "negative" if op == ">" else "positive"
        bugs = [Bug("best = None", "best = 0", f"Starting from 0 is wrong when the numbers are all {sign}: start with "
                    "no value (`None`) and take the first number."),
                Bug(f"x {op} best", f"x {other} best", f"`x {other} best` keeps the wrong end: the {word} needs "
                    f"`x {op} best`.")]
        pick = max if variant == "max" else min
        ref = lambda xs: [pick(xs[: i + 1]) for i in range(len(xs))]  # noqa: E731
    sign = -1 if variant == "max" else 1
    inputs = [([sign * rng.randint(1, 30) for _ in range(rng.randint(3, 6))],)]
    inputs += [([rng.randint(-20, 20) for _ in range(rng.randint(0, 7))],) for _ in range(4)]
    return CodeTask("running", name, "xs", desc, source, bugs, _cases(ref, inputs, rng))


def _compare(rng: random.Random) -> CodeTask:
    k, op, shape = rng.randint(0, 20), rng.choice([">", "<", ">="]), rng.choice(["count", "keep"])
    words = {">": "greater_than", "<": "less_than", ">=": "at_least"}[op]
    said = {">": "greater than", "<": "less than", ">=": "at least"}[op]
    wrong = {">": ">=", "<": "<=", ">=": ">"}[op]
    if shape == "count":
        name, desc = f"count_{words}_{k}", f"returns how many numbers in the list xs are {said} {k}"
        source = f"def {name}(xs):\n    return sum(1 for x in xs if x {op} {k})\n"
    else:
        name, desc = f"keep_{words}_{k}", f"returns the numbers of the list xs that are {said} {k}, in their order"
        source = f"def {name}(xs):\n    return [x for x in xs if x {op} {k}]\n"
    bugs = [Bug(f"x {op} {k}", f"x {wrong} {k}", f"`{wrong}` gets the numbers equal to {k} wrong: it must be `{op}`.")]
    keep = {">": lambda x: x > k, "<": lambda x: x < k, ">=": lambda x: x >= k}[op]
    ref = (lambda xs: sum(map(keep, xs))) if shape == "count" else (lambda xs: [x for x in xs if keep(x)])
    inputs = [([k, rng.randint(-5, 30), k, rng.randint(-5, 30)],)]
    inputs += [([rng.randint(-5, 30) for _ in range(rng.randint(0, 6))],) for _ in range(4)]
    return CodeTask("compare", name, "xs", desc, source, bugs, _cases(ref, inputs, rng), "{count|keep}_{op}_{k}")


def _digits(rng: random.Random) -> CodeTask:
    variant = rng.choice(["sum", "product", "count"])
    d = rng.randint(1, 9)
    if variant == "sum":
        name, desc = "digit_sum", "returns the sum of the decimal digits of the integer n >= 0"
        start, step = "total = 0", "total += n % 10"
        ref = lambda n: sum(map(int, str(n)))  # noqa: E731
    elif variant == "product":
        name, desc = "digit_product", "returns the product of the decimal digits of the integer n >= 1"
        start, step = "total = 1", "total *= n % 10"
        ref = lambda n: math.prod(map(int, str(n)))  # noqa: E731
    else:
        name, desc = f"count_digit_{d}", f"returns how many of the decimal digits of the integer n >= 0 are {d}"
        start, step = "total = 0", f"total += n % 10 == {d}"
        ref = lambda n: str(n).count(str(d))  # noqa: E731
    source = f"def {name}(n):\n    {start}\n    while n > 0:\n        {step}\n        n //= 10\n    return total\n"
    bugs = [Bug("while n > 0", "while n > 9", "The loop stops while one digit is still left: it must run while "
                "`n > 0`."),
            Bug("n % 10", "n // 10", "`n // 10` drops the last digit instead of taking it: that is `n % 10`.")]
    if variant == "product":
        bugs.append(Bug("total = 1", "total = 0", "Starting the product at 0 makes every answer 0: start at 1."))
    lead = int(f"{d}{rng.randint(1, 9)}{rng.randint(0, 9)}")  # its leading digit d is what `n > 9` misses
    inputs = [(lead,)] + [(rng.randint(1, 99_999),) for _ in range(4)]
    return CodeTask("digits", name, "n", desc, source, bugs, _cases(ref, inputs, rng),
                    "count_digit_{d}" if variant == "count" else "")


def _sequence(rng: random.Random) -> CodeTask:
    variant = rng.choice(["factorial", "fibonacci", "triangular", "power"])
    if variant == "factorial":
        name, desc = "factorial", "returns n! (the product of 1 to n; 1 when n is 0)"
        source = ("def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n"
                  "    return result\n")
        bugs = [Bug("range(2, n + 1)", "range(2, n)", "`range(2, n)` leaves out n itself: it must end at `n + 1`.")]
        ref = math.factorial
    elif variant == "fibonacci":
        name, desc = "fibonacci", "returns the n-th Fibonacci number, counting fibonacci(0) = 0 and fibonacci(1) = 1"
        source = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
        bugs = [Bug("return a", "return b", "It returns the next number: after n steps `a` is the n-th one.")]
        ref = lambda n: round(((1 + 5 ** 0.5) / 2) ** n / 5 ** 0.5)  # noqa: E731  exact for n < 70
    elif variant == "triangular":
        name, desc = "triangular", "returns the n-th triangular number, 1 + 2 + ... + n"
        source = "def triangular(n):\n    return n * (n + 1) // 2\n"
        bugs = [Bug("n + 1", "n - 1", "`n * (n - 1) // 2` is one triangle short: it is `n * (n + 1) // 2`.")]
        ref = lambda n: n * (n + 1) // 2  # noqa: E731
    else:
        k = rng.randint(2, 9)
        name, desc = f"power_of_{k}", f"returns {k} raised to the power n (n >= 0), by repeated multiplication"
        source = f"def {name}(n):\n    result = 1\n    for _ in range(n):\n        result *= {k}\n    return result\n"
        bugs = [Bug("range(n)", "range(n - 1)", "`range(n - 1)` multiplies one time too few: it must be `range(n)`."),
                Bug(f"result *= {k}", f"result += {k}", f"`+=` adds {k} instead of multiplying by it.")]
        ref = lambda n: k ** n  # noqa: E731
    inputs = [(rng.randint(3, 12),), (rng.randint(1, 2),)] + [(rng.randint(0, 15),) for _ in range(4)]
    return CodeTask("sequence", name, "n", desc, source, bugs, _cases(ref, inputs, rng),
                    "power_of_{k}" if variant == "power" else "")


def _lists(rng: random.Random) -> CodeTask:
    variant = rng.choice(["spread", "mean_floor", "unique_in_order", "top"])
    nums = lambda: [rng.randint(-20, 40) for _ in range(rng.randint(1, 6))]  # noqa: E731
    inputs = [([],), ([rng.randint(0, 9), rng.randint(0, 9), 7, 7, rng.randint(0, 9)],)] + [(nums(),) for _ in range(4)]
    if variant == "spread":
        name, desc = "spread", "returns the largest number of the list xs minus the smallest (0 for an empty list)"
        source = "def spread(xs):\n    if not xs:\n        return 0\n    return max(xs) - min(xs)\n"
        bugs = [Bug("    if not xs:\n        return 0\n", "", "An empty list has no maximum: return 0 for it first."),
                Bug("max(xs) - min(xs)", "max(xs) - xs[0]", "The smallest number need not come first: `min(xs)`.")]
        ref = lambda xs: max(xs) - min(xs) if xs else 0  # noqa: E731
        inputs.insert(1, ([5, 1, 9],))
    elif variant == "mean_floor":
        name, desc = "mean_floor", "returns the mean of the list xs rounded down to an integer (0 for an empty list)"
        source = "def mean_floor(xs):\n    if not xs:\n        return 0\n    return sum(xs) // len(xs)\n"
        bugs = [Bug("    if not xs:\n        return 0\n", "", "An empty list divides by zero: return 0 for it first."),
                Bug("sum(xs) // len(xs)", "sum(xs) / len(xs)", "`/` gives a fraction; rounding down needs `//`.")]
        ref = lambda xs: sum(xs) // len(xs) if xs else 0  # noqa: E731
        inputs.insert(1, ([1, 2, 4],))
    elif variant == "unique_in_order":
        name, desc = "unique_in_order", "returns the numbers of xs without repeats, each where it first appears"
        body = ("    seen = set()\n    result = []\n    for x in xs:\n        if x not in seen:\n"
                "            seen.add(x)\n            result.append(x)\n    return result\n")
        source = f"def unique_in_order(xs):\n{body}"
        bugs = [Bug(body, "    return list(set(xs))\n", "A set loses the order: keep a list and a set of the numbers "
                    "seen so far.")]
        ref = lambda xs: list(dict.fromkeys(xs))  # noqa: E731
        inputs.insert(0, ([3, 1, 3, 2, 1],))
    else:
        k = rng.randint(1, 4)
        name, desc = f"top_{k}", f"returns the {k} largest numbers of the list xs, largest first (all of them if fewer)"
        source = f"def {name}(xs):\n    return sorted(xs, reverse=True)[:{k}]\n"
        bugs = [Bug("sorted(xs, reverse=True)", "sorted(xs)", "`sorted(xs)` puts the smallest first: sort with "
                    "`reverse=True`.")]
        ref = lambda xs: sorted(xs, reverse=True)[:k]  # noqa: E731
        inputs.insert(0, ([2, 9, 4, 7, 1, 8],))
    return CodeTask("lists", name, "xs", desc, source, bugs, _cases(ref, inputs, rng),
                    "top_{k}" if variant == "top" else "")


def _palindrome(rng: random.Random) -> CodeTask:
    phrase = rng.random() < 0.5
    if phrase:
        name, desc = "is_palindrome_phrase", "returns whether text reads the same backwards, ignoring spaces and case"
        source = ('def is_palindrome_phrase(text):\n    letters = text.replace(" ", "").lower()\n'
                  "    return letters == letters[::-1]\n")
        bugs = [Bug('.replace(" ", "")', "", "The spaces are compared too: remove them with `replace(\" \", \"\")`."),
                Bug(".lower()", "", "Capitals break the comparison: lower the text first.")]
        ref = lambda t: t.replace(" ", "").lower() == t.replace(" ", "").lower()[::-1]  # noqa: E731
        inputs = [(rng.choice(PHRASES),), (rng.choice(PHRASES),), (_sentence(rng),), (rng.choice(PALINDROMES),)]
    else:
        name, desc = "is_palindrome", "returns whether the word reads the same backwards, ignoring case"
        source = "def is_palindrome(word):\n    word = word.lower()\n    return word == word[::-1]\n"
        bugs = [Bug("    word = word.lower()\n", "", "A capital first letter breaks the comparison: lower it first.")]
        ref = lambda w: w.lower() == w.lower()[::-1]  # noqa: E731
        inputs = [(rng.choice([p for p in PALINDROMES if p[0].isupper()]),), (rng.choice(PALINDROMES),),
                  (rng.choice(WORDS),), (rng.choice(WORDS),)]
    return CodeTask("palindrome", name, "text" if phrase else "word", desc, source, bugs, _cases(ref, inputs, rng))


KINDS: dict[str, Callable[[random.Random], CodeTask]] = {
    "sum_powers": _sum_powers, "count_in_text": _count_in_text, "words": _words, "clamp": _clamp,
    "fizzbuzz": _fizzbuzz, "running": _running, "compare": _compare, "digits": _digits, "sequence": _sequence,
    "lists": _lists, "palindrome": _palindrome,
}


def draw_task(rng: random.Random) -> CodeTask:
    """One task of a kind chosen uniformly, its parameters and test inputs drawn from `rng`."""
    return KINDS[rng.choice(sorted(KINDS))](rng)
