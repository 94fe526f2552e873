"""Training data: the target model's own answers, stored as token ids in JSONL.

Each line is ``{"index", "prompt_ids", "response_ids", "finish_reason", "temperature",
["turn", "num_turns"], ["source"], ["user"]}``: the draft learns to predict what the target itself
says, so the responses are always generated here, by the target, through `Engine` batched
generation (greedy by default, like the decoding we accelerate; ``sampled_share`` of the prompts
are answered at ``sampled_temperature`` instead). Token ids are stored so training never
re-tokenises.

Prompts come from a JSONL file (`dspine-train prompts` writes one), or from the target itself
(Magpie-style self-generation): the chat template is rendered around a sentinel user message and
cut at the sentinel, which leaves exactly the text a user turn starts after; the target samples a
user message from there until its end-of-turn token, and then answers it like any request. No
external data is needed. A prompts file can mix both (``{"magpie": true}`` lines).

A multi-turn prompt (``{"turns": [q1, q2, ...]}``) is answered turn by turn: the target answers
q1, its answer goes into the conversation, then it answers q2, and so on. Each answered turn is
one record whose ``prompt_ids`` hold the whole conversation before that answer, so a training
sequence is still "context, then one target response" and every response is the target's.

Generation appends to the output file chunk by chunk and resumes where an earlier run stopped
(indices already present are skipped), so it can run in several short sessions.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
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


def merge_samples(parts: list[Path], out: Path) -> dict:
    """Concatenates data files (in the given order) into ``out``, dropping records whose prompt
    was already seen (the same token ids: generators with overlapping prompts or seeds), and
    renumbers the indices from 0 (the turns of one conversation keep sharing theirs).
    Deterministic: the same parts in the same order give the same file. Returns counts."""
    seen, new_index, kept, dropped, tokens = set(), {}, 0, 0, 0
    tmp = Path(out).with_suffix(Path(out).suffix + ".tmp")
    with open(tmp, "w") as f:
        for n, part in enumerate(parts):
            for rec in read_samples(Path(part)):
                key = tuple(rec["prompt_ids"])
                if key in seen:
                    dropped += 1
                    continue
                seen.add(key)
                rec["index"] = new_index.setdefault((n, rec.get("index")), len(new_index))
                f.write(json.dumps(rec) + "\n")
                kept += 1
                tokens += len(rec["response_ids"])
    tmp.replace(out)
    return {"records": kept, "duplicates_dropped": dropped, "response_tokens": tokens}


def _drop_torn_tail(path: Path) -> None:
    """Cuts what a kill mid-write leaves: a torn last line, and the records of a multi-turn
    conversation whose later turns were not written (a conversation is written in one go, so
    only the last one can be incomplete)."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[:data.rfind(b"\n") + 1]
    lines = data.splitlines(keepends=True)
    last = json.loads(lines[-1]) if lines else {}
    tail = [n for n, line in enumerate(lines) if json.loads(line).get("index") == last.get("index")]
    if len(tail) < last.get("num_turns", 1):
        data = b"".join(lines[:tail[0]])
    if data != path.read_bytes():
        path.write_bytes(data)


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


def _user(text) -> dict:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"a user turn must be a non-empty string, got {str(text)[:80]!r}")
    return {"role": "user", "content": text}


def parse_prompt(rec) -> Prompt:
    """One prompts-file record -> a `Prompt`.

    Accepts {"prompt_ids": [...]}, {"turns": [q1, q2, ...]} (every answer by the target),
    {"messages"|"conversations": [{"role"/"from", "content"/"value"}]} (cut after the last user
    turn), {"prompt"|"instruction"|"question"|"text": "..."}, {"magpie": true} or a bare string;
    an optional "source" names the family."""
    if isinstance(rec, str):
        return Prompt(messages=[_user(rec)])
    if not isinstance(rec, dict):
        raise ValueError(f"a prompt record must be a string or an object, got {str(rec)[:80]}")
    source = rec.get("source")
    if rec.get("magpie"):
        return Prompt(source=source or "magpie", magpie=True)
    if isinstance(rec.get("prompt_ids"), list):
        return Prompt(ids=[int(t) for t in rec["prompt_ids"]], source=source)
    if isinstance(rec.get("turns"), list) and rec["turns"]:
        first, *rest = rec["turns"]
        return Prompt(messages=[_user(first)], followups=[_user(t)["content"] for t in rest],
                      source=source)
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
            return Prompt(messages=[_user(rec[key])], source=source)
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


def prompt_ids(tokenizer: Tokenizer, prompt) -> list[int]:
    """Token ids of chat messages (rendered with the chat template when there is one)."""
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
    sampled_share: float = 0.0  # share of the prompts answered at sampled_temperature instead
    sampled_temperature: float = 1.0  # (data for sampled decoding)
    user_temperature: float = 1.0
    user_top_p: float = 1.0
    user_max_tokens: int = 256
    keep_truncated: bool = False  # keep user turns cut at user_max_tokens (tiny test models)
    chunk: int = 256  # prompts per batched generate call (and per append to the file)
    seed: int = 0


