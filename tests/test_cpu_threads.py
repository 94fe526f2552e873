"""The engine's CPU threads (engine/cpu_threads.py, EngineConfig.cpu_threads): kernels on their
own thread count, torch's ops on one thread during the GGUF path's steps, both restored after;
and no output bit depends on the count (greedy, default model, AR and speculative, batch 1 and
batched)."""
import pytest
import torch

from dspine_engine import Engine, ops
from dspine_engine.engine.cpu_threads import ENV, CpuThreads


def counts() -> tuple[int, int]:
    return torch.get_num_threads(), ops.cpu_threads()


def test_scope_sets_the_counts_and_restores_them():
    before = counts()
    threads = CpuThreads(kernels=3, torch_ops=1)
    with threads.scope():
        assert counts() == (1, 3)
        with CpuThreads(kernels=2, torch_ops=None).scope():  # torch's count left alone
            assert counts() == (1, 2)
        assert counts() == (1, 3)
    assert counts() == before
    with pytest.raises(KeyError), threads.scope():
        raise KeyError("a failed step")
    assert counts() == before


def test_engine_setting_env_and_defaults(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert CpuThreads.for_engine(cuda, 4) is None  # CUDA: nothing changes
    monkeypatch.delenv(ENV, raising=False)
    default = CpuThreads.for_engine(cpu, None)
    assert (default.kernels, default.torch_ops) == (torch.get_num_threads(), 1)
    monkeypatch.setenv(ENV, "3")
    assert CpuThreads.for_engine(cpu, None).kernels == 3
    assert CpuThreads.for_engine(cpu, 5).kernels == 5  # the setting wins


def record_step_counts(engine) -> list:
    """Wraps the verify forward so that each call records the thread counts it ran under."""
    seen, verify = [], engine.runner.verify

    def recorded():
        seen.append(counts())
        return verify()
    engine.runner.verify = recorded
    return seen


@pytest.mark.parametrize("cpu_threads", [1, 3])
@pytest.mark.parametrize("draft", [None, "default"], ids=["ar", "spec"])
def test_outputs_are_identical_whatever_the_threads(cpu_threads, draft, quant_prompts,
                                                     quant_params, quant_reference):
    before = counts()
    eng = Engine(None, draft=draft, device="cpu", dtype="gguf", progress=False, max_num_seqs=4,
                 spec_policy="fixed", cpu_threads=cpu_threads)
    seen = record_step_counts(eng)
    assert [r.token_ids for r in eng.generate(quant_prompts, quant_params)] == quant_reference
    one_by_one = [eng.generate(p, quant_params)[0].token_ids for p in quant_prompts[1:3]]
    assert one_by_one == quant_reference[1:3]
    assert seen and set(seen) == {(1, cpu_threads)}, "steps ran under other thread counts"
    assert counts() == before, "the engine left its thread counts behind"
    if draft is not None:
        assert eng.stats.tau > 1.2, f"the drafter is barely accepted (tau {eng.stats.tau:.2f})"
