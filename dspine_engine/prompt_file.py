"""Prompts files: the one reader behind `dspine-train data --prompts`, `dspine-bench --prompts
FILE.jsonl` and the benchmarks, so a file means the same prompts to all of them.

A line is a bare string or an object: {"prompt_ids": [...]}, {"turns": [q1, q2, ...]} (every
answer by the target), {"messages"|"conversations": [{"role"/"from", "content"/"value"}]} (cut
after the last user turn), {"prompt"|"instruction"|"question"|"text": "..."}, or {"magpie":
true} (the target writes the user turn itself: data generation only); "source" names a family.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

ROLE_ALIASES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                "model": "assistant", "bot": "assistant", "system": "system"}


@dataclass
class Prompt:
    """One prompt to answer: chat messages ending with a user turn (or ready token ids), further
    user turns the target answers one after the other, each after its own previous answer, and
    the family it came from (carried into the data records)."""

    messages: list[dict] | None = None
    ids: list[int] | None = None
    followups: list[str] = field(default_factory=list)
    source: str | None = None
    magpie: bool = False  # the target writes the user turn itself (self-generation)


def user_turn(text) -> dict:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"a user turn must be a non-empty string, got {str(text)[:80]!r}")
    return {"role": "user", "content": text}


def parse_prompt(rec) -> Prompt:
    """One prompts-file record (the forms of the module docstring) -> a `Prompt`."""
    if isinstance(rec, str):
        return Prompt(messages=[user_turn(rec)])
    if not isinstance(rec, dict):
        raise ValueError(f"a prompt record must be a string or an object, got {str(rec)[:80]}")
    source = rec.get("source")
    if rec.get("magpie"):
        return Prompt(source=source or "magpie", magpie=True)
    if isinstance(rec.get("prompt_ids"), list):
        return Prompt(ids=[int(t) for t in rec["prompt_ids"]], source=source)
    if isinstance(rec.get("turns"), list) and rec["turns"]:
        first, *rest = rec["turns"]
        return Prompt(messages=[user_turn(first)],
                      followups=[user_turn(t)["content"] for t in rest], source=source)
    turns = rec.get("messages") or rec.get("conversations") or rec.get("conversation")
    if isinstance(turns, list):
        messages = [{"role": ROLE_ALIASES.get(str(t.get("role", t.get("from"))).lower(), "user"),
                     "content": t.get("content", t.get("value", ""))} for t in turns]
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
        if last_user < 0:
            raise ValueError(f"conversation without a user turn: {str(rec)[:80]}")
        return Prompt(messages=messages[:last_user + 1], source=source)
    for key in ("prompt", "instruction", "question", "text"):
        if isinstance(rec.get(key), str):
            return Prompt(messages=[user_turn(rec[key])], source=source)
    raise ValueError(f"cannot find a prompt in record {str(rec)[:80]}")


def load_prompts(path: Path) -> list[Prompt]:
    prompts = []
    with open(path) as f:
        for n, line in enumerate(f):
            if line.strip():
                try:
                    prompts.append(parse_prompt(json.loads(line)))
                except (ValueError, json.JSONDecodeError) as e:
                    raise ValueError(f"{path}:{n + 1}: {e}") from None
    return prompts


def first_turns(path: Path) -> list:
    """The prompts of a file as the engine takes them (token ids or chat messages), one per
    record: a multi-turn record gives its first turn. Self-generation records have no prompt."""
    out = []
    for n, p in enumerate(load_prompts(path)):
        if p.magpie:
            raise ValueError(f"{path}: record {n + 1} is a magpie record (self-generation, for "
                             "dspine-train data only): it holds no prompt to run")
        out.append(p.ids if p.ids is not None else p.messages)
    return out
