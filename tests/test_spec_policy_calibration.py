"""Online calibration of the verify-cost profile (engine/cost_calibrator.py): the correction is
the median of the last 31 log ratios of observed to predicted round time, used from 5
observations on and only once the plain step of the batch bucket is known; drafted rounds are
steered to plain decoding until it is, then now and then to a neighbouring width and (1 in 32)
to plain again, whose window also forgets rounds older than 256, so a plain step measured in a
busy spell is re-measured while the policy drafts. A profile
that is wrong about one width is corrected until the policy chooses what the right profile
chooses; greedy output stays the target's; the setting reaches the engine from the config and
the CLIs, and the costs reach the stats."""
import json
import math

import numpy as np
import pytest

from dspine_engine import Engine
from dspine_engine.engine.config import EngineConfig
from dspine_engine.engine.cost_calibrator import CostCalibrator, bucket
from dspine_engine.engine.verify_cost import CostProfile
from random_drafts import write_tiny_random_draft
from test_cli import _run
from test_spec_policy import WIDTHS, policy, seqs
from test_spec_policy_lossless import write_linear_profile

MAX_BATCH = 8


def steps_table(steps: dict[int, float]) -> np.ndarray:
    """``[widths, m]``: a round of m sequences at w tokens costs m * steps[w] seconds."""
    return np.array([[m * steps[w] for m in range(MAX_BATCH + 1)] for w in WIDTHS])


FLAT = steps_table({w: 1.0 for w in WIDTHS})


def feed(cal, width, batch, ratios):
    """Records rounds whose observed time is ``ratio`` x the flat table's prediction."""
    for r in ratios:
        cal.record(width, batch, r * batch)


def cost(cal, width, batch):
    return cal.table()[WIDTHS.index(width), batch]


def test_buckets_are_powers_of_two():
    assert [bucket(b) for b in range(1, 10)] == [0, 1, 2, 2, 3, 3, 3, 3, 4]


def test_the_correction_is_the_median_of_the_log_ratios():
    cal = CostCalibrator(FLAT, WIDTHS)
    feed(cal, 1, 1, [1.0] * 5)
    feed(cal, 4, 1, [0.5, 0.5, 0.5, 100.0, 100.0])  # the mean of the logs would give ~3.2
    assert cost(cal, 4, 1) == pytest.approx(0.5)
    assert cost(cal, 1, 1) == pytest.approx(1.0)


def test_the_window_holds_the_last_31_observations():
    cal = CostCalibrator(FLAT, WIDTHS)
    feed(cal, 1, 1, [1.0] * 5)
    feed(cal, 4, 1, [2.0] * 31 + [4.0] * 16)  # the last 31: 15 x 2, 16 x 4
    assert cost(cal, 4, 1) == pytest.approx(4.0)  # all 47: the median would be 2
    assert cal.summary()["observations"][4] == 47  # the stats count every round


def test_a_key_needs_five_observations():
    cal = CostCalibrator(FLAT, WIDTHS)
    feed(cal, 1, 1, [1.0] * 5)
    feed(cal, 8, 1, [3.0] * 4)
    assert cost(cal, 8, 1) == pytest.approx(1.0)
    feed(cal, 8, 1, [3.0])
    assert cost(cal, 8, 1) == pytest.approx(3.0)


def test_moves_of_the_median_under_one_percent_leave_the_table_alone():
    """(Each change of the table costs the policy a rebuild of its rate terms.)"""
    cal = CostCalibrator(FLAT, WIDTHS)
    feed(cal, 1, 1, [1.0] * 5)
    version = cal.version
    feed(cal, 1, 1, [1.005] * 10)  # the median moves by 0.5%
    assert cal.version == version and cost(cal, 1, 1) == pytest.approx(1.0)
    feed(cal, 1, 1, [1.05] * 20)
    assert cal.version > version and abs(math.log(cost(cal, 1, 1) / 1.05)) <= 0.01


