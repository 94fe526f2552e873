"""The Engine: load a target (and optionally a DSpine/DFlash draft), then serve requests.

Three ways in, one mechanism underneath:
- ``generate(prompts, params)`` runs a list of prompts (strings, token lists or chat messages) to
  completion and returns results with statistics;
- ``stream(prompt, params)`` yields text as it is produced;
- the step-level API (``add_request``, ``step``, ``abort``) lets a serving stack drive the engine;
  requests join and leave between steps. ``generate`` and ``stream`` are built on it.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from pathlib import Path
from typing import Iterator

import torch
from tqdm.auto import tqdm

from ..models.config import ModelConfigError, TargetConfig
from ..models.dspine import DSpineDraft
from ..models.target import TargetModel
from ..models.tokenizer import Tokenizer
from .detokenizer import IncrementalDetokenizer
from .kv_cache import KVCache
from .outputs import GenerationResult, RequestOutput, RequestStats
from .runner import ModelRunner
from .sampling import SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence, Status
from .speculative import speculative_round

log = logging.getLogger("dspine_engine")

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_device(device) -> torch.device:
    """The device asked for, or CUDA when there is one, else the CPU."""
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


@dataclasses.dataclass
class EngineStats:
    """Totals over the engine's life (what `dspine-generate` and the benchmarks print)."""

    requests: int = 0
    new_tokens: int = 0
    rounds: int = 0  # decode steps / speculative rounds, summed over sequences
    accepted_drafts: int = 0
    accepted_by_position: list[int] = dataclasses.field(default_factory=list)
    drafted_rounds: int = 0
    busy_seconds: float = 0.0

    @property
    def tau(self) -> float:
        return 1.0 + self.accepted_drafts / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.busy_seconds if self.busy_seconds else 0.0

    def acceptance_by_position(self) -> list[float]:
        """P(draft j accepted) over drafted rounds, j = 1..B-1."""
        n = max(1, self.drafted_rounds)
        return [a / n for a in self.accepted_by_position]


