"""The model runner: prepares a round's device inputs once and runs the forwards from them.

`prepare_round(seqs, seats)` writes the round's per-sequence scalars into persistent buffers
(round_inputs.py: one host-to-device copy per region). The draft and verify forwards read only
those buffers, the cache manager's block-table mirrors and the KV caches, and derive positions,
slots and lengths on the device; so the same prepared tensors feed a CUDA-graph replay (the batch
padded to a captured size) or an eager run, and capture lives here (`capture_graphs`). The draft
context of the previous round's committed positions never leaves the device: the verify forward
stores its tapped hidden states per seat and the next draft forward reads them from there.

Prefill (whole prompts, once per request) is variable-length and runs eagerly from inputs built
on the host.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import ops
from ..models.attention_meta import AttnMeta
from ..models.dspine import DSpineDraft
from ..models.target import TargetModel
from .cache_manager import CacheManager, PagedCache
from .cpu_threads import CpuThreads, scope
from .round_inputs import RoundInputs
from .seat_state import SeatState
from .sequence import Sequence


class RoundIndex:
    """The index math of a round's metadata (positions, slots, lengths: `ModelRunner._block_meta`)
    on one array library: torch on CUDA (graphs capture it), numpy on the CPU. There the staged
    inputs and the block tables are host memory and a few rows of arithmetic are far cheaper
    than a torch op's dispatch (2-5 us each, ~25 of them a forward; docs/DECISIONS.md, "CPU
    draft forward"). The same expressions run on either: only the calls below differ."""

    def __init__(self, inputs: RoundInputs):
        self.cpu = inputs.device.type == "cpu"
        self.round = inputs.host if self.cpu else inputs.dev  # seats, base, pending, ...
        self.offsets = self.array(inputs.offsets)

    def array(self, t: torch.Tensor):
        return t.numpy() if self.cpu else t

    def tensor(self, a) -> torch.Tensor:
        return torch.from_numpy(a) if self.cpu else a

    def rows(self, table, seats):  # table[seats]
        return table[seats] if self.cpu else table.index_select(0, seats)

    def take(self, table, cols):  # table[i, cols[i, j]]
        return np.take_along_axis(table, cols, 1) if self.cpu else table.gather(1, cols.long())

    def where(self, cond, a, b):
        return (np if self.cpu else torch).where(cond, a, b)

    def int32(self, a):
        return a.astype(np.int32, copy=False) if self.cpu else a.to(torch.int32)


