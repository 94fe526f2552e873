import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from tiny_models import write_tiny_model  # noqa: E402


def pytest_configure(config):
    """Under pytest-xdist each worker takes its share of the cores for torch's own CPU ops: the
    GPU runs' twelve workers on 16 cores each ran 16 threads, and a reference that sorts 480 rows
    of a 152K vocabulary took 111 s (15 s alone here). Serial runs (CI) keep torch's default."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_dir():
    """The default model (SmolLM2-135M-Instruct), fetched and converted once into the cache."""
    from dspine_engine.models.default_model import default_model_dir

    return default_model_dir(progress=False)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory, smollm2_dir):
    return write_tiny_model(tmp_path_factory.mktemp("tiny_llama"), "llama", smollm2_dir)


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_dir):
    from dspine_engine import Engine

    return Engine(smollm2_dir, progress=False, max_num_seqs=32)


# The CPU greedy-lossless tests (random, DFlash-format and trained drafts) share one set of real
# prompts and one plain-decoding reference: fp32 decoding of 20 prompts costs minutes here.
LOSSLESS_TOKENS = 128


@pytest.fixture(scope="session")
def lossless_prompts():
    """20 real prompts: 10 HumanEval, 10 MT-Bench (first turns, chat template applied later)."""
    from dspine_engine.datasets import humaneval_prompts, mtbench_prompts

    return humaneval_prompts()[:10] + mtbench_prompts()[:10]


@pytest.fixture(scope="session")
def greedy_reference(smollm2_engine, lossless_prompts):
    """Plain greedy decoding of ``lossless_prompts``, LOSSLESS_TOKENS new tokens each (EOS
    ignored), batched. A test that decodes n < LOSSLESS_TOKENS compares with the first n: greedy
    decoding never looks ahead, so the shorter answer is the longer one's prefix."""
    from dspine_engine import SamplingParams

    params = SamplingParams(max_tokens=LOSSLESS_TOKENS, ignore_eos=True)
    return [r.token_ids for r in smollm2_engine.generate(lossless_prompts, params)]


@pytest.fixture(scope="session")
def smollm2_quant_engine():
    """The default model on its own GGUF blocks (Q4_1 layers, Q8_0 tied embedding/lm_head)."""
    from dspine_engine import Engine

    return Engine(None, device="cpu", dtype="gguf", progress=False, max_num_seqs=32)


# The quantised path's greedy-lossless tests (thread counts, draft blocks) share four real
# prompts and one plain-decoding reference on the GGUF blocks.
QUANT_TOKENS = 40


@pytest.fixture(scope="session")
def quant_prompts():
    from dspine_engine.datasets import humaneval_prompts, mtbench_prompts

    return humaneval_prompts()[:2] + mtbench_prompts()[:2]


@pytest.fixture(scope="session")
def quant_params():
    from dspine_engine import SamplingParams

    return SamplingParams(max_tokens=QUANT_TOKENS, ignore_eos=True)


@pytest.fixture(scope="session")
def quant_reference(smollm2_quant_engine, quant_prompts, quant_params):
    """Plain greedy decoding of ``quant_prompts`` on the GGUF blocks (default threads), batched."""
    return [r.token_ids for r in smollm2_quant_engine.generate(quant_prompts, quant_params)]


@pytest.fixture(scope="session")
def tiny_llama_engine(tiny_llama):
    """An autoregressive engine on the tiny target (fast; for input-handling tests)."""
    from dspine_engine import Engine

    return Engine(tiny_llama, progress=False)


@pytest.fixture(scope="session")
def small_vocab_target(tmp_path_factory, smollm2_dir):
    """A tiny target with a 512-token vocabulary and larger embeddings (so a draft can reach
    confident logits in a few steps); used where no tokenizer is needed."""
    from dspine_engine.models.target import TargetModel

    path = write_tiny_model(tmp_path_factory.mktemp("tiny512"), "llama", smollm2_dir,
                            vocab_size=512, initializer_range=0.2)
    return TargetModel.load(path, progress=False)