def test_nothing_moves_until_the_plain_step_is_known_then_every_width_moves_with_it():
    """The policy compares costs as ratios: a width's own correction waits for the plain step's;
    a width without observations keeps the profile's ratio to the plain step."""
    cal = CostCalibrator(FLAT, WIDTHS)
    feed(cal, 8, 2, [3.0] * 10)
    feed(cal, 1, 2, [2.0] * 4)
    np.testing.assert_allclose(cal.table(), FLAT)
    feed(cal, 1, 2, [2.0])
    assert cost(cal, 8, 2) == pytest.approx(3.0 * 2)
    assert cost(cal, 4, 2) == pytest.approx(2.0 * 2)  # no observations: moves with the plain
    assert cost(cal, 1, 2) == pytest.approx(2.0 * 2)
    assert cost(cal, 8, 1) == cost(cal, 8, 4) / 4 == pytest.approx(1.0)  # other buckets


def test_drafted_rounds_are_plain_one_in_four_until_the_plain_step_is_known():
    cal = CostCalibrator(FLAT, WIDTHS)
    assert [cal.steer(8, 1) for _ in range(12)] == [8, 8, 8, 1] * 3
    feed(cal, 1, 1, [1.0] * 5)
    ran = [cal.steer(8, 1) for _ in range(64)]
    assert ran.count(1) == 2  # from now on only the refresh, 1 in 32
    assert 1 in [cal.steer(8, 4) for _ in range(4)]  # another bucket: not known yet


def test_known_plain_step_explores_neighbouring_widths_one_in_sixteen():
    cal = CostCalibrator(FLAT, WIDTHS)
    feed(cal, 1, 1, [1.0] * 5)
    ran = [cal.steer(8, 1) for _ in range(64)]
    assert sorted(w for w in ran if w != 8) == [1, 1, 4, 4, 16, 16]  # alternately narrower, wider
    assert [i for i, w in enumerate(ran) if w not in (1, 8)] == [15, 31, 47, 63]
    assert [i for i, w in enumerate(ran) if w == 1] == [23, 55]  # the plain step's refresh
    assert {cal.steer(2, 1) for _ in range(32)} - {1} == {2, 4}  # plain: only the refresh
    assert {cal.steer(16, 1) for _ in range(32)} - {1} == {16, 8}


def test_the_plain_steps_window_forgets_by_age():
    """Observations of the plain step older than 256 rounds of its bucket are dropped (the
    newest 5 stay), so a long slow spell does not outvote the refresh rounds after it."""
    cal = CostCalibrator(FLAT, WIDTHS)
    feed(cal, 1, 1, [3.0] * 31)  # a busy spell fills the plain step's window
    feed(cal, 4, 1, [1.0] * 300)  # then drafted rounds at normal speed, 300 rounds
    assert cost(cal, 1, 1) == pytest.approx(3.0)
    feed(cal, 1, 1, [1.0] * 2)  # two refreshes: the spell's old rounds go, the newest 5 stay
    assert cost(cal, 1, 1) == pytest.approx(3.0)
    feed(cal, 1, 1, [1.0])  # the third: the median of (3, 3, 1, 1, 1)
    assert cost(cal, 1, 1) == pytest.approx(1.0)
    assert cost(cal, 4, 1) == pytest.approx(1.0)
    cal = CostCalibrator(FLAT, WIDTHS)  # within the age nothing is dropped: the median of 31
    feed(cal, 1, 1, [3.0] * 31)
    feed(cal, 1, 1, [1.0] * 15)
    assert cost(cal, 1, 1) == pytest.approx(3.0)