class Engine:
    def __init__(self, target=None, draft=None, device=None, dtype=None,
                 kv_cache_tokens: int | None = None, page_size: int = 16,
                 max_num_seqs: int = 64, max_prefill_tokens: int = 4096,
                 max_model_len: int | None = None, cuda_graphs: bool = True,
                 progress: bool = True):
        """Loads the target (a model directory, a .gguf file, or None / "default" for
        SmolLM2-135M-Instruct) and an optional draft directory ("default" for the shipped one).

        ``dtype`` "auto" (None) runs a GGUF target (the default model included) on the CPU on its
        own quantised blocks ("gguf", models/gguf_target.py); "float32" / "bfloat16" load the
        dequantised weights instead. ``kv_cache_tokens`` sizes the target's KV pool (default:
        32K tokens on the CPU, half of the free GPU memory on CUDA); requests that can never fit
        are refused with an error."""
        from ..models.default_model import gguf_source, resolve_model_path
        from ..models.drafters import resolve_draft_path
        from ..models.gguf_target import load_gguf_target, use_quantized

        self.device = resolve_device(device)
        gguf_path = gguf_source(target, progress)
        self.quantized = use_quantized(dtype, self.device, gguf_path)
        self.dtype = torch.float32 if self.quantized else resolve_dtype(dtype, self.device)
        target_dir = resolve_model_path(target)
        self.model_dir = Path(target_dir)
        self.tokenizer = Tokenizer(target_dir)
        self.target = (load_gguf_target(gguf_path, progress) if self.quantized else
                       TargetModel.load(target_dir, self.device, self.dtype, progress=progress))
        cfg: TargetConfig = self.target.config
        if cfg.num_kv_layers != cfg.num_layers:
            raise ModelConfigError("hybrid (Gated DeltaNet) targets are not served by the engine "
                                   "yet: their recurrent-state cache is still to come")
        self.max_model_len = min(max_model_len or cfg.max_position_embeddings,
                                 cfg.max_position_embeddings)
        self.draft = None
        if draft is not None:
            self.draft = DSpineDraft.load(resolve_draft_path(draft), self.device, self.dtype,
                                          progress=progress)
            self.draft.bind(self.target.embed, self.target.lm_head, cfg,
                            self.target.lm_head_dense)
        self.block = self.draft.config.block_size if self.draft else 1
        self.eos_ids = self.tokenizer.eos_token_ids | set(cfg.eos_token_ids)
        self._build_caches(kv_cache_tokens, page_size)
        window = (self.draft.config.sliding_window or 0) if self.draft else 0
        self.scheduler = Scheduler(self.target_kv, self.draft_kv, self.block, window,
                                   max_num_seqs, max_prefill_tokens)
        self.runner = ModelRunner(self.target, self.draft, self.target_kv, self.draft_kv)
        if cuda_graphs and self.device.type == "cuda":
            self._capture_graphs(max_num_seqs, progress)
        self.stats = EngineStats(accepted_by_position=[0] * (self.block - 1))
        self._seqs: dict[str, Sequence] = {}  # unfinished requests (and aborted, until reported)
        self._aborted: list[Sequence] = []
        self._ids = itertools.count()

    # ------------------------------------------------------------------ setup
    def _capture_graphs(self, max_num_seqs: int, progress: bool) -> None:
        from .cuda_graphs import CudaGraphRunner

        try:
            self.runner.graphs = CudaGraphRunner(self.runner, max_num_seqs, progress=progress)
        except Exception:  # a capture failure costs speed, never correctness
            log.warning("CUDA graph capture failed; running the forwards eagerly",
                        exc_info=True)
            self.runner.graphs = None
            torch.cuda.synchronize(self.device)

    def _build_caches(self, kv_cache_tokens: int | None, page_size: int) -> None:
        cfg = self.target.config
        if kv_cache_tokens is None:
            kv_cache_tokens = self._default_kv_tokens(page_size)
        num_pages = max(1, kv_cache_tokens // page_size)
        self.target_kv = KVCache(cfg.num_layers, num_pages, page_size, cfg.num_kv_heads,
                                 cfg.head_dim, self.dtype, self.device)
        self.draft_kv = None
        if self.draft is not None:
            d = self.draft.config
            self.draft_kv = KVCache(d.num_layers, num_pages, page_size, d.num_kv_heads,
                                    d.head_dim, self.dtype, self.device)

    def _default_kv_tokens(self, page_size: int) -> int:
        if self.device.type != "cuda":
            return 32768
        cfg = self.target.config
        per_page = KVCache.bytes_per_page(cfg.num_layers, page_size, cfg.num_kv_heads,
                                          cfg.head_dim, self.dtype)
        if self.draft is not None:
            d = self.draft.config
            per_page += KVCache.bytes_per_page(d.num_layers, page_size, d.num_kv_heads,
                                               d.head_dim, self.dtype)
        free, _ = torch.cuda.mem_get_info(self.device)
        return int(free * 0.5 // per_page) * page_size

    # ------------------------------------------------------------------ step-level API
    def add_request(self, prompt, params: SamplingParams | None = None,
                    request_id: str | None = None, chat: bool | None = None) -> str:
        """Queues a request and returns its id. Raises ValueError (bad prompt or parameters) or
        KVCacheFullError (can never fit) without touching any other request."""
        params = dataclasses.replace(params or SamplingParams())
        params.validate(self.target.config.vocab_size)
        ids = self._prompt_ids(prompt, chat)
        room = self.max_model_len - len(ids)
        if room < 1:
            raise ValueError(f"prompt has {len(ids)} tokens but the context holds "
                             f"{self.max_model_len}; shorten the prompt")
        params.max_tokens = min(params.max_tokens, room)
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        seq = Sequence(request_id, prompt, ids, params,
                       IncrementalDetokenizer(self.tokenizer, params.stop), self.eos_ids)
        self.scheduler.add(seq)
        self._seqs[request_id] = seq
        self.stats.requests += 1
        return request_id

    def _prompt_ids(self, prompt, chat: bool | None) -> list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            return self.tokenizer.encode_chat(prompt)
        if isinstance(prompt, list):
            if not prompt or not all(isinstance(t, int) for t in prompt):
                raise ValueError("a token prompt must be a non-empty list of ints")
            bad = [t for t in prompt if not 0 <= t < self.target.config.vocab_size]
            if bad:
                raise ValueError(f"prompt token ids out of range: {bad[:5]}")
            return list(prompt)
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("prompt must be a non-empty string, a token list or chat messages")
        use_chat = self.tokenizer.has_chat_template if chat is None else chat
        if use_chat:
            return self.tokenizer.encode_chat([{"role": "user", "content": prompt}])
        return self.tokenizer.encode(prompt)

    def abort(self, request_id: str) -> bool:
        """Stops a request; its pages go back at once. Returns False for an unknown id."""
        seq = self._seqs.get(request_id)
        if seq is None or seq.status is Status.FINISHED:
            return False
        self.scheduler.finish(seq, "abort")
        self._aborted.append(seq)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or bool(self._aborted)

    def step(self) -> list[RequestOutput]:
        """Runs one prefill batch or one decode/speculative round; returns what changed."""
        outputs = [self._finished_output(s, "") for s in self._aborted]
        self._aborted.clear()
        t0 = time.perf_counter()
        admitted = self.scheduler.admit()
        batch = admitted or list(self.scheduler.running)
        if not batch:
            return outputs
        try:
            new_tokens = (self._prefill(admitted) if admitted
                          else speculative_round(self.runner, batch, self.stats))
        except Exception as e:  # a failed batch must not take the engine down
            log.exception("step failed")
            for s in batch:
                self.scheduler.finish(s, "error", error=f"{type(e).__name__}: {e}")
                outputs.append(self._finished_output(s, ""))
            return outputs
        self.stats.busy_seconds += time.perf_counter() - t0
        for seq in batch:
            outputs.append(self._emit(seq, new_tokens.get(seq.request_id, [])))
        return outputs

    def _prefill(self, seqs: list[Sequence]) -> dict[str, list[int]]:
        logits, taps = self.runner.prefill(seqs)
        temps, top_k, top_p, u = self.runner.sampling_inputs(seqs, 1)
        _, out, _ = self.runner.verify_tokens(logits[:, None], None, None, None, temps, top_k,
                                              top_p, u, seqs)
        first = out[:, 0].tolist()
        if self.draft is not None:
            self.runner.ingest_prompt_context(seqs, taps)
        new = {}
        for seq, tok in zip(seqs, first):
            seq.num_cached = len(seq.prompt_ids)
            new[seq.request_id] = seq.commit([tok])
        return new

    def _emit(self, seq: Sequence, tokens: list[int]) -> RequestOutput:
        text = seq.detok.add(tokens) if tokens else ""
        self.stats.new_tokens += len(tokens)
        if seq.detok.stopped_by is not None:
            seq.finish_reason = "stop"
        if seq.finish_reason is not None:
            self.scheduler.finish(seq, seq.finish_reason)
            return self._finished_output(seq, text, tokens)
        return RequestOutput(seq.request_id, text, tokens, finished=False)

    def _finished_output(self, seq: Sequence, text: str, tokens=()) -> RequestOutput:
        text += seq.detok.flush()
        seq.stats.elapsed = time.perf_counter() - seq.t_admitted
        self._seqs.pop(seq.request_id, None)
        return RequestOutput(seq.request_id, text, list(tokens), finished=True,
                             finish_reason=seq.finish_reason, error=seq.error, stats=seq.stats)

    # ------------------------------------------------------------------ convenience APIs
    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 progress: bool = False) -> list[GenerationResult]:
        """Runs every prompt to completion (batched) and returns results in prompt order.
        A prompt that is rejected (bad input, cannot fit) gets a result with finish_reason
        "error" and the reason; the others are served normally."""
        single = isinstance(prompts, str) or (isinstance(prompts, list) and prompts
                                              and isinstance(prompts[0], dict))
        prompts = [prompts] if single else list(prompts)
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        results: dict[str, GenerationResult] = {}
        order, texts, tokens = [], {}, {}
        for i, (prompt, p) in enumerate(zip(prompts, plist)):
            rid = f"gen-{next(self._ids)}"
            order.append(rid)
            try:
                self.add_request(prompt, p, request_id=rid)
            except (ValueError, RuntimeError) as e:
                results[rid] = GenerationResult(rid, prompt, "", [], "error",
                                                RequestStats(), error=str(e))
                continue
            texts[rid], tokens[rid] = [], []
        prompt_of = dict(zip(order, prompts))
        bar = tqdm(total=len(texts), desc="generating", unit="req", disable=not progress)
        while self.has_unfinished():
            for out in self.step():
                if out.request_id not in texts:
                    continue
                texts[out.request_id].append(out.new_text)
                tokens[out.request_id].extend(out.new_token_ids)
                if out.finished:
                    bar.update()
                    results[out.request_id] = GenerationResult(
                        out.request_id, prompt_of[out.request_id], "".join(texts[out.request_id]),
                        tokens[out.request_id], out.finish_reason, out.stats, error=out.error)
        bar.close()
        return [results[r] for r in order]

    def stream(self, prompt, params: SamplingParams | None = None,
               chat: bool | None = None) -> Iterator[RequestOutput]:
        """Yields a RequestOutput for each piece of new text of one request (the last one has
        finished=True and the statistics). Other queued requests keep running meanwhile."""
        rid = self.add_request(prompt, params, chat=chat)
        try:
            while True:
                for out in self.step():
                    if out.request_id == rid:
                        yield out
                        if out.finished:
                            return
        finally:
            if rid in self._seqs:
                self.abort(rid)
                self.step()
