// A backend in a separately built library adds itself to lockstep's registry when it is loaded:
// before, its device is an ls::Error; after, tensors on it compute through it.
#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include <lockstep/lockstep.h>
#include "backends/backend.h"
#include "backends/ref/ref_backend.h"

namespace ls = lockstep;
using ::testing::HasSubstr;

TEST(BackendPlugin, ALoadedLibraryServesItsDevice) {
  const ls::Device cuda = ls::parse_device("cuda:0");
  try {
    (void)ls::ones({2}, ls::TensorOptions(ls::DType::F32, cuda)).to_vector<float>();
    ADD_FAILURE() << "cuda:0 served before any backend library was loaded";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not available"));
  }
  void* lib = dlopen(LOCKSTEP_TEST_BACKEND, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto compiles = reinterpret_cast<int (*)()>(dlsym(lib, "lockstep_forwarding_backend_compiles"));
  ASSERT_NE(compiles, nullptr) << dlerror();
  const ls::TensorOptions on_cuda(ls::DType::F32, cuda);
  ls::Tensor a = ls::from_vector<float>({1, 2, 3}).to(cuda);
  ls::Tensor b = ls::full({3}, 2.0, on_cuda);
  ls::Tensor y = ls::sum(a * b + 1.0);
  EXPECT_EQ(y.item<float>(), 15.0f);
  EXPECT_GE(compiles(), 1);
  EXPECT_EQ(y.device(), cuda);
  // A second backend for the same device is refused, naming the one that serves it.
  try {
    lockstep::backends::register_backend(cuda, &lockstep::backends::ref::backend());
    ADD_FAILURE() << "a second backend for cuda:0 was accepted";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("already served by the forwarding backend"));
  }
}
