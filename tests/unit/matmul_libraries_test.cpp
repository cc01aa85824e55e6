// The cpu backend's libraries for f32 and bf16 products (src/backends/cpu/matmul.h): each computes
// every layout the lowering hands it as a product in double does, the choice between them is the
// tuning record's, and a record that is missing, unwritable or full of junk changes nothing but
// the speed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <lockstep/lockstep.h>

#include "backends/cpu/matmul.h"

namespace ls = lockstep;
namespace cpu = lockstep::backends::cpu;

namespace {

// Restores the library choice and the tuning record a test changed.
struct Restore {
  std::string file = cpu::detail::tuning_file();
  ~Restore() {
    cpu::set_matmul_choice(cpu::MatMulChoice::Auto);
    cpu::detail::set_tuning_file(file);
  }
};

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "lockstep_matmul_" + std::to_string(::getpid()) + "_" + name;
}

// One product's operands in the layouts given by the strides (a transposed operand is stored
// with its rows and columns swapped, and leading dimensions may exceed the row length).
struct Problem {
  int64_t m, k, n;
  bool ta, tb, ct;
  int64_t pad;  // extra elements per stored row of each operand and of the result
};

uint16_t bf16_bits(float v) { return ls::bfloat16(v).bits; }
float bf16_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

// Checks the product against one in double; the library that computed it. With bf16 operands
// (`in`), the operands are bf16 values and the result is `out`'s: a bf16 one within its rounding
// (relative 2^-8) of the product in double.
cpu::MatMulLibrary check(const Problem& pr, cpu::MatMulChoice choice,
                         std::optional<cpu::MatMulLibrary> expect = std::nullopt,
                         ls::DType in = ls::DType::F32, ls::DType out = ls::DType::F32) {
  const int64_t m = pr.m, k = pr.k, n = pr.n;
  // Stored row lengths (leading dimensions).
  const int64_t lda = (pr.ta ? m : k) + pr.pad, ldb = (pr.tb ? k : n) + pr.pad,
                ldc = (pr.ct ? m : n) + pr.pad;
  const std::vector<int64_t> as =
      pr.ta ? std::vector<int64_t>{1, lda} : std::vector<int64_t>{lda, 1};
  const std::vector<int64_t> bs =
      pr.tb ? std::vector<int64_t>{1, ldb} : std::vector<int64_t>{ldb, 1};
  const std::vector<int64_t> cs =
      pr.ct ? std::vector<int64_t>{1, ldc} : std::vector<int64_t>{ldc, 1};
  std::vector<float> a((pr.ta ? k : m) * lda), b((pr.tb ? n : k) * ldb);
  std::mt19937 gen(static_cast<uint32_t>(m * 131 + k * 17 + n));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const bool bf16 = in == ls::DType::BF16;
  for (float& v : a) v = bf16 ? bf16_float(bf16_bits(u(gen))) : u(gen);
  for (float& v : b) v = bf16 ? bf16_float(bf16_bits(u(gen))) : u(gen);
  std::vector<uint16_t> a16(a.size()), b16(b.size());
  for (size_t i = 0; i < a.size(); ++i) a16[i] = bf16_bits(a[i]);
  for (size_t i = 0; i < b.size(); ++i) b16[i] = bf16_bits(b[i]);
  // NaN everywhere first: the product must assign, not accumulate, and leave the padding alone.
  const size_t c_size = static_cast<size_t>((pr.ct ? n : m) * ldc);
  std::vector<float> c32(c_size, std::numeric_limits<float>::quiet_NaN());
  std::vector<uint16_t> c16(c_size, bf16_bits(std::numeric_limits<float>::quiet_NaN()));
  cpu::set_matmul_choice(choice);
  cpu::MatMul mm(ls::Shape{m, k}, as, ls::Shape{k, n}, bs, ls::Shape{m, n}, in, out, cs);
  // A product to be timed is timed at its first run.
  mm.run(bf16 ? static_cast<const void*>(a16.data()) : a.data(),
         bf16 ? static_cast<const void*>(b16.data()) : b.data(),
         out == ls::DType::BF16 ? static_cast<void*>(c16.data()) : c32.data());
  std::vector<float> c = c32;
  if (out == ls::DType::BF16)
    for (size_t i = 0; i < c_size; ++i) c[i] = bf16_float(c16[i]);
  if (expect) {
    EXPECT_EQ(mm.library(), *expect);
  }
  auto at = [&](const std::vector<float>& x, const std::vector<int64_t>& s, int64_t i, int64_t j) {
    return x[i * s[0] + j * s[1]];
  };
  int64_t wrong = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double want = 0, scale = 0;
      for (int64_t q = 0; q < k; ++q) {
        want += static_cast<double>(at(a, as, i, q)) * at(b, bs, q, j);
        scale += std::fabs(static_cast<double>(at(a, as, i, q)) * at(b, bs, q, j));
      }
      const float got = at(c, cs, i, j);
      const double tol =
          1e-5 * scale + 1e-6 + (out == ls::DType::BF16 ? std::fabs(want) / 256 : 0.0);
      if (!(std::fabs(got - want) <= tol) && wrong++ < 5)
        ADD_FAILURE() << "c[" << i << ", " << j << "] = " << got << ", want " << want;
    }
  // The padding of each stored row was not written.
  for (int64_t r = 0; r < (pr.ct ? n : m); ++r)
    for (int64_t p = (pr.ct ? m : n); p < ldc; ++p)
      if (!std::isnan(c[r * ldc + p])) {
        ADD_FAILURE() << "padding written at row " << r;
        return mm.library();
      }
  return mm.library();
}

}  // namespace

