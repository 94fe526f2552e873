"""Overlapped rounds (EngineConfig.overlap, driver.py, seat_state.py) on the CPU.

On CUDA a round is launched before the host reads the last one back; the CPU runs the same
code synchronously (overlap="on"), so the logic is checked here: the host's lengths one round
behind the device's, each seat's state advanced and gathered on the device, a sequence's extra
round after its end dropped, a dead seat's rows run as padding. Outputs, finish reasons and
statistics must be those of rounds without overlap, through stops, length limits, aborts and
failures, and every page must come back.
"""
import pytest
import torch

from dspine_engine import Engine, SamplingParams
from dspine_engine.engine.config import EngineConfig
from engine_rounds import pools_whole, running_after_rounds
from random_drafts import write_tiny_random_draft
from test_spec_policy_lossless import write_linear_profile
from tiny_models import write_tiny_hybrid

PROMPTS = ["The color I'm referring to", "Write a short poem", "Count to ten", "Hello there",
           "Tell me a story", "Why is the sky blue?"]


def sampled(i: int, max_tokens: int, **kw) -> SamplingParams:
    """Seeded sampling: the tiny random models' tokens then vary (greedy repeats one token)."""
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=1.0, seed=i, **kw)


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory):
    return write_tiny_random_draft(tmp_path_factory.mktemp("overlap_draft"), seed=3)


def engines(target, draft):
    return {mode: Engine(target, draft=draft, progress=False, max_num_seqs=4, page_size=4,
                         overlap=mode) for mode in ("off", "on")}


def run(engine, params):
    results = engine.generate(PROMPTS, params)
    assert pools_whole(engine) and not engine.has_unfinished()
    return [(r.token_ids, r.finish_reason, r.stats.rounds) for r in results]


@pytest.mark.parametrize("with_draft", [False, True], ids=["autoregressive", "random-draft"])
def test_outputs_and_stats_are_those_without_overlap(tiny_llama, tiny_draft, with_draft):
    """Six requests on four seats (admission while rounds run), lengths 1..23, and stop tokens
    taken from the plain run's outputs so that requests end early mid-batch."""
    pair = engines(tiny_llama, tiny_draft if with_draft else None)
    assert pair["on"].overlap and not pair["off"].overlap
    lengths = [1, 5, 23, 9, 17, 12]
    plain = run(pair["off"], [sampled(i, n) for i, n in enumerate(lengths)])
    stops = [set(tokens[3:4]) if i % 2 else set() for i, (tokens, _, _) in enumerate(plain)]
    params = [sampled(i, n, stop_token_ids=sorted(s)) for i, (n, s) in
              enumerate(zip(lengths, stops))]
    pair["off"].reset_stats()
    expected = run(pair["off"], params)
    assert sum(reason == "stop" for _, reason, _ in expected) >= 2  # the stop path runs
    assert run(pair["on"], params) == expected
    assert pair["on"].stats.rounds == pair["off"].stats.rounds
    assert pair["on"].stats.batches == pair["off"].stats.batches
    assert pair["on"].stats.accepted_drafts == pair["off"].stats.accepted_drafts


def test_a_round_whose_requests_all_ended_is_no_batch_in_the_statistics(tiny_llama):
    """A request that stops while its next round is in flight: that round's rows are dropped,
    and the batch is not counted either (the mean batch is rounds / batches)."""
    pair = engines(tiny_llama, None)
    plain = pair["off"].generate(PROMPTS[:1], sampled(0, 12))[0].token_ids
    params = sampled(0, 12, stop_token_ids=[plain[5]])
    for eng in pair.values():
        eng.reset_stats()
    out = {mode: eng.generate(PROMPTS[:1], params)[0] for mode, eng in pair.items()}
    assert out["on"].token_ids == out["off"].token_ids and out["on"].finish_reason == "stop"
    pair["on"]._driver.settle()  # the round launched before the stop was read back
    assert pair["on"].stats.batches == pair["off"].stats.batches == pair["off"].stats.rounds > 0
    assert pair["on"].stats.mean_batch == 1.0


def test_device_state_is_the_hosts_once_settled(tiny_llama, tiny_draft):
    eng = Engine(tiny_llama, draft=tiny_draft, progress=False, max_num_seqs=4, page_size=4,
                 overlap="on")
    with running_after_rounds(eng, PROMPTS[:3], rounds=5, max_tokens=40) as seqs:
        eng._driver.settle()
        eng.cache.check_invariants(seqs)
        state, seats = eng.runner.seat_state, [s.seat for s in seqs]
        assert state.kv_len[seats].tolist() == eng.cache.kv_len[seats].tolist()
        assert state.anchor[seats].tolist() == [s.anchor for s in seqs]
        assert state.pending[seats].tolist() == eng.cache.pending[seats].tolist()
        assert state.kv_len[eng.cache.padding_seat] == -1  # the padding seat stays dead
    assert pools_whole(eng)


def test_plain_rounds_catch_the_draft_context_up_by_the_hosts_bound(tiny_llama, tiny_draft,
                                                                    tmp_path):
    """The auto policy under a profile where drafting never pays: plain rounds, whose draft
    context piles up until a catch-up writes it. Overlapped, the host decides the catch-ups
    from its bound on the pending rows; the device's pending rows and the host's agree once
    settled, and catch-ups happened."""
    profile = write_linear_profile(tmp_path / "profile.json", per_token=5.0)
    eng = Engine(tiny_llama, draft=tiny_draft, progress=False, max_num_seqs=4, page_size=4,
                 overlap="on", spec_policy="auto", spec_cost_profile=str(profile))
    real, wrote = eng.runner.catch_up_context, []
    eng.runner.catch_up_context = lambda: wrote.append(real()) or wrote[-1]
    with running_after_rounds(eng, PROMPTS[:3], rounds=40, max_tokens=60) as seqs:
        eng.cache.check_invariants(seqs)
        seats = [s.seat for s in seqs]
        state = eng.runner.seat_state
        assert state.pending[seats].tolist() == eng.cache.pending[seats].tolist()
        assert state.kv_len[seats].tolist() == eng.cache.kv_len[seats].tolist()
    assert any(wrote) and not all(wrote)
    assert eng.stats.verify_lengths.get(0, 0) > 0
    assert pools_whole(eng)


