"""Draft training: the training forward equals the inference forward, loss weighting and
masking, the dspine-train CLI end to end (data -> fit -> resume -> Engine), and learning."""
from __future__ import annotations

import json
import math

import pytest
import torch

from dspine_engine.engine.kv_cache import KVCache
from dspine_engine.models.attention_meta import AttnMeta
from dspine_engine.models.dspine import DSpineDraft
from dspine_engine.models.target import TargetModel
from dspine_engine.train.capture import TargetCapture
from dspine_engine.train.draft_init import new_draft_config
from dspine_engine.train.forward import (TrainingForward, block_attention_mask, make_blocks,
                                         sample_anchors, teacher_states)
from dspine_engine.train.losses import (LossConfig, block_metrics, dspine_loss, position_weights,
                                        summarize_metrics, vocab_cross_entropy, weighted_mean)

BLOCK = 8


@pytest.fixture(scope="module")
def tiny_target(tiny_llama):
    return TargetModel.load(tiny_llama, progress=False)


def _draft(target, window=None, injection=True, transition=True, seed=0):
    cfg = new_draft_config(target.config, layers=2, block_size=BLOCK, sliding_window=window,
                           rank=16, top_k=4, target_layers=[0, 2], injection=injection,
                           transition=transition)
    draft = DSpineDraft(cfg).init_weights(seed=seed, std=0.1)
    with torch.no_grad():  # open the injection gates and move norms off 1 so every path counts
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
    return draft


