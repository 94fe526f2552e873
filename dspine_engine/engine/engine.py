"""The Engine: load a target (and optionally a DSpine/DFlash draft), then serve requests.

Four ways in, one loop driver underneath (driver.py), which routes every output to its
request's handle whoever drives the step:
- ``generate(prompts, params)`` runs a list of prompts (strings, token lists or chat messages) to
  completion and returns results with statistics;
- ``stream(prompt, params)`` yields text as it is produced;
- ``submit(prompt, params)`` returns a `RequestHandle`: iterate it (``for`` or ``async for``),
  read its live stats, abort it (what a server front needs);
- the step-level API (``add_request``, ``step``, ``abort``) lets a serving stack drive the engine;
  requests join and leave between steps, and ``step()`` returns their outputs, including those
  produced while a ``generate()`` or a stream was driving.
Any mix of these on one engine gets every request's complete output exactly once.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from pathlib import Path
from typing import Iterator

import torch
from tqdm.auto import tqdm

from ..models.config import TargetConfig
from ..models.dspine import DSpineDraft
from ..models.target import TargetModel
from ..models.tokenizer import Tokenizer
from .cache_manager import CacheManager, PagedKVSpec
from .config import EngineConfig
from .cpu_threads import CpuThreads
from .cuda_graphs import graph_sizes
from .detokenizer import IncrementalDetokenizer
from .driver import LoopDriver
from .handles import RequestHandle
from .kv_cache import KVCache, KVCacheFullError, resolve_kv_dtype
from .outputs import (GenerationResult, RequestOutput, RequestStats, acceptance_rates,
                      decoding_path)
from .prompts import prompt_to_ids
from .recurrent_cache import RecurrentCache
from .runner import ModelRunner
from .sampling import SamplingParams
from .scheduler import Scheduler
from .spec_policy import build_policy
from .verify_cost import build_fingerprint, device_name
from .sequence import Sequence

log = logging.getLogger("dspine_engine")

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_device(device) -> torch.device:
    """The device asked for, or CUDA when there is one, else the CPU."""
    try:
        return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}; use cpu or cuda[:N]") from None


def check_device(device: torch.device) -> None:
    """Refuses a device the kernels cannot run on, saying why and what to do instead."""
    from .. import _C

    if device.type == "cpu":
        return
    if device.type != "cuda":
        raise ValueError(f"device {device} is not supported; use cpu or cuda[:N]")
    if not torch.cuda.is_available():
        why = ("this torch is a CPU build" if torch.version.cuda is None
               else "no CUDA device is visible")
        raise ValueError(f"device {device} was asked for but CUDA is not available ({why}); "
                         "use --device cpu / device='cpu'")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {device} does not exist: {torch.cuda.device_count()} CUDA "
                         "device(s) visible")
    if not _C.with_cuda:
        raise ValueError("dspine_engine was built without its CUDA kernels; rebuild it with a "
                         "CUDA torch and nvcc on the PATH (docs: README 'Set up')")


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
    batches: int = 0  # verified batches with a request still running (a group each: auto policy)
    accepted_drafts: int = 0
    accepted_by_position: list[int] = dataclasses.field(default_factory=list)
    drafted_rounds: int = 0
    # Rounds whose verified block held d_j; sized like accepted_by_position when not given.
    verified_by_position: list[int] = dataclasses.field(default_factory=list)
    verify_lengths: dict[int, int] = dataclasses.field(default_factory=dict)  # drafts -> rounds
    busy_seconds: float = 0.0

    def __post_init__(self):
        if not self.verified_by_position:
            self.verified_by_position = [0] * len(self.accepted_by_position)

    @property
    def tau(self) -> float:
        return 1.0 + self.accepted_drafts / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.busy_seconds if self.busy_seconds else 0.0

    @property
    def mean_batch(self) -> float:
        """Sequences a verified batch held on average: how full the rounds ran (a benchmark at
        concurrency c whose batch drains as its requests end reads below c)."""
        return self.rounds / self.batches if self.batches else 0.0

    def path(self) -> str:
        """autoregressive / speculative / mixed: which path the rounds took (outputs.py)."""
        return decoding_path(self.drafted_rounds, self.rounds)

    def acceptance_by_position(self) -> list[float]:
        """P(draft j accepted) over the rounds whose verified block held d_j, j = 1..B-1 (with
        full blocks: over every drafted round)."""
        return acceptance_rates(self.accepted_by_position, self.verified_by_position)


class _Default:
    """Marks an Engine keyword that was not given (the EngineConfig value applies)."""

    def __repr__(self) -> str:
        return "<EngineConfig default>"


_DEFAULT = _Default()


class Engine:
    def __init__(self, target=None, draft=None, device=None, dtype=None,
                 kv_cache_tokens=_DEFAULT, page_size=_DEFAULT, max_num_seqs=_DEFAULT,
                 max_prefill_tokens=_DEFAULT, max_model_len=_DEFAULT, cuda_graphs=_DEFAULT,
                 admission_batch=_DEFAULT, spec_policy=_DEFAULT,
                 num_speculative_tokens=_DEFAULT, spec_cost_profile=_DEFAULT,
                 reprofile=_DEFAULT, spec_calibration=_DEFAULT, spec_min_gain=_DEFAULT,
                 tensor_parallel_size=_DEFAULT, cpu_threads=_DEFAULT,
                 draft_block=_DEFAULT, attention=_DEFAULT, kv_cache_dtype=_DEFAULT,
                 overlap=_DEFAULT, progress: bool = True,
                 config: EngineConfig | None = None):
        """Loads the target (a model directory, a .gguf file, or None / "default" for
        SmolLM2-135M-Instruct) and an optional draft directory ("default" for the shipped one).

        ``dtype`` "auto" (None) runs a GGUF target (the default model included) on the CPU on its
        own quantised blocks ("gguf", models/gguf_target.py); "float32" / "bfloat16" load the
        dequantised weights instead.

        Settings come from ``config`` (an `EngineConfig`), overridden by the keywords given:
        ``kv_cache_tokens`` sizes the KV pools (default: 32K tokens on the CPU, half of the free
        GPU memory on CUDA; requests that can never fit are refused with an error),
        ``page_size``, ``max_num_seqs`` (requests decoded together), ``max_prefill_tokens``,
        ``max_model_len`` (default: the target's context), ``cuda_graphs`` and
        ``admission_batch`` (seats free before new requests join a running batch). With a
        draft, ``spec_policy`` "fixed" (default) verifies ``num_speculative_tokens`` drafts every
        round (default: the whole block) and "auto" chooses per round and sequence from a
        measured cost model (cached; ``reprofile=True`` measures again, ``spec_cost_profile``
        reads a given profile) and each request's acceptance (spec_policy.py); with
        ``spec_calibration=True`` (opt-in) the profile is corrected online from the rounds'
        observed times (cost_calibrator.py; `calibrated_costs()` reports it);
        ``spec_min_gain`` (default 1.1) is the predicted speed-up over plain decoding a drafted
        round must show.
        ``draft_block`` says what a draft forward runs over: "full" (the whole block), "verified"
        (the anchor and the drafts the round verifies: cheaper where rows cost, proposals change
        a little, output never) or "auto" (default: verified on the CPU, full on CUDA).
        ``attention`` "exact" (default) computes every attention row of the target one way on
        CUDA, so greedy speculative output is the autoregressive output token for token and
        no request's output depends on the batch; "fast" lets the kernels split by shape
        (outputs may then part at near-ties). The CPU is exact either way.
        ``kv_cache_dtype`` "auto" (default) keeps the KV cache in fp16 on the CPU GGUF path
        (half the bytes of fp32) and in the model's compute dtype elsewhere; "float16" /
        "bfloat16" / "float32" ask for one the kernels can run with the model (`Engine.kv_dtype`
        says which was taken).
        ``tensor_parallel_size`` N > 1 shards the target over N processes (this one and N - 1
        workers it starts; distributed/): the API and the outputs stay those of one process;
        `close()` (or ``with Engine(...)``, or the interpreter's exit) stops the workers.
        ``cpu_threads`` (CPU only) runs the engine's kernels on that many threads (default:
        ``DSPINE_CPU_THREADS``, else torch's thread count); torch's own small ops run on one
        thread during the engine's steps (cpu_threads.py).
        ``overlap`` "auto" (default) launches each round before the host reads the last one
        back on CUDA, so the host's bookkeeping and text run while the device computes (the
        fixed policy or no draft, an attention-only target, one rank; `Engine.overlap` says
        whether it applies); "on" asks for it anywhere (refused where it cannot apply), "off"
        never. Outputs do not depend on it. Every
        value, and the tensor-parallel layout, is checked before anything loads or starts
        (ValueError naming it)."""
        from ..models.default_model import gguf_source, resolve_model_path
        from ..models.gguf_target import use_quantized

        given = {k: v for k, v in dict(
            kv_cache_tokens=kv_cache_tokens, page_size=page_size, max_num_seqs=max_num_seqs,
            max_prefill_tokens=max_prefill_tokens, max_model_len=max_model_len,
            cuda_graphs=cuda_graphs, admission_batch=admission_batch, spec_policy=spec_policy,
            num_speculative_tokens=num_speculative_tokens, spec_cost_profile=spec_cost_profile,
            reprofile=reprofile, spec_calibration=spec_calibration, spec_min_gain=spec_min_gain,
            tensor_parallel_size=tensor_parallel_size,
            cpu_threads=cpu_threads, draft_block=draft_block, attention=attention,
            kv_cache_dtype=kv_cache_dtype, overlap=overlap).items()
            if v is not _DEFAULT}
        self.config = EngineConfig.from_kwargs(config, **given)
        self.device = resolve_device(device)
        check_device(self.device)
        gguf_path = gguf_source(target, progress)
        self.quantized = use_quantized(dtype, self.device, gguf_path)
        self.dtype = torch.float32 if self.quantized else resolve_dtype(dtype, self.device)
        self.kv_dtype = resolve_kv_dtype(self.config.kv_cache_dtype, self.dtype, self.device,
                                         self.quantized)
        target_dir = resolve_model_path(target)
        self.model_dir = Path(target_dir)
        self._workers = self._start_workers(target_dir)
        try:
            self._build(target_dir, draft, gguf_path, progress)
        except BaseException:
            self.close()
            raise

    def _build(self, target_dir: Path, draft, gguf_path: Path | None, progress: bool) -> None:
        from ..models.drafters import resolve_draft_path
        from ..models.gguf_target import load_gguf_target

        self.tokenizer = Tokenizer(target_dir)
        self.target = (load_gguf_target(gguf_path, progress) if self.quantized else
                       TargetModel.load(target_dir, self.device, self.dtype, progress=progress))
        self.target.exact_attention = self.config.attention == "exact"
        cfg: TargetConfig = self.target.config
        self.draft = None
        if draft is not None:
            self.draft = DSpineDraft.load(resolve_draft_path(draft), self.device, self.dtype,
                                          progress=progress)
        self.config.derive(cfg, self.draft.config if self.draft else None)
        self.target.cover_positions(self.config.max_position)
        if self.draft is not None:
            self.draft.bind(self.target.embed, self.target.lm_head, cfg,
                            self.target.lm_head_dense, max_positions=self.config.max_position,
                            weight_format=self.draft_weight_format)
            self.draft.drop_training_projections()  # bind made the copies inference reads
        if self._workers is not None:  # after bind: the draft keeps the whole lm_head
            self.target = self._workers.drive(self.target)
        self.eos_ids = self.tokenizer.eos_token_ids | set(cfg.eos_token_ids)
        c = self.config
        self.overlap = c.overlapped(self.device, cfg.num_kv_layers != cfg.num_layers,
                                    self.draft is not None, self._workers is not None)
        self.cache = self._build_cache_manager()
        if self._workers is not None:
            self._workers.setup(c.max_position, self.cache.target.pool.num_pages, c.page_size,
                                self.target.exact_attention, self.kv_dtype)
        self.scheduler = Scheduler(self.cache, c.max_num_seqs, c.max_prefill_tokens,
                                   c.admission_batch)
        use_graphs = c.cuda_graphs and self.device.type == "cuda"  # per rank under TP
        sizes = graph_sizes(c.max_num_seqs) if use_graphs else []
        threads = CpuThreads.for_engine(self.device, c.cpu_threads)
        self.runner = ModelRunner(self.target, self.draft, self.cache,
                                  max_batch=max([c.max_num_seqs] + sizes), threads=threads,
                                  verified_draft_blocks=c.verified_draft_blocks(self.device,
                                                                                use_graphs),
                                  overlap=self.overlap)
        if use_graphs:
            self._capture_graphs(sizes, progress)
        self.policy = build_policy(c, self.runner, self._identity(), progress)
        self._driver = LoopDriver(self.scheduler, self.runner, EngineStats(),
                                  has_draft=self.draft is not None, policy=self.policy,
                                  overlap=self.overlap)
        self.reset_stats()
        self._ids = itertools.count()

    def _start_workers(self, target_dir: Path):
        """The tensor-parallel workers (None for one rank), once the layout is known to fit.
        DSPINE_TP_GROUP_OF_ONE=1 runs one rank through the whole tensor-parallel path anyway
        (a process group of one, the sharded model, the driven target; no worker): how the
        NCCL code runs on a machine with one GPU (a test aid; outputs equal one rank's)."""
        size = self.config.tensor_parallel_size
        if size == 1 and os.environ.get("DSPINE_TP_GROUP_OF_ONE", "0") != "1":
            return None
        from ..distributed import WorkerGroup, check_layout

        check_layout(size, TargetConfig.from_dir(target_dir), self.quantized, self.device)
        return WorkerGroup(size, target_dir, self.device, self.dtype)

    def close(self) -> None:
        """Stops the tensor-parallel workers (nothing to do for one rank); idempotent. A
        tensor-parallel engine raises at its next step after this."""
        if getattr(self, "_workers", None) is not None:
            self._workers.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def draft_weight_format(self) -> str | None:
        """How the draft's projections (and its heads' lm_head) are held: Q4_1 blocks beside a
        quantised (CPU) target, so the whole round runs on the quantised kernels and the draft
        reads as few bytes as the target's layers; else the engine's dtype (None)."""
        return "q4_1" if self.quantized and self.draft is not None else None

    @property
    def block(self) -> int:
        """Tokens a round verifies per sequence (the draft's block; 1 without a draft)."""
        return self.config.block_size

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    @property
    def max_num_seqs(self) -> int:
        """Requests decoded together; may be lowered (and raised back) between calls, up to
        the configured value (CUDA graphs were captured up to it)."""
        return self.scheduler.max_num_seqs

    @max_num_seqs.setter
    def max_num_seqs(self, n: int) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= self.config.max_num_seqs:
            raise ValueError(f"max_num_seqs must be an integer in [1, "
                             f"{self.config.max_num_seqs}] (the configured limit), got {n!r}")
        self.scheduler.max_num_seqs = n

    @property
    def stats(self) -> EngineStats:
        """Totals over the engine's life (or since `reset_stats()`)."""
        return self._driver.stats

    def calibrated_costs(self) -> dict | None:
        """The auto policy's calibrated round costs (`CostCalibrator.summary`: plain steps by
        width at the most observed batch bucket, the profile's beside them, observations);
        None without calibration or before the first round."""
        calibrator = getattr(self.policy, "calibrator", None)
        return calibrator.summary() if calibrator is not None else None

    def reset_stats(self) -> None:
        """Starts the engine-wide totals (`engine.stats`) from zero."""
        self._driver.stats = EngineStats(accepted_by_position=[0] * (self.block - 1))

    # ------------------------------------------------------------------ setup
    def _identity(self) -> dict:
        """What a round's cost depends on (the key of the cached verify-cost profile)."""
        return {"device": device_name(self.device), "dtype": str(self.dtype),
                "quantized": self.quantized, "draft_weights": self.draft_weight_format,
                "target": dataclasses.asdict(self.target.config),
                "draft": dataclasses.asdict(self.draft.config) if self.draft else None,
                "graphs": self.runner.graphs is not None, "page_size": self.config.page_size,
                "verified_draft_blocks": self.runner.verified_draft_blocks,
                "tensor_parallel_size": self.config.tensor_parallel_size,
                "torch": torch.__version__, "build": build_fingerprint(),
                **self._kv_identity(), **self._thread_identity()}

    def _kv_identity(self) -> dict:
        """The KV cache's dtype where it is not the compute dtype (a round reads the cache, so
        its cost follows it); nothing otherwise, so those profiles keep their key."""
        return {} if self.kv_dtype == self.dtype else {"kv_cache_dtype": str(self.kv_dtype)}

    def _thread_identity(self) -> dict:
        """The CPU's thread counts (a round's cost follows them); nothing on CUDA, whose
        profiles keep their key."""
        threads = self.runner.cpu_threads
        return {} if threads is None else {"cpu_threads": [threads.kernels, threads.torch_ops]}

    def _capture_graphs(self, sizes: list[int], progress: bool) -> None:
        try:
            self.runner.capture_graphs(sizes, progress, self.config.verify_widths)
        except Exception:  # a capture failure costs speed, never correctness
            if self._workers is not None:  # ...but half-captured workers are out of step
                raise
            log.warning("CUDA graph capture failed; running the forwards eagerly",
                        exc_info=True)
            self.runner.graphs = None
            torch.cuda.synchronize(self.device)

    def _build_cache_manager(self) -> CacheManager:
        cfg, c = self.target.config, self.config
        recurrent = self._build_recurrent_cache()  # first: the K/V pools take what is left
        target = PagedKVSpec("target", cfg.num_kv_layers, cfg.num_kv_heads, cfg.head_dim)
        draft = None
        if self.draft is not None:
            d = self.draft.config
            draft = PagedKVSpec("draft", d.num_layers, d.num_kv_heads, d.head_dim,
                                window=c.draft_window)
        kv_tokens = c.kv_cache_tokens or self._default_kv_tokens(c.page_size)
        # Overlapped rounds: the device's lengths may lead the host's by a block.
        return CacheManager(target, draft, max(1, kv_tokens // c.page_size), c.page_size,
                            c.max_num_seqs, c.max_position, c.block_size, self.kv_dtype,
                            self.device, recurrent, ahead=c.block_size if self.overlap else 0)

    def _build_recurrent_cache(self) -> RecurrentCache | None:
        """Hybrid targets: a recurrent-state slot for each of max_num_seqs sequences; on a GPU
        at most what half of the free memory holds (admission then waits for a free slot)."""
        if self.target.config.num_kv_layers == self.target.config.num_layers:
            return None
        c = self.config
        slots = c.max_num_seqs
        per_slot = RecurrentCache.bytes_per_slot(self.target, c.block_size)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            slots = min(slots, int(free * 0.5 // per_slot))
            if slots < 1:
                raise KVCacheFullError(
                    f"the recurrent state of one sequence ({per_slot / 2**20:.0f} MiB) does not "
                    f"fit in half of the free GPU memory ({free / 2**20:.0f} MiB)")
            if slots < c.max_num_seqs:
                log.warning("recurrent state for %d sequences (%.1f MiB each) fits the GPU, "
                            "below max_num_seqs=%d", slots, per_slot / 2**20, c.max_num_seqs)
        return RecurrentCache(self.target, slots, c.max_num_seqs, c.block_size)

    @property
    def recurrent(self) -> RecurrentCache | None:
        """The hybrid target's recurrent-state cache (None for pure-attention targets)."""
        return self.cache.recurrent

    @property
    def target_kv(self) -> KVCache:
        return self.cache.target.kv

    @property
    def draft_kv(self) -> KVCache | None:
        return self.cache.draft.kv if self.cache.draft is not None else None

    def _default_kv_tokens(self, page_size: int) -> int:
        if self.device.type != "cuda":
            return 32768
        cfg = self.target.config
        per_page = KVCache.bytes_per_page(cfg.num_kv_layers, page_size, cfg.num_kv_heads,
                                          cfg.head_dim, self.kv_dtype)
        if self.draft is not None:
            d = self.draft.config
            per_page += KVCache.bytes_per_page(d.num_layers, page_size, d.num_kv_heads,
                                               d.head_dim, self.kv_dtype)
        free, _ = torch.cuda.mem_get_info(self.device)
        return int(free * 0.5 // per_page) * page_size

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt, params: SamplingParams | None = None,
                    request_id: str | None = None, chat: bool | None = None) -> str:
        """Queues a request for the step API and returns its id; `step()` returns its outputs.
        Raises ValueError (bad prompt or parameters) or KVCacheFullError (can never fit)
        without touching any other request."""
        return self._queue(prompt, params, request_id, chat, step_api=True).request_id

    def submit(self, prompt, params: SamplingParams | None = None,
               request_id: str | None = None, chat: bool | None = None) -> RequestHandle:
        """Queues a request and returns its handle: ``for out in handle`` / ``async for out in
        handle`` yields its outputs (driving the engine as needed), ``handle.stats`` are its live
        statistics, ``handle.abort()`` stops it, ``handle.result()`` waits for all of it.
        Raises like `add_request`."""
        return self._queue(prompt, params, request_id, chat, step_api=False)

    def _queue(self, prompt, params, request_id, chat, step_api: bool,
               queue_outputs: bool = True) -> RequestHandle:
        if params is not None and not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        params = dataclasses.replace(params or SamplingParams())  # the caller's stays unchanged
        params.validate(self.target.config.vocab_size)
        if request_id is not None and (not isinstance(request_id, str) or not request_id):
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        ids = self.encode_prompt(prompt, chat)
        room = self.max_model_len - len(ids)
        if room < 1:
            raise ValueError(f"prompt has {len(ids)} tokens but the context holds "
                             f"{self.max_model_len}; shorten the prompt")
        params.max_tokens = min(params.max_tokens, room)
        detok = (IncrementalDetokenizer(self.tokenizer, params.stop) if params.detokenize
                 else None)
        seq = Sequence(request_id or self._new_id(), prompt, ids, params, detok, self.eos_ids,
                       draft_positions=self.block - 1)
        return self._driver.add(seq, step_api, queue_outputs)

    def encode_prompt(self, prompt, chat: bool | None = None) -> list[int]:
        """The token ids a prompt runs as (the one prompt -> ids path; ValueError if bad)."""
        return prompt_to_ids(self.tokenizer, prompt, self.target.config.vocab_size, chat)

    def _new_id(self) -> str:
        """An automatic id; skips ids a caller chose, so automatic ids never collide."""
        while True:
            rid = f"req-{next(self._ids)}"
            if not self._driver.in_use(rid):
                return rid

    def abort(self, request_id: str) -> bool:
        """Stops a request; its pages go back at once. Returns False for an unknown or finished
        id. Its final output (finish_reason "abort") goes to whoever reads the request."""
        return self._driver.abort(request_id)

    # ------------------------------------------------------------------ step-level API
    def has_unfinished(self) -> bool:
        """Requests still to run, or step-API outputs `step()` has not returned yet."""
        return self._driver.has_work()

    def step(self) -> list[RequestOutput]:
        """Runs one prefill batch or one decode/speculative round, and returns the news of the
        step-API requests (`add_request`): one merged output per request that changed since
        the last `step()`, also through steps that `generate()` or a stream drove. Outputs of
        `submit`/`stream`/`generate` requests go to their own consumers. With overlapped rounds
        (`overlap`) a round step launches the next round and returns the previous one's
        tokens, so a request's tokens come one step later than without."""
        self._driver.advance()
        return self._driver.step_api_outputs()

    # ------------------------------------------------------------------ convenience APIs
    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 progress: bool = False) -> list[GenerationResult]:
        """Runs every prompt to completion (batched) and returns results in prompt order.
        A prompt that is rejected (bad input, cannot fit) gets a result with finish_reason
        "error" and the reason; the others are served normally. If the call is interrupted
        (an exception, Ctrl-C), its requests are aborted, never left queued."""
        single = isinstance(prompts, str) or (isinstance(prompts, list) and prompts
                                              and isinstance(prompts[0], dict))
        prompts = [prompts] if single else list(prompts)
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        slots: list[RequestHandle | GenerationResult] = []
        try:
            for prompt, p in zip(prompts, plist):
                try:
                    slots.append(self._queue(prompt, p, None, None, step_api=False,
                                             queue_outputs=False))
                except (ValueError, KVCacheFullError) as e:
                    slots.append(GenerationResult(self._new_id(), prompt, "", [], "error",
                                                  RequestStats(), error=str(e)))
            handles = [h for h in slots if isinstance(h, RequestHandle)]
            self._run_until_finished(handles, progress)
        except BaseException:
            for h in slots:
                if isinstance(h, RequestHandle) and not h.finished:
                    h.abort()
            raise
        return [h.result() if isinstance(h, RequestHandle) else h for h in slots]

    def _run_until_finished(self, handles: list[RequestHandle], progress: bool) -> None:
        bar = tqdm(total=len(handles), desc="generating", unit="req", disable=not progress)
        waiting = list(handles)
        while waiting:
            self._driver.advance_until(lambda: waiting[0].finished, waiting[0].request_id)
            still = [h for h in waiting if not h.finished]
            bar.update(len(waiting) - len(still))
            waiting = still
        bar.close()

    def stream(self, prompt, params: SamplingParams | None = None,
               chat: bool | None = None) -> Iterator[RequestOutput]:
        """Yields a RequestOutput for each piece of new text of one request (the last one has
        finished=True and the statistics). Other requests keep running meanwhile, and several
        streams may be advanced in any order. Closing the stream early aborts its request."""
        handle = self.submit(prompt, params, chat=chat)
        try:
            yield from handle
        finally:
            if not handle.finished:
                handle.abort()