def test_an_abort_while_a_round_is_in_flight_loses_nothing_else(tiny_llama, tiny_draft):
    pair = engines(tiny_llama, tiny_draft)
    params = [sampled(i, 20) for i in range(3)]
    reference = [r.token_ids for r in pair["off"].generate(PROMPTS[:3], params)]
    eng = pair["on"]
    ids = [eng.add_request(p, q) for p, q in zip(PROMPTS[:3], params)]
    outs = {rid: [] for rid in ids}
    for _ in range(4):  # prefill, then rounds: one is in flight after each
        for o in eng.step():
            outs[o.request_id] += o.new_token_ids
    assert eng._driver._flight
    assert eng.abort(ids[1])
    while eng.has_unfinished():
        for o in eng.step():
            outs[o.request_id] += o.new_token_ids
            assert not (o.request_id == ids[1] and o.new_token_ids)  # nothing after the abort
    assert outs[ids[0]] == reference[0] and outs[ids[2]] == reference[2]
    assert outs[ids[1]] == reference[1][:len(outs[ids[1]])]
    assert pools_whole(eng)


def test_a_failed_round_ends_its_requests_and_the_engine_goes_on(tiny_llama, tiny_draft,
                                                                monkeypatch):
    eng = engines(tiny_llama, tiny_draft)["on"]
    params = sampled(0, 12)
    reference = eng.generate(PROMPTS[0], params)[0].token_ids
    calls = []
    real_verify = eng.runner.verify

    def failing_verify():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("verify broke")
        return real_verify()

    monkeypatch.setattr(eng.runner, "verify", failing_verify)
    results = eng.generate(PROMPTS[:2], [sampled(0, 30), sampled(1, 30)])
    assert [r.finish_reason for r in results] == ["error", "error"]
    assert all("verify broke" in r.error for r in results)
    assert pools_whole(eng) and not eng._driver._flight
    assert eng.generate(PROMPTS[0], params)[0].token_ids == reference


def test_overlap_setting_is_checked(tiny_llama, tiny_draft, tmp_path, smollm2_dir):
    with pytest.raises(ValueError, match="overlap must be one of"):
        Engine(tiny_llama, progress=False, overlap="yes")
    hybrid = write_tiny_hybrid(tmp_path / "hybrid", "qwen3_5", smollm2_dir, num_hidden_layers=2,
                               layer_types=["linear_attention", "full_attention"])
    with pytest.raises(ValueError, match="recurrent state"):
        Engine(hybrid, progress=False, overlap="on")
    assert not Engine(tiny_llama, progress=False).overlap  # "auto": the CPU runs in step
    # The resolution by device (no GPU here): the auto policy overlaps on the CPU only for now.
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    auto_policy = EngineConfig(overlap="on", spec_policy="auto")
    with pytest.raises(ValueError, match="CPU only"):
        auto_policy.overlapped(cuda, hybrid=False, has_draft=True, distributed=False)
    assert auto_policy.overlapped(cpu, hybrid=False, has_draft=True, distributed=False)
    assert EngineConfig().overlapped(cuda, hybrid=False, has_draft=True, distributed=False)
    assert not EngineConfig(spec_policy="auto").overlapped(cuda, hybrid=False, has_draft=True,
                                                           distributed=False)
    assert not Engine(hybrid, progress=False, overlap="auto").overlap


def test_overlapped_greedy_with_the_shipped_drafter_is_the_target_output(
        smollm2_dir, lossless_prompts, greedy_reference):
    """Real prompts, the trained drafter (multi-token accepts), answers of different lengths
    and stop tokens: the batch changes under the overlapped rounds, and every output is the
    plain greedy reference's prefix up to its stop."""
    prompts = lossless_prompts[::3]
    reference = greedy_reference[::3]
    params, expected = [], []
    for i, ref in enumerate(reference):
        n = 24 + 13 * i
        stop = [ref[n // 2]] if i % 3 == 1 else []
        cut = ref[:n]
        if stop:
            cut = cut[:cut.index(stop[0]) + 1]
        params.append(SamplingParams(max_tokens=n, ignore_eos=True, stop_token_ids=stop))
        expected.append(cut)
    pair = {mode: Engine(smollm2_dir, draft="default", progress=False, max_num_seqs=4,
                         overlap=mode) for mode in ("on", "off")}
    results = {mode: eng.generate(prompts, params) for mode, eng in pair.items()}
    assert [r.token_ids for r in results["on"]] == expected
    stats = {mode: eng.stats for mode, eng in pair.items()}
    assert stats["on"].tau > 1.2  # accepts happen, so anchors move by several tokens a round
    # The same proposals (the draft context of the accepted tokens, the anchors), so the same
    # acceptance, request by request: the outputs alone would not show a wrong draft context.
    assert stats["on"].accepted_by_position == stats["off"].accepted_by_position
    assert ([r.stats.outcomes for r in results["on"]]
            == [r.stats.outcomes for r in results["off"]])
    eng = pair["on"]
    assert pools_whole(eng) and not eng.has_unfinished()
    assert eng.runner.seat_state.kv_len[eng.cache.padding_seat] == -1
