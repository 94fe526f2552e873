"""Code and documentation prompts built from `CodeItem`s (third-party docstrings and sources,
see prompt_sources.py): the task shapes a coding assistant is asked for, and explanation
questions about the libraries' modules, classes and terms.

Each shape is a function ``(item, rng) -> str | None`` (None: no prompt from this item, e.g. no
line to plant a bug in); `CODE_SHAPES` and `EXPLAIN_SHAPES` give each shape's share and which
items it can use. The completion shape is the one our
HumanEval evaluation sends (`datasets.humaneval_prompts`): "Complete the following Python
function." and the signature + docstring in a fenced block.
"""
from __future__ import annotations

import random
import re

from . import prompt_words as W
from .prompt_sources import CodeItem

HUMANEVAL_HEAD = "Complete the following Python function."
FENCED = re.compile(r"```python\n(.*?)```", re.S)  # the code a prompt shows


def _fence(code: str) -> str:
    return f"```python\n{code if code.endswith(chr(10)) else code + chr(10)}```"


def _third_person(summary: str) -> str | None:
    """"Return the sum of x." -> "returns the sum of x" (None when the summary does not start
    with an imperative or third-person verb we can recognise)."""
    words = summary.rstrip(".").split(" ", 1)
    if len(words) < 2 or not words[0].isalpha():
        return None
    verb, rest = words[0].lower(), words[1]
    if verb.endswith("s") and len(verb) > 3 and not verb.endswith("ss"):
        return f"{verb} {rest}"
    if verb in ("return", "compute", "calculate", "convert", "create", "get", "set", "check",
                "find", "build", "make", "load", "save", "read", "write", "parse", "apply",
                "generate", "evaluate", "test", "determine", "construct", "remove", "add",
                "update", "split", "sort", "count", "format", "validate", "normalize",
                "normalise", "transform", "estimate", "extract", "compare", "merge", "yield",
                "resolve", "encode", "decode", "fit", "plot", "draw", "open", "copy", "insert",
                "replace", "filter", "map", "reduce", "solve", "perform", "take", "turn", "give",
                "raise", "wrap", "register", "initialize", "initialise", "construct", "select",
                "search", "match", "scale", "round", "reshape", "pad", "join", "print", "run",
                "send", "fetch", "append", "iterate", "list", "sum", "multiply", "divide",
                "simplify", "expand", "integrate", "differentiate", "approximate", "interpolate",
                "sample", "draw", "fill", "clip", "flatten", "stack", "concatenate", "shift"):
        if verb.endswith(("s", "sh", "ch", "x", "z")):
            return f"{verb}es {rest}"
        if verb.endswith("y") and verb[-2] not in "aeiou":
            return f"{verb[:-1]}ies {rest}"
        return f"{verb}s {rest}"
    return None


# ------------------------------------------------------------------------------ code shapes
def _callable(item: CodeItem) -> bool:
    return item.kind in ("function", "method") and bool(item.code)


def _shown(item: CodeItem) -> bool:
    return bool(item.source)


def complete(item: CodeItem, r: random.Random) -> str | None:
    if r.random() < 0.7:
        head = (HUMANEVAL_HEAD if item.kind == "function"
                else "Complete the following Python method.")
    else:
        head = r.choice(["Implement the body of this Python function.", "Finish this function:",
                         "Write the implementation of the function below.",
                         "Fill in the code for this function so that it does what the docstring "
                         "says."])
    return f"{head}\n\n{_fence(item.code)}"


def write(item: CodeItem, r: random.Random) -> str | None:
    what = _third_person(item.summary)
    if item.kind == "class":
        if what:
            return f"Write a Python class `{item.name}` that {what}."
        return f"Write a Python class `{item.name}`. Its documentation says: \"{item.summary}\""
    name = item.signature.replace("self, ", "").replace("(self)", "()")
    if what and r.random() < 0.7:
        return r.choice([f"Write a Python function `{name}` that {what}.",
                         f"Implement `{name}` in Python: it {what}.",
                         f"Write a function `{name}` in Python that {what}. Include a docstring."])
    return f"Write a Python function `{name}`. It should do the following: {item.summary}"