def _batch(target, lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    s = max(lengths)
    tokens = torch.randint(3, target.config.vocab_size, (len(lengths), s), generator=gen)
    for i, n in enumerate(lengths):
        tokens[i, n:] = 0
    taps = TargetCapture(target, [0, 2], sum(lengths))(tokens, lengths)
    return tokens, torch.tensor(lengths), taps


def _inference_hidden(draft, target, tokens, taps, seqs, anchors, pending=3):
    """The draft's inference forward through a real paged cache, one inference 'sequence' per block: the context
    before the anchor is ingested (all but `pending` rows, which go in with the block)."""
    c, ps = draft.config, 16
    n = len(anchors)
    pages_each = (max(anchors) + BLOCK) // ps + 1
    kv = KVCache(c.num_layers, n * pages_each, ps, c.num_kv_heads, c.head_dim, torch.float32,
                 "cpu")
    tables = torch.arange(n * pages_each).view(n, pages_each)
    slot = lambda i, pos: int(tables[i, pos // ps]) * ps + pos % ps  # noqa: E731
    ctx_rows, ctx_pos, ctx_slots = [], [], []
    for i, (s, a) in enumerate(zip(seqs, anchors)):
        done = max(0, a - pending)
        draft.ingest_context(taps[s, :done], torch.arange(done, dtype=torch.int32),
                             torch.tensor([slot(i, p) for p in range(done)], dtype=torch.int32),
                             kv.k, kv.v)
        rows = list(range(done, a))
        ctx_rows.append(torch.cat([taps[s, rows], taps.new_zeros(BLOCK - len(rows),
                                                                  taps.shape[-1])]))
        ctx_pos += rows + [0] * (BLOCK - len(rows))
        ctx_slots += [slot(i, p) for p in rows] + [-1] * (BLOCK - len(rows))
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    meta = AttnMeta(i32([p for a in anchors for p in range(a, a + BLOCK)]),
                    i32([slot(i, p) for i, a in enumerate(anchors) for p in range(a, a + BLOCK)]),
                    tables.to(torch.int32), i32([a + BLOCK for a in anchors]),
                    i32(list(range(0, n * BLOCK + 1, BLOCK))), BLOCK, causal=False)
    anchor_ids = torch.tensor([int(tokens[s, a]) for s, a in zip(seqs, anchors)])
    return draft(anchor_ids, torch.cat(ctx_rows), i32(ctx_pos), i32(ctx_slots), meta,
                 kv.k, kv.v), anchor_ids


@pytest.mark.parametrize("window", [None, 12])
@pytest.mark.parametrize("injection", [True, False])
def test_training_forward_matches_inference(tiny_target, window, injection):
    draft = _draft(tiny_target, window, injection, transition=injection)
    draft.bind(tiny_target.embed, tiny_target.lm_head, tiny_target.config)
    lengths = [40, 29]
    tokens, lens, taps = _batch(tiny_target, lengths)
    # Blocks at the start, in the middle, overlapping and running past the end of a sequence.
    anchors = torch.tensor([[0, 17, 20, 35], [5, 11, 26, 27]])
    keep = torch.ones_like(anchors, dtype=torch.bool)
    blocks = make_blocks(tokens, lens, anchors, keep, BLOCK)
    with torch.no_grad():
        out = TrainingForward(draft, tiny_target.embed, tiny_target.lm_head)(taps, blocks)
    seqs = [s for s in range(2) for _ in range(4)]
    ref, anchor_ids = _inference_hidden(draft, tiny_target, tokens, taps, seqs,
                                        anchors.flatten().tolist())
    got = out.hidden.reshape(-1, BLOCK - 1, out.hidden.shape[-1])
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-5)
    logits, g = draft.heads(ref)
    torch.testing.assert_close(got @ tiny_target.lm_head.T, logits, atol=1e-4, rtol=1e-5)
    if draft.transition is not None:
        # The training transition logits equal U_j + (P[prev] * G_j) Q^T from the bound tables.
        prev = blocks.previous.reshape(-1, BLOCK - 1)
        tables = draft.bound.transition
        expect = logits + torch.einsum("njr,vr->njv", tables.pred[prev] * g, tables.succ)
        tr = draft.transition
        pair = (torch.nn.functional.embedding(prev, tiny_target.lm_head) @ tr.pred.weight.T
                * (got @ tr.hidden_proj.weight.T)) @ tr.succ.weight
        torch.testing.assert_close((got + pair) @ tiny_target.lm_head.T, expect, atol=1e-4,
                                   rtol=1e-5)


def test_training_forward_runs_no_reference_op(small_vocab_target, monkeypatch):
    """Reference ops are test references only: the training forward and its backward run with
    every ``ops.*_ref`` broken, and no production module calls one."""
    from pathlib import Path

    from dspine_engine import ops

    for name in dir(ops):
        if name.endswith("_ref"):
            monkeypatch.setattr(ops, name, _refuse(name))
    draft, tokens, lens, taps, blocks = _loss_setup(small_vocab_target)
    out = TrainingForward(draft, small_vocab_target.embed, small_vocab_target.lm_head)(taps,
                                                                                         blocks)
    res = dspine_loss(draft, small_vocab_target.lm_head, out, blocks, LossConfig(gamma=7.0))
    res.loss.backward()
    k_proj = draft.layers[0].self_attn.k_proj.weight
    assert torch.isfinite(k_proj.grad).all() and k_proj.grad.abs().sum() > 0
    package = Path(ops.__file__).parent
    callers = [str(f.relative_to(package)) for f in package.rglob("*.py")
               if f.name != "ops.py" and "_ref(" in f.read_text()]
    assert callers == []


def _refuse(name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"ops.{name} called on a production path")
    return refuse


@pytest.mark.parametrize("dspine", [True, False])
def test_dflash_or_dspine_is_a_config_fact(tiny_target, dspine):
    """The bound tables are typed fields; a DFlash draft has no injection or transition tables
    (not empty tensors), its heads give no pair term, and its walk is the per-position argmax."""
    from dspine_engine.models.dspine import (BoundTables, InjectionTables, TransitionTables,
                                             choose_drafts)

    draft = _draft(tiny_target, injection=dspine, transition=dspine)
    draft.bind(tiny_target.embed, tiny_target.lm_head, tiny_target.config)
    tables = draft.bound
    assert isinstance(tables, BoundTables) and len(tables.layers) == draft.config.num_layers
    assert all(isinstance(t.injection, InjectionTables) == dspine for t in tables.layers)
    assert isinstance(tables.transition, TransitionTables) == dspine
    assert (draft.transition is not None) == dspine
    hn = torch.randn(3, BLOCK - 1, draft.config.hidden_size)
    logits, g = draft.heads(hn)
    assert (g is not None) == dspine
    if not dspine:
        anchors, zeros = torch.tensor([1, 2, 3]), torch.zeros(3)
        tokens, _, _ = choose_drafts(logits, None, anchors, 4, zeros, torch.zeros(3, BLOCK - 1))
        assert torch.equal(tokens, logits.argmax(-1))


# --------------------------------------------------------------------------- losses and masks
def test_position_weights_and_default_gamma():
    from dspine_engine.train.losses import default_gamma

    assert default_gamma(16) == 7.0
    w = position_weights(16, 7.0)
    assert w.shape == (15,) and w[0] == 1.0
    torch.testing.assert_close(w[7], torch.tensor(math.exp(-1.0)))
    torch.testing.assert_close(w[1:] / w[:-1], torch.full((14,), math.exp(-1 / 7)))
    values, weights = torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.0, 0.5, 0.25])
    assert weighted_mean(values, weights) == pytest.approx((1 + 1 + 1) / 1.75)