@dataclass
class _Conversation:
    """A prompt being answered: the prompt of its next answer, its messages (to render later
    turns), the user turns still to ask, and the records made so far."""

    index: int
    ids: list[int]
    messages: list[dict] | None
    followups: list[str]
    temperature: float
    source: str | None = None
    user: str | None = None  # a self-generated user turn (kept for de-duplication)
    records: list[dict] = field(default_factory=list)


class DataGenerator:
    def __init__(self, engine, out_path: Path, cfg: GenerationConfig):
        if not 0 <= cfg.sampled_share <= 1:
            raise ValueError(f"sampled_share must be in [0, 1], got {cfg.sampled_share}")
        self.engine, self.out, self.cfg = engine, Path(out_path), cfg
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.next_index, self.seen, indices = 0, set(), set()
        if self.out.is_file():
            _drop_torn_tail(self.out)
            for rec in read_samples(self.out):
                indices.add(rec.get("index"))
                self.next_index = max(self.next_index, int(rec.get("index", -1)) + 1)
                self.seen.add(rec.get("user"))
        self.done = len(indices)  # prompts answered (a multi-turn one counts once)

    def _seed(self, index: int, part: int) -> int:
        return (self.cfg.seed * 1_000_003 + index) * 2 + part

    def _answer_seed(self, index: int, turn: int) -> int:
        return self._seed(index, 1) + (turn << 44)  # turn 0 keeps the single-turn seed

    def _temperature(self, index: int) -> float:
        """Greedy, or for a seeded share of the indices, sampled (fixed per index, so resuming
        and chunking change nothing)."""
        c = self.cfg
        if c.sampled_share and random.Random(self._seed(index, 1)).random() < c.sampled_share:
            return c.sampled_temperature
        return c.answer_temperature

    def run(self, num: int, prompts: list[Prompt] | None = None,
            max_minutes: float | None = None) -> int:
        """Answers prompts until the file holds ``num`` (or the prompts run out, or the time is
        up); returns how many the file holds. Without ``prompts`` the target writes them."""
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
            written = self._answer_and_write(self._conversations(indices, prompts)[
                :num - self.done])
            self.done += written
            bar.update(written)
            chunk_time = time.monotonic() - start
        bar.close()
        return self.done

    def _conversations(self, indices: list[int], prompts) -> list[_Conversation]:
        tok = self.engine.tokenizer
        magpie = [i for i in indices if prompts is None or prompts[i].magpie]
        convs = {c.index: c for c in self._user_turns(magpie, prompts)}
        for i in indices:
            if i not in convs and i not in magpie:
                p = prompts[i]
                ids = p.ids if p.ids is not None else prompt_ids(tok, p.messages)
                convs[i] = _Conversation(i, ids, p.messages, list(p.followups),
                                         self._temperature(i), p.source)
        return [convs[i] for i in indices if i in convs]

    def _user_turns(self, indices: list[int], prompts) -> list[_Conversation]:
        """Magpie: the target writes user messages, which become chat prompts."""
        if not indices:
            return []
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
            messages = [{"role": "user", "content": text}]
            out.append(_Conversation(i, tok.encode_chat(messages), messages, [],
                                     self._temperature(i),
                                     prompts[i].source if prompts else "magpie", user=text))
        return out

    def _answer_and_write(self, convs: list[_Conversation]) -> int:
        """Answers every conversation turn by turn (one batched call per turn), then appends
        its records in one write; returns how many conversations got at least one answer."""
        tok, c = self.engine.tokenizer, self.cfg
        active, turn = list(convs), 0
        while active:
            params = [SamplingParams(max_tokens=c.max_new_tokens, temperature=conv.temperature,
                                     seed=self._answer_seed(conv.index, turn)) for conv in active]
            results = self.engine.generate([conv.ids for conv in active], params, progress=True)
            next_turn = []
            for conv, res in zip(active, results):
                if res.error or len(res.token_ids) < 2:  # a block needs an anchor + a target
                    continue  # the conversation ends here
                conv.records.append({"index": conv.index, "prompt_ids": conv.ids,
                                     "response_ids": res.token_ids,
                                     "finish_reason": res.finish_reason,
                                     "temperature": conv.temperature})
                if conv.followups and conv.messages is not None:
                    answer = {"role": "assistant", "content": tok.decode(res.token_ids).strip()}
                    conv.messages = conv.messages + [answer, _user(conv.followups.pop(0))]
                    conv.ids = prompt_ids(tok, conv.messages)
                    next_turn.append(conv)
            active, turn = next_turn, turn + 1
        written = [conv for conv in convs if conv.records]
        with open(self.out, "a") as f:
            f.write("".join(json.dumps(rec) + "\n" for conv in written
                            for rec in self._finish_records(conv)))
        return len(written)

    @staticmethod
    def _finish_records(conv: _Conversation) -> list[dict]:
        for turn, rec in enumerate(conv.records):
            if len(conv.records) > 1:
                rec.update(turn=turn, num_turns=len(conv.records))
            if conv.source is not None:
                rec["source"] = conv.source
            if conv.user is not None:
                rec["user"] = conv.user
        return conv.records