def explain_code(item: CodeItem, r: random.Random) -> str | None:
    head = r.choice(["Explain what the following Python code does.",
                     "What does this function do? Walk me through it step by step.",
                     "Explain this code to a junior developer.",
                     "Describe the inputs, outputs and behaviour of this function."])
    return f"{head}\n\n{_fence(item.source)}"


def tests(item: CodeItem, r: random.Random) -> str | None:
    code = item.source if item.source and r.random() < 0.5 else item.code
    head = r.choice(["Write unit tests with pytest for the following function.",
                     "Write test cases for this function, including edge cases.",
                     "How would you test this function? Write the tests."])
    return f"{head}\n\n{_fence(code)}"


def type_hints(item: CodeItem, r: random.Random) -> str | None:
    head = r.choice(["Add type hints to this Python function.",
                     "Annotate this function with type hints and explain your choices."])
    return f"{head}\n\n{_fence(item.source)}"


# Small, plausible bugs: one operator, constant or name swapped for a near neighbour.
MUTATIONS = [(r" <= ", " < "), (r" < ", " <= "), (r" >= ", " > "), (r" > ", " >= "),
             (r" == ", " != "), (r" != ", " == "), (r" \+ 1\b", " - 1"), (r" - 1\b", " + 1"),
             (r"\band\b", "or"), (r"\bor\b", "and"), (r"\bis None\b", "is not None"),
             (r"\bis not None\b", "is None"), (r"\bmax\(", "min("), (r"\bmin\(", "max("),
             (r"\[1:\]", "[:-1]"), (r"\[-1\]", "[0]"), (r"\bTrue\b", "False"),
             (r"\bFalse\b", "True"), (r"\breturn not ", "return "), (r"\+= ", "-= ")]


def mutate(item: CodeItem, r: random.Random) -> str | None:
    """The item's source with one small bug in a code line after the docstring (None when no
    line offers one)."""
    lines = item.source.splitlines()
    start = item.doc_lines[1]
    spots = [(n, pat, rep) for n in range(start, len(lines))
             for pat, rep in MUTATIONS
             if not lines[n].lstrip().startswith("#") and "'" not in lines[n]
             and '"' not in lines[n] and re.search(pat, lines[n])]
    if not spots:
        return None
    n, pat, rep = r.choice(spots)
    lines[n] = re.sub(pat, rep, lines[n], count=1)
    return "\n".join(lines) + "\n"


def find_bug(item: CodeItem, r: random.Random) -> str | None:
    bad = mutate(item, r)
    if bad is None:
        return None
    head = r.choice(["This Python function has a bug. Find it and fix it.",
                     "The following code does not do what its docstring says. What is wrong?",
                     "Find the bug in this function and explain the fix."])
    return f"{head}\n\n{_fence(bad)}"


def convert(item: CodeItem, r: random.Random) -> str | None:
    head = r.choice([f"Rewrite this Python code in {r.choice(W.PROGRAMMING_LANGUAGES)}.",
                     "Refactor this function to make it easier to read.",
                     "Rewrite this function in a more Pythonic style.",
                     "Review this code and suggest improvements.",
                     "Add error handling and input validation to this function."])
    return f"{head}\n\n{_fence(item.source)}"


def write_docstring(item: CodeItem, r: random.Random) -> str | None:
    lines = item.source.splitlines()
    a, b = item.doc_lines
    bare = "\n".join(lines[:a] + lines[b:]) + "\n"
    style = r.choice(["", " in Google style", " in NumPy style", " with an example"])
    return f"Write a docstring{style} for this function.\n\n{_fence(bare)}"