def test_sample_anchors_stay_inside_the_response():
    lengths, starts = torch.tensor([30, 12, 9]), torch.tensor([10, 3, 7])
    anchors, keep = sample_anchors(lengths, starts, 6, 30, torch.Generator().manual_seed(0))
    assert anchors.shape == (3, 6)
    assert keep.sum(1).tolist() == [6, 6, 1]  # the last sequence has one anchor: 7 (= 9 - 2)
    for a, k, n, s in zip(anchors, keep, lengths, starts):
        kept = a[k].tolist()
        assert len(set(kept)) == len(kept) and all(s <= x <= n - 2 for x in kept)
    assert anchors[2][keep[2]].tolist() == [7]


def test_block_mask_small_case():
    tokens = torch.arange(1, 11)[None]
    blocks = make_blocks(tokens, torch.tensor([10]), torch.tensor([[2, 5]]),
                         torch.tensor([[True, True]]), 3)
    assert blocks.positions.tolist() == [[[2, 3, 4], [5, 6, 7]]]
    assert blocks.valid.tolist() == [[[True, True], [True, True]]]
    mask = block_attention_mask(blocks, 10, window=4)[0, 0].int()
    # Query at position 3 (block at 2): context keys 0, 1 (t < 2, 3 - t < 4), its own block.
    assert mask[1].tolist() == [1, 1, 0, 0, 0, 0, 0, 0, 0, 0] + [1, 1, 1, 0, 0, 0]
    # Query at position 7 (block at 5): context keys 4 only (7 - t < 4 and t < 5).
    assert mask[5].tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0, 0] + [0, 0, 0, 1, 1, 1]
    short = make_blocks(tokens, torch.tensor([7]), torch.tensor([[5]]), torch.tensor([[True]]),
                        3)
    assert short.valid.tolist() == [[[True, False]]] and short.tokens.tolist() == [[[6, 7, 0]]]


def _loss_setup(target, lengths=(30, 14), seed=0, **draft_kw):
    draft = _draft(target, **draft_kw)
    tokens, lens, taps = _batch(target, list(lengths), seed)
    anchors, keep = sample_anchors(lens, torch.tensor([4, 4]), 5, tokens.shape[1],
                                   torch.Generator().manual_seed(seed))
    anchors[1, 0], keep[1, 0] = 11, True  # a block running past the end of sequence 1
    return draft, tokens, lens, taps, make_blocks(tokens, lens, anchors, keep, BLOCK)