def test_the_plain_step_recovers_from_a_busy_spell_while_the_policy_drafts():
    """The failure of the CPU A/B (docs/DECISIONS.md "Online calibration"): the plain step is
    measured in a busy spell (every round 2.5x slower) while the request accepts every draft;
    then the machine is quiet again and the request accepts none, so with a right price plain
    decoding wins. With the spell's price a 4-token round looks cheaper than a plain step (1.4 /
    2.5): before the refresh the policy never ran a plain round again and drafted for good; now
    the refresh rounds re-measure the plain step and the policy returns to plain decoding."""
    right = policy(profile_of(TRUE_STEPS))
    run_rounds(right, 40, timed=False)
    run_rounds(right, 460, timed=False, accept=False)
    assert right.choose(np.array([0]))[0] == 1  # what a correct profile picks
    pol = policy(profile_of(TRUE_STEPS), calibrate=True)
    run_rounds(pol, 40, slow=2.5)  # the spell: the plain step measured in it
    assert pol.calibrator.summary()["plain_step_seconds"] == pytest.approx(2.5)
    run_rounds(pol, 60, accept=False)
    assert pol.choose(np.array([0]))[0] > 1  # drafting looks cheap: the stale plain price
    widths = run_rounds(pol, 400, accept=False)
    assert pol.calibrator.summary()["plain_step_seconds"] == pytest.approx(1.0)
    assert pol.choose(np.array([0]))[0] == 1
    assert widths[-100:].count(1) >= 90, widths[-100:]  # plain, bar exploration probes


def test_observations_off_the_table_are_ignored():
    cal = CostCalibrator(FLAT, WIDTHS)
    for width, batch, seconds in [(3, 1, 1.0), (1, 0, 1.0), (1, MAX_BATCH + 1, 1.0),
                                  (1, 1, 0.0), (1, 1, float("nan"))]:
        cal.record(width, batch, seconds)
    assert cal.summary() is None and cal.version == 0


# The CPU's costs in plain steps (a 4-token round cheap, wide rounds dear), and a profile that
# read the 4-token round at 3x its cost: a request accepting every draft should verify 4
# tokens; under the wrong profile the policy verifies 2 (and never learns the later positions).
TRUE_STEPS = {1: 1.0, 2: 1.2, 4: 1.4, 8: 4.0, 16: 9.0}
WRONG_STEPS = {**TRUE_STEPS, 4: 3 * TRUE_STEPS[4]}


def profile_of(steps) -> CostProfile:
    return CostProfile({w: {1: s, 64: 64 * s} for w, s in steps.items()})


def run_rounds(pol, rounds: int, timed: bool = True, accept: bool = True,
               slow: float = 1.0) -> list[int]:
    """Rounds of one request that accepts every draft (none with ``accept=False``), each round
    taking its true cost (in seconds of one plain step) x ``slow``; returns the widths run."""
    batch, seats, widths = seqs(1), np.array([0]), []
    for _ in range(rounds):
        for width, group in pol.plan(batch):
            pol.observe(seats, width, np.array([width - 1 if accept else 0]),
                        TRUE_STEPS[width] * slow if timed else None)
            widths.append(width)
    return widths


def test_a_wrong_profile_is_corrected_to_the_right_choice():
    right = policy(profile_of(TRUE_STEPS))
    run_rounds(right, 200, timed=False)
    assert right.choose(np.array([0]))[0] == 4
    wrong = policy(profile_of(WRONG_STEPS))
    run_rounds(wrong, 200, timed=False)
    assert wrong.choose(np.array([0]))[0] == 2  # uncalibrated, it stays wrong
    calibrated = policy(profile_of(WRONG_STEPS), calibrate=True)
    widths = run_rounds(calibrated, 200)
    assert calibrated.choose(np.array([0]))[0] == 4
    assert widths[:20] == [2, 2, 2, 1] * 5  # the plain step measured first
    assert widths[-32:].count(4) == 29, widths  # then 4, neighbours 1 in 16, plain 1 in 32
    costs = calibrated.calibrator.summary()["costs"]
    assert costs[4] == pytest.approx(TRUE_STEPS[4]) and costs[8] == pytest.approx(TRUE_STEPS[8])


def test_without_calibrate_the_policy_neither_steers_nor_records():
    pol = policy(profile_of(WRONG_STEPS))
    assert pol.calibrator is None
    assert set(run_rounds(pol, 64)) == {2}  # timed, yet no forced plain rounds, no neighbours


