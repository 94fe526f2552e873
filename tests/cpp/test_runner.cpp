// The main() body of the test executables: runs the groups named on the command line (all of
// them without arguments), prints a line per group and returns non-zero on any failure.
#include <chrono>

#include "test_util.h"

namespace dspine_test {

namespace {

void run_group(const std::string& name, const std::function<void()>& group) {
  const auto start = std::chrono::steady_clock::now();
  const auto failures_before = tally().failures, checks_before = tally().checks;
  group();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("%-24s %6lld checks, %lld failed (%.0f ms)\n", name.c_str(),
              static_cast<long long>(tally().checks - checks_before),
              static_cast<long long>(tally().failures - failures_before), ms);
}

}  // namespace

int run_test_groups(int argc, char** argv, const TestGroups& groups) {
  std::printf("dspine_kernels %s\n", dspine_version());
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) names.emplace_back(argv[i]);
  if (names.empty())
    for (const auto& entry : groups) names.push_back(entry.first);
  for (const auto& name : names) {
    const auto group = groups.find(name);
    if (group == groups.end()) {
      std::fprintf(stderr, "unknown test group '%s'\n", name.c_str());
      return 2;
    }
    run_group(name, group->second);
  }
  std::printf("%s: %lld checks, %lld failed\n", tally().failures ? "FAILED" : "PASSED",
              static_cast<long long>(tally().checks), static_cast<long long>(tally().failures));
  return tally().failures ? 1 : 0;
}

}  // namespace dspine_test
