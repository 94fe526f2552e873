"""Training runs beyond one draft's loss: a DSpine draft and its DFlash twin trained side by
side on the same batches, runs sized to a time budget, held-out scoring with the engine's chain
choice and best-checkpoint keeping, the narrower-MLP init, and the FLOP count."""
from __future__ import annotations

import json
import math

import pytest
import torch

from dspine_engine.models.dspine import DSpineDraft
from dspine_engine.train.draft_init import copy_target_layers, mlp_neurons, new_draft_config
from dspine_engine.train.trainer import SequenceData, TrainConfig, Trainer

BLOCK = 8


def _records(n=12, length=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [{"prompt_ids": [1, 90, 198, 100 + i],
             "response_ids": torch.randint(3, 500, (length,), generator=gen).tolist()}
            for i in range(n)]


def _draft(target, **kw):
    cfg = new_draft_config(target.config, layers=2, block_size=BLOCK, rank=16, top_k=4,
                           target_layers=[0, 2], **kw)
    return DSpineDraft(cfg).init_weights(seed=3)


def _twin(draft):
    from dspine_engine.cli.train import _ablation_twin

    return _ablation_twin(draft)


def _config(**kw):
    base = dict(steps=3, batch_size=4, lr=3e-3, warmup=1, blocks_per_seq=3, save_every=1000,
                eval_batches=1, bf16=False)
    base.update(kw)
    return TrainConfig(**base)


def _params(draft):
    return {n: p.detach().clone() for n, p in draft.named_parameters()}


def test_side_by_side_equals_separate_runs(small_vocab_target, tmp_path):
    """Training the DFlash twin alongside changes nothing for either draft: each ends with the
    weights it reaches when trained alone on the same data and steps."""
    target, data = small_vocab_target, SequenceData(_records(), 256)
    dspine = _draft(target)
    twin = _twin(dspine)
    assert not twin.config.injection and not twin.config.transition
    shared = set(_params(twin))
    assert all(torch.equal(_params(dspine)[n], p) for n, p in _params(twin).items())
    alone = [_draft(target), _twin(_draft(target))]

    pair = Trainer(target, dspine, data, None, _config(), tmp_path / "a",
                   ablation=(twin, tmp_path / "b"))
    for _ in range(3):
        pair.train_step()
    for i, draft in enumerate(alone):
        solo = Trainer(target, draft, data, None, _config(), tmp_path / f"solo{i}")
        for _ in range(3):
            solo.train_step()
    for mine, ref in ((dspine, alone[0]), (twin, alone[1])):
        for name, p in _params(ref).items():
            torch.testing.assert_close(_params(mine)[name], p, rtol=0, atol=0, msg=name)
    assert shared < set(_params(dspine))  # the twin lacks exactly the DSpine-only parts
    assert not any("injection" in n or "transition" in n for n in shared)


def test_side_by_side_from_the_cli_and_resume(tiny_llama, tmp_path, monkeypatch):
    from dspine_engine.cli.train import main
    from dspine_engine.train import trainer as trainer_mod
    from dspine_engine.train.data import read_samples

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records(length=30)))
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in _records(n=4, length=30, seed=9)))
    args = ["fit", "--target", str(tiny_llama), "--data", str(data), "--eval-data", str(held),
            "--out", str(tmp_path / "dspine"), "--ablation-out", str(tmp_path / "dflash"),
            "--layers", "2", "--target-layers", "0,2", "--block-size", str(BLOCK), "--rank",
            "16", "--batch-size", "2", "--blocks-per-seq", "3", "--max-len", "64",
            "--save-every", "2", "--log-every", "1", "--quiet"]
    original = trainer_mod.Trainer.train_step

    def interrupting(self):
        if self.step == 3:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", interrupting)
    with pytest.raises(KeyboardInterrupt):
        main(args + ["--steps", "4"])
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", original)
    for name in ("dspine", "dflash"):
        rows = [json.loads(line) for line in (tmp_path / name / "train_log.jsonl").open()]
        evals = [r for r in rows if "eval" in r]
        assert [r["step"] for r in evals] == [2]
        for r in evals:
            assert 1.0 <= r["eval"]["tau_walk"] <= BLOCK
        steps = [r for r in rows if "eval" not in r]
        assert [r["step"] for r in steps] == [1, 2, 3]
        assert all(r["tflops"] > 0 and r["tokens_per_s"] > 0 for r in steps)
        state = json.loads((tmp_path / name / "train_state" / "state.json").read_text())
        best = max(evals, key=lambda r: r["eval"]["tau_walk"])
        assert state["best"] == pytest.approx(best["eval"]["tau_walk"])
        assert (tmp_path / name / "config.json").is_file()
    cfg = json.loads((tmp_path / "dflash" / "config.json").read_text())
    assert not cfg["transition"]["enabled"] and cfg["injection"] == {"enabled": False}
    assert len(read_samples(held)) == 4
    # Resuming continues both runs; a run with only one saved state is refused clearly.
    assert main(args + ["--steps", "4", "--resume"]) == 0
    for name in ("dspine", "dflash"):
        state = json.loads((tmp_path / name / "train_state" / "state.json").read_text())
        assert state["step"] == 4
        rows = [json.loads(line) for line in (tmp_path / name / "train_log.jsonl").open()]
        assert [r["step"] for r in rows if "eval" in r] == [2, 4]
    import shutil

    shutil.rmtree(tmp_path / "dflash" / "train_state")
    assert main(args + ["--steps", "5", "--resume"]) == 2


