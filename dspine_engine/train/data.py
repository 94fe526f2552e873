"""Training data: the target model's own answers, stored as token ids in JSONL.

Each line is ``{"index", "prompt_ids", "response_ids", "finish_reason", ["user"]}``: the draft
learns to predict what the target itself says, so the responses are always generated here, by the
target, through `Engine` batched generation (greedy by default, like the decoding we accelerate).
Token ids are stored so training never re-tokenises.

Prompts come from a JSONL file, or from the target itself (Magpie-style self-generation): the
chat template is rendered around a sentinel user message and cut at the sentinel, which leaves
exactly the text a user turn starts after; the target samples a user message from there until its
end-of-turn token, and then answers it like any request. No external data is needed.

Generation appends to the output file chunk by chunk and resumes where an earlier run stopped
(indices already present are skipped), so it can run in several short sessions.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from ..engine.sampling import SamplingParams
from ..models.tokenizer import Tokenizer

SENTINEL = "<<dspine-user-turn-4f1c>>"
ROLE_ALIASES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                "model": "assistant", "bot": "assistant", "system": "system"}


# ---------------------------------------------------------------------------- JSONL i/o
def read_samples(path: Path) -> list[dict]:
    """The records of a data file (a torn last line, from a run killed mid-write, is ignored)."""
    records = []
    lines = Path(path).read_text().splitlines()
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines) - 1:
                break
            raise ValueError(f"{path}:{n + 1} is not valid JSON") from None
        if not isinstance(rec.get("prompt_ids"), list) or not isinstance(
                rec.get("response_ids"), list):
            raise ValueError(f"{path}:{n + 1} lacks prompt_ids / response_ids token lists")
        records.append(rec)
    return records


def _drop_torn_line(path: Path) -> None:
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[:data.rfind(b"\n") + 1])


# ---------------------------------------------------------------------------- prompts
def user_turn_prefix(tokenizer: Tokenizer) -> tuple[list[int], int]:
    """Token ids a user message starts after, and the template's end-of-turn token id."""
    if not tokenizer.has_chat_template:
        raise ValueError("self-generation needs a chat template; pass --prompts instead")
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}],
                                         add_generation_prompt=False)
    if SENTINEL not in text:
        raise ValueError("the chat template does not echo the user message; pass --prompts")
    before, after = text.split(SENTINEL, 1)
    after_ids = tokenizer.encode(after, add_special_tokens=False)
    if not after_ids:
        raise ValueError("the chat template writes nothing after a user message, so the end of "
                         "a user turn cannot be detected; pass --prompts")
    return tokenizer.encode(before, add_special_tokens=False), after_ids[0]


def parse_prompt(rec) -> list[dict] | list[int]:
    """One prompts-file record -> chat messages (up to the last user turn) or token ids.

    Accepts {"prompt_ids": [...]}, {"messages"|"conversations": [{"role"/"from",
    "content"/"value"}]}, {"prompt"|"instruction"|"question"|"text": "..."} or a bare string."""
    if isinstance(rec, str):
        return [{"role": "user", "content": rec}]
    if isinstance(rec.get("prompt_ids"), list):
        return [int(t) for t in rec["prompt_ids"]]
    turns = rec.get("messages") or rec.get("conversations") or rec.get("conversation")
    if isinstance(turns, list):
        messages = [{"role": ROLE_ALIASES.get(str(t.get("role", t.get("from"))).lower(), "user"),
                     "content": t.get("content", t.get("value", ""))} for t in turns]
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
        if last_user < 0:
            raise ValueError(f"conversation without a user turn: {str(rec)[:80]}")
        return messages[:last_user + 1]
    for key in ("prompt", "instruction", "question", "text"):
        if isinstance(rec.get(key), str):
            return [{"role": "user", "content": rec[key]}]
    raise ValueError(f"cannot find a prompt in record {str(rec)[:80]}")


def load_prompts(path: Path) -> list:
    with open(path) as f:
        return [parse_prompt(json.loads(line)) for line in f if line.strip()]


def prompt_ids(tokenizer: Tokenizer, prompt) -> list[int]:
    if prompt and isinstance(prompt[0], int):
        return prompt
    if tokenizer.has_chat_template:
        return tokenizer.encode_chat(prompt)
    return tokenizer.encode("\n\n".join(m["content"] for m in prompt))


