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

Generation keeps the engine full (a request is added whenever one finishes) and appends
conversations to the output file in index order, so a run that was stopped resumes after the
last index written, and data can be made in several short sessions.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from ..engine.prompts import prompt_to_ids
from ..engine.sampling import SamplingParams
from ..models.tokenizer import Tokenizer
from ..prompt_file import Prompt, user_turn

SENTINEL = "<<dspine-user-turn-4f1c>>"


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


def prompt_ids(tokenizer: Tokenizer, prompt) -> list[int]:
    """Token ids of a prompt (chat messages or ids), the engine's one way."""
    return prompt_to_ids(tokenizer, prompt, tokenizer.vocab_size)  # the engine's one way


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
        self._end_of_turn = None  # the template's end-of-turn token (Magpie), found lazily
        self._user_prefix: list[int] = []  # the ids a self-generated user turn follows

    def _seed(self, index: int, part: int) -> int:
        return (self.cfg.seed * 1_000_003 + index) * 2 + part

    def _answer_seed(self, index: int, turn: int) -> int:
        return self._seed(index, 1) + (turn << 44)  # turn 0 keeps the single-turn seed

    def _temperature(self, index: int) -> float:
        """Greedy, or for a seeded share of the indices, sampled (fixed per index, so resuming
        and what runs beside an index change nothing)."""
        c = self.cfg
        if c.sampled_share and random.Random(self._seed(index, 1)).random() < c.sampled_share:
            return c.sampled_temperature
        return c.answer_temperature

    def run(self, num: int, prompts: list[Prompt] | None = None,
            max_minutes: float | None = None) -> int:
        """Answers prompts until the file holds ``num`` (or the prompts run out, or the time is
        up); returns how many the file holds. Without ``prompts`` the target writes them.

        The engine is kept full: requests are added as earlier ones finish (a Magpie user turn
        that ends becomes its answer request, an answered turn its follow-up), so batches never
        drain between chunks. Conversations are written in index order, which keeps the file
        the one an uninterrupted run writes and lets a rerun continue after the last index."""
        pipe = _Pipeline(self, num, prompts, max_minutes)
        return pipe.run()

    def _conversation(self, index: int, prompt: Prompt) -> _Conversation:
        ids = (prompt.ids if prompt.ids is not None
               else prompt_ids(self.engine.tokenizer, prompt.messages))
        return _Conversation(index, ids, prompt.messages, list(prompt.followups),
                             self._temperature(index), prompt.source)

    def _user_request(self, index: int) -> SamplingParams:
        c = self.cfg
        return SamplingParams(max_tokens=c.user_max_tokens, temperature=c.user_temperature,
                              top_p=c.user_top_p, seed=self._seed(index, 0),
                              stop_token_ids=[self._end_of_turn], detokenize=False)

    def _from_user_turn(self, index: int, res, source: str) -> _Conversation | None:
        """Magpie: a finished user-turn request -> the conversation to answer (None when the
        turn did not end, is empty or repeats an earlier one)."""
        tok, c = self.engine.tokenizer, self.cfg
        ended = res.token_ids[-1:] == [self._end_of_turn]
        if res.error or not (ended or c.keep_truncated):
            return None
        text = tok.decode(res.token_ids[:-1] if ended else res.token_ids).strip()
        if not text or text in self.seen:
            return None
        self.seen.add(text)
        messages = [{"role": "user", "content": text}]
        return _Conversation(index, tok.encode_chat(messages), messages, [],
                             self._temperature(index), source, user=text)

    def _answer_request(self, conv: _Conversation) -> SamplingParams:
        return SamplingParams(max_tokens=self.cfg.max_new_tokens, temperature=conv.temperature,
                              seed=self._answer_seed(conv.index, len(conv.records)),
                              detokenize=False)

    def _record_answer(self, conv: _Conversation, res) -> bool:
        """Stores one answered turn; returns True when the conversation goes on."""
        if res.error or len(res.token_ids) < 2:  # a block needs an anchor + a target
            return False  # the conversation ends here
        conv.records.append({"index": conv.index, "prompt_ids": conv.ids,
                             "response_ids": res.token_ids, "finish_reason": res.finish_reason,
                             "temperature": conv.temperature})
        if not (conv.followups and conv.messages is not None):
            return False
        tok = self.engine.tokenizer
        answer = {"role": "assistant", "content": tok.decode(res.token_ids).strip()}
        conv.messages = conv.messages + [answer, user_turn(conv.followups.pop(0))]
        conv.ids = prompt_ids(tok, conv.messages)
        return True

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