def test_greedy_lossless_with_calibration(quant_prompts, quant_params, quant_reference,
                                          tmp_path):
    """The default model on its GGUF blocks with the shipped drafter, a flat profile (every
    width priced as a plain step, so the policy drafts wide) corrected by the rounds' real
    times: forced plain rounds, neighbours and the corrected choices all give the target's
    tokens, batched and at batch 1."""
    eng = Engine(None, draft="default", device="cpu", dtype="gguf", progress=False,
                 max_num_seqs=4, spec_policy="auto", spec_calibration=True,
                 spec_cost_profile=str(write_linear_profile(tmp_path / "flat.json", 0.0)))
    assert eng.policy.calibrator is not None
    assert [r.token_ids for r in eng.generate(quant_prompts, quant_params)] == quant_reference
    one_by_one = [eng.generate(p, quant_params)[0].token_ids for p in quant_prompts[:2]]
    assert one_by_one == quant_reference[:2]
    lengths = eng.stats.verify_lengths
    assert lengths.get(0, 0) > 0 and len([k for k in lengths if k > 0]) >= 2, lengths
    summary = eng.calibrated_costs()
    assert summary["observations"][1] >= 5, summary  # the plain step got measured
    assert summary["plain_step_seconds"] < 0.5  # real seconds, not the profile's 1 a row


def test_the_setting_is_checked_and_reaches_the_policy(tiny_llama, tmp_path):
    assert EngineConfig().spec_calibration is False  # opt-in (DECISIONS: measured slower)
    with pytest.raises(ValueError, match="spec_calibration must be True or False"):
        EngineConfig.from_kwargs(None, spec_calibration="no")
    draft = write_tiny_random_draft(tmp_path / "draft", seed=3)
    profile = str(write_linear_profile(tmp_path / "p.json", 0.1))
    kw = dict(draft=draft, progress=False, max_num_seqs=2, spec_policy="auto",
              spec_cost_profile=profile)
    off = Engine(tiny_llama, **kw)  # the default
    assert off.policy.calibrator is None and off.calibrated_costs() is None
    on = Engine(tiny_llama, spec_calibration=True, **kw)
    assert on.calibrated_costs() is None  # nothing observed yet
    on.generate("Hello there", None)
    assert sum(on.calibrated_costs()["observations"].values()) > 0


@pytest.mark.parametrize("parser", ["generate", "serve"])
def test_the_cli_flag_reaches_the_engine_settings(parser):
    from dspine_engine.cli import generate, serve
    from dspine_engine.cli.generate import spec_settings

    build = {"generate": generate.build_parser, "serve": serve.build_parser}[parser]
    assert spec_settings(build().parse_args(["hi"] * (parser == "generate")))[
        "spec_calibration"] is False
    args = build().parse_args(["--spec-calibration"] + ["hi"] * (parser == "generate"))
    assert spec_settings(args)["spec_calibration"] is True


def test_bench_e2e_takes_the_flag():
    from dspine_engine.cli.bench import build_parser

    assert build_parser().parse_args(["e2e"]).spec_calibration is False
    assert build_parser().parse_args(["e2e", "--spec-calibration"]).spec_calibration


def test_generate_json_stats_carry_the_calibrated_costs(tiny_llama, tmp_path):
    write_tiny_random_draft(tmp_path / "draft", seed=1)
    base = ["dspine_engine.cli.generate", "--model", str(tiny_llama), "--draft",
            str(tmp_path / "draft"), "--max-new-tokens", "20", "--quiet", "--json-stats", "Hi"]
    env = {"DSPINE_CACHE": str(tmp_path / "cache")}
    stats = [json.loads(out.stderr.strip().splitlines()[-1])
             for out in (_run(base + ["--spec-calibration"], env_extra=env),
                         _run(base, env_extra=env))]
    costs = stats[0]["calibrated_costs"]
    assert costs["costs"]["1"] == 1.0 and set(costs["costs"]) == {"1", "2", "4", "8", "16"}
    assert sum(costs["observations"].values()) == stats[0]["rounds"]
    assert math.isfinite(costs["plain_step_seconds"])
    assert "calibrated_costs" not in stats[1]