# ---------------------------------------------------------------------------- generation
@dataclass
class GenerationConfig:
    max_new_tokens: int = 1024  # answer length cap
    answer_temperature: float = 0.0  # greedy: the decoding the drafter accelerates
    user_temperature: float = 1.0
    user_top_p: float = 1.0
    user_max_tokens: int = 256
    keep_truncated: bool = False  # keep user turns cut at user_max_tokens (tiny test models)
    chunk: int = 256  # prompts per batched generate call (and per append to the file)
    seed: int = 0


class DataGenerator:
    def __init__(self, engine, out_path: Path, cfg: GenerationConfig):
        self.engine, self.out, self.cfg = engine, Path(out_path), cfg
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.done, self.next_index, self.seen = 0, 0, set()
        if self.out.is_file():
            _drop_torn_line(self.out)
            for rec in read_samples(self.out):
                self.done += 1
                self.next_index = max(self.next_index, int(rec.get("index", -1)) + 1)
                self.seen.add(rec.get("user"))

    def _seed(self, index: int, part: int) -> int:
        return (self.cfg.seed * 1_000_003 + index) * 2 + part

    def run(self, num: int, prompts: list | None = None, max_minutes: float | None = None) -> int:
        """Adds records until the file holds ``num`` (or the prompts run out, or the time is
        up); returns how many the file holds."""
        t0, chunk_time = time.monotonic(), 0.0
        bar = tqdm(total=num, initial=min(self.done, num), desc="samples", unit="sample")
        attempts_left = 50 * max(num, 1)  # guards against a model that never ends a user turn
        while self.done < num and attempts_left > 0:
            if prompts is not None and self.next_index >= len(prompts):
                break
            if max_minutes and time.monotonic() - t0 + chunk_time > max_minutes * 60:
                tqdm.write(f"time budget reached: {self.done} samples in {self.out}; "
                           "run the same command again to continue")
                break
            start = time.monotonic()
            size = min(self.cfg.chunk, 2 * (num - self.done) + 8)
            if prompts is not None:
                size = min(size, len(prompts) - self.next_index)
            indices = list(range(self.next_index, self.next_index + size))
            self.next_index += size
            attempts_left -= size
            pending = (self._user_turns(indices) if prompts is None else
                       [(i, prompt_ids(self.engine.tokenizer, prompts[i]), None)
                        for i in indices])
            written = self._answer_and_write(pending[:num - self.done])
            self.done += written
            bar.update(written)
            chunk_time = time.monotonic() - start
        bar.close()
        return self.done

    def _user_turns(self, indices: list[int]) -> list[tuple[int, list[int], str]]:
        """Magpie: the target writes user messages, which become chat prompts."""
        tok, c = self.engine.tokenizer, self.cfg
        prefix, end_of_turn = user_turn_prefix(tok)
        params = [SamplingParams(max_tokens=c.user_max_tokens, temperature=c.user_temperature,
                                 top_p=c.user_top_p, seed=self._seed(i, 0),
                                 stop_token_ids=[end_of_turn]) for i in indices]
        out = []
        for i, res in zip(indices, self.engine.generate([prefix] * len(indices), params,
                                                        progress=True)):
            ended = res.token_ids[-1:] == [end_of_turn]
            if res.error or not (ended or c.keep_truncated):
                continue
            text = tok.decode(res.token_ids[:-1] if ended else res.token_ids).strip()
            if not text or text in self.seen:
                continue
            self.seen.add(text)
            out.append((i, tok.encode_chat([{"role": "user", "content": text}]), text))
        return out

    def _answer_and_write(self, pending) -> int:
        if not pending:
            return 0
        c = self.cfg
        params = [SamplingParams(max_tokens=c.max_new_tokens, temperature=c.answer_temperature,
                                 seed=self._seed(i, 1)) for i, _, _ in pending]
        results = self.engine.generate([ids for _, ids, _ in pending], params, progress=True)
        written = 0
        with open(self.out, "a") as f:
            for (i, ids, user), res in zip(pending, results):
                if res.error or len(res.token_ids) < 2:  # a block needs an anchor + a target
                    continue
                rec = {"index": i, "prompt_ids": ids, "response_ids": res.token_ids,
                       "finish_reason": res.finish_reason}
                if user is not None:
                    rec["user"] = user
                f.write(json.dumps(rec) + "\n")
                written += 1
        return written