TEST(MatMulLibraries, EveryLayoutMatchesAProductInDouble) {
  Restore restore;
  cpu::detail::set_tuning_file("");
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool ct : {false, true})
        for (int64_t pad : {0, 3}) {
          const Problem pr{37, 53, 29, ta, tb, ct, pad};
          SCOPED_TRACE(::testing::Message()
                       << "ta " << ta << " tb " << tb << " ct " << ct << " pad " << pad);
          check(pr, cpu::MatMulChoice::OpenBlas, cpu::MatMulLibrary::OpenBlas);
          check(pr, cpu::MatMulChoice::OneDnnSgemm, cpu::MatMulLibrary::OneDnnSgemm);
          check(pr, cpu::MatMulChoice::OneDnn, cpu::MatMulLibrary::OneDnn);
        }
  // Large enough to be timed (2^21 multiply-adds and more): whichever wins computes the same
  // product.
  check({128, 160, 128, true, false, false, 0}, cpu::MatMulChoice::Auto);
}

// bf16 products widened to f32 on a BLAS (where that beats oneDNN's bf16 kernels: CPUs without
// AMX), with a bf16 or an f32 result, in every layout; oneDNN's own as the same check.
TEST(MatMulLibraries, Bf16ProductsWidenedOnEachBlasMatchAProductInDouble) {
  Restore restore;
  cpu::detail::set_tuning_file("");
  for (const auto out : {ls::DType::BF16, ls::DType::F32})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool ct : {false, true})
          for (int64_t pad : {0, 3}) {
            const Problem pr{37, 53, 29, ta, tb, ct, pad};
            SCOPED_TRACE(::testing::Message() << "out " << ls::dtype_name(out) << " ta " << ta
                                              << " tb " << tb << " ct " << ct << " pad " << pad);
            const auto bf16 = ls::DType::BF16;
            check(pr, cpu::MatMulChoice::OpenBlas, cpu::MatMulLibrary::OpenBlas, bf16, out);
            check(pr, cpu::MatMulChoice::OneDnnSgemm, cpu::MatMulLibrary::OneDnnSgemm, bf16, out);
            check(pr, cpu::MatMulChoice::OneDnn, cpu::MatMulLibrary::OneDnn, bf16, out);
          }
  // Several tiles of rows and of columns (64 x 1024), the last ones partial.
  for (bool ta : {false, true})
    for (bool ct : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "tiles, ta " << ta << " ct " << ct);
      check({130, 40, 1100, ta, !ta, ct, 1}, cpu::MatMulChoice::OneDnnSgemm,
            cpu::MatMulLibrary::OneDnnSgemm, ls::DType::BF16, ls::DType::BF16);
    }
  // Timed (whichever wins computes the same product), large enough for the threaded widening.
  check({256, 192, 160, false, true, false, 0}, cpu::MatMulChoice::Auto, std::nullopt,
        ls::DType::BF16, ls::DType::BF16);
}