# shape -> (share, which items it can use)
CODE_SHAPES = {
    complete: (0.36, _callable),
    write: (0.18, lambda it: it.kind != "module"),
    explain_code: (0.1, _shown),
    tests: (0.08, _callable),
    type_hints: (0.06, lambda it: _shown(it) and not it.annotated and it.kind != "class"),
    find_bug: (0.08, lambda it: _shown(it) and it.kind != "class"),  # None: nothing to mutate
    convert: (0.08, _shown),
    write_docstring: (0.06, lambda it: _shown(it) and it.doc_lines != (0, 0)),
}


# ------------------------------------------------------------------------------ explanations
_PREPOSITIONS = {"for", "with", "to", "of", "from", "and", "or", "in", "on", "by", "as"}
_GENERIC = {"base", "mixin", "config", "output", "error", "exception", "warning", "abstract",
            "impl", "test", "helper", "wrapper", "util", "utils", "meta", "proxy", "dummy",
            "mock", "fake", "default", "generic", "interface", "protocol", "type", "kwargs",
            "args", "self", "object", "class", "new", "old", "get", "set"}


def terms_of(item: CodeItem) -> list[str]:
    """Technical terms in a definition's name: "RandomForestClassifier" -> "random forest
    classifier", "shortest_path" -> "shortest path" (2-4 real words)."""
    name = item.name.rsplit(".", 1)[-1]
    words = (re.findall(r"[A-Z][a-z]+|[A-Z]{2,}(?![a-z])", name) if item.kind == "class"
             else name.split("_"))
    words = [w if w.isupper() and len(w) > 1 else w.lower() for w in words]
    if not 2 <= len(words) <= 4 or len("".join(words)) < 8:
        return []
    if any(not w.isalpha() or len(w) < 2 or w.lower() in _PREPOSITIONS | _GENERIC
           for w in words):
        return []
    return [" ".join(words)]


def explain_module(item: CodeItem, r: random.Random) -> str | None:
    doc = item.doc if len(item.doc) < 1500 else item.summary
    return r.choice([f"Here is the documentation of the Python module `{item.module}`:\n\n"
                     f"{doc}\n\nSummarize what the module is for.",
                     f"Explain in plain language what this library module does, based on its "
                     f"description:\n\n{doc}",
                     f"Read this description of a software module and list the problems it "
                     f"helps with:\n\n{doc}"])


def explain_api(item: CodeItem, r: random.Random) -> str | None:
    full = f"{item.module}.{item.name}"
    return r.choice([f"What is `{full}` used for? Its documentation says: \"{item.summary}\" "
                     "Explain it with an example.",
                     f"Summarize the following documentation in two sentences:\n\n{item.doc}",
                     f"Explain this documentation to a beginner:\n\n{item.doc}",
                     f"Based on this docstring, when would you use `{item.name}`?\n\n{item.doc}"])


_PARAMS_SECTION = re.compile(r"^\s*(Parameters|Args|Arguments)\s*:?\s*$", re.M)


def extract_params(item: CodeItem, r: random.Random) -> str:
    return r.choice(["List the parameters described in this documentation as JSON, with name, "
                     f"type and description.\n\n{item.doc}",
                     f"Turn this documentation into a short table of its parameters.\n\n"
                     f"{item.doc}"])


def explain_term(term: str, other: str | None, r: random.Random) -> str:
    if other is not None and r.random() < 0.35:
        return r.choice([f"What is the difference between a {term} and a {other}?",
                         f"When would you use a {term} instead of a {other}?",
                         f"Compare {term} and {other} in programming."])
    return r.choice([f"What is a {term}?", f"Explain the concept of a {term} in programming.",
                     f"Explain {term} with a short Python example.",
                     f"What is a {term} and when is it useful?"])


EXPLAIN_SHAPES = {
    explain_module: (0.25, lambda it: it.kind == "module"),
    explain_api: (0.35, lambda it: it.kind != "module"),
    extract_params: (0.1, lambda it: it.kind != "module" and bool(_PARAMS_SECTION.search(it.doc))),
}
TERM_SHARE = 0.3  # the rest of the explain family: questions about terms