class _Pipeline:
    """One `DataGenerator.run`: feeds the engine's step API from a queue of prompt indices and
    writes finished conversations in index order.

    Each request in flight is a stage of one index: its Magpie user turn, or answer turn k of
    its conversation. ``waiting`` holds the finished (or failed: None) conversations not yet
    written, so the file grows in index order."""

    def __init__(self, gen: DataGenerator, num: int, prompts, max_minutes):
        self.gen, self.num, self.prompts = gen, num, prompts
        self.engine = gen.engine
        self.deadline = time.monotonic() + max_minutes * 60 if max_minutes else None
        self.in_flight: dict[str, tuple[int, _Conversation | None]] = {}
        self.tokens: dict[str, list[int]] = {}
        self.waiting: dict[int, _Conversation | None] = {}
        self.next_write = self.next_index = gen.next_index
        self.open = 0  # indices started and not yet written
        self.response_tokens = 0
        self.attempts_left = 50 * max(num, 1)  # a model that never ends a user turn
        self.ahead = 2 * self.engine.max_num_seqs  # requests kept queued

    def run(self) -> int:
        gen = self.gen
        t0 = time.monotonic()
        self.bar = tqdm(total=self.num, initial=min(gen.done, self.num), desc="samples",
                        unit="sample")
        try:
            self._top_up()
            while self.in_flight:
                if self.deadline is not None and time.monotonic() > self.deadline:
                    tqdm.write(f"time budget reached: {gen.done} samples in {gen.out}; "
                               "run the same command again to continue")
                    break
                for out in self.engine.step():
                    self._on_output(out)
                self._flush()
                self._top_up()
        finally:
            for rid in list(self.in_flight):
                self.engine.abort(rid)
            while self.engine.has_unfinished():  # report the aborts; nothing else runs
                self.engine.step()
            self._flush()
            self.bar.close()
        secs = time.monotonic() - t0
        tqdm.write(f"{gen.out}: {gen.done} samples; {self.response_tokens} response tokens in "
                   f"{secs:.0f} s ({self.response_tokens / max(secs, 1e-9):.0f} tokens/s)")
        return gen.done

    # ------------------------------------------------------------------ feeding
    def _more(self) -> bool:
        if self.gen.done + self.open >= self.num or self.attempts_left <= 0:
            return False
        return self.prompts is None or self.next_index < len(self.prompts)

    def _top_up(self) -> None:
        while len(self.in_flight) < self.ahead and self._more():
            index = self.next_index
            self.next_index += 1
            self.attempts_left -= 1
            self.open += 1
            prompt = None if self.prompts is None else self.prompts[index]
            if prompt is None or prompt.magpie:
                self._submit_user_turn(index)
            else:
                try:
                    self._submit_answer(self.gen._conversation(index, prompt))
                except ValueError:  # a prompt the engine refuses (too long, bad ids)
                    self.waiting[index] = None

    def _submit_user_turn(self, index: int) -> None:
        gen = self.gen
        if gen._end_of_turn is None:
            prefix, gen._end_of_turn = user_turn_prefix(self.engine.tokenizer)
            gen._user_prefix = prefix
        rid = self.engine.add_request(gen._user_prefix, gen._user_request(index))
        self.in_flight[rid], self.tokens[rid] = (index, None), []

    def _submit_answer(self, conv: _Conversation) -> None:
        try:
            rid = self.engine.add_request(conv.ids, self.gen._answer_request(conv))
        except ValueError:
            self.waiting[conv.index] = conv if conv.records else None
            return
        self.in_flight[rid], self.tokens[rid] = (conv.index, conv), []

    # ------------------------------------------------------------------ results
    def _on_output(self, out) -> None:
        if out.request_id not in self.in_flight:
            return
        self.tokens[out.request_id].extend(out.new_token_ids)
        if not out.finished:
            return
        index, conv = self.in_flight.pop(out.request_id)
        res = _Result(self.tokens.pop(out.request_id), out.finish_reason, out.error)
        if conv is None:  # a Magpie user turn
            source = "magpie" if self.prompts is None else (self.prompts[index].source or
                                                             "magpie")
            conv = self.gen._from_user_turn(index, res, source)
            if conv is None:
                self.waiting[index] = None
            else:
                self._submit_answer(conv)
            return
        if self.gen._record_answer(conv, res):
            self._submit_answer(conv)
        else:
            self.waiting[index] = conv if conv.records else None

    def _flush(self) -> None:
        lines = []
        while self.next_write in self.waiting:
            conv = self.waiting.pop(self.next_write)
            self.next_write += 1
            self.open -= 1
            if conv is None or self.gen.done >= self.num:
                continue
            records = DataGenerator._finish_records(conv)
            lines += [json.dumps(rec) + "\n" for rec in records]
            self.response_tokens += sum(len(r["response_ids"]) for r in records)
            self.gen.done += 1
            self.bar.update()
        if lines:
            with open(self.gen.out, "a") as f:
                f.write("".join(lines))


@dataclass
class _Result:
    token_ids: list[int]
    finish_reason: str | None
    error: str | None