// blas_sgemm, the small products of fused attention and Winograd, on each library: transposes,
// leading dimensions past the rows, alpha, and beta accumulating into what c holds.
TEST(MatMulLibraries, BlasSgemmOnEachLibraryMatchesAProductInDouble) {
  Restore restore;
  for (const auto choice : {cpu::MatMulChoice::OpenBlas, cpu::MatMulChoice::OneDnnSgemm})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        cpu::set_matmul_choice(choice);
        EXPECT_EQ(cpu::blas_library(), choice == cpu::MatMulChoice::OpenBlas
                                           ? cpu::MatMulLibrary::OpenBlas
                                           : cpu::MatMulLibrary::OneDnnSgemm);
        SCOPED_TRACE(::testing::Message()
                     << cpu::library_name(cpu::blas_library()) << " ta " << ta << " tb " << tb);
        const int64_t m = 19, n = 23, k = 31, lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 5,
                      ldc = n + 3;
        std::vector<float> a((ta ? k : m) * lda), b((tb ? n : k) * ldb), c(m * ldc);
        std::mt19937 gen(5);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (float& v : a) v = u(gen);
        for (float& v : b) v = u(gen);
        for (float& v : c) v = u(gen);
        const std::vector<float> c0 = c;
        cpu::blas_sgemm(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 2.0f, c.data(), ldc);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            if (j >= n) {  // past the row: untouched
              ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]) << i << ", " << j;
              continue;
            }
            double want = 2.0 * c0[i * ldc + j];
            for (int64_t q = 0; q < k; ++q)
              want += 0.5 * (ta ? a[q * lda + i] : a[i * lda + q]) *
                      (tb ? b[j * ldb + q] : b[q * ldb + j]);
            ASSERT_NEAR(c[i * ldc + j], want, 1e-4) << i << ", " << j;
          }
      }
}

TEST(MatMulLibraries, ProductsThatAreNotOneGemmStayOnOneDnn) {
  Restore restore;
  cpu::set_matmul_choice(cpu::MatMulChoice::OpenBlas);
  // A batch of two.
  cpu::MatMul batch(ls::Shape{2, 8, 8}, {64, 8, 1}, ls::Shape{2, 8, 8}, {64, 8, 1},
                    ls::Shape{2, 8, 8});
  EXPECT_EQ(batch.library(), cpu::MatMulLibrary::OneDnn);
  // An operand with no unit stride.
  cpu::MatMul strided(ls::Shape{8, 8}, {16, 2}, ls::Shape{8, 8}, {8, 1}, ls::Shape{8, 8});
  EXPECT_EQ(strided.library(), cpu::MatMulLibrary::OneDnn);
  // bf16 operands with an f32 or bf16 result go to the BLAS, widened.
  cpu::MatMul half(ls::Shape{8, 8}, {8, 1}, ls::Shape{8, 8}, {8, 1}, ls::Shape{8, 8},
                   ls::DType::BF16, ls::DType::BF16);
  EXPECT_EQ(half.library(), cpu::MatMulLibrary::OpenBlas);
  // A batch of one folds to one call.
  cpu::MatMul one(ls::Shape{1, 8, 8}, {64, 8, 1}, ls::Shape{1, 8, 8}, {64, 8, 1},
                  ls::Shape{1, 8, 8});
  EXPECT_EQ(one.library(), cpu::MatMulLibrary::OpenBlas);
}

