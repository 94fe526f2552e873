"""Data-parallel `dspine-train` on the CPU: torchrun with 2 gloo ranks. Fitting with a per-rank
batch of b gives the weights one process reaches with a batch of 2b (up to fp32 reduction
order); data generation answers every prompt exactly once across the ranks."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not available")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
           "-m", "dspine_engine.cli.train", *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _state(run):
    from safetensors.torch import load_file

    from dspine_engine.models.weights import checkpoint_files

    tensors = {}
    for f in checkpoint_files(run / "train_state"):
        tensors.update(load_file(f))
    return json.loads((run / "train_state" / "state.json").read_text()), tensors


def test_two_ranks_match_one_process_with_the_global_batch(tiny_llama, tmp_path):
    from dspine_engine.cli.train import main

    gen = torch.Generator().manual_seed(0)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({
        "prompt_ids": [1, 90, 198, 100 + i],
        "response_ids": torch.randint(3, 500, (20 + 3 * i,), generator=gen).tolist()}) + "\n"
        for i in range(10)))
    common = ["fit", "--target", tiny_llama, "--data", data, "--layers", "1", "--target-layers",
              "0,2", "--block-size", "8", "--rank", "8", "--blocks-per-seq", "3", "--max-len",
              "64", "--steps", "3", "--eval-batches", "0", "--log-every", "1", "--quiet",
              "--no-bf16"]
    one = tmp_path / "one"
    assert main([str(a) for a in common + ["--batch-size", "4", "--out", one,
                                          "--ablation-out", tmp_path / "one_dflash"]]) == 0
    two = tmp_path / "two"
    _torchrun(common + ["--batch-size", "2", "--out", two,
                        "--ablation-out", tmp_path / "two_dflash"])
    for a, b in ((one, two), (tmp_path / "one_dflash", tmp_path / "two_dflash")):
        (sa, ta), (sb, tb) = _state(a), _state(b)
        assert sa["step"] == sb["step"] == 3
        for name, t in ta.items():
            torch.testing.assert_close(tb[name], t, rtol=1e-4, atol=1e-5, msg=name)
        la = [json.loads(x) for x in (a / "train_log.jsonl").open()]
        lb = [json.loads(x) for x in (b / "train_log.jsonl").open()]
        assert len(la) == len(lb) == 3  # only rank 0 writes
        for x, y in zip(la, lb):  # logged losses are the whole batch's, not one rank's
            assert y["loss"] == pytest.approx(x["loss"], rel=1e-4)
            assert y["acc_by_pos"] == pytest.approx(x["acc_by_pos"], nan_ok=True)


def test_two_ranks_answer_every_prompt_once(tiny_llama, tmp_path):
    from dspine_engine.models.tokenizer import Tokenizer
    from dspine_engine.train.data import read_samples

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Count to {n}."}) + "\n"
                               for n in range(7)))
    out = tmp_path / "data.jsonl"
    _torchrun(["data", "--target", tiny_llama, "--prompts", prompts, "--out", out,
               "--max-new-tokens", 6, "--device", "cpu", "--quiet"])
    tok = Tokenizer(tiny_llama)
    expect = sorted(tuple(tok.encode_chat([{"role": "user", "content": f"Count to {n}."}]))
                    for n in range(7))
    records = read_samples(out)
    assert sorted(tuple(r["prompt_ids"]) for r in records) == expect
    assert [r["index"] for r in records] == list(range(7))
    shards = [read_samples(out.with_name(f"data.jsonl.rank{r}")) for r in (0, 1)]
    assert [len(s) for s in shards] == [4, 3]
