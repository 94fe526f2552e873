// Tiny test harness for the C API tests: checks that count and report instead of aborting, so a
// run lists every failure; a per-case context line says which inputs failed; seeded inputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dspine_kernels.h"

namespace dspine_test {

// ---- reporting ------------------------------------------------------------------------------

struct Tally {
  int64_t checks = 0;
  int64_t failures = 0;
  std::string context;  // the case being run, printed with each failure
};

inline Tally& tally() {
  static Tally t;
  return t;
}

// Names the current case for failure messages while in scope.
class Case {
 public:
  explicit Case(std::string description) : saved_(tally().context) { tally().context = std::move(description); }
  ~Case() { tally().context = saved_; }

 private:
  std::string saved_;
};

template <typename... Parts>
std::string str(const Parts&... parts) {
  std::ostringstream os;
  os.precision(9);
  (os << ... << parts);
  return os.str();
}

inline bool check(bool ok, const std::string& what) {
  ++tally().checks;
  if (!ok) {
    ++tally().failures;
    std::fprintf(stderr, "FAIL [%s] %s\n", tally().context.c_str(), what.c_str());
  }
  return ok;
}

inline bool check_status(dspine_status got, dspine_status want, const char* call) {
  return check(got == want, str(call, " returned ", static_cast<int>(got), " (want ", static_cast<int>(want),
                                "): ", dspine_last_error()));
}

inline bool check_ok(dspine_status got, const char* call) { return check_status(got, DSPINE_OK, call); }

// |got - want| <= atol + rtol * |want| everywhere, and got is never NaN. Reports the first few
// offending indices with their values.
inline bool check_close(const char* what, const std::vector<float>& got, const std::vector<double>& want,
                        double atol, double rtol) {
  if (!check(got.size() == want.size(), str(what, ": size ", got.size(), " != ", want.size()))) return false;
  int64_t bad = 0;
  double worst = 0.0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const bool ok = !std::isnan(got[i]) && err <= atol + rtol * std::fabs(want[i]);
    if (ok) continue;
    if (bad < 5) first += str(" [", i, "] got ", got[i], " want ", want[i], ";");
    worst = std::isnan(got[i]) ? worst : std::max(worst, err);
    ++bad;
  }
  return check(bad == 0, str(what, ": ", bad, " of ", got.size(), " values off (max abs err ", worst, "):", first));
}

template <typename T>
bool check_equal(const char* what, const std::vector<T>& got, const std::vector<T>& want) {
  if (!check(got.size() == want.size(), str(what, ": size ", got.size(), " != ", want.size()))) return false;
  int64_t bad = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (bad < 5) first += str(" [", i, "] got ", got[i], " want ", want[i], ";");
    ++bad;
  }
  return check(bad == 0, str(what, ": ", bad, " of ", got.size(), " values differ:", first));
}

// Bitwise equality for floats (NaN == NaN): for outputs that must be copies, not recomputations.
inline bool check_same_bits(const char* what, const std::vector<float>& got, const std::vector<float>& want) {
  std::vector<uint32_t> g(got.size()), w(want.size());
  for (size_t i = 0; i < got.size(); ++i) std::memcpy(&g[i], &got[i], 4);
  for (size_t i = 0; i < want.size(); ++i) std::memcpy(&w[i], &want[i], 4);
  return check_equal(what, g, w);
}

// ---- inputs ---------------------------------------------------------------------------------

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Outputs start as NaN so a value the kernel forgot to write fails the comparison.
inline std::vector<float> poisoned(size_t n) { return std::vector<float>(n, kNaN); }

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  float normal() { return std::normal_distribution<float>(0.f, 1.f)(gen_); }
  float uniform(float lo = 0.f, float hi = 1.f) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen_); }  // [lo, hi]
  bool coin(double p_true = 0.5) { return std::bernoulli_distribution(p_true)(gen_); }
  // Multiples of 1/denominator in [-range, range]: float arithmetic on these is exact, so
  // comparisons (argmax, ties) cannot differ between the kernel and a double reference.
  float dyadic(int range, int denominator) {
    return static_cast<float>(integer(-range * denominator, range * denominator)) / static_cast<float>(denominator);
  }
  std::vector<float> normals(size_t n, float scale = 1.f) {
    std::vector<float> v(n);
    for (auto& x : v) x = scale * normal();
    return v;
  }
  template <typename T>
  void shuffle(std::vector<T>& v) {
    std::shuffle(v.begin(), v.end(), gen_);
  }

 private:
  std::mt19937_64 gen_;
};

inline std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// ---- the test groups (one ctest test each) ----------------------------------------------------

using TestGroups = std::map<std::string, std::function<void()>>;

// main(): runs the groups named in argv (all without arguments); non-zero exit on any failure.
int run_test_groups(int argc, char** argv, const TestGroups& groups);


void test_norm();
void test_rope();
void test_write_kv();
void test_attention();
void test_injection();
void test_transition_walk();
void test_block_verify();
void test_errors();

}  // namespace dspine_test