def test_ablation_out_needs_a_dspine_draft(small_vocab_target):
    dflash = _draft(small_vocab_target, injection=False, transition=False)
    with pytest.raises(ValueError, match="DSpine"):
        _twin(dflash)


def test_ablation_twin_continues_from_the_previous_runs_twin(small_vocab_target, tmp_path):
    """--ablation-draft starts the twin from the previous run's twin (its own weights, not the
    DSpine draft's), and refuses a directory that is not the twin of --draft."""
    import argparse

    from dspine_engine.cli.train import _ablation_start

    target = small_vocab_target
    dspine = _draft(target)
    previous_twin = _twin(_draft(target))
    with torch.no_grad():
        for p in previous_twin.parameters():
            p.add_(0.5)
    dspine.save(tmp_path / "dspine", dtype=torch.float32)
    previous_twin.save(tmp_path / "dflash", dtype=torch.float32)
    args = argparse.Namespace(draft=str(tmp_path / "dspine"), quiet=True,
                              ablation_draft=str(tmp_path / "dflash"))
    twin = _ablation_start(args, dspine, target)
    assert not twin.config.injection and not twin.config.transition
    for name, p in _params(previous_twin).items():
        torch.testing.assert_close(_params(twin)[name], p, rtol=0, atol=0, msg=name)
    assert not torch.equal(_params(twin)["layers.0.mlp.down_proj.weight"],
                           _params(dspine)["layers.0.mlp.down_proj.weight"])
    with pytest.raises(ValueError, match="not the DFlash twin"):
        _ablation_start(argparse.Namespace(draft=args.draft, quiet=True,
                                           ablation_draft=args.draft), dspine, target)
    with pytest.raises(ValueError, match="--draft too"):
        _ablation_start(argparse.Namespace(draft=None, quiet=True,
                                           ablation_draft=args.ablation_draft), dspine, target)
    args.ablation_draft = None
    same = _ablation_start(args, dspine, target)
    assert all(torch.equal(_params(dspine)[n], p) for n, p in _params(same).items())


def test_run_sized_to_its_budget(small_vocab_target, tmp_path):
    target, data = small_vocab_target, SequenceData(_records(), 256)
    with pytest.raises(ValueError, match="max_minutes"):
        Trainer(target, _draft(target), data, None, _config(steps=0), tmp_path)
    trainer = Trainer(target, _draft(target), data, None,
                      _config(steps=0, max_minutes=1.0, save_every=10), tmp_path)
    trainer.step = 20

    class Bar:
        total = None

    import time

    deadline, bar = time.monotonic() + 30.0, Bar()
    trainer._size_to_budget([0.1] * 15, 1.0, deadline, bar)
    # 30 s * 0.97 - 1 s for the last checkpoint, at 0.1 s/step + 1 s per 10 steps: ~143 more.
    assert 20 + 135 <= trainer.total_steps <= 20 + 145
    assert bar.total == trainer.total_steps