// What makes runs reproducible across processes: the record's line for a problem decides, not
// this process's timing; a process that times a problem writes one line and follows the record.
TEST(MatMulLibraries, TheRecordDecidesEveryLaterChoice) {
  Restore restore;
  const std::string path = temp_path("record.tsv");
  std::filesystem::remove(path);
  cpu::detail::set_tuning_file(path);
  cpu::set_matmul_choice(cpu::MatMulChoice::Auto);
  const ls::Shape a{128, 160}, b{160, 128}, c{128, 128};
  const std::vector<int64_t> as{1, 128}, bs{128, 1}, cs{128, 1};
  // Not known yet: oneDNN until its first run times it.
  EXPECT_EQ(cpu::MatMul(a, as, b, bs, c, ls::DType::F32, ls::DType::F32, cs).library(),
            cpu::MatMulLibrary::OneDnn);
  const cpu::MatMulLibrary first =
      check({128, 160, 128, true, false, false, 0}, cpu::MatMulChoice::Auto);
  std::string line;
  {
    std::ifstream in(path);
    ASSERT_TRUE(std::getline(in, line)) << "nothing recorded in " << path;
    std::string more;
    EXPECT_FALSE(std::getline(in, more)) << "a second line: " << more;
  }
  const size_t t1 = line.find('\t');
  ASSERT_NE(t1, std::string::npos) << line;
  const std::string key = line.substr(0, t1);
  EXPECT_NE(key.find("128x160x128 ta"), std::string::npos) << key;
  EXPECT_EQ(line.substr(t1 + 1, line.find('\t', t1 + 1) - t1 - 1), cpu::library_name(first));

  // Another process's record: junk, a line for the key naming the other library, then one
  // naming this process's choice. The first valid line wins.
  const cpu::MatMulLibrary other = first == cpu::MatMulLibrary::OneDnn
                                       ? cpu::MatMulLibrary::OpenBlas
                                       : cpu::MatMulLibrary::OneDnn;
  {
    std::ofstream out(path, std::ios::trunc);
    out << "junk without a tab\n"
        << key << "\tnot-a-library\t1\t2\n"
        << "\t\t\n"
        << key << "\t" << cpu::library_name(other) << "\t1.0\t2.0\n"
        << key << "\t" << cpu::library_name(first) << "\t1.0\t2.0\n"
        << key << "\tonednn";  // cut short
  }
  cpu::detail::forget_matmul_choices();
  EXPECT_EQ(cpu::MatMul(a, as, b, bs, c, ls::DType::F32, ls::DType::F32, cs).library(), other);
  // Remembered in the process: the file no longer matters for this problem.
  std::filesystem::remove(path);
  EXPECT_EQ(cpu::MatMul(a, as, b, bs, c, ls::DType::F32, ls::DType::F32, cs).library(), other);
  std::filesystem::remove(path);
}

TEST(MatMulLibraries, AnUnwritableRecordStillChooses) {
  Restore restore;
  const std::string dir = temp_path("dir");
  std::filesystem::create_directories(dir);
  // The record's path is a directory: nothing can be read or written there.
  cpu::detail::set_tuning_file(dir);
  cpu::set_matmul_choice(cpu::MatMulChoice::Auto);
  const cpu::MatMulLibrary first =
      check({128, 160, 128, false, true, false, 0}, cpu::MatMulChoice::Auto);
  // Kept in the process.
  check({128, 160, 128, false, true, false, 0}, cpu::MatMulChoice::Auto, first);
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

// Through the whole cpu backend with OpenBLAS pinned: products, their gradients (transposed
// operands) and a linear layer's batch folded into one product, against the ref backend.
TEST(MatMulLibraries, TrainingOnOpenBlasMatchesRef) {
  Restore restore;
  cpu::set_matmul_choice(cpu::MatMulChoice::OpenBlas);
  const int64_t before = ls::metrics::counter("blas_products");
  auto run = [](const char* dev) {
    const ls::Device d = ls::parse_device(dev);
    ls::manual_seed(7);
    ls::Tensor x = ls::randn({4, 24, 40}).to(d);
    ls::Tensor w = ls::randn({56, 40}).to(d);
    w.set_requires_grad();
    ls::Tensor v = ls::randn({56, 33}).to(d);
    v.set_requires_grad();
    ls::Tensor y = ls::matmul(ls::matmul(x, ls::transpose(w, 0, 1)), v);
    ls::Tensor loss = ls::sum(ls::mul(y, y));
    loss.backward();
    std::vector<std::vector<float>> out{y.to_vector<float>(), w.grad().to_vector<float>(),
                                        v.grad().to_vector<float>()};
    return out;
  };
  const auto got = run("cpu"), want = run("ref");
  // The forward's two products and the gradients' three (w's input gradient is not needed).
  EXPECT_GE(ls::metrics::counter("blas_products") - before, 4);
  for (size_t t = 0; t < got.size(); ++t) {
    ASSERT_EQ(got[t].size(), want[t].size());
    for (size_t i = 0; i < got[t].size(); ++i)
      ASSERT_NEAR(got[t][i], want[t][i], 2e-3 * (1 + std::fabs(want[t][i])))
          << "tensor " << t << " element " << i;
  }
}
