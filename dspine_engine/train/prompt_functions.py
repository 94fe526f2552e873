"""The `pyfunc` family: complete a small self-contained Python function given its signature and
docstring, the shape of our HumanEval prompts ("Complete the following Python function." and the
code in a fenced block), over tasks written for this project.

The `code` family's completions show third-party library functions: long reference docstrings,
methods inside classes, library state. The target answers those with library-shaped code, not
with the short algorithmic bodies HumanEval asks for; these tasks (list, string, number,
dictionary and grid problems) fill that gap. Each task is a `FunctionTask`: a signature, a few
phrasings of what it does, a reference solution and a generator of example inputs. The reference
only computes the docstring's examples (so they are right); the answers are the target's.
Every (operation, predicate) pair, over integers or words, and every other task is one
`Template`, the unit the held-out split reserves. No evaluation set was consulted.
"""
from __future__ import annotations

import itertools
import math
import random
import re
import textwrap
from dataclasses import dataclass
from typing import Callable

from .prompt_code import HUMANEVAL_HEAD, _fence
from .prompt_templates import FAMILIES, Template

FAMILY = "pyfunc"
_VOCAB = ("apple", "river", "stone", "piano", "tiger", "cloud", "lemon", "orbit", "candle",
          "garden", "bridge", "pepper", "rocket", "violet", "window", "ocean", "forest", "marble",
          "anchor", "butter", "castle", "dragon", "eagle", "falcon", "ginger", "harbor", "island",
          "jungle", "kettle", "ladder", "meadow", "nickel", "olive", "parrot", "quartz", "ribbon",
          "saddle", "tunnel", "umbrella", "valley", "walnut", "yogurt", "zebra", "cat", "dog",
          "sun", "map", "ink", "owl", "tea", "arc", "elm", "bee", "level", "noon", "radar",
          "stats", "refer", "kayak")
_TYPING = ("List", "Tuple", "Dict", "Optional", "Set")


@dataclass(frozen=True)
class FunctionTask:
    key: str  # template name within the family
    names: tuple[str, ...]  # function names ({consts} allowed)
    params: str  # "numbers: List[int], k: int" (typing names; see _types)
    returns: str
    says: tuple[str, ...]  # docstring descriptions ({consts} allowed)
    solve: Callable  # (consts, *args) -> result
    args: Callable  # (r, consts) -> tuple of arguments for one example
    consts: Callable = lambda r: {}  # (r) -> constants baked into the task


# ------------------------------------------------------------------------------ inputs
def _ints(r, lo=-9, hi=40, most=8, least=0):
    return [r.randint(lo, hi) for _ in range(r.randint(least, most))]


def _words(r, most=6, least=0):
    return [r.choice(_VOCAB) for _ in range(r.randint(least, most))]


def _sentence(r, least=1):
    return " ".join(_words(r, 7, least))


def _mixed_text(r):
    pieces = [r.choice(_VOCAB).capitalize() if r.random() < 0.3 else r.choice(_VOCAB)
              for _ in range(r.randint(1, 5))]
    pieces += [str(r.randint(0, 99)) for _ in range(r.randint(0, 2))]
    r.shuffle(pieces)
    return r.choice([" ", ", ", "! ", " - "]).join(pieces)


def _grid(r, square=False):
    rows = r.randint(1, 4)
    cols = rows if square else r.randint(1, 4)
    return [[r.randint(-5, 9) for _ in range(cols)] for _ in range(rows)]


def _counts(r):
    return {w: r.randint(0, 20) for w in _words(r, 5)}


def _sorted_ints(r):
    return sorted(_ints(r, -5, 30, 6))


# ------------------------------------------------------------------------------ helpers
def _is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))


def _digits(n: int) -> list[int]:
    return [int(c) for c in str(abs(n))]


def _runs(seq) -> list[int]:
    return [len(list(g)) for _, g in itertools.groupby(seq)]


def _increasing_run(xs) -> int:
    best = cur = 1 if xs else 0
    for a, b in zip(xs, xs[1:]):
        cur = cur + 1 if b > a else 1
        best = max(best, cur)
    return best


def _rle(s: str) -> str:
    return "".join(f"{ch}{len(list(g))}" for ch, g in itertools.groupby(s))


def _rle_decode(s: str) -> str:
    return "".join(ch * int(n) for ch, n in re.findall(r"([a-z])(\d+)", s))


def _caesar(s: str, k: int) -> str:
    def shift(c):
        if not c.isalpha() or not c.isascii():
            return c
        base = ord("A") if c.isupper() else ord("a")
        return chr((ord(c) - base + k) % 26 + base)
    return "".join(map(shift, s))


def _alternate_case(s: str) -> str:
    out, upper = [], True
    for c in s:
        if c.isalpha():
            out.append(c.upper() if upper else c.lower())
            upper = not upper
        else:
            out.append(c)
    return "".join(out)


def _balanced(s: str) -> bool:
    stack, pairs = [], {")": "(", "]": "[", "}": "{"}
    for c in s:
        if c in "([{":
            stack.append(c)
        elif c in pairs:
            if not stack or stack.pop() != pairs[c]:
                return False
    return not stack


def _brackets(r):
    s = "".join(r.choice("()[]{}") for _ in range(r.randint(0, 8)))
    if r.random() < 0.5:  # a balanced one half the time
        s = "".join(r.choice(["()", "[]", "{}", "([])", "{()}", "[{}]"]) for _ in range(
            r.randint(1, 3)))
    return s


def _nth_prime(n: int) -> int:
    return next(itertools.islice((p for p in itertools.count(2) if _is_prime(p)), n - 1, None))