def _naive_loss(draft, lm_head, out, blocks, gamma, layer_weight, soft_weight=0.0,
                teacher_logits=None):
    """All three terms with full logits and no chunking: the definition. With ``soft_weight``
    the final and transition terms' label is (1 - alpha) onehot + alpha softmax(teacher)."""
    w = position_weights(BLOCK, gamma).expand_as(blocks.valid)
    mask = blocks.valid.float() * w
    hard = torch.nn.functional.one_hot(blocks.targets, lm_head.shape[0]).float()
    soft = hard if teacher_logits is None else (
        (1 - soft_weight) * hard + soft_weight * teacher_logits.softmax(-1))

    def ce(logits, label=hard):
        per = -(label * logits.log_softmax(-1)).sum(-1)
        return (per * mask).sum() / mask.sum()

    u = out.hidden @ lm_head.T
    tr = draft.transition
    p_table, q_table = lm_head @ tr.pred.weight.T, lm_head @ tr.succ.weight.T
    bilinear = (p_table[blocks.previous] * tr.hidden_proj(out.hidden)) @ q_table.T
    layers = torch.stack([ce(f @ lm_head.T) for f in out.features]).mean()
    return ce(u, soft) + ce(u + bilinear, soft) + layer_weight * layers


def test_loss_matches_definition_and_chunking(small_vocab_target):
    target = small_vocab_target
    draft, tokens, lens, taps, blocks = _loss_setup(target)
    fwd = TrainingForward(draft, target.embed, target.lm_head)
    expect = _naive_loss(draft, target.lm_head, fwd(taps, blocks), blocks, 7.0, 0.5)
    grads = []
    for chunk in (7, 100000):
        draft.zero_grad()
        res = dspine_loss(draft, target.lm_head, fwd(taps, blocks), blocks,
                          LossConfig(gamma=7.0, layer_weight=0.5, chunk_rows=chunk))
        torch.testing.assert_close(res.loss, expect)
        res.loss.backward()
        grads.append([p.grad.clone() for p in draft.parameters()])
    for a, b in zip(*grads):  # checkpointed chunks give the same gradients
        torch.testing.assert_close(a, b)
    assert set(res.terms) == {"final", "transition", "layers"}


def test_soft_labels_match_definition_with_the_targets_own_distribution(small_vocab_target):
    """alpha > 0: the final and transition labels mix in the target's next-token distribution,
    taken from the capture's final states at a+j-1 (whose logits are the target's own)."""
    target = small_vocab_target
    draft, tokens, lens, _, blocks = _loss_setup(target)
    taps, final = TargetCapture(target, [0, 2], int(lens.sum()))(tokens, lens.tolist(),
                                                                  final=True)
    blocks.teacher = teacher_states(final, blocks)
    # The target's logits over every real row, straight from its forward.
    flat = tokens[torch.arange(tokens.shape[1])[None] < lens[:, None]]
    cap = TargetCapture(target, [0, 2], int(lens.sum()))
    logits, _ = target.forward(flat, cap.prefill_meta(lens.tolist()), cap.kv.k, cap.kv.v)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)[:-1]])
    before = (blocks.positions[..., :-1] + starts[:, None, None])[blocks.valid]
    torch.testing.assert_close(blocks.teacher[blocks.valid] @ target.lm_head.T, logits[before],
                               rtol=1e-4, atol=1e-4)
    teacher_logits = blocks.teacher @ target.lm_head.T
    fwd = TrainingForward(draft, target.embed, target.lm_head)
    for alpha in (0.5, 1.0):
        expect = _naive_loss(draft, target.lm_head, fwd(taps, blocks), blocks, 7.0, 0.5, alpha,
                             teacher_logits)
        grads = []
        for chunk in (7, 100000):
            draft.zero_grad()
            res = dspine_loss(draft, target.lm_head, fwd(taps, blocks), blocks,
                              LossConfig(gamma=7.0, layer_weight=0.5, chunk_rows=chunk,
                                         soft_weight=alpha))
            torch.testing.assert_close(res.loss, expect)
            res.loss.backward()
            grads.append([p.grad.clone() for p in draft.parameters()])
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b)
        naive_grads = torch.autograd.grad(
            _naive_loss(draft, target.lm_head, fwd(taps, blocks), blocks, 7.0, 0.5, alpha,
                        teacher_logits), list(draft.parameters()), allow_unused=True)
        for got, ref in zip(grads[0], naive_grads):
            torch.testing.assert_close(got, torch.zeros_like(got) if ref is None else ref)
    hard = dspine_loss(draft, target.lm_head, fwd(taps, blocks), blocks, LossConfig())
    assert not torch.allclose(hard.loss, res.loss)  # the soft label does change the loss
    blocks.teacher = None
    with pytest.raises(ValueError, match="final states"):
        dspine_loss(draft, target.lm_head, fwd(taps, blocks), blocks, LossConfig(soft_weight=0.5))


