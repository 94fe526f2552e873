"""EngineConfig: every engine setting in one validated dataclass.

`Engine(...)` accepts the fields as keyword arguments too (they override a given config). The
config is checked in one place, `validate()`, before any model is loaded, so a bad value is a
clear ValueError and never a hang (max_num_seqs=0), a ZeroDivisionError (page_size=0) or a
silent substitute (kv_cache_tokens=0 used to become one page, max_model_len=0 the model's limit).
What follows from the models (the verify block, the draft's window, the context limit) is
derived once, in `derive()`, and read from here by the scheduler, runner and graphs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from os import PathLike

from ..models.config import ModelConfigError
from .cpu_threads import check_threads, env_threads
from .spec_policy import POLICIES, verify_widths

_POSITIVE_INTS = ("page_size", "max_num_seqs", "max_prefill_tokens", "admission_batch",
                  "tensor_parallel_size")
_OPTIONAL_POSITIVE_INTS = ("kv_cache_tokens", "max_model_len", "cpu_threads")
DRAFT_BLOCKS = ("auto", "full", "verified")
ATTENTION_MODES = ("exact", "fast")
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "float32")
OVERLAP_MODES = ("auto", "on", "off")


@dataclass
class EngineConfig:
    kv_cache_tokens: int | None = None  # None: 32K tokens on the CPU, half the free GPU memory
    page_size: int = 16  # tokens per KV page
    max_num_seqs: int = 64  # requests decoded together (also the largest CUDA graph)
    max_prefill_tokens: int = 4096  # prompt tokens per prefill step (a longer prompt runs alone)
    # While requests decode, new ones are admitted once this many seats are free: fewer, larger
    # prefill steps between the decode rounds (throughput; 1 = admit at once, lowest latency).
    admission_batch: int = 1
    max_model_len: int | None = None  # prompt + answer limit; None: the target's context
    cuda_graphs: bool = True  # capture the draft/verify forwards on CUDA
    # Verification policy (spec_policy.py): "fixed" verifies num_speculative_tokens drafts every
    # round; "auto" chooses per round and sequence (0..num_speculative_tokens, from buckets) by
    # a measured cost model and the acceptance expected for each request.
    spec_policy: str = "fixed"
    num_speculative_tokens: int | None = None  # drafts verified (at most); None: block - 1
    spec_cost_profile: str | None = None  # "auto": a cost-profile JSON to use instead of probing
    reprofile: bool = False  # "auto": measure the verify cost again (replacing the cached one)
    # "auto": correct the cost profile online from the rounds' observed times
    # (cost_calibrator.py; opt-in: on the CPU it did not beat the measured profile, DECISIONS.md
    # "Online calibration"); False plans from the profile as measured or given.
    spec_calibration: bool = False
    # "auto": the predicted speed-up a drafted round must show over plain decoding before the
    # policy drafts (1.0: any predicted gain). The estimates behind the prediction carry ~10%
    # error on a shared CPU, so a predicted gain under that was as often a loss (DECISIONS.md,
    # "A drafted round must promise a margin").
    spec_min_gain: float = 1.1
    # What a draft forward runs over: "full" the whole block (what the drafter was trained on),
    # "verified" the anchor and the drafts the round verifies alone (a w-token round drafts
    # from a w-token block: its attention is bidirectional, so proposals change a little, the
    # output never), "auto" verified on the CPU (the cost grows with the rows there), full on
    # CUDA (a block costs what a few rows cost, and graphs capture the whole block).
    draft_block: str = "auto"
    # The target's attention on CUDA: "exact" sums every row one way whatever the batch and the
    # block around it, so greedy speculative output equals autoregressive output token for
    # token and a request's output does not depend on its neighbours; "fast" lets the kernels
    # split keys by batch and block shape (rows then differ in their last bits, and greedy
    # outputs may part at near-ties). The CPU is exact either way. DECISIONS.md, "Row-exact
    # attention by default", gives the measured cost.
    attention: str = "exact"
    # The KV cache's element type (kv_cache.py, resolve_kv_dtype): "auto" is float16 on the CPU
    # GGUF path (a long-context decode step reads the cache as much as the weights; fp16 halves
    # those bytes and the cache's memory, and the kernels widen it to fp32 exactly) and the
    # model's compute dtype everywhere else. An explicit dtype must be the compute dtype, or
    # float16 under fp32 on the CPU (what the kernels can mix); Engine refuses any other.
    kv_cache_dtype: str = "auto"
    # Ranks the target is sharded over (distributed/): 1 = this process alone; N > 1 starts
    # N - 1 worker processes (the layout is checked against the target before they start).
    tensor_parallel_size: int = 1
    # Threads of the engine's own CPU kernels (None: $DSPINE_CPU_THREADS, else torch's thread
    # count at start-up). Torch's small ops between them run on one thread during the
    # engine's steps (engine/cpu_threads.py says why). Outputs never depend on it.
    cpu_threads: int | None = None
    # Overlapped rounds (driver.py): the next round is launched before the host reads the last
    # one back, so the host's bookkeeping, text and outputs run while the device computes.
    # It needs an attention-only target and one rank. "auto" overlaps on CUDA under the fixed
    # policy or without a draft, "on" wherever it applies (the CPU too, where it gains nothing;
    # the auto policy on the CPU only, for now) and refuses a setting it cannot apply to, "off"
    # never. Outputs are the same either way (greedy; under the auto policy the widths may
    # differ).
    overlap: str = "auto"

    # Derived from the models by derive(); not arguments.
    block_size: int = field(default=1, init=False)  # tokens a round verifies per sequence
    draft_window: int = field(default=0, init=False)  # the draft's sliding window, 0 = none
    verify_widths: list[int] = field(default_factory=lambda: [1], init=False)  # tokens/round

    @classmethod
    def from_kwargs(cls, config: "EngineConfig | None", **overrides) -> "EngineConfig":
        """A validated copy of ``config`` (or of the defaults) with ``overrides`` applied."""
        if config is not None and not isinstance(config, EngineConfig):
            raise ValueError(f"config must be an EngineConfig, got {type(config).__name__}")
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown engine setting(s) {unknown}; settings are {sorted(names)}")
        out = dataclasses.replace(config or cls(), **overrides)
        out.validate()
        return out

    def validate(self) -> None:
        """Raises ValueError naming the first bad setting."""
        for name in _POSITIVE_INTS + _OPTIONAL_POSITIVE_INTS:
            value = getattr(self, name)
            if value is None and name in _OPTIONAL_POSITIVE_INTS:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                what = "a positive integer" + (" or None" if name in _OPTIONAL_POSITIVE_INTS
                                               else "")
                raise ValueError(f"{name} must be {what}, got {value!r}")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < self.page_size:
            raise ValueError(f"kv_cache_tokens ({self.kv_cache_tokens}) holds less than one "
                             f"page of {self.page_size} tokens")
        for name in ("cuda_graphs", "reprofile", "spec_calibration"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.spec_min_gain, (int, float)) or not self.spec_min_gain >= 1.0:
            raise ValueError(f"spec_min_gain must be a number >= 1.0, got {self.spec_min_gain!r}")
        if self.draft_block not in DRAFT_BLOCKS:
            raise ValueError(f"draft_block must be one of {', '.join(DRAFT_BLOCKS)}, got "
                             f"{self.draft_block!r}")
        if self.attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_MODES)}, got "
                             f"{self.attention!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got "
                             f"{self.kv_cache_dtype!r}")
        if self.overlap not in OVERLAP_MODES:
            raise ValueError(f"overlap must be one of {', '.join(OVERLAP_MODES)}, got "
                             f"{self.overlap!r}")
        if self.spec_policy not in POLICIES:
            raise ValueError(f"spec_policy must be one of {', '.join(POLICIES)}, got "
                             f"{self.spec_policy!r}")
        n = self.num_speculative_tokens
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise ValueError(f"num_speculative_tokens must be a positive integer or None (the "
                             f"draft's block - 1), got {n!r}")
        if self.cpu_threads is None:
            env_threads()  # the default's source: a bad DSPINE_CPU_THREADS fails here too
        else:
            check_threads(self.cpu_threads, "cpu_threads")
        if self.spec_cost_profile is not None and not isinstance(self.spec_cost_profile,
                                                                 (str, PathLike)):
            raise ValueError(f"spec_cost_profile must be a path or None, got "
                             f"{self.spec_cost_profile!r}")

    def derive(self, target_config, draft_config=None) -> None:
        """Fills in what follows from the models: the context limit, block and window.

        A draft must cover every position the engine can reach: its RoPE table and training
        stop at its max_position_embeddings (a shorter draft used to read past its table and
        accept nothing), so such a draft is refused unless max_model_len is lowered to fit."""
        model_len = target_config.max_position_embeddings
        if self.max_model_len is not None and self.max_model_len > model_len:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the target's context "
                             f"of {model_len} tokens")
        self.max_model_len = self.max_model_len or model_len
        if draft_config is None:
            self.block_size, self.draft_window, self.verify_widths = 1, 0, [1]
            return
        if draft_config.max_position_embeddings < self.max_model_len:
            raise ModelConfigError(
                f"draft does not fit this target: its max_position_embeddings "
                f"({draft_config.max_position_embeddings}) is below the engine's context of "
                f"{self.max_model_len} tokens; pass max_model_len <= "
                f"{draft_config.max_position_embeddings}")
        self.block_size = draft_config.block_size
        self.draft_window = draft_config.sliding_window or 0
        drafts = self.num_speculative_tokens or self.block_size - 1
        if drafts > self.block_size - 1:
            raise ValueError(f"num_speculative_tokens {drafts} exceeds what the draft proposes "
                             f"per round ({self.block_size - 1}: its block of "
                             f"{self.block_size} minus the anchor)")
        self.verify_widths = verify_widths(self.block_size, drafts, self.spec_policy)

    def verified_draft_blocks(self, device, graphs: bool) -> bool:
        """Whether eager draft forwards run over the verified drafts only (``draft_block``
        resolved for ``device``); "verified" with CUDA graphs is refused: a graph is captured
        for the whole block."""
        if self.draft_block == "verified" and graphs:
            raise ValueError("draft_block='verified' runs the draft eagerly: pass "
                             "cuda_graphs=False with it (graphs capture the whole block)")
        return self.draft_block == "verified" or (self.draft_block == "auto"
                                                   and device.type == "cpu")

    def overlapped(self, device, hybrid: bool, has_draft: bool, distributed: bool) -> bool:
        """Whether rounds overlap (``overlap`` resolved). They need the round's whole state on
        the device: no recurrent state (its replay is the host's) and one rank. "auto"
        overlaps on CUDA under the fixed policy or without a draft (measured on a GPU). The
        auto policy (which then plans from the acceptance up to the round in flight and
        launches a round per group) overlaps when asked ("on") on the CPU only in this
        version: two launches a step need host buffers that no GPU run has checked yet. "on"
        where it cannot apply is refused, naming why."""
        if self.overlap == "off":
            return False
        why = None
        if hybrid:
            why = "a hybrid target's recurrent state is replayed from the host"
        elif distributed:
            why = "tensor-parallel rounds are driven by the host, rank by rank"
        elif has_draft and self.spec_policy != "fixed" and device.type == "cuda":
            why = ("spec_policy='auto' overlaps on the CPU only in this version (its CUDA path "
                   "has not run on a GPU yet)")
        if why is not None and self.overlap == "on":
            raise ValueError(f"overlap='on' cannot apply: {why}; use overlap='auto' or 'off'")
        return why is None and (self.overlap == "on" or device.type == "cuda")

    @property
    def max_position(self) -> int:
        """One past the largest position a forward can see: the last verify block of a full
        context starts at max_model_len - 1 and spans block_size positions."""
        return self.max_model_len + self.block_size - 1