def _fibonacci(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _collatz(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def _to_base(n: int, b: int) -> str:
    out = ""
    while n:
        n, d = divmod(n, b)
        out = str(d) + out
    return out or "0"


def _median(xs):
    s, n = sorted(xs), len(xs)
    return float(s[n // 2]) if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _majority(xs):
    for x in xs:
        if xs.count(x) * 2 > len(xs):
            return x
    return None


def _missing(r):
    n = r.randint(1, 9)
    xs = list(range(n + 1))
    xs.remove(r.choice(xs))
    r.shuffle(xs)
    return (xs,)


def _merge(a, b):
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out + a[i:] + b[j:]


def _interleave(a, b):
    out = [x for pair in zip(a, b) for x in pair]
    return out + a[len(b):] + b[len(a):]


def _normalise(xs):
    lo, hi = min(xs), max(xs)
    return [0.0] * len(xs) if hi == lo else [round((x - lo) / (hi - lo), 2) for x in xs]


def _rotate_clockwise(m):
    return [list(row) for row in zip(*m[::-1])]


def _diag(m):
    n = len(m)
    return sum(m[i][i] + m[i][n - 1 - i] for i in range(n)) - (m[n // 2][n // 2] if n % 2 else 0)


def _first_unique(s):
    return next((i for i, c in enumerate(s) if s.count(c) == 1), -1)


def _most_common_word(s):
    words = s.lower().split()
    return max(words, key=lambda w: (words.count(w), -words.index(w))) if words else ""


def _key_of_max(d):
    return min(d, key=lambda k: (-d[k], k)) if d else None


def _invert(d):
    out = {}
    for k in sorted(d):
        out.setdefault(d[k], []).append(k)
    return dict(sorted(out.items()))


def _totals(pairs):
    out = {}
    for name, amount in pairs:
        out[name] = out.get(name, 0) + amount
    return out


def _name_amounts(r):
    return ([(r.choice(("ana", "ben", "chen", "dara", "eli")), r.randint(1, 50))
             for _ in range(r.randint(0, 6))],)


def _camel(s):
    head, *rest = s.split("_")
    return head + "".join(w.capitalize() for w in rest)


def _snake(s):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", s).lower()


def _identifier(r):
    return "_".join(_words(r, 4, 1))


# ------------------------------------------------------------------------------ predicates
# key: (name part, singular "a number that ...", plural "numbers that ...", test, constants)
PREDICATES = {
    "even": ("even", "is even", "are even", lambda c, x: x % 2 == 0, None),
    "odd": ("odd", "is odd", "are odd", lambda c, x: x % 2 == 1, None),
    "positive": ("positive", "is positive", "are positive", lambda c, x: x > 0, None),
    "negative": ("negative", "is negative", "are negative", lambda c, x: x < 0, None),
    "above": ("above_{t}", "is greater than {t}", "are greater than {t}",
              lambda c, x: x > c["t"], lambda r: {"t": r.randint(0, 25)}),
    "multiple": ("multiples_of_{k}", "is divisible by {k}", "are divisible by {k}",
                 lambda c, x: x % c["k"] == 0, lambda r: {"k": r.randint(3, 9)}),
    "prime": ("primes", "is a prime number", "are prime numbers", lambda c, x: _is_prime(x),
              None),
    "square": ("squares", "is a perfect square", "are perfect squares",
               lambda c, x: x >= 0 and int(x ** 0.5) ** 2 == x, None),
    "between": ("in_range", "lies between {lo} and {hi} inclusive",
                "lie between {lo} and {hi} inclusive", lambda c, x: c["lo"] <= x <= c["hi"],
                lambda r: dict(zip(("lo", "hi"), sorted(r.sample(range(-5, 30), 2))))),
    "digit_sum": ("even_digit_sum", "has an even digit sum", "have an even digit sum",
                  lambda c, x: sum(_digits(x)) % 2 == 0, None),
    "last_digit": ("ending_in_{d}", "ends in the digit {d}", "end in the digit {d}",
                   lambda c, x: abs(x) % 10 == c["d"], lambda r: {"d": r.randint(0, 9)}),
}

# The same over a list of words (key: name part, singular, plural, test, constants).
WORD_PREDICATES = {
    "w_long": ("longer_than_{k}", "has more than {k} letters", "have more than {k} letters",
               lambda c, w: len(w) > c["k"], lambda r: {"k": r.randint(3, 6)}),
    "w_vowel": ("vowel_initial", "starts with a vowel", "start with a vowel",
                lambda c, w: w[:1].lower() in ("a", "e", "i", "o", "u"), None),
    "w_palindrome": ("palindromes", "reads the same backwards", "read the same backwards",
                     lambda c, w: w.lower() == w[::-1].lower(), None),
    "w_contains": ("containing_{ch}", "contains the letter {ch}", "contain the letter {ch}",
                   lambda c, w: c["ch"] in w.lower(), lambda r: {"ch": r.choice("aeiort")}),
    "w_ends": ("ending_with_{ch}", "ends with the letter {ch}", "end with the letter {ch}",
               lambda c, w: w.lower().endswith(c["ch"]), lambda r: {"ch": r.choice("eknrst")}),
    "w_double": ("with_double_letters", "has the same letter twice in a row",
                 "have the same letter twice in a row",
                 lambda c, w: any(a == b for a, b in zip(w, w[1:])), None),
    "w_capital": ("capitalised", "starts with a capital letter", "start with a capital letter",
                  lambda c, w: w[:1].isupper(), None),
}
NUMBER_ONLY_OPS = ("sum", "max")

# op: (names, returns, phrasings over {sing}/{plural}, solve(test, xs)); the phrasings say
# "numbers"/"number"/"integers", which a word task replaces by "words"/"word"/"words".
PREDICATE_OPS = {
    "filter": (("keep_{part}", "filter_{part}", "select_{part}"), "List[int]",
               ("Return the numbers in the list that {plural}, in their original order.",
                "Given a list of integers, return a new list with only the numbers that "
                "{plural}."),
               lambda t, xs: [x for x in xs if t(x)]),
    "count": (("count_{part}", "how_many_{part}", "num_{part}"), "int",
              ("Return how many numbers in the list {plural}.",
               "Count the elements of the list that {plural}."),
              lambda t, xs: sum(1 for x in xs if t(x))),
    "sum": (("sum_{part}", "total_of_{part}"), "int",
            ("Return the sum of the numbers that {plural}. If there are none, return 0.",
             "Add up every element of the list that {sing} and return the total."),
            lambda t, xs: sum(x for x in xs if t(x))),
    "first": (("first_{part}", "find_first_{part}"), "Optional[int]",
              ("Return the first number in the list that {sing}, or None if there is none.",
               "Scan the list from the left and return the first element that {sing}. Return "
               "None when no element does."),
              lambda t, xs: next((x for x in xs if t(x)), None)),
    "last_index": (("last_index_{part}", "rindex_{part}"), "int",
                   ("Return the index of the last number that {sing}, or -1 if no number does.",),
                   lambda t, xs: max((i for i, x in enumerate(xs) if t(x)), default=-1)),
    "all": (("all_{part}", "only_{part}"), "bool",
            ("Return True if every number in the list {sing}, and False otherwise. An empty "
             "list gives True.",
             "Check whether all the numbers {plural}."),
            lambda t, xs: all(t(x) for x in xs)),
    "any": (("any_{part}", "has_{part}", "contains_{part}"), "bool",
            ("Return True if at least one number in the list {sing}.",
             "Return whether the list contains a number that {sing}."),
            lambda t, xs: any(t(x) for x in xs)),
    "remove": (("drop_{part}", "remove_{part}", "without_{part}"), "List[int]",
               ("Return a copy of the list without the numbers that {plural}.",
                "Remove every element that {sing} and return what is left, in order."),
               lambda t, xs: [x for x in xs if not t(x)]),
    "max": (("largest_{part}", "max_{part}"), "Optional[int]",
            ("Return the largest number that {sing}, or None if there is none.",),
            lambda t, xs: max((x for x in xs if t(x)), default=None)),
    "partition": (("split_{part}", "partition_{part}"), "Tuple[List[int], List[int]]",
                  ("Split the list into two lists: the numbers that {plural} and all the "
                   "others, both in their original order. Return them as a tuple.",),
                  lambda t, xs: ([x for x in xs if t(x)], [x for x in xs if not t(x)])),
}


def _predicate_task(op: str, pred: str, words: bool = False) -> FunctionTask:
    names, returns, says, solve = PREDICATE_OPS[op]
    part, sing, plural, test, consts = (WORD_PREDICATES if words else PREDICATES)[pred]
    item, element = ("word", "str") if words else ("number", "int")
    if words:
        says = tuple(x.replace("numbers", "words").replace("number", "word").replace(
            "integers", "words") for x in says)
        returns = returns.replace("[int]", "[str]")
    return FunctionTask(
        key=f"{op}_{pred}", names=tuple(n.replace("{part}", part) for n in names),
        params=f"{item}s: List[{element}]", returns=returns,
        says=tuple(x.format(sing=sing, plural=plural) for x in says),
        solve=lambda c, xs: solve(lambda x: test(c, x), xs),
        args=(lambda r, c: ([w.capitalize() if r.random() < 0.3 else w for w in _words(r, 7)],))
        if words else (lambda r, c: (_ints(r, -9, 60),)),
        consts=consts or (lambda r: {}))


# ------------------------------------------------------------------------------ other tasks
def _ints1(r, c):
    return (_ints(r),)


def _words1(r, c):
    return (_words(r),)


def _sentence1(r, c):
    return (_sentence(r),)


def _text1(r, c):
    return (_mixed_text(r),)


def _nat1(lo, hi):
    return lambda r, c: (r.randint(lo, hi),)


_CHAR_CLASSES = {"vowels": ("vowels (a, e, i, o and u, in either case)",
                            lambda ch: ch.lower() in "aeiou"),
                 "consonants": ("consonants (letters other than a, e, i, o and u)",
                                lambda ch: ch.isalpha() and ch.lower() not in "aeiou"),
                 "uppercase": ("upper-case letters", str.isupper),
                 "digits": ("decimal digits", str.isdigit),
                 "spaces": ("spaces", lambda ch: ch == " ")}

TASKS = [
    # ---- lists
    FunctionTask("running_sum", ("running_sum", "prefix_sums", "cumulative_sum"),
                 "numbers: List[int]", "List[int]",
                 ("Return a list whose i-th element is the sum of the first i + 1 numbers.",
                  "Return the running totals of the list."),
                 lambda c, xs: list(itertools.accumulate(xs)), _ints1),
    FunctionTask("differences", ("differences", "pairwise_diffs", "deltas"),
                 "numbers: List[int]", "List[int]",
                 ("Return the difference between each number and the one before it; a list of "
                  "n numbers gives n - 1 differences.",),
                 lambda c, xs: [b - a for a, b in zip(xs, xs[1:])], _ints1),
    FunctionTask("rotate", ("rotate_right", "rotate"), "items: List[int], k: int", "List[int]",
                 ("Rotate the list to the right by k positions and return the result. k may be "
                  "larger than the length of the list.",),
                 lambda c, xs, k: xs[-(k % len(xs)):] + xs[:-(k % len(xs))] if xs and k % len(
                     xs) else list(xs),
                 lambda r, c: (_ints(r, 0, 9), r.randint(0, 10))),
    FunctionTask("chunks", ("chunks", "split_into_chunks", "batched"),
                 "items: List[int], size: int", "List[List[int]]",
                 ("Split the list into consecutive chunks of the given size; the last chunk may "
                  "be shorter.",),
                 lambda c, xs, n: [xs[i:i + n] for i in range(0, len(xs), n)],
                 lambda r, c: (_ints(r, 0, 9), r.randint(1, 4))),
    FunctionTask("dedupe", ("unique_in_order", "dedupe", "remove_duplicates"),
                 "items: List[int]", "List[int]",
                 ("Remove repeated values, keeping the first occurrence of each, and return the "
                  "result in the original order.",),
                 lambda c, xs: list(dict.fromkeys(xs)), lambda r, c: (_ints(r, 0, 6, 9),)),
    FunctionTask("moving_average", ("moving_average", "rolling_mean"),
                 "numbers: List[float], window: int", "List[float]",
                 ("Return the average of every run of `window` consecutive numbers, rounded to "
                  "two decimal places.",),
                 lambda c, xs, w: [round(sum(xs[i:i + w]) / w, 2) for i in range(len(xs) - w + 1)],
                 lambda r, c: (_ints(r, 0, 20, 7, 1), r.randint(1, 3))),
    FunctionTask("second_largest", ("second_largest", "runner_up"),
                 "numbers: List[int]", "Optional[int]",
                 ("Return the second largest distinct value in the list, or None if the list "
                  "has fewer than two distinct values.",),
                 lambda c, xs: sorted(set(xs))[-2] if len(set(xs)) > 1 else None, _ints1),
    FunctionTask("top_k", ("top_k", "largest_k", "k_largest"), "numbers: List[int], k: int",
                 "List[int]",
                 ("Return the k largest numbers of the list in descending order (all of them "
                  "when the list is shorter than k).",),
                 lambda c, xs, k: sorted(xs, reverse=True)[:k],
                 lambda r, c: (_ints(r), r.randint(1, 4))),
    FunctionTask("clamp", ("clamp_all", "clip_values", "clamp"),
                 "numbers: List[int], low: int, high: int", "List[int]",
                 ("Return a copy of the list in which values below `low` become `low` and "
                  "values above `high` become `high`.",),
                 lambda c, xs, lo, hi: [min(max(x, lo), hi) for x in xs],
                 lambda r, c: (_ints(r), *sorted(r.sample(range(-5, 30), 2)))),
    FunctionTask("interleave", ("interleave", "alternate_merge", "zip_alternately"),
                 "first: List[int], second: List[int]", "List[int]",
                 ("Merge two lists by taking elements alternately, starting with the first "
                  "list; when one list runs out, append the rest of the other.",),
                 lambda c, a, b: _interleave(a, b),
                 lambda r, c: (_ints(r, 0, 9, 4), _ints(r, 10, 19, 4))),
    FunctionTask("pair_sums", ("count_pairs_with_sum", "pairs_summing_to"),
                 "numbers: List[int], target: int", "int",
                 ("Count the pairs of positions i < j such that numbers[i] + numbers[j] equals "
                  "target.",),
                 lambda c, xs, t: sum(1 for a, b in itertools.combinations(xs, 2) if a + b == t),
                 lambda r, c: (_ints(r, 0, 9), r.randint(3, 14))),
    FunctionTask("increasing_run", ("longest_increasing_run", "longest_rising_stretch"),
                 "numbers: List[int]", "int",
                 ("Return the length of the longest run of consecutive elements that strictly "
                  "increase. An empty list gives 0.",),
                 lambda c, xs: _increasing_run(xs), lambda r, c: (_ints(r, 0, 9, 9),)),
    FunctionTask("streak", ("longest_streak", "longest_repeat"), "items: List[int]", "int",
                 ("Return the length of the longest stretch of equal adjacent values (0 for an "
                  "empty list).",),
                 lambda c, xs: max(_runs(xs), default=0), lambda r, c: (_ints(r, 0, 3, 9),)),
    FunctionTask("flatten", ("flatten", "concat_lists"), "nested: List[List[int]]", "List[int]",
                 ("Flatten a list of lists into a single list, keeping the order.",),
                 lambda c, m: [x for row in m for x in row], lambda r, c: (_grid(r),)),
    FunctionTask("occurrences", ("count_occurrences", "tally", "word_counts"),
                 "items: List[str]", "Dict[str, int]",
                 ("Count how many times each string occurs and return a dictionary from each "
                  "string to its count, in order of first appearance.",),
                 lambda c, xs: {x: xs.count(x) for x in dict.fromkeys(xs)}, _words1),
    FunctionTask("median", ("median",), "numbers: List[int]", "float",
                 ("Return the median of a non-empty list of numbers; with an even count, the "
                  "mean of the two middle values.",),
                 lambda c, xs: _median(xs), lambda r, c: (_ints(r, -9, 40, 7, 1),)),
    FunctionTask("spread", ("spread", "value_range", "max_minus_min"), "numbers: List[int]",
                 "int",
                 ("Return the difference between the largest and the smallest number, or 0 "
                  "for an empty list.",),
                 lambda c, xs: max(xs) - min(xs) if xs else 0, _ints1),
    FunctionTask("normalise", ("normalize", "rescale_unit", "min_max_scale"),
                 "numbers: List[float]", "List[float]",
                 ("Scale the numbers linearly so that the smallest becomes 0.0 and the largest "
                  "1.0, rounded to two decimals. If all the numbers are equal, return zeros.",),
                 lambda c, xs: _normalise(xs), lambda r, c: (_ints(r, 0, 20, 6, 1),)),
    FunctionTask("cumulative_max", ("cumulative_max", "running_max"), "numbers: List[int]",
                 "List[int]",
                 ("Return a list whose i-th element is the largest of the first i + 1 "
                  "elements.",),
                 lambda c, xs: list(itertools.accumulate(xs, max)), _ints1),
    FunctionTask("alternating_sum", ("alternating_sum", "even_minus_odd_positions"),
                 "numbers: List[int]", "int",
                 ("Return the sum of the elements at even positions minus the sum of those at "
                  "odd positions; positions start at 0.",),
                 lambda c, xs: sum(xs[::2]) - sum(xs[1::2]), _ints1),
    FunctionTask("majority", ("majority_element", "dominant_value"), "items: List[int]",
                 "Optional[int]",
                 ("Return the value that occurs in more than half of the positions of the list, "
                  "or None if no value does.",),
                 lambda c, xs: _majority(xs), lambda r, c: (_ints(r, 0, 2, 7),)),
    FunctionTask("missing", ("missing_number", "find_missing"), "numbers: List[int]", "int",
                 ("The list holds distinct integers from 0 to n with exactly one of them "
                  "missing, in any order. Return the missing number.",),
                 lambda c, xs: sum(range(len(xs) + 1)) - sum(xs), lambda r, c: _missing(r)),
    FunctionTask("merge_sorted", ("merge_sorted", "merge_two_sorted"),
                 "first: List[int], second: List[int]", "List[int]",
                 ("Merge two sorted lists into one sorted list without calling sort or "
                  "sorted.",),
                 lambda c, a, b: _merge(a, b), lambda r, c: (_sorted_ints(r), _sorted_ints(r))),
    FunctionTask("argmax", ("index_of_max", "argmax"), "numbers: List[int]", "int",
                 ("Return the index of the first occurrence of the largest value, or -1 for an "
                  "empty list.",),
                 lambda c, xs: xs.index(max(xs)) if xs else -1, _ints1),
    FunctionTask("sort_abs", ("sort_by_magnitude", "sort_by_abs"), "numbers: List[int]",
                 "List[int]",
                 ("Sort the numbers by absolute value; numbers with the same absolute value keep "
                  "their relative order.",),
                 lambda c, xs: sorted(xs, key=abs), lambda r, c: (_ints(r, -9, 9),)),
    # ---- strings
    FunctionTask("count_chars", ("count_{cls}", "number_of_{cls}"), "text: str", "int",
                 ("Return the number of {what} in the string.",
                  "Count the {what} that occur in text."),
                 lambda c, s: sum(1 for ch in s if _CHAR_CLASSES[c["cls"]][1](ch)), _text1,
                 lambda r: (lambda k: {"cls": k, "what": _CHAR_CLASSES[k][0]})(
                     r.choice(sorted(_CHAR_CLASSES)))),
    FunctionTask("reverse_words", ("reverse_words", "reverse_word_order"), "sentence: str",
                 "str",
                 ("Return the sentence with the order of its words reversed. Words are "
                  "separated by single spaces.",),
                 lambda c, s: " ".join(s.split(" ")[::-1]), _sentence1),
    FunctionTask("title_case", ("capitalize_words", "to_title_case"), "sentence: str", "str",
                 ("Capitalise the first letter of every word and lower-case the rest of it; "
                  "words are separated by single spaces.",),
                 lambda c, s: " ".join(w[:1].upper() + w[1:].lower() for w in s.split(" ")),
                 lambda r, c: (" ".join(w.upper() if r.random() < 0.3 else w
                                        for w in _words(r, 5, 1)),)),
    FunctionTask("palindrome", ("is_palindrome_phrase", "reads_same_backwards"), "text: str",
                 "bool",
                 ("Return True if the string reads the same forwards and backwards when case "
                  "and every character that is not a letter or a digit are ignored.",),
                 lambda c, s: (lambda t: t == t[::-1])([ch.lower() for ch in s if ch.isalnum()]),
                 lambda r, c: (r.choice([_mixed_text(r), r.choice(_VOCAB[-6:]).capitalize(),
                                         "No lemon, no melon", "Was it a rat I saw?"]),)),
    FunctionTask("longest_word", ("longest_word",), "sentence: str", "str",
                 ("Return the longest word of the sentence; if several words share the greatest "
                  "length, return the first of them. An empty sentence gives ''.",),
                 lambda c, s: max(s.split(), key=len, default=""), _sentence1),
    FunctionTask("rle", ("run_length_encode", "rle_encode"), "text: str", "str",
                 ("Encode the string with run-length encoding: each run of one repeated "
                  "character becomes the character followed by the length of the run.",),
                 lambda c, s: _rle(s),
                 lambda r, c: ("".join(r.choice("abc") * r.randint(1, 4)
                                       for _ in range(r.randint(0, 4))),)),
    FunctionTask("rle_decode", ("run_length_decode", "rle_decode"), "encoded: str", "str",
                 ("Decode a run-length encoded string, in which each lower-case letter is "
                  "followed by how many times it repeats (the count may have several "
                  "digits).",),
                 lambda c, s: _rle_decode(s),
                 lambda r, c: ("".join(f"{r.choice('xyz')}{r.randint(1, 12)}"
                                       for _ in range(r.randint(0, 3))),)),
    FunctionTask("caesar", ("caesar_shift", "shift_letters", "rotate_letters"),
                 "text: str, shift: int", "str",
                 ("Shift every letter `shift` places forward in the alphabet, wrapping around "
                  "from z to a and keeping its case; other characters stay as they are.",),
                 lambda c, s, k: _caesar(s, k), lambda r, c: (_mixed_text(r), r.randint(1, 25))),
    FunctionTask("count_overlapping", ("count_overlapping", "occurrences_of"),
                 "text: str, pattern: str", "int",
                 ("Count how many times pattern occurs in text, overlapping occurrences "
                  "included. pattern is never empty.",),
                 lambda c, s, p: sum(1 for i in range(len(s)) if s.startswith(p, i)),
                 lambda r, c: ("".join(r.choice("ab") for _ in range(r.randint(0, 9))),
                               r.choice(["a", "ab", "aa", "aba", "bb"]))),
    FunctionTask("alternate_case", ("alternate_case", "sponge_case"), "text: str", "str",
                 ("Return the string with its letters alternating between upper and lower "
                  "case, starting with upper case; other characters are kept and do not count.",),
                 lambda c, s: _alternate_case(s), _text1),
    FunctionTask("anagram", ("are_anagrams", "is_anagram"), "first: str, second: str", "bool",
                 ("Return True if the two words are anagrams of each other, ignoring case.",),
                 lambda c, a, b: sorted(a.lower()) == sorted(b.lower()),
                 lambda r, c: (lambda w: (w, r.choice([w[::-1].upper(), "".join(
                     r.sample(w, len(w))), r.choice(_VOCAB)])))(r.choice(_VOCAB))),
    FunctionTask("first_unique", ("first_unique_index", "first_non_repeating"), "text: str",
                 "int",
                 ("Return the index of the first character that occurs exactly once in the "
                  "string, or -1 if there is none.",),
                 lambda c, s: _first_unique(s),
                 lambda r, c: ("".join(r.choice("abcd") for _ in range(r.randint(0, 7))),)),
    FunctionTask("acronym", ("acronym", "initials"), "phrase: str", "str",
                 ("Return the acronym of the phrase: the first letter of each word, in upper "
                  "case.",),
                 lambda c, s: "".join(w[0].upper() for w in s.split()), _sentence1),
    FunctionTask("snake_to_camel", ("snake_to_camel", "to_camel_case"), "name: str", "str",
                 ("Convert a snake_case identifier to camelCase.",),
                 lambda c, s: _camel(s), lambda r, c: (_identifier(r),)),
    FunctionTask("camel_to_snake", ("camel_to_snake", "to_snake_case"), "name: str", "str",
                 ("Convert a camelCase identifier to snake_case.",),
                 lambda c, s: _snake(s), lambda r, c: (_camel(_identifier(r)),)),
    FunctionTask("brackets", ("balanced_brackets", "is_balanced", "brackets_match"),
                 "text: str", "bool",
                 ("Return True if every bracket of the kinds (), [] and {{}} in the string is "
                  "closed by the matching bracket in the right order.",),
                 lambda c, s: _balanced(s), lambda r, c: (_brackets(r),)),
    FunctionTask("long_words", ("words_longer_than", "long_words"), "sentence: str, n: int",
                 "List[str]",
                 ("Return the words of the sentence that have more than n letters, in order.",),
                 lambda c, s, n: [w for w in s.split() if len(w) > n],
                 lambda r, c: (_sentence(r), r.randint(2, 6))),
    FunctionTask("prefix", ("with_prefix", "starting_with", "filter_by_prefix"),
                 "words: List[str], prefix: str", "List[str]",
                 ("Return the words that start with the given prefix, in their original "
                  "order.",),
                 lambda c, ws, p: [w for w in ws if w.startswith(p)],
                 lambda r, c: (_words(r, 7), r.choice("abcdmprst"))),
    FunctionTask("sort_length", ("sort_by_length", "order_by_length"), "words: List[str]",
                 "List[str]",
                 ("Sort the words by length, and words of the same length alphabetically.",),
                 lambda c, ws: sorted(ws, key=lambda w: (len(w), w)), _words1),
    FunctionTask("letter_counts", ("letter_histogram", "letter_frequencies"), "text: str",
                 "Dict[str, int]",
                 ("Count each letter of the text, ignoring case and every other character, and "
                  "return a dictionary from lower-case letter to count, in alphabetical "
                  "order.",),
                 lambda c, s: {ch: s.lower().count(ch) for ch in sorted(set(s.lower()))
                               if ch.isalpha()}, lambda r, c: (_mixed_text(r)[:14],)),
    FunctionTask("remove_vowels", ("remove_vowels", "strip_vowels", "disemvowel"), "text: str",
                 "str",
                 ("Return the text with every vowel (a, e, i, o, u, in either case) removed.",),
                 lambda c, s: "".join(ch for ch in s if ch.lower() not in "aeiou"), _text1),
    FunctionTask("common_word", ("most_common_word", "most_frequent_word"), "sentence: str",
                 "str",
                 ("Return the word that occurs most often in the sentence, ignoring case, in "
                  "lower case; a tie goes to the word that appears first. An empty sentence "
                  "gives ''.",),
                 lambda c, s: _most_common_word(s),
                 lambda r, c: (" ".join(w.capitalize() if r.random() < 0.2 else w
                                        for w in (lambda ws: ws + r.sample(ws, min(2, len(ws))))(
                                            _words(r, 5, 1))),)),
    FunctionTask("squeeze", ("squeeze_spaces", "normalize_whitespace"), "text: str", "str",
                 ("Replace every run of whitespace by a single space and remove the whitespace "
                  "at both ends.",),
                 lambda c, s: " ".join(s.split()),
                 lambda r, c: ("".join(w + r.choice([" ", "  ", "\t", " \n "])
                                       for w in _words(r, 4, 1)),)),
    FunctionTask("mask", ("mask_all_but_last", "mask_secret"), "text: str, keep: int", "str",
                 ("Replace every character except the last `keep` ones by '#'.",),
                 lambda c, s, k: "#" * max(0, len(s) - k) + s[max(0, len(s) - k):],
                 lambda r, c: ("".join(r.choice("0123456789") for _ in range(r.randint(0, 12))),
                               r.randint(0, 4))),
    # ---- numbers
    FunctionTask("digit_sum", ("digit_sum", "sum_of_digits"), "n: int", "int",
                 ("Return the sum of the decimal digits of n (the sign is ignored).",),
                 lambda c, n: sum(_digits(n)), _nat1(-999, 99999)),
    FunctionTask("digit_product", ("digit_product", "product_of_digits"), "n: int", "int",
                 ("Return the product of the decimal digits of the non-negative integer n.",),
                 lambda c, n: math.prod(_digits(n)), _nat1(0, 9999)),
    FunctionTask("reverse_digits", ("reverse_digits", "reverse_number"), "n: int", "int",
                 ("Return the integer whose digits are those of n in reverse order, keeping the "
                  "sign of n.",),
                 lambda c, n: (-1 if n < 0 else 1) * int(str(abs(n))[::-1]), _nat1(-9999, 9999)),
    FunctionTask("is_prime", ("is_prime", "check_prime"), "n: int", "bool",
                 ("Return True if n is a prime number and False otherwise.",),
                 lambda c, n: _is_prime(n), _nat1(-3, 120)),
    FunctionTask("nth_prime", ("nth_prime",), "n: int", "int",
                 ("Return the n-th prime number, counting 2 as the first (n >= 1).",),
                 lambda c, n: _nth_prime(n), _nat1(1, 30)),
    FunctionTask("gcd", ("gcd_of", "euclid_gcd"), "a: int, b: int", "int",
                 ("Return the greatest common divisor of two positive integers, using Euclid's "
                  "algorithm and no library function.",),
                 lambda c, a, b: math.gcd(a, b),
                 lambda r, c: (r.randint(1, 200), r.randint(1, 200))),
    FunctionTask("lcm", ("least_common_multiple", "lcm_of"), "a: int, b: int", "int",
                 ("Return the least common multiple of two positive integers.",),
                 lambda c, a, b: a * b // math.gcd(a, b),
                 lambda r, c: (r.randint(1, 40), r.randint(1, 40))),
    FunctionTask("fibonacci", ("fibonacci", "fib"), "n: int", "int",
                 ("Return the n-th Fibonacci number, where the sequence starts with 0 and 1 "
                  "(n >= 0).",),
                 lambda c, n: _fibonacci(n), _nat1(0, 30)),
    FunctionTask("collatz", ("collatz_steps", "steps_to_one"), "n: int", "int",
                 ("Return how many steps the Collatz process needs to reach 1 from the positive "
                  "integer n: halve an even number, and turn an odd number m into 3m + 1.",),
                 lambda c, n: _collatz(n), _nat1(1, 40)),
    FunctionTask("divisors", ("count_divisors", "num_divisors"), "n: int", "int",
                 ("Return how many positive integers divide the positive integer n.",),
                 lambda c, n: sum(1 for d in range(1, n + 1) if n % d == 0), _nat1(1, 120)),
    FunctionTask("perfect", ("is_perfect_number", "is_perfect"), "n: int", "bool",
                 ("Return True if the positive integer n equals the sum of its divisors other "
                  "than itself.",),
                 lambda c, n: sum(d for d in range(1, n) if n % d == 0) == n,
                 lambda r, c: (r.choice([6, 28, 496, r.randint(1, 100), r.randint(1, 100)]),)),
    FunctionTask("to_base", ("to_base", "convert_base", "in_base"), "n: int, base: int", "str",
                 ("Return the digits of the non-negative integer n written in the given base "
                  "(from 2 to 9) as a string.",),
                 lambda c, n, b: _to_base(n, b), lambda r, c: (r.randint(0, 300), r.randint(2, 9))),
    FunctionTask("set_bits", ("count_set_bits", "popcount", "ones_in_binary"), "n: int", "int",
                 ("Return how many 1s the binary representation of the non-negative integer n "
                  "has.",),
                 lambda c, n: bin(n).count("1"), _nat1(0, 1024)),
    FunctionTask("power_of", ("is_power_of", "is_exact_power"), "n: int, base: int", "bool",
                 ("Return True if n is a non-negative integer power of base (base >= 2), for "
                  "example 1 = base ** 0.",),
                 lambda c, n, b: n >= 1 and b ** round(math.log(n, b)) == n,
                 lambda r, c: (lambda b: (r.choice([b ** r.randint(0, 5), r.randint(1, 200)]),
                                          b))(r.randint(2, 5))),
    FunctionTask("multiples_below", ("sum_of_multiples", "sum_multiples_below"),
                 "limit: int, a: int, b: int", "int",
                 ("Return the sum of the natural numbers below limit that are multiples of a or "
                  "of b.",),
                 lambda c, n, a, b: sum(x for x in range(1, n) if x % a == 0 or x % b == 0),
                 lambda r, c: (r.randint(1, 60), r.randint(2, 7), r.randint(2, 7))),
    FunctionTask("count_primes", ("count_primes_below", "primes_under"), "n: int", "int",
                 ("Return how many prime numbers are smaller than n.",),
                 lambda c, n: sum(1 for k in range(n) if _is_prime(k)), _nat1(0, 100)),
    FunctionTask("isqrt", ("integer_sqrt", "floor_sqrt"), "n: int", "int",
                 ("Return the largest integer whose square is at most the non-negative integer "
                  "n, using integer arithmetic only.",),
                 lambda c, n: math.isqrt(n), _nat1(0, 2000)),
    FunctionTask("armstrong", ("is_armstrong", "is_narcissistic"), "n: int", "bool",
                 ("Return True if the non-negative integer n equals the sum of its digits each "
                  "raised to the power of the number of digits.",),
                 lambda c, n: sum(d ** len(str(n)) for d in _digits(n)) == n,
                 lambda r, c: (r.choice([153, 370, 9474, r.randint(0, 999), r.randint(0, 999)]),)),
    FunctionTask("digital_root", ("digital_root", "repeated_digit_sum"), "n: int", "int",
                 ("Add up the digits of the non-negative integer n, then the digits of the "
                  "result, and so on until one digit is left; return that digit.",),
                 lambda c, n: 0 if n == 0 else 1 + (n - 1) % 9, _nat1(0, 99999)),
    # ---- dictionaries and records
    FunctionTask("invert", ("invert_mapping", "group_keys_by_value"), "mapping: Dict[str, int]",
                 "Dict[int, List[str]]",
                 ("Invert the mapping: return a dictionary from each value to the sorted list of "
                  "the keys that have it, with the values in increasing order.",),
                 lambda c, d: _invert(d), lambda r, c: ({w: r.randint(0, 3)
                                                         for w in _words(r, 5)},)),
    FunctionTask("merge_counts", ("merge_counts", "add_counts"),
                 "first: Dict[str, int], second: Dict[str, int]", "Dict[str, int]",
                 ("Merge two dictionaries of counts, adding up the counts of keys present in "
                  "both, and return the result with its keys in sorted order.",),
                 lambda c, a, b: {k: a.get(k, 0) + b.get(k, 0) for k in sorted({*a, *b})},
                 lambda r, c: (_counts(r), _counts(r))),
    FunctionTask("group_first", ("group_by_first_letter", "index_by_initial"),
                 "words: List[str]", "Dict[str, List[str]]",
                 ("Group the words by their first letter: return a dictionary from each first "
                  "letter to the words that start with it, both in order of first "
                  "appearance.",),
                 lambda c, ws: {k: [w for w in ws if w[0] == k] for k in dict.fromkeys(
                     w[0] for w in ws)}, _words1),
    FunctionTask("key_of_max", ("best_key", "key_with_max_value", "top_scorer"),
                 "scores: Dict[str, int]", "Optional[str]",
                 ("Return the key with the largest value, or None for an empty dictionary; a "
                  "tie goes to the key that comes first alphabetically.",),
                 lambda c, d: _key_of_max(d), lambda r, c: (_counts(r),)),
    FunctionTask("at_least", ("at_least", "filter_scores"),
                 "scores: Dict[str, int], threshold: int", "Dict[str, int]",
                 ("Return the entries whose value is at least threshold, in their original "
                  "order.",),
                 lambda c, d, t: {k: v for k, v in d.items() if v >= t},
                 lambda r, c: (_counts(r), r.randint(3, 15))),
    FunctionTask("totals", ("totals_by_name", "sum_per_name"), "records: List[Tuple[str, int]]",
                 "Dict[str, int]",
                 ("Given (name, amount) pairs, return the total amount per name, in order of "
                  "first appearance.",),
                 lambda c, ps: _totals(ps), lambda r, c: _name_amounts(r)),
    # ---- grids
    FunctionTask("transpose", ("transpose",), "matrix: List[List[int]]", "List[List[int]]",
                 ("Return the transpose of a rectangular matrix given as a list of rows.",),
                 lambda c, m: [list(col) for col in zip(*m)], lambda r, c: (_grid(r),)),
    FunctionTask("row_sums", ("row_sums", "sum_each_row"), "matrix: List[List[int]]",
                 "List[int]", ("Return the sum of each row of the matrix.",),
                 lambda c, m: [sum(row) for row in m], lambda r, c: (_grid(r),)),
    FunctionTask("diagonals", ("diagonal_sum", "sum_of_diagonals"), "matrix: List[List[int]]",
                 "int",
                 ("Return the sum of both diagonals of a non-empty square matrix, counting the "
                  "centre once when the size is odd.",),
                 lambda c, m: _diag(m), lambda r, c: (_grid(r, square=True),)),
    FunctionTask("rotate_grid", ("rotate_clockwise", "rotate_matrix"),
                 "matrix: List[List[int]]", "List[List[int]]",
                 ("Rotate the rectangular matrix 90 degrees clockwise and return the new one.",),
                 lambda c, m: _rotate_clockwise(m), lambda r, c: (_grid(r),)),
    FunctionTask("column_max", ("column_maxima", "max_per_column"), "matrix: List[List[int]]",
                 "List[int]",
                 ("Return the largest value of each column of a non-empty rectangular "
                  "matrix.",),
                 lambda c, m: [max(col) for col in zip(*m)], lambda r, c: (_grid(r),)),
    FunctionTask("symmetric", ("is_symmetric",), "matrix: List[List[int]]", "bool",
                 ("Return True if the square matrix equals its transpose.",),
                 lambda c, m: all(m[i][j] == m[j][i] for i in range(len(m))
                                  for j in range(len(m))),
                 lambda r, c: (r.choice([_grid(r, square=True), [[1, 2], [2, 1]],
                                         [[0, 3, 4], [3, 1, 5], [4, 5, 2]]]),)),
    FunctionTask("count_cells", ("count_cells", "occurrences_in_grid"),
                 "grid: List[List[int]], value: int", "int",
                 ("Return how many cells of the grid hold the given value.",),
                 lambda c, m, v: sum(row.count(v) for row in m),
                 lambda r, c: ([[r.randint(0, 3) for _ in range(3)] for _ in range(
                     r.randint(1, 3))], r.randint(0, 3))),
]
TASKS += [_predicate_task(op, pred) for op in PREDICATE_OPS for pred in PREDICATES]
TASKS += [_predicate_task(op, pred, words=True) for op in PREDICATE_OPS if op not in NUMBER_ONLY_OPS
          for pred in WORD_PREDICATES]


# ------------------------------------------------------------------------------ the prompt
def _types(params: str, returns: str, r: random.Random) -> tuple[str, str, str]:
    """The signature's types in one of three styles: typing (with its import), built-in generics
    (`list[int]`, `X | None`), or no hints at all; and the import line."""
    style = r.choice(["typing", "typing", "builtin", "none"])
    if style == "none":
        return re.sub(r":\s*[^,]+(?=,|$)", "", _split_safe(params)), "", ""
    if style == "builtin":
        def builtin(t):
            t = re.sub(r"\b(List|Tuple|Dict|Set)\[", lambda m: m.group(1).lower() + "[", t)
            return re.sub(r"Optional\[(\w+)\]", r"\1 | None", t)
        return builtin(params), builtin(returns), ""
    used = [n for n in _TYPING if re.search(rf"\b{n}\[", params + returns)]
    return params, returns, f"from typing import {', '.join(used)}\n\n\n" if used else ""


def _split_safe(params: str) -> str:
    """Commas inside brackets hidden (so a regex can cut `a: Dict[str, int], b: int` at the
    top-level commas), then restored by the caller's substitution result."""
    depth, out = 0, []
    for ch in params:
        depth += ch == "["
        depth -= ch == "]"
        out.append("\0" if ch == "," and depth else ch)
    return "".join(out)


def _examples(task: FunctionTask, consts: dict, name: str, r: random.Random) -> list[str]:
    """Two to four example calls, chosen to show different results where the inputs allow
    (a boolean task shows both answers more often than chance would)."""
    candidates, seen_calls = [], set()
    for _ in range(8):
        args = task.args(r, consts)
        call = f"{name}({', '.join(map(repr, args))})"
        if call not in seen_calls:
            seen_calls.add(call)
            candidates.append((call, repr(task.solve(consts, *args))))
    distinct = list({out: (call, out) for call, out in reversed(candidates)}.values())[::-1]
    rest = [c for c in candidates if c not in distinct]
    chosen = set((distinct + rest)[:r.randint(2, 4)])
    calls = [c for c in candidates if c in chosen]
    style = r.choice(["doctest", "doctest", "doctest", "arrow", "equals", "none"])
    if style == "none":
        return []
    if style == "doctest":
        return [line for call, out in calls for line in (f">>> {call}", out)]
    if style == "arrow":
        return ["Examples:"] + [f"    {call} -> {out}" for call, out in calls]
    return ["For example:"] + [f"    {call} == {out}" for call, out in calls]


def function_code(task: FunctionTask, r: random.Random) -> tuple[str, str, str]:
    """(the import + signature + docstring, the signature, the description) of one instance."""
    consts = task.consts(r)
    name = r.choice(task.names).format(**consts)
    says = r.choice(task.says).format(**consts)
    params, returns, imports = _types(task.params, task.returns, r)
    params = params.replace("\0", ",")
    arrow = f" -> {returns}" if returns else ""
    signature = f"def {name}({params}){arrow}:"
    doc = textwrap.wrap(says, 76) + ([""] + ex if (ex := _examples(task, consts, name, r)) else [])
    body = "\n".join(f"    {line}" if line else "" for line in doc)
    quote = '"""' if r.random() < 0.8 else '""" '
    code = f'{imports}{signature}\n    {quote}{body.lstrip()}\n    """\n'
    return code, f"{name}({params}){arrow}", says


_HEADS = ("Implement the body of this Python function.", "Finish this function:",
          "Write the implementation of the function below.",
          "Fill in the code for this function so that it does what the docstring says.",
          "Complete the function below. Return only the code.")


def make_prompt(task: FunctionTask, r: random.Random) -> str:
    code, signature, says = function_code(task, r)
    roll = r.random()
    if roll < 0.65:
        return f"{HUMANEVAL_HEAD}\n\n{_fence(code)}"
    if roll < 0.85:
        return f"{r.choice(_HEADS)}\n\n{_fence(code)}"
    # In words, as a user would ask for it.
    return (f"Write a Python function `{signature}`. {says[0].upper()}{says[1:]}"
            + r.choice(["", " Include a docstring.", " Add a few doctest examples.",
                        " Explain your solution briefly after the code."]))


def _register() -> None:
    keys = [t.key for t in TASKS]
    assert len(keys) == len(set(keys)), "duplicate pyfunc task keys"
    for task in TASKS:
        FAMILIES.setdefault(FAMILY, []).append(
            Template(f"{FAMILY}.{task.key}", lambda r, task=task: make_prompt(task, r)))


_register()
