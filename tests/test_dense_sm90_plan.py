"""How the Hopper dense GEMM cuts a call (csrc/cuda/dense_sm90_plan.h), compiled from the header
alone with the host C++ compiler and checked without a GPU (tests/dense_sm90_plan_check.cpp): the
plan depends on n, k and the SM count only, so a row's arithmetic never depends on the call's
rows; tests/test_dense_gpu.py checks the bits on the GPU."""
from host_check import run_host_check


def test_the_plan_keeps_every_sm_streaming_and_ignores_the_rows(tmp_path):
    run_host_check(tmp_path, "dense_sm90_plan_check.cpp")