def test_positions_past_the_end_are_ignored(small_vocab_target):
    target = small_vocab_target
    draft, tokens, lens, taps, blocks = _loss_setup(target)
    assert not blocks.valid[1, 0, 2:].any() and blocks.valid[1, 0, :2].all()
    fwd = TrainingForward(draft, target.embed, target.lm_head)
    res = dspine_loss(draft, target.lm_head, fwd(taps, blocks), blocks, LossConfig())
    # Garbage past each sequence's end (tokens and tapped states) changes nothing.
    noisy_tokens, noisy_taps = tokens.clone(), taps.clone()
    for i, n in enumerate(lens.tolist()):
        noisy_tokens[i, n:] = torch.randint(3, 500, (tokens.shape[1] - n,))
        noisy_taps[i, n:] = torch.randn_like(noisy_taps[i, n:])
    noisy_blocks = make_blocks(noisy_tokens, lens, blocks.anchors, blocks.keep, BLOCK)
    res2 = dspine_loss(draft, target.lm_head, fwd(noisy_taps, noisy_blocks), noisy_blocks,
                       LossConfig())
    torch.testing.assert_close(res.loss, res2.loss)
    m = summarize_metrics(block_metrics(res.correct, res.valid))
    assert len(m["acc_by_pos"]) == BLOCK - 1 and 1.0 <= m["tau"] <= BLOCK


def test_vocab_cross_entropy_empty_and_dflash_terms(small_vocab_target):
    target = small_vocab_target
    ce, top = vocab_cross_entropy(torch.zeros(0, 64), target.lm_head, torch.zeros(0).long())
    assert ce.shape == (0,) and top.shape == (0,)
    draft, tokens, lens, taps, blocks = _loss_setup(target, injection=False, transition=False)
    fwd = TrainingForward(draft, target.embed, target.lm_head)
    res = dspine_loss(draft, target.lm_head, fwd(taps, blocks), blocks, LossConfig())
    assert set(res.terms) == {"final"}


# --------------------------------------------------------------------------- learning
@pytest.mark.parametrize("soft_targets", [0.0, 0.5])
def test_a_few_dozen_steps_learn_a_repetitive_dataset(small_vocab_target, tmp_path,
                                                      soft_targets):
    """Hard labels, and soft ones mixed with this random target's near-uniform distribution:
    the label's mode is still the data's token, so the drafts learn it either way (the soft
    loss floors at alpha x the target's entropy, so only the hard loss must fall to near 0)."""
    from dspine_engine.train import SequenceData, TrainConfig, Trainer

    target = small_vocab_target
    pattern = [100 + 37 * i for i in range(7)]
    records = [{"prompt_ids": [1, 90, 198, 100 + i],
                "response_ids": [pattern[(i + k) % 7] for k in range(40)]} for i in range(16)]
    cfg = new_draft_config(target.config, layers=1, block_size=BLOCK, rank=16, target_layers=[2])
    draft = DSpineDraft(cfg).init_weights(seed=0)
    tc = TrainConfig(steps=30, batch_size=4, lr=3e-3, warmup=3, blocks_per_seq=4,
                     save_every=1000, eval_batches=0, soft_targets=soft_targets)
    trainer = Trainer(target, draft, SequenceData(records, 256), None, tc, tmp_path)
    losses, accs = [], []
    for _ in range(30):
        terms, counts = trainer.train_step()
        losses.append(float(terms["final"]))
        accs.append(summarize_metrics(counts)["acc"])
    if not soft_targets:
        assert sum(losses[-5:]) / 5 < 0.35 * sum(losses[:3]) / 3, losses
    assert sum(losses[-5:]) < sum(losses[:3]) / 3 * 5, losses
    assert sum(accs[-5:]) / 5 > 0.5, accs