def _plain_cosine(step, total, warm, floor):
    """The schedule as trainers before re-planning computed it (their state files resume on it)."""
    if step < warm:
        return (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, total - warm))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize("warmup", [0.04, 30])
def test_lr_stays_continuous_when_the_run_is_resized(warmup):
    from dspine_engine.train.draft_run import LRSchedule

    plain = LRSchedule.start(1000, warmup, 0.05)
    assert [plain.factor(s) for s in range(0, 1001, 7)] == pytest.approx(
        [_plain_cosine(s, 1000, plain.warm, 0.05) for s in range(0, 1001, 7)], abs=1e-12)
    # Re-sized during the warm-up (at 20: 40 -> 600 steps), then up and down in the cosine.
    sched, factors = plain, []
    for step, total in ((20, 600), (300, 1500), (900, 1000)):
        curve = [sched.factor(s) for s in range(step - 3, step + 1)]
        sched = sched.replan(step, total, warmup)
        curve += [sched.factor(s) for s in range(step, step + 4)]
        factors.append(curve)
        # The factor at the re-plan step is the one the scheduler already set for it ...
        assert curve[3] == curve[4]
        # ... and the change from step to step across the re-plan stays within what the curve
        # does just before or after it (a raised total used to push the factor back up).
        jumps = [abs(b - a) for a, b in zip(curve[4:], curve[5:])]
        before = [abs(b - a) for a, b in zip(curve[:4], curve[1:4])]
        assert max(jumps) <= 1.5 * max(before + jumps[1:]) + 1e-12
        if step >= sched.warm:  # in the cosine: still going down
            assert curve[4:] == sorted(curve[4:], reverse=True)
    assert sched.factor(1000) == pytest.approx(0.05) and sched.factor(999) > 0.05
    assert sched.factor(1200) == pytest.approx(0.05)
    # The old way: the plain cosine for the new total, which jumps at the re-plan.
    assert _plain_cosine(300, 1500, 60, 0.05) - _plain_cosine(300, 600, 24, 0.05) > 0.2


def test_a_run_that_gets_faster_is_resized_to_fill_its_budget(small_vocab_target, tmp_path,
                                                              monkeypatch):
    """Steps that take 0.1 s until step 150 and 0.05 s after it (the GPU shared at first): the
    run grows to fill its 60 s instead of stopping at the ~560 steps planned at step 120 (at
    ~37 s), with a continuous learning rate. A fake clock and step: no real timing."""
    from dspine_engine.train import trainer as trainer_mod

    data = SequenceData(_records(), 256)
    trainer = Trainer(small_vocab_target, _draft(small_vocab_target), data, None,
                      _config(steps=0, max_minutes=1.0, log_every=10**6, warmup=0.04), tmp_path)
    now, factors, planned = [1000.0], [], []

    def step():
        factors.append(trainer._lr_factor(trainer.step))  # the factor this step trains at
        now[0] += 0.1 if trainer.step < 150 else 0.05
        trainer.step += 1
        if trainer.step == 150:
            planned.append(trainer.total_steps)  # as sized at step 120

    def checkpoint():
        now[0] += 1.0
        return 1.0

    trainer.clock, trainer.train_step, trainer._checkpoint = (lambda: now[0]), step, checkpoint
    monkeypatch.setattr(trainer, "_log_train", lambda bar, window: None)
    monkeypatch.setattr(trainer_mod._Window, "add", lambda self, t: None)
    assert trainer.run(t_start=1000.0)
    assert 500 < planned[0] < 600
    assert trainer.step == trainer.total_steps > planned[0] + 300
    assert 55.0 < now[0] - 1000.0 <= 60.0  # ends just inside the budget
    # The warm-up climbs step by step from the first step (unsized, it is a fraction of
    # UNSIZED_RUN_STEPS, not of the 10**6 placeholder), and nothing jumps after it.
    assert factors[0] < 0.05 and factors[10] < 0.5
    assert max(factors[:60]) == pytest.approx(1.0, abs=0.01)  # ... and ends at the full rate
    steps = [abs(b - a) for a, b in zip(factors, factors[1:])]
    assert max(steps) < 0.05
    assert factors[-1] == pytest.approx(0.05, abs=1e-3)


