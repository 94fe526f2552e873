"""The cache manager: invariants through real engine rounds, the sliding-window rule, and the
block-table mirror kept up to date by deltas (the CUDA path, exercised on the CPU)."""
import numpy as np
import pytest
import torch

from dspine_engine import Engine, SamplingParams
from dspine_engine.engine import cache_manager
from dspine_engine.engine.cache_manager import PAGES_AHEAD, PagedCache, PagedKVSpec
from random_drafts import write_tiny_random_draft
from test_spec_policy_lossless import write_linear_profile


def test_window_rule():
    spec = PagedKVSpec("draft", 1, 1, 8, window=24)
    assert spec.first_needed(10) == 0 and spec.first_needed(30) == 7
    assert list(spec.first_needed(np.array([0, 23, 24, 100]))) == [0, 0, 1, 77]
    assert PagedKVSpec("t", 1, 1, 8).first_needed(100) == 0
    # window + block tokens may straddle one extra page; never more than the whole sequence
    assert spec.pages_to_reserve(1000, 16, 4) == 11 and spec.pages_to_reserve(8, 16, 4) == 6


def test_invariants_hold_through_rounds(tiny_llama, tmp_path):
    """Target KV length == anchor position == draft context (written + pending) after every
    step; draft pages outside the window are freed; every page comes back."""
    draft = write_tiny_random_draft(tmp_path / "draft", seed=5, sliding_window=24)
    eng = Engine(tiny_llama, draft=draft, progress=False, page_size=4, max_num_seqs=4)
    cache = eng.cache
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=1.0, seed=n)
              for n in (60, 25, 80)]
    for i, p in enumerate(params):
        eng.add_request(f"request number {i} " * (i + 1), p)
    steps = 0
    while eng.has_unfinished():
        eng.step()
        steps += 1
        running = eng.scheduler.running
        cache.check_invariants(running)
        for s in running:
            first_page = int(cache.draft.spec.first_needed(cache.kv_len[s.seat])) // 4
            row = cache.draft.tables[s.seat, :first_page]
            assert (row == -1).all(), "a draft page outside the window is still held"
            assert cache.draft.live[s.seat] <= cache.draft.reserved[s.seat]
        if steps == 6:
            eng.add_request("late arrival", SamplingParams(max_tokens=30, ignore_eos=True))
    for c in cache.caches:
        assert c.pool.available == c.pool.num_pages == c.pool.free_pages
        assert (c.live == 0).all() and (c.reserved == 0).all()


def test_device_mirror_follows_the_host_tables():
    """On CUDA the kernels read a mirror updated by deltas; the same code runs mirrored on the
    CPU here: after random growth, rollback, window frees and releases (several per flush,
    including one entry freed and retaken), the mirror equals the host tables."""
    spec = PagedKVSpec("draft", 1, 1, 8, window=12)
    cache = PagedCache(spec, num_pages=64, page_size=4, max_seats=3, max_pages=20,
                       dtype=torch.float32, device=torch.device("cpu"), mirrored=True)
    assert cache.tables.data_ptr() != torch.from_numpy(cache._host).data_ptr()
    rng = np.random.default_rng(0)
    lens = np.zeros(4, np.int64)
    for seat in range(3):
        assert cache.reserve(seat, 8)
    seats = np.arange(3)
    for step in range(40):
        grow = lens[:3] + rng.integers(1, 6, 3)
        cache.prepare_round(seats, lens[:3], 5)
        lens[:3] = np.minimum(grow, 60)
        cache.commit(seats, lens[:3])
        if step % 3 == 0:
            cache.flush()
            assert torch.equal(cache.tables, torch.from_numpy(cache._host))
        if step == 20:
            cache.release(1)
            lens[1] = 0
            assert cache.reserve(1, 8)
    cache.flush()
    assert torch.equal(cache.tables, torch.from_numpy(cache._host))
    assert (cache.tables[3] == 0).all()  # the padding seat reads page 0


