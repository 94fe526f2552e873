// The CPU test executable: one group per op family (ctest runs each as its own test).
#include "test_util.h"

int main(int argc, char** argv) {
  using namespace dspine_test;
  return run_test_groups(argc, argv, {{"norm", test_norm},
                                      {"rope", test_rope},
                                      {"write_kv", test_write_kv},
                                      {"attention", test_attention},
                                      {"injection", test_injection},
                                      {"transition_walk", test_transition_walk},
                                      {"block_verify", test_block_verify},
                                      {"errors", test_errors}});
}