# --------------------------------------------------------------------------- the CLI end to end
FIT_ARGS = ["--layers", "2", "--target-layers", "0,2", "--block-size", str(BLOCK), "--rank", "16",
            "--batch-size", "2", "--blocks-per-seq", "3", "--max-len", "64", "--eval-batches", "1",
            "--log-every", "1", "--quiet"]


def _cli(*argv):
    from dspine_engine.cli.train import main

    assert main([str(a) for a in argv]) == 0


@pytest.fixture(scope="module")
def self_generated(tiny_llama, tmp_path_factory):
    """`dspine-train data` with self-generation on the tiny target (which never ends a user turn
    by itself, hence --keep-truncated)."""
    out = tmp_path_factory.mktemp("data") / "data.jsonl"
    _cli("data", "--target", tiny_llama, "--out", out, "--num", 5, "--user-max-tokens", 6,
         "--max-new-tokens", 24, "--keep-truncated", "--quiet")
    return out


def test_data_self_generation_and_resume(self_generated, tiny_llama, tmp_path):
    from dspine_engine.models.tokenizer import Tokenizer
    from dspine_engine.train.data import read_samples, user_turn_prefix

    records = read_samples(self_generated)
    assert len(records) == 5 and [r["index"] for r in records] == list(range(5))
    tok = Tokenizer(tiny_llama)
    prefix, end_of_turn = user_turn_prefix(tok)
    assert tok.decode([end_of_turn], skip_special_tokens=False) == "<|im_end|>"
    assert tok.decode(prefix, skip_special_tokens=False).endswith("<|im_start|>user\n")
    for r in records:
        assert r["prompt_ids"] == tok.encode_chat([{"role": "user", "content": r["user"]}])
        assert 2 <= len(r["response_ids"]) <= 24
    # Running again with a larger --num continues the file instead of starting over.
    copy = tmp_path / "data.jsonl"
    copy.write_text(self_generated.read_text() + '{"index": 9, "prompt_')  # a torn last line
    _cli("data", "--target", tiny_llama, "--out", copy, "--num", 6, "--user-max-tokens", 6,
         "--max-new-tokens", 8, "--keep-truncated", "--quiet")
    more = read_samples(copy)
    assert len(more) == 6 and more[:5] == records and more[5]["index"] == 5


def test_data_from_prompts_file(tiny_llama, tmp_path):
    from dspine_engine.models.tokenizer import Tokenizer
    from dspine_engine.train.data import read_samples

    prompts = tmp_path / "prompts.jsonl"
    chat = [{"from": "human", "value": "Hi!"}, {"from": "gpt", "value": "Hello."},
            {"from": "human", "value": "Name a colour."}, {"from": "gpt", "value": "Red."}]
    prompts.write_text(json.dumps({"prompt": "Say something."}) + "\n" +
                       json.dumps({"conversations": chat}) + "\n")
    out = tmp_path / "data.jsonl"
    _cli("data", "--target", tiny_llama, "--prompts", prompts, "--out", out,
         "--max-new-tokens", 6, "--quiet")
    tok = Tokenizer(tiny_llama)
    records = read_samples(out)
    assert records[0]["prompt_ids"] == tok.encode_chat([{"role": "user",
                                                         "content": "Say something."}])
    expect = [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."},
              {"role": "user", "content": "Name a colour."}]
    assert records[1]["prompt_ids"] == tok.encode_chat(expect)


