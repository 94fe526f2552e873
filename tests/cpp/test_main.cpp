// Runs the C API test groups named on the command line (all of them without arguments) and
// exits non-zero on any failure. ctest runs one group per test so failures show per op family.
#include <chrono>
#include <cstring>
#include <functional>
#include <map>

#include "test_util.h"

namespace {

const std::map<std::string, std::function<void()>>& groups() {
  static const std::map<std::string, std::function<void()>> all = {
      {"norm", dspine_test::test_norm},
      {"rope", dspine_test::test_rope},
      {"write_kv", dspine_test::test_write_kv},
      {"attention", dspine_test::test_attention},
      {"injection", dspine_test::test_injection},
      {"transition_walk", dspine_test::test_transition_walk},
      {"block_verify", dspine_test::test_block_verify},
      {"errors", dspine_test::test_errors},
  };
  return all;
}

void run_group(const std::string& name) {
  const auto start = std::chrono::steady_clock::now();
  const auto failures_before = dspine_test::tally().failures;
  const auto checks_before = dspine_test::tally().checks;
  groups().at(name)();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("%-16s %6lld checks, %lld failed (%.0f ms)\n", name.c_str(),
              static_cast<long long>(dspine_test::tally().checks - checks_before),
              static_cast<long long>(dspine_test::tally().failures - failures_before), ms);
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("dspine_kernels %s\n", dspine_version());
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) names.emplace_back(argv[i]);
  if (names.empty())
    for (const auto& entry : groups()) names.push_back(entry.first);
  for (const auto& name : names) {
    if (!groups().count(name)) {
      std::fprintf(stderr, "unknown test group '%s'\n", name.c_str());
      return 2;
    }
    run_group(name);
  }
  const auto& t = dspine_test::tally();
  std::printf("%s: %lld checks, %lld failed\n", t.failures ? "FAILED" : "PASSED", static_cast<long long>(t.checks),
              static_cast<long long>(t.failures));
  return t.failures ? 1 : 0;
}
