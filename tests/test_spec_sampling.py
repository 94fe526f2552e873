"""Speculative sampling keeps the target's distribution (CPU, fp32), with full blocks and with
dynamic verification (spec_policy="auto", which verifies fewer drafts or none).

On a tiny-vocabulary model (16 tokens) we draw many continuations with plain sampling and with
speculative sampling (random DSpine draft: its proposals are often rejected, so residual sampling
is exercised at every position of the block) and compare the joint distribution of the first
tokens of the first round with a chi-square test of homogeneity at significance 1e-3. The test
has power: the same comparison rejects a verifier that resamples from p instead of the residual
max(0, p - q).
"""
import json

import pytest
import torch
from scipy.stats import chi2_contingency

from dspine_engine import Engine, SamplingParams, ops
from dspine_engine.models.draft_config import DraftConfig
from dspine_engine.models.dspine import DSpineDraft

ALPHA = 1e-3
VOCAB = 16
SAMPLES = 6000
PROMPT = [3, 1, 4, 1, 5]


def _tiny_vocab_model(path, hybrid: bool = False):
    """A 16-token target (Llama, or with ``hybrid`` a Qwen3.5 of one Gated DeltaNet and one
    gated attention layer) and a random DSpine draft for it."""
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "t15"}))
    torch.manual_seed(5)
    shape = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                 eos_token_id=15, tie_word_embeddings=True)
    if hybrid:
        from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(
            head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
            layer_types=["linear_attention", "full_attention"], **shape)).float()
    else:
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**shape))
    with torch.no_grad():  # sharpen the distribution a little so it is far from uniform
        model.model.embed_tokens.weight.mul_(6)
    model.save_pretrained(path)
    draft = DSpineDraft(DraftConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                                    head_dim=8, intermediate_size=64, vocab_size=VOCAB,
                                    target_layer_ids=[0, 1], block_size=4, sliding_window=None,
                                    transition_rank=8, transition_top_k=4,
                                    max_position_embeddings=128))
    draft.init_weights(seed=9, std=0.5).save(path / "draft", torch.float32)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _tiny_vocab_model(tmp_path_factory.mktemp("tinyvocab"))


@pytest.fixture(scope="module")
def tiny_hybrid(tmp_path_factory):
    pytest.importorskip("transformers.models.qwen3_5")
    return _tiny_vocab_model(tmp_path_factory.mktemp("tinyvocab_hybrid"), hybrid=True)


def _draw(engine, params_for, n=SAMPLES, length=4):
    results = engine.generate([PROMPT] * n, [params_for(i) for i in range(n)])
    return [tuple(r.token_ids[:length]) for r in results]


def _homogeneous(a, b) -> float:
    """p-value of a chi-square test that two samples of outcomes share one distribution."""
    cells = sorted(set(a) | set(b))
    counts = {c: [0, 0] for c in cells}
    for x in a:
        counts[x][0] += 1
    for x in b:
        counts[x][1] += 1
    table, rare = [], [0, 0]
    for c in cells:  # pool cells too thin for the chi-square approximation
        if sum(counts[c]) < 10:
            rare[0] += counts[c][0]
            rare[1] += counts[c][1]
        else:
            table.append(counts[c])
    if sum(rare):
        table.append(rare)
    return chi2_contingency(table)[1]


def _outcomes(samples):
    # Joint of the 2nd and 3rd token (the first two of the speculative round) and the 4th.
    return [(s[1], s[2]) for s in samples], [s[3] for s in samples]


def _auto_policy(tmp_path) -> dict:
    """Dynamic verification under a cost profile (a round costs b * (1 + 0.3 (w - 1))) where
    the draft's acceptance makes it choose plain decoding, 1 or 3 drafts as it learns."""
    seconds = {str(w): {"1": 1 + 0.3 * (w - 1), "512": 512 * (1 + 0.3 * (w - 1))}
               for w in (1, 2, 4)}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"seconds": seconds}))
    return dict(spec_policy="auto", spec_cost_profile=str(path))


def _check_distribution(tiny, filters, policy: dict | None = None):
    ar = Engine(tiny, progress=False, max_num_seqs=512)
    spec = Engine(tiny, draft=tiny / "draft", progress=False, max_num_seqs=512,
                  **(policy or {}))
    mk = lambda seed0: lambda i: SamplingParams(max_tokens=4, temperature=1.0, seed=seed0 + i,
                                                ignore_eos=True, **filters)  # noqa: E731
    a_pairs, a_last = _outcomes(_draw(ar, mk(0)))
    s_pairs, s_last = _outcomes(_draw(spec, mk(10**6)))
    assert spec.stats.drafted_rounds > 0
    accepted = spec.stats.acceptance_by_position()
    assert 0.05 < accepted[0] < 0.95, "the draft must be accepted sometimes and rejected sometimes"
    if policy:  # not vacuous: rounds of different lengths, plain ones included
        assert len(spec.stats.verify_lengths) >= 2 and 0 in spec.stats.verify_lengths, \
            spec.stats.verify_lengths
    assert _homogeneous(a_pairs, s_pairs) > ALPHA
    assert _homogeneous(a_last, s_last) > ALPHA


@pytest.mark.parametrize("filters", [dict(), dict(top_k=6, top_p=0.9)])
def test_speculative_sampling_matches_target_distribution(tiny, filters):
    _check_distribution(tiny, filters)


def test_dynamic_verification_keeps_the_target_distribution(tiny, tmp_path):
    _check_distribution(tiny, dict(), _auto_policy(tmp_path))


def test_speculative_sampling_on_a_hybrid_target_matches_its_distribution(tiny_hybrid):
    """The same test on a Gated DeltaNet target: the rollback of rejected drafts out of the
    recurrent state must not bias later tokens (the 4th token comes from a second round, after a
    rollback, whenever the first accepts fewer than two drafts)."""
    _check_distribution(tiny_hybrid, dict())


def test_the_statistical_test_catches_a_wrong_residual(tiny, monkeypatch):
    """Resampling from p after a rejection (instead of max(0, p - q)) must be detected."""

    correct = ops.block_verify

    def wrong_residual(logits, drafts, cand_ids, cand_probs, temp, top_k, top_p, u):
        accept, out = correct(logits, drafts, cand_ids, cand_probs, temp, top_k, top_p, u)
        for b in range(logits.shape[0]):  # redo the final sample from p at the stop position
            n = int(accept[b])
            p = ops.sampling_probs_ref(logits[b, n], float(temp[b]), int(top_k[b]),
                                       float(top_p[b]))
            out[b, n] = ops._sample_index(p, float(u[b, -1]))
        return accept, out

    ar = Engine(tiny, progress=False, max_num_seqs=512)
    spec = Engine(tiny, draft=tiny / "draft", progress=False, max_num_seqs=512)
    monkeypatch.setattr("dspine_engine.engine.runner.ops.block_verify", wrong_residual)
    mk = lambda seed0: lambda i: SamplingParams(max_tokens=4, temperature=1.0, seed=seed0 + i,
                                                ignore_eos=True)  # noqa: E731
    a_pairs, _ = _outcomes(_draw(ar, mk(0)))
    s_pairs, _ = _outcomes(_draw(spec, mk(10**6)))
    assert _homogeneous(a_pairs, s_pairs) < ALPHA