def _state(run):
    from safetensors.torch import load_file

    from dspine_engine.models.weights import checkpoint_files

    tensors = {}
    for f in checkpoint_files(run / "train_state"):
        tensors.update(load_file(f))
    return json.loads((run / "train_state" / "state.json").read_text()), tensors


def test_fit_resume_and_engine(self_generated, tiny_llama, tmp_path, monkeypatch):
    from dspine_engine import Engine, SamplingParams
    from dspine_engine.train import draft_run, trainer as trainer_mod

    monkeypatch.setattr(draft_run, "SHARD_BYTES", 64 * 1024)  # exercise sharded files
    args = ["fit", "--target", tiny_llama, "--data", self_generated, "--steps", 4, *FIT_ARGS]
    straight = tmp_path / "straight"
    _cli(*args, "--out", straight)

    # The same run, interrupted after step 2 (it saves on the way out) and resumed.
    original = trainer_mod.Trainer.train_step

    def interrupting(self):
        if self.step == 2:
            raise KeyboardInterrupt
        return original(self)

    run = tmp_path / "run"
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", interrupting)
    with pytest.raises(KeyboardInterrupt):
        _cli(*args, "--out", run)
    assert _state(run)[0]["step"] == 2
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", original)
    _cli(*args, "--out", run, "--resume")
    state, tensors = _state(run)
    assert state["step"] == 4
    logged = [json.loads(line)["step"] for line in (run / "train_log.jsonl").open()
              if "eval" not in line]
    assert logged == [1, 2, 3, 4]
    _, expect = _state(straight)
    for name, t in expect.items():  # resuming reproduces the uninterrupted run exactly
        torch.testing.assert_close(tensors[name], t, rtol=0, atol=0, msg=name)

    assert (run / "model.safetensors.index.json").is_file()
    assert all(f.stat().st_size <= 64 * 1024 for f in run.glob("model-*.safetensors"))
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["injection"]["enabled"] and cfg["transition"]["enabled"]

    params = SamplingParams(max_tokens=24, ignore_eos=True)
    spec = Engine(tiny_llama, draft=run, progress=False)
    plain = Engine(tiny_llama, progress=False)
    for prompt in ("Write a poem about the sea.", "What is 2 + 2?"):
        a, b = spec.generate(prompt, params)[0], plain.generate(prompt, params)[0]
        assert a.token_ids == b.token_ids
        assert a.stats.drafted_rounds > 0


def test_fit_dflash_ablation(self_generated, tiny_llama, tmp_path):
    out = tmp_path / "dflash"
    _cli("fit", "--target", tiny_llama, "--data", self_generated, "--out", out, "--steps", 1,
         "--ablation", "dflash", *FIT_ARGS)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["injection"] == {"enabled": False} and not cfg["transition"]["enabled"]
    state, tensors = _state(out)
    assert not any("injection" in n or "transition" in n for n in tensors)
    row = json.loads((out / "train_log.jsonl").open().readline())
    assert "final" in row and "transition" not in row and "layers" not in row


def test_fit_refuses_to_overwrite_a_run(self_generated, tiny_llama, tmp_path, capsys):
    from dspine_engine.cli.train import main

    out = tmp_path / "run"
    (out / "train_state").mkdir(parents=True)
    assert main(["fit", "--target", str(tiny_llama), "--data", str(self_generated), "--out",
                 str(out), "--quiet"]) == 2
    assert "--resume" in capsys.readouterr().err