class ModelRunner:
    def __init__(self, target: TargetModel, draft: DSpineDraft | None, cache: CacheManager,
                 max_batch: int, threads: CpuThreads | None = None,
                 verified_draft_blocks: bool = False, overlap: bool = False):
        self.target, self.draft, self.cache = target, draft, cache
        # Eager draft forwards over the anchor and the drafts the round verifies only, not the
        # whole block (EngineConfig.draft_block; a CUDA graph always runs the whole block).
        self.verified_draft_blocks = verified_draft_blocks
        self.cpu_threads = threads  # the CPU's thread counts for the engine's work (None: CUDA)
        self.device = target.device
        self.block = cache.block
        self.taps = tuple(draft.config.target_layer_ids) if draft is not None else ()
        self.tap_dim = len(self.taps) * target.config.hidden_size
        top_k = draft.config.transition_top_k if draft is not None else 1
        self.inputs = RoundInputs(max_batch, self.block, top_k, self.device)
        seats = cache.max_seats + 1
        # Sampling parameters per seat, set when a request is prefilled.
        self._temps = np.zeros(seats, np.float32)
        self._top_k = np.zeros(seats, np.int32)
        self._top_p = np.ones(seats, np.float32)
        self._sampled = np.zeros(seats, bool)
        self._anchors = np.zeros(seats, np.int64)  # each seat's last committed token
        self._taps = (torch.zeros(seats, self.block, self.tap_dim, dtype=target.dtype,
                                  device=self.device) if draft is not None else None)
        self.graphs = None  # a GraphSet once capture_graphs ran
        # Overlapped rounds (driver.py): the rounds' positions, anchors and pending rows live on
        # the device (seat_state.py), and the host's lengths may trail them by one round.
        self.seat_state = (SeatState(seats, cache.padding_seat, self.device) if overlap
                           else None)
        # With a seat state the host does not know the pending rows: per seat a bound on them
        # (exact after plain rounds, the width after a drafted one), what catch-ups go by.
        self._pending_bound = np.zeros(seats, np.int64)
        self._context_written = True  # the staged round writes the pending draft context
        self._readback = _Readback(max_batch, self.block, self.device)
        self._ix = RoundIndex(self.inputs)
        # Query offsets per verify width (a round may verify fewer than B tokens: spec_policy).
        self._cu_q = {w: torch.arange(0, max_batch * w + 1, w, dtype=torch.int32,
                                      device=self.device) for w in range(1, self.block + 1)}
        self._b = self._n = self._width = 0
        self._tokens = self.block  # tokens the prepared round verifies per sequence
        self._use_graph = False
        self._logits = None

    # ----------------------------------------------------------------- host -> device
    def _ints(self, values, dtype=torch.int32) -> torch.Tensor:
        t = torch.as_tensor(values, dtype=dtype)
        return t.to(self.device, non_blocking=True) if self.device.type == "cuda" else t

    def _bind(self, seqs: list[Sequence], seats: np.ndarray) -> None:
        for s, seat in zip(seqs, seats):
            p = s.params
            self._temps[seat], self._top_k[seat], self._top_p[seat] = (p.temperature, p.top_k,
                                                                       p.top_p)
            self._sampled[seat] = not p.greedy

    # ----------------------------------------------------------------- prefill
    def prefill(self, seqs: list[Sequence], seats: np.ndarray | None = None):
        """Whole prompts at once. Returns last-position logits [b, V] and the taps [N, T*H]."""
        seats = CacheManager.seats_of(seqs) if seats is None else seats
        self._bind(seqs, seats)
        lens = [len(s.prompt_ids) for s in seqs]
        tokens = [t for s in seqs for t in s.prompt_ids]
        positions = np.concatenate([np.arange(n, dtype=np.int32) for n in lens])
        slots = np.concatenate([self.cache.target.slots(int(seat), np.arange(n))
                                for seat, n in zip(seats, lens)]).astype(np.int32)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        width = -(-max(lens) // self.cache.page_size)
        meta = AttnMeta(self._ints(positions), self._ints(slots),
                        self._tables(self.cache.target, self._ints(seats), width),
                        self._ints(lens), self._ints(cu), max(lens), causal=True,
                        max_kv_len=max(lens), prefill=True)
        if self.cache.recurrent is not None:  # prompts run through the state, no checkpoint
            meta.recurrent = self.cache.recurrent.meta(
                self._ints(self.cache.recurrent.slots(seats)), checkpoint=False)
        last_rows = self._ints(cu[1:] - 1, torch.long)
        return self.target.forward(self._ints(tokens, torch.long), meta, self.target_kv.k,
                                   self.target_kv.v, logit_rows=last_rows, tap_layers=self.taps)

    def sample_prefill(self, seqs: list[Sequence], seats: np.ndarray, logits) -> np.ndarray:
        """Each prompt's first token from its last-position logits (the verifier with a block
        of one token is the sampler). Host sync."""
        b, inp = len(seqs), self.inputs
        inp.flip()
        self._stage_sampling(seqs, seats, b, b, width=1)
        inp.upload()
        d = inp.dev
        _, out = ops.block_verify(logits[:, None], inp.drafts[:b, :0], inp.cand_ids[:b, :0],
                                  inp.cand_probs[:b, :0], d["temps"][:b], d["top_k"][:b],
                                  d["top_p"][:b], d["verify_u"][:b, :1].contiguous())
        first = out[:, 0].cpu().numpy()
        self._anchors[seats] = first
        if self.seat_state is not None:
            self._pending_bound[seats] = 0
            lens = np.fromiter((len(s.prompt_ids) for s in seqs), np.int64, b)
            ends = lens + np.fromiter((s.params.max_tokens for s in seqs), np.int64, b) - 1
            self.seat_state.prefilled(seats, lens, ends, out[:, 0])
        return first

    def ingest_prompt_context(self, seqs: list[Sequence], seats: np.ndarray, taps) -> None:
        """Writes the draft context of every prompt position a future query can see."""
        spec, rows, positions, slots, offset = self.cache.draft.spec, [], [], [], 0
        for s, seat in zip(seqs, seats):
            n = len(s.prompt_ids)
            pos = np.arange(int(spec.first_needed(n)), n)
            rows.append(offset + pos)
            positions.append(pos)
            slots.append(self.cache.draft.slots(int(seat), pos))
            offset += n
        self.draft.ingest_context(taps[self._ints(np.concatenate(rows), torch.long)],
                                  self._ints(np.concatenate(positions).astype(np.int32)),
                                  self._ints(np.concatenate(slots).astype(np.int32)),
                                  self.draft_kv.k, self.draft_kv.v)

    # ----------------------------------------------------------------- a round
    def prepare_round(self, seqs: list[Sequence], seats: np.ndarray,
                      tokens: int | None = None) -> None:
        """Stages every input of this round's draft and verify forwards (one copy per region):
        padded to a captured graph's size when one fits, else exactly the batch. The verify
        checks ``tokens`` positions per sequence (the anchor + tokens - 1 drafts; default the
        whole block)."""
        b = len(seqs)
        self._tokens = tokens or self.block
        self._context_written = True
        self._use_graph = self.graphs is not None and self.graphs.fits(b)
        n = self.graphs.padded(b) if self._use_graph else b
        base = self.cache.kv_len[seats]
        self.inputs.flip()
        h = self.inputs.host
        h["seats"][:b] = seats
        if self.seat_state is None:
            h["base"][:b] = base
            h["pending"][:b] = self.cache.pending[seats]
            h["anchors"][:b] = self._anchors[seats]
        self._stage_sampling(seqs, seats, b, n, width=2 * self.block - 1)
        self.inputs.fill_rows(b, n, self.cache.padding_seat)
        self.inputs.upload()
        if self.seat_state is not None:
            self.seat_state.stage(self.inputs.seat_rows, n)
        # The host's lengths trail the device's by up to a round with a seat state.
        reach = int(base.max()) + self.block * (2 if self.seat_state is not None else 1)
        full = self.cache.target.max_pages
        self._width = full if self._use_graph else min(full, -(-reach // self.cache.page_size))
        self._b, self._n = b, n

    def padding_round(self, b: int, tokens: int) -> None:
        """One whole round on ``b`` padding rows (they read page 0 and write nothing) at
        ``tokens`` verified per row, host sync included: what verify_cost.py times (under the
        engine's CPU threads, as a real round is)."""
        with self.threads():
            self.stage_padding(b, tokens)
            if tokens > 1:
                self.propose()
            elif self.draft is not None:
                self.catch_up_context()
            self.verify()
            self.accept()

    def threads(self):
        """A scope running its block under the engine's CPU thread counts (cpu_threads.py);
        a no-op on CUDA. Every step and every padding round runs in one."""
        return scope(self.cpu_threads)

    def stage_padding(self, b: int, tokens: int) -> None:
        """Prepares a round of ``b`` padding rows at ``tokens`` verified per row."""
        self._tokens = tokens
        self.inputs.flip()
        # A width the engine never verifies has no graph (fixed policy: the full block only);
        # its padding round runs eagerly rather than failing (round_profile.py times them all).
        self._use_graph = (self.graphs is not None and self.graphs.fits(b)
                           and self.graphs.has(self._verify_graph(tokens)))
        n = self.graphs.padded(b) if self._use_graph else b
        self.inputs.fill_rows(0, n, self.cache.padding_seat)
        if tokens > 1:  # as many context rows as a drafted round of this width leaves pending
            self.inputs.host["pending"][:n] = tokens
        self.inputs.upload()
        self._width = self.cache.target.max_pages if self._use_graph else -(-self.block //
                                                                           self.cache.page_size)
        self._b, self._n = b, n

    def _stage_sampling(self, seqs, seats: np.ndarray, b: int, n: int, width: int) -> None:
        h, blk = self.inputs.host, self.block
        h["temps"][:b] = self._temps[seats]
        h["top_k"][:b] = self._top_k[seats]
        h["top_p"][:b] = self._top_p[seats]
        for i in np.nonzero(self._sampled[seats])[0]:  # greedy rows need no uniforms
            u = seqs[i].rng.uniforms(width)
            if width == 1:
                h["verify_u"][i, 0] = u[0]
            else:
                h["walk_u"][i] = u[:blk - 1]
                h["verify_u"][i] = u[blk - 1:]

    def catch_up_context(self) -> bool:
        """For a round that verifies no drafts. The draft context of committed positions is
        written lazily: each plain round only adds its position's taps to the seat's buffer
        (up to a block of rows, `_verify_body`), and the next draft forward writes them all,
        as it does after a drafted round. Only when some sequence's buffer may be full are the
        pending rows written here, in one batched pass (so a long run of plain rounds pays one
        draft-context write per block of tokens, not one per token). Returns whether it wrote
        (then nothing is pending: the cache manager is told through `commit`). With a seat
        state it goes by the host's bound on the pending rows (a catch-up where the bound
        says one may be needed writes what is pending, however little)."""
        b, seats = self._b, self.inputs.host["seats"][:self._b]
        pending = (self._pending_bound[seats] if self.seat_state is not None
                   else self.inputs.host["pending"][:b])
        wrote = bool((pending >= self.block).any())
        if wrote:
            if self._use_graph and self.graphs is not None:
                self.graphs.replay("ingest", self._n)
            else:
                self._ingest_body(self._n, self._width, self._pending_rows())
            self.inputs.dev["pending"][:self._n].zero_()  # this round's taps go to row 0
        if self.seat_state is not None:
            self._pending_bound[seats] = 1 if wrote else self._pending_bound[seats] + 1
        self._context_written = wrote
        return wrote

    def propose(self) -> None:
        """Draft forward of the prepared round: writes the pending context rows, drafts the
        tokens the round verifies (B-1 per sequence in a graph, which is captured for the
        whole block; eagerly only the ``tokens - 1`` the verify reads) into the static draft
        outputs."""
        if self._use_graph and self.graphs is not None:
            self.graphs.replay("draft", self._n)
        else:
            self._draft_body(self._n, self._width, self._tokens - 1,
                             self.verified_draft_blocks, self._pending_rows())
        if self.seat_state is not None:  # accepted + 1 rows become pending
            self._pending_bound[self.inputs.host["seats"][:self._b]] = self._tokens

    def verify(self) -> torch.Tensor:
        """Target forward over [anchor, d_1..d_{B-1}] (or the anchor alone without a draft);
        stores the taps per seat for the next draft. Returns logits [b, B, V]."""
        if self._use_graph and self.graphs is not None:
            logits = self.graphs.replay(self._verify_graph(self._tokens), self._n)
        else:
            logits = self._verify_body(self._n, self._width, self._tokens)
        self._logits = logits
        return logits[:self._b]

    def accept(self) -> tuple[np.ndarray, np.ndarray]:
        """Block verify of the round: accepted draft counts [b] and tokens [b, B] (accepted
        drafts, the bonus, then -1), on the host. The round's one host sync."""
        return self.read_back(self.accept_later())

    @staticmethod
    def read_back(result: "RoundResult") -> tuple[np.ndarray, np.ndarray]:
        """Waits for a round's results on the host (the round's one host sync)."""
        return result.get()

    def accept_later(self) -> "RoundResult":
        """Queues the round's block verify (and, with a seat state, the seats' advance) and the
        copy of its results to the host; the returned result waits for them when read. The
        host's anchors follow only without a seat state (then the result is read at once)."""
        b, inp, d, t = self._b, self.inputs, self.inputs.dev, self._tokens
        accept, out = ops.block_verify(self._logits[:b], inp.drafts[:b, :t - 1].contiguous(),
                                       inp.cand_ids[:b, :t - 1].contiguous(),
                                       inp.cand_probs[:b, :t - 1].contiguous(),
                                       d["temps"][:b], d["top_k"][:b], d["top_p"][:b],
                                       d["verify_u"][:b, :t].contiguous())
        if self.seat_state is not None:
            self.seat_state.advance(inp.seat_rows, b, accept, out, self._context_written)
        both = torch.cat([accept.long()[:, None], out], 1)
        seats = None if self.seat_state is not None else self.inputs.host["seats"][:b].copy()
        return RoundResult(self._readback.start(both), seats, self._anchors)

    # ----------------------------------------------------------------- forward bodies
    # Both read only persistent buffers; `n` rows (a graph's size, or the batch), tables
    # `width` pages wide (a graph's full width, or what the batch needs).
    def _tables(self, cache: PagedCache, seats: torch.Tensor, width: int) -> torch.Tensor:
        return cache.tables[:, :width].index_select(0, seats)

    def _block_meta(self, cache: PagedCache, n: int, width: int, causal: bool,
                    tokens: int | None = None):
        ix, blk = self._ix, tokens or self.block
        seats, base = ix.round["seats"][:n], ix.round["base"][:n]
        live = (base >= 0)[:, None]
        p = base.clip(min=0)
        positions = p[:, None] + ix.offsets[:blk]  # [n, blk]
        tables = ix.rows(ix.array(cache.tables)[:, :width], seats)
        slots = self._slots(cache, tables, positions, live)
        kv_lens = ix.int32(p + blk)
        meta = AttnMeta(ix.tensor(positions.reshape(-1)), ix.tensor(slots.reshape(-1)),
                        ix.tensor(tables), ix.tensor(kv_lens), self._cu_q[blk][:n + 1], blk,
                        causal=causal)
        return meta, tables, p, live

    def _slots(self, cache: PagedCache, tables, positions, valid):
        ix, ps = self._ix, cache.page_size
        page = ix.take(tables, positions // ps)
        return ix.int32(ix.where(valid & (page >= 0), page * ps + positions % ps, -1))

    def _verify_body(self, n: int, width: int, blk: int | None = None) -> torch.Tensor:
        d, blk = self.inputs.dev, blk or self.block
        meta, _, _, _ = self._block_meta(self.cache.target, n, width, causal=True, tokens=blk)
        if self.cache.recurrent is not None:  # from the round's checkpoint, filling the rings
            rec = self.cache.recurrent
            meta.recurrent = rec.meta(rec.slot_of_seat.index_select(0, d["seats"][:n]),
                                      checkpoint=True)
        anchors = d["anchors"][:n].long()
        tokens = anchors if blk == 1 else torch.cat([anchors[:, None],
                                                     self.inputs.drafts[:n, :blk - 1]], 1)
        logits, taps = self.target.forward(tokens.reshape(-1), meta, self.target_kv.k,
                                           self.target_kv.v, tap_layers=self.taps)
        if taps is not None:
            self._store_taps(taps.view(n, blk, -1), n)
        return logits.view(n, blk, -1)

    def _store_taps(self, taps: torch.Tensor, n: int) -> None:
        """Keeps the verified block's taps per seat for the next draft context: a drafted
        round's block from row 0 (its draft forward wrote what was pending), a plain round's
        one row after the rows still pending (see `catch_up_context`)."""
        seats = self.inputs.dev["seats"][:n].long()
        blk = taps.shape[1]
        if blk > 1:
            self._taps[:, :blk].index_copy_(0, seats, taps)
        else:
            rows = self.inputs.dev["pending"][:n].long().clamp(max=self.block - 1)
            self._taps.index_put_((seats, rows), taps[:, 0])

    def _verify_graph(self, tokens: int) -> str:
        return "verify" if tokens == self.block else f"verify{tokens}"

    def _pending_rows(self) -> int:
        """Context rows per sequence an eager draft forward needs: the most any sequence of
        the staged round has pending (at least one row; the rest of a block of rows would be
        padding that only costs projections, ~a sixth of a block row each). With a seat state
        the host does not know them: a block."""
        if self.seat_state is not None:
            return self.block
        return max(1, int(self.inputs.host["pending"][:self._n].max(initial=0)))

    def _pending_context(self, n: int, width: int, tokens: int | None = None,
                         rows: int | None = None):
        """The draft-context rows of the previous round's committed positions p - pending ..
        p - 1: their taps, positions and draft-cache slots (-1 where nothing is pending),
        ``rows`` per sequence (default a block), beside the meta of a ``tokens``-long draft
        block (default the whole block)."""
        ix, rows = self._ix, rows or self.block
        meta, tables, p, live = self._block_meta(self.cache.draft, n, width, causal=False,
                                                 tokens=tokens)
        pending, offsets = ix.round["pending"][:n], ix.offsets[:rows]
        ctx_pos = ((p - pending)[:, None] + offsets).clip(min=0)
        ctx_valid = live & (offsets[None] < pending[:, None])
        ctx_slots = self._slots(self.cache.draft, tables, ctx_pos, ctx_valid)
        ctx_taps = self._seat_rows(self._taps, n, rows).reshape(n * rows, -1)
        return (meta, ctx_taps, ix.tensor(ix.int32(ctx_pos.reshape(-1))),
                ix.tensor(ctx_slots.reshape(-1)))

    def _seat_rows(self, table: torch.Tensor, n: int, rows: int) -> torch.Tensor:
        """``table[seats]`` for the staged round's ``n`` rows. On the CPU a concatenation of
        the seats' slices, read from the host copy of the seats: index_select parallelises even
        a one-seat copy (a 184 KB block of taps) in an OpenMP region, measured 0.5-6 ms of a
        ~20 ms draft forward under load; one seat's rows are a view, read in place by the
        draft's fc. On CUDA the gather on the device (graph-safe)."""
        if self.device.type != "cpu":
            return table[:, :rows].index_select(0, self.inputs.dev["seats"][:n])
        parts = [table[int(s), :rows][None] for s in self.inputs.host["seats"][:n]]
        return parts[0] if n == 1 else torch.cat(parts)

    def _ingest_body(self, n: int, width: int, rows: int | None = None) -> None:
        _, ctx_taps, ctx_pos, ctx_slots = self._pending_context(n, width, rows=rows)
        self.draft.ingest_context(ctx_taps, ctx_pos, ctx_slots, self.draft_kv.k, self.draft_kv.v)

    def _draft_body(self, n: int, width: int, drafts: int | None = None,
                    verified_block: bool = False, rows: int | None = None) -> None:
        """Drafts ``drafts`` tokens per sequence (default B-1) from a forward over the whole
        block, or with ``verified_block`` over the anchor and those drafts alone; ``rows``
        context rows per sequence (default a block: what a graph captures)."""
        d, inp = self.inputs.dev, self.inputs
        drafts = drafts or self.block - 1
        meta, ctx_taps, ctx_pos, ctx_slots = self._pending_context(
            n, width, drafts + 1 if verified_block else None, rows)
        tokens, cand_ids, cand_probs = self.draft.propose(
            d["anchors"][:n].long(), ctx_taps, ctx_pos, ctx_slots, meta, self.draft_kv.k,
            self.draft_kv.v, d["temps"][:n], d["walk_u"][:n], drafts=drafts)
        inp.drafts[:n, :drafts].copy_(tokens)
        inp.cand_ids[:n, :drafts].copy_(cand_ids)
        inp.cand_probs[:n, :drafts].copy_(cand_probs)

    # ----------------------------------------------------------------- CUDA graphs
    def capture_graphs(self, sizes: list[int], progress: bool = True,
                       widths: list[int] | None = None) -> None:
        """Captures the draft and verify forwards at each batch size, the verify at each of
        ``widths`` (tokens per sequence; default the whole block), from the same buffers the
        eager path reads (padding rows staged so the captured runs write nothing)."""
        from .cuda_graphs import GraphSet

        top = max(sizes)
        self.inputs.fill_rows(0, top, self.cache.padding_seat)
        self.inputs.upload()
        full = self.cache.target.max_pages
        # A tensor-parallel target (distributed.DrivenTarget) replays its workers' graphs with ours.
        graphs = GraphSet(sizes, partner=getattr(self.target, "graph_partner", None))
        bodies = [(self._verify_graph(w),
                   lambda n, width, w=w: self._verify_body(n, width, w))
                  for w in (widths or [self.block])]
        if self.draft is not None:
            bodies.append(("draft", self._draft_body))
            if 1 in (widths or ()):
                bodies.append(("ingest", self._ingest_body))
        graphs.capture_all(bodies, full, progress)
        self.graphs = graphs

    # ----------------------------------------------------------------- caches
    @property
    def target_kv(self):
        return self.cache.target.kv

    @property
    def draft_kv(self):
        return self.cache.draft.kv if self.cache.draft is not None else None


class _Readback:
    """Pinned host buffers the rounds' results are copied into, used in turn: a round's copy
    is read (its event waited on) before the round after next is launched into its buffer."""

    def __init__(self, capacity: int, block: int, device: torch.device):
        cuda = device.type == "cuda"
        # Flat, so a round's [b, 1 + w] is a contiguous view (an asynchronous copy into a
        # strided view would go through an unpinned temporary).
        self._buffers = [torch.zeros(capacity * (block + 1), dtype=torch.long, pin_memory=cuda)
                         for _ in range(2 if cuda else 1)]
        self._events = [torch.cuda.Event() if cuda else None for _ in self._buffers]
        self._turn = 0

    def start(self, both: torch.Tensor):
        """Queues the copy of ``both`` [b, 1 + w]; returns (host view, event or None)."""
        if self._events[0] is None:
            return both.numpy(), None
        self._turn ^= len(self._buffers) - 1
        b, w = both.shape
        host = self._buffers[self._turn][:b * w].view(b, w)
        host.copy_(both, non_blocking=True)
        event = self._events[self._turn]
        event.record()
        return host.numpy(), event


class RoundResult:
    """A round's accepted counts and tokens, on the host once `get` returns."""

    def __init__(self, started, seats: np.ndarray | None, anchors: np.ndarray):
        (self._host, self._event), self._seats, self._anchors = started, seats, anchors

    def get(self) -> tuple[np.ndarray, np.ndarray]:
        """Waits for the copy (the host sync of a round); accepted [b] and tokens [b, w]."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        both = self._host.copy()  # the buffer is reused two rounds on
        accept, out = both[:, 0], both[:, 1:]
        if self._seats is not None:  # the host's anchors (no seat state)
            self._anchors[self._seats] = out[np.arange(len(accept)), accept]
            self._seats = None
        return accept, out
