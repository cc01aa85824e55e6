// Helpers shared by the op tests (ops_*_test.cpp): building tensors from host values, checking a
// tensor's dtype, shape and values against hand-computed expectations, and checking that a bad
// call throws ls::Error whose message names the op and the shapes.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <source_location>
#include <string>
#include <type_traits>
#include <vector>

#include <lockstep/lockstep.h>

namespace ls = lockstep;

namespace ops_test {

// How much an ls::metrics counter grew since construction: Delta compiles("compiles"); ...
// compiles.get().
struct Delta {
  std::string name;
  int64_t start;
  explicit Delta(const char* n) : name(n), start(ls::metrics::counter(n)) {}
  int64_t get() const { return ls::metrics::counter(name) - start; }
};

// The device the op tests run on: LOCKSTEP_TEST_DEVICE ("ref", "cpu", "cuda:0"), else ref, the
// backend whose kernels define the semantics. E.g. LOCKSTEP_TEST_DEVICE=cpu unit_tests
// --gtest_filter='Ops*' checks another backend against the same hand-computed values.
inline ls::Device test_device() {
  const char* env = std::getenv("LOCKSTEP_TEST_DEVICE");
  return ls::parse_device(env && *env ? env : "ref");
}

// The message of the ls::Error `fn` throws ("" if it throws none).
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ls::Error& e) {
    return e.what();
  }
  return "";
}

// The bit patterns of an f32 tensor's values: "the same" meaning bit for bit.
inline std::vector<uint32_t> bits(const ls::Tensor& t) {
  const std::vector<float> v = t.to_vector<float>();
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// Fixture of every op test: new tensors go to test_device() for the duration of the test.
class OnTestDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = ls::default_device();
    ls::set_default_device(test_device());
  }
  void TearDown() override { ls::set_default_device(saved_); }

 private:
  ls::Device saved_;
};

template <typename T>
ls::Tensor tensor(const std::vector<T>& values, const ls::Shape& shape = {}) {
  return ls::from_vector<T>(values, shape);
}
inline ls::Tensor f32(const std::vector<float>& v, const ls::Shape& s = {}) { return tensor(v, s); }
inline ls::Tensor f64(const std::vector<double>& v, const ls::Shape& s = {}) {
  return tensor(v, s);
}
inline ls::Tensor i32(const std::vector<int32_t>& v, const ls::Shape& s = {}) {
  return tensor(v, s);
}
inline ls::Tensor i64(const std::vector<int64_t>& v, const ls::Shape& s = {}) {
  return tensor(v, s);
}
inline ls::Tensor b8(const std::vector<bool>& v, const ls::Shape& s = {}) { return tensor(v, s); }

// 0, 1, ..., numel-1 as T in `shape` (host-built, so it does not depend on ls::arange).
template <typename T>
ls::Tensor iota(const ls::Shape& shape) {
  std::vector<T> v(static_cast<size_t>(ls::shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(i);
  return ls::from_blob(v.data(), shape, ls::dtype_of<T>(), ls::default_device());
}

template <typename T>
constexpr double default_tol() {
  if constexpr (std::is_same_v<T, float>) return 1e-6;
  if constexpr (std::is_same_v<T, double>) return 1e-12;
  return 0;
}

// NaN matches NaN, infinities match exactly, finite values within tol * (1 + |want|).
template <typename T>
::testing::AssertionResult values_match(const ls::Tensor& t, const ls::Shape& shape,
                                        const std::vector<T>& want, double tol) {
  if (t.dtype() != ls::dtype_of<T>())
    return ::testing::AssertionFailure()
           << "dtype is " << t.dtype() << ", expected " << ls::dtype_of<T>();
  if (t.shape() != shape)
    return ::testing::AssertionFailure()
           << "shape is " << ls::shape_str(t.shape()) << ", expected " << ls::shape_str(shape);
  const std::vector<T> got = t.to_vector<T>();
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << "got " << got.size() << " values, expected " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    bool ok;
    if constexpr (std::is_floating_point_v<T>) {
      const double g = got[i], w = want[i];
      if (std::isnan(w))
        ok = std::isnan(g);
      else if (std::isinf(w))
        ok = g == w;
      else
        ok = std::isfinite(g) && std::abs(g - w) <= tol * (1 + std::abs(w));
    } else {
      ok = got[i] == want[i];
    }
    if (!ok) {
      ::testing::AssertionResult r = ::testing::AssertionFailure();
      r << "element " << i << " is " << +got[i] << ", expected " << +want[i] << "\n got:";
      for (size_t k = 0; k < got.size(); ++k) r << " " << +got[k];
      return r;
    }
  }
  return ::testing::AssertionSuccess();
}

// Checks dtype == T, the shape and the values; failures point at the caller's line.
template <typename T>
void expect_tensor(const ls::Tensor& t, const ls::Shape& shape, const std::vector<T>& want,
                   double tol = default_tol<T>(),
                   std::source_location loc = std::source_location::current()) {
  ::testing::ScopedTrace trace(loc.file_name(), static_cast<int>(loc.line()), "expect_tensor");
  EXPECT_TRUE(values_match<T>(t, shape, want, tol));
}

// Runs `fn`, which must throw ls::Error (of exactly `backend` kind when asked) whose message
// contains every string in `parts`.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts,
                         bool backend, const char* text, const char* file, int line) {
  ::testing::ScopedTrace trace(file, line, text);
  try {
    fn();
  } catch (const ls::Error& e) {
    const std::string msg = e.what();
    if (backend && !dynamic_cast<const ls::BackendError*>(&e))
      ADD_FAILURE() << "threw ls::Error but not ls::BackendError: " << msg;
    for (const std::string& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos)
          << "message does not contain \"" << p << "\":\n  " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a std::exception that is not ls::Error: " << e.what();
    return;
  } catch (...) {
    ADD_FAILURE() << "threw something that is not a std::exception";
    return;
  }
  ADD_FAILURE() << "did not throw";
}

}  // namespace ops_test

// EXPECT_LS_ERROR(expr, "substring", ...): evaluating expr throws ls::Error mentioning each one.
#define EXPECT_LS_ERROR(expr, ...) \
  ::ops_test::expect_error([&] { (void)(expr); }, {__VA_ARGS__}, false, #expr, __FILE__, __LINE__)
// The same for a run-time failure: ls::BackendError.
#define EXPECT_BACKEND_ERROR(expr, ...) \
  ::ops_test::expect_error([&] { (void)(expr); }, {__VA_ARGS__}, true, #expr, __FILE__, __LINE__)