def test_help_explains_every_flag(capsys):
    from dspine_engine.cli.train import build_parser

    for sub in ("data", "fit"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([sub, "--help"])
        text = capsys.readouterr().out
        assert "--max-minutes" in text and "--target" in text
    fit_actions = build_parser()._subparsers._group_actions[0].choices["fit"]._actions
    assert all(a.help for a in fit_actions)


def test_vocab_cross_entropy_matches_torch():
    gen = torch.Generator().manual_seed(0)
    vectors = torch.randn(37, 16, generator=gen, requires_grad=True)
    lm_head = torch.randn(300, 16, generator=gen)
    targets = torch.randint(0, 300, (37,), generator=gen)
    weights = torch.rand(37, generator=gen)
    ce, top = vocab_cross_entropy(vectors, lm_head, targets, chunk_rows=10)
    (ce * weights).sum().backward()
    got = vectors.grad.clone()
    vectors.grad = None
    logits = vectors @ lm_head.T
    ref = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    (ref * weights).sum().backward()
    torch.testing.assert_close(ce, ref)
    torch.testing.assert_close(got, vectors.grad)
    assert torch.equal(top, logits.argmax(-1))


def test_new_draft_sizing_and_init_from_target(tiny_target):
    from dspine_engine.models.config import ModelConfigError
    from dspine_engine.train.draft_init import copy_target_layers

    cfg = new_draft_config(tiny_target.config, layers=1, target_layers=[1])
    t = tiny_target.config
    assert (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size,
            cfg.block_size, cfg.vocab_size) == (t.hidden_size, t.num_heads, t.num_kv_heads,
                                                t.intermediate_size, 16, t.vocab_size)
    assert cfg.mask_token_id is None and cfg.injection and cfg.transition
    with pytest.raises(ModelConfigError):  # 2 taps cannot be spaced over 3 layers DFlash's way
        new_draft_config(tiny_target.config, layers=2)
    draft = DSpineDraft(cfg).init_weights()
    assert copy_target_layers(draft, tiny_target) == [2]
    src, layer = tiny_target.layers[2], draft.layers[0]
    torch.testing.assert_close(layer.mlp.down_proj.weight, src.down.checkpoint_weight)
    torch.testing.assert_close(layer.self_attn.v_proj.weight, src.qkv.checkpoint_weight[-t.num_kv_heads * t.head_dim:])


@pytest.mark.gpu
def test_training_on_cuda_under_autocast_equals_the_reference_rope(tiny_llama, monkeypatch):
    """What `dspine-train fit` runs on a GPU (bf16 autocast): loss and gradients through the RoPE
    kernel (`ops.trainable_rope`) equal those through the reference rotation it replaced."""
    from dspine_engine import ops

    target = TargetModel.load(tiny_llama, device="cuda", progress=False)
    draft = _draft(target).to("cuda")
    tokens = torch.randint(3, target.config.vocab_size, (2, 40),
                           generator=torch.Generator().manual_seed(0)).cuda()
    tokens[1, 29:] = 0
    lens = torch.tensor([40, 29], device="cuda")
    taps = TargetCapture(target, [0, 2], int(lens.sum()))(tokens, lens.tolist())
    anchors, keep = sample_anchors(lens.cpu(), torch.tensor([4, 4]), 5, tokens.shape[1],
                                   torch.Generator().manual_seed(0))
    blocks = make_blocks(tokens, lens, anchors.cuda(), keep.cuda(), BLOCK)
    fwd = TrainingForward(draft, target.embed, target.lm_head)

    def loss_and_grads():
        draft.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            res = dspine_loss(draft, target.lm_head, fwd(taps, blocks), blocks,
                              LossConfig(gamma=7.0, layer_weight=0.5))
        res.loss.backward()
        return res.loss.detach(), [p.grad.clone() for p in draft.parameters()]

    loss, grads = loss_and_grads()
    monkeypatch.setattr(ops, "trainable_rope", ops.rope_ref)
    ref_loss, ref_grads = loss_and_grads()
    assert torch.isfinite(loss) and abs(float(loss - ref_loss)) < 1e-2 * abs(float(ref_loss))
    for g, r in zip(grads, ref_grads):
        assert float((g - r).norm()) <= 3e-2 * float(r.norm()) + 1e-6
