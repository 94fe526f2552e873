"""Which attention kernel a call takes: the dispatch rules (csrc/cuda/attention_heuristics.h),
compiled from the header alone with the host C++ compiler and checked without a GPU
(tests/attention_dispatch_check.cpp). The GPU tests check that the kernels chosen agree."""
from host_check import run_host_check


def test_prefills_take_the_wgmma_kernel_whatever_their_batch(tmp_path):
    run_host_check(tmp_path, "attention_dispatch_check.cpp")