def test_resume_from_a_state_without_a_schedule(small_vocab_target, tmp_path):
    """A state file written before re-planning existed (no ``lr_schedule``) resumes on the
    plain cosine of its ``total_steps``; one written now carries its re-planned schedule."""
    from dspine_engine.train.draft_run import find_state

    data = SequenceData(_records(), 256)
    cfg = _config(steps=40, warmup=0.1)
    first = Trainer(small_vocab_target, _draft(small_vocab_target), data, None, cfg, tmp_path)
    for _ in range(2):
        first.train_step()
    first.schedule = first.schedule.replan(first.step, 60, cfg.warmup)
    first.save()
    state_dir = find_state(tmp_path)
    state = json.loads((state_dir / "state.json").read_text())
    assert state["total_steps"] == 60 and state["lr_schedule"]["anchor"] == 2

    again = Trainer(small_vocab_target, _draft(small_vocab_target), data, None, cfg, tmp_path)
    again.load_state([state_dir], [state])
    assert again.schedule == first.schedule
    del state["lr_schedule"]
    (state_dir / "state.json").write_text(json.dumps(state))
    old = Trainer(small_vocab_target, _draft(small_vocab_target), data, None, cfg, tmp_path)
    old.load_state([state_dir], [json.loads((state_dir / "state.json").read_text())])
    assert (old.step, old.total_steps, old.schedule.anchor) == (2, 60, 0)
    assert [old._lr_factor(s) for s in range(2, 61)] == pytest.approx(
        [_plain_cosine(s, 60, 6, cfg.min_lr_ratio) for s in range(2, 61)], abs=1e-12)
    old.train_step()
    old.save()
    assert json.loads((state_dir / "state.json").read_text())["step"] == 3


def test_walk_score_is_the_argmax_chain_without_pair_scores(small_vocab_target):
    """With a zero pair term the transition walk picks each position's argmax, so the held-out
    tau_walk equals the argmax tau; the transition tables are the ones the engine binds."""
    from dspine_engine.train.evaluation import walk_tables

    target, data = small_vocab_target, SequenceData(_records(), 256)
    draft = _draft(target)
    with torch.no_grad():
        draft.transition.hidden_proj.weight.zero_()
    trainer = Trainer(target, draft, data, data, _config(eval_batches=2), "/nonexistent")
    scores = trainer.evaluate()
    assert scores["tau_walk"] == pytest.approx(scores["tau"])
    assert scores["acc_walk_by_pos"] == pytest.approx(scores["acc_by_pos"], nan_ok=True)
    draft.bind(target.embed, target.lm_head, target.config, target.lm_head_dense)
    p_tab, q_tab = walk_tables(draft, target.lm_head)
    torch.testing.assert_close(p_tab, draft.bound.transition.pred)
    torch.testing.assert_close(q_tab, draft.bound.transition.succ)


def test_best_checkpoint_is_kept(small_vocab_target, tmp_path):
    from dspine_engine.train.draft_run import DraftRun

    target = small_vocab_target
    run = DraftRun("dspine", _draft(target), target, _config(), tmp_path, lambda s: 1.0)
    assert run.record_eval(2, 1.5) and not run.record_eval(4, 1.4) and run.record_eval(6, 1.6)
    assert (run.best, run.best_step) == (1.6, 6)
    assert not run.record_eval(8, 1.6)  # ties keep the earlier checkpoint