def test_a_prompts_pages_leave_the_pool_as_an_ascending_run(monkeypatch):
    """The Hopper attention kernel loads a 128-key tile by TMA only when its pages are
    consecutive, so a prompt's pages, taken together, must come out of the pool as one ascending
    run: from a fresh pool, and again after sequences released theirs (in any order). (The
    pool's order, with exactly the pages each prompt needs: pages taken ahead extend the run.)"""
    monkeypatch.setattr(cache_manager, "PAGES_AHEAD", 0)
    spec = PagedKVSpec("target", 1, 1, 8)
    cache = PagedCache(spec, num_pages=64, page_size=4, max_seats=3, max_pages=16,
                       dtype=torch.float32, device=torch.device("cpu"))
    zero = np.zeros(1, np.int64)

    def prompt(seat, tokens):
        assert cache.reserve(seat, 16)
        cache.ensure(np.array([seat]), np.array([tokens]), zero)
        return cache._host[seat, : -(-tokens // 4)].tolist()

    def ascending(row):
        return row == list(range(row[0], row[0] + len(row)))

    first, second = prompt(0, 40), prompt(1, 64)
    assert ascending(first) and ascending(second) and first[0] == 0
    cache.release(0)
    cache.release(1)
    again = prompt(2, 64)
    assert ascending(again), again
    cache.release(2)
    assert ascending(prompt(0, 25)) and ascending(prompt(1, 30))


def test_a_request_that_cannot_fit_is_refused_up_front(tiny_llama):
    from dspine_engine import KVCacheFullError

    eng = Engine(tiny_llama, progress=False, kv_cache_tokens=64, page_size=16)
    with pytest.raises(KVCacheFullError, match="pool holds 4"):
        eng.add_request("hi", SamplingParams(max_tokens=100))
    assert not eng.has_unfinished()


def _draft_context(engine, seat: int, positions: np.ndarray) -> torch.Tensor:
    """The draft cache's K and V of one seat's positions, every layer, stacked."""
    kv, slots = engine.draft_kv, torch.as_tensor(engine.cache.draft.slots(seat, positions))
    flat = lambda t: t.view(-1, *t.shape[2:])[slots]  # noqa: E731
    return torch.stack([flat(t) for t in kv.k + kv.v])


def test_plain_rounds_write_the_draft_context_lazily(tiny_llama, tmp_path):
    """Under plain rounds (a profile where drafting never pays) each position's draft context
    stays pending, at most a block of it, and is written in one pass when the block is full;
    what that pass writes equals what a prefill of the same tokens writes."""
    draft = write_tiny_random_draft(tmp_path / "draft", seed=5)
    profile = write_linear_profile(tmp_path / "p.json", per_token=10.0)
    make = lambda: Engine(tiny_llama, draft=draft, progress=False, page_size=4,  # noqa: E731
                          max_num_seqs=2, spec_policy="auto", spec_cost_profile=str(profile))
    eng = make()
    cache, block = eng.cache, eng.block
    eng.add_request("a prompt of a few tokens", SamplingParams(max_tokens=64, ignore_eos=True))
    eng.step()  # the prefill
    seq = eng.scheduler.running[0]
    pending = []
    for _ in range(block + 4):
        eng.step()
        cache.check_invariants([seq])
        pending.append(int(cache.pending[seq.seat]))
    assert pending == list(range(1, block + 1)) + [1, 2, 3, 4]
    assert eng.stats.drafted_rounds == 0
    written = int(cache.draft_len[seq.seat])
    lazy = np.arange(len(seq.prompt_ids), written)  # what the catch-up pass wrote
    assert len(lazy) == block
    tokens = (seq.prompt_ids + seq.output_ids)[:written]
    ref = make()
    ref.add_request(tokens, SamplingParams(max_tokens=8))
    ref.step()  # the prefill writes the context of every prompt position
    torch.testing.assert_close(_draft_context(eng, seq.seat, lazy),
                               _draft_context(ref, ref.scheduler.running[0].seat, lazy),
                               atol=1e-4, rtol=1e-3)


def test_a_rollback_keeps_the_pages_the_next_block_writes():
    """Rejected drafts roll back by the length alone: their pages stay with the sequence (the
    next round's block writes them again). A block crossing into a new page takes PAGES_AHEAD
    more with it while the reservation has room, so the rounds after take none and the table
    mirror has nothing to flush; the reservation caps what is taken ahead."""
    spec = PagedKVSpec("target", 1, 1, 8)
    cache = PagedCache(spec, num_pages=32, page_size=4, max_seats=2, max_pages=16,
                       dtype=torch.float32, device=torch.device("cpu"), mirrored=True)
    seat = np.array([0])
    assert cache.reserve(0, 16) and PAGES_AHEAD < 8
    cache.prepare_round(seat, np.array([0]), 16)  # positions 0..15: four pages, and more ahead
    cache.flush()
    held = cache._host[0, :4 + PAGES_AHEAD].tolist()
    assert cache.live[0] == 4 + PAGES_AHEAD and -1 not in held
    cache.commit(seat, np.array([3]))  # two drafts accepted + the bonus
    assert cache.live[0] == 4 + PAGES_AHEAD and not cache._deltas
    cache.prepare_round(seat, np.array([3]), 16)  # positions 3..18: a fifth page, held already
    assert cache.live[0] == 4 + PAGES_AHEAD and not cache._deltas
    assert cache._host[0, :4 + PAGES_AHEAD].tolist() == held
    anchor = 4 * (4 + PAGES_AHEAD) - 15  # the first block that needs one more page
    cache.prepare_round(seat, np.array([anchor]), 16)
    assert cache.live[0] == 5 + 2 * PAGES_AHEAD
    assert cache._host[0, :4 + PAGES_AHEAD].tolist() == held
    assert list(cache._deltas) == list(range(4 + PAGES_AHEAD, 5 + 2 * PAGES_AHEAD))
    cache.flush()
    cache.prepare_round(seat, np.array([4 * 16 - 16]), 16)  # the last page: capped at 16 taken
    assert cache.live[0] == cache.num_entries[0] == 16
    cache.release(0)
    assert cache.pool.available == cache.pool.num_pages == cache.pool.free_pages