def test_narrower_mlp_starts_from_the_strongest_target_neurons(tiny_target_model):
    target = tiny_target_model
    t = target.config
    keep = t.intermediate_size // 2
    cfg = new_draft_config(t, layers=1, target_layers=[1], intermediate=keep)
    draft = DSpineDraft(cfg).init_weights()
    assert copy_target_layers(draft, target) == [t.num_layers - 1]
    src = target.layers[t.num_layers - 1]
    gu = src.gate_up.checkpoint_weight
    gate, up, down = gu[:t.intermediate_size], gu[t.intermediate_size:], src.down.checkpoint_weight
    idx = mlp_neurons(gate, up, down, keep)
    score = gate.norm(dim=1) * up.norm(dim=1) * down.norm(dim=0)
    assert set(idx.tolist()) == set(torch.topk(score, keep).indices.tolist())
    assert idx.tolist() == sorted(idx.tolist())
    mlp = draft.layers[0].mlp
    torch.testing.assert_close(mlp.gate_proj.weight, gate[idx])
    torch.testing.assert_close(mlp.down_proj.weight, down[:, idx])
    wide = new_draft_config(t, layers=1, target_layers=[1], intermediate=t.intermediate_size * 2)
    from dspine_engine.models.config import ModelConfigError

    with pytest.raises(ModelConfigError):
        copy_target_layers(DSpineDraft(wide).init_weights(), target)


@pytest.fixture(scope="module")
def tiny_target_model(tiny_llama):
    from dspine_engine.models.target import TargetModel

    return TargetModel.load(tiny_llama, progress=False)


@pytest.mark.parametrize("soft", [False, True])
def test_flop_count_matches_torch_counter(small_vocab_target, soft):
    """The analytic count of the draft's GEMMs (forward + backward, loss projections included)
    agrees with torch's FLOP counter on a real step, attention aside (kept tiny here)."""
    from torch.utils.flop_counter import FlopCounterMode

    from dspine_engine.train.flops import ce_terms, draft_step_flops

    target, data = small_vocab_target, SequenceData(_records(n=4, length=12), 256)
    draft = _draft(target)
    trainer = Trainer(target, draft, data, None, _config(batch_size=4, soft_targets=0.5 * soft),
                      "/nonexistent")
    batch = data.batch([0, 1, 2, 3])
    taps, blocks = trainer._capture(batch, torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        res, _ = trainer.runs[0].loss(taps, blocks, autocast=False)
        res.loss.backward()
    counted = counter.get_total_flops()
    ours = draft_step_flops(draft.config, batch[1].tolist(), int(blocks.keep.sum()),
                            int(blocks.valid.sum()), ce_terms(draft.config, 1.0, soft))
    assert 0.75 * counted <= ours <= 1.25 * counted, (ours, counted)


def test_merge_keeps_the_first_record_of_each_prompt(tmp_path, capsys):
    from dspine_engine.cli.train import main
    from dspine_engine.train.data import read_samples

    a, b = _records(n=3), _records(n=4, seed=1)  # b's first 3 prompts repeat a's
    for path, recs in ((tmp_path / "a.jsonl", a), (tmp_path / "b.jsonl", b)):
        path.write_text("".join(json.dumps({**r, "index": 7 + i}) + "\n"
                                for i, r in enumerate(recs)))
    out = tmp_path / "all.jsonl"
    assert main(["merge", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--out",
                 str(out)]) == 0
    merged = read_samples(out)
    assert [r["response_ids"] for r in merged] == [r["response_ids"] for r in a + b[3:]]
    assert [r["index"] for r in merged] == [0, 1, 2, 3]
    # The turns of one conversation share an index, before and after.
    turns = [{**a[0], "index": 5, "turn": 0}, {**b[3], "index": 5, "turn": 1}]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in turns))
    assert main(["merge", str(tmp_path / "a.jsonl"), str(tmp_path / "c.jsonl"), "--out",
                 str(out)]) == 0
    assert [r["index"] for r in read_samples(out)] == [0, 1, 2, 3]  # a[0] repeats; b[3] new
    assert "3 repeated prompts dropped" in capsys.readouterr().err
