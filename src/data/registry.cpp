// make_dataset: datasets by name for command lines ("fake", "fashion-mnist[:DIR]", "mnist:DIR",
// "cifar10:DIR"). Not where any format is read (idx.cpp, cifar.cpp, fake.cpp).
#include "data/io.h"
#include "lockstep/data.h"
#include "util/check.h"

namespace lockstep::data {

using util::cat;

namespace {
constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
constexpr const char* kKnown = "fake, fashion-mnist[:DIR], mnist:DIR, cifar10:DIR";

std::string need_dir(const std::string& spec, const std::string& name, const std::string& dir) {
  if (dir.empty())
    throw Error(cat("make_dataset: '", spec, "' names no directory; write ", name, ":DIR"));
  if (!io::is_directory(dir))
    throw Error(cat("make_dataset: directory '", dir, "' for ", name, " does not exist"));
  return dir;
}
}  // namespace

std::shared_ptr<Dataset> make_dataset(const std::string& spec, bool train,
                                      const FakeDataOptions& fake) {
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const bool has_arg = colon != std::string::npos;
  const std::string arg = has_arg ? spec.substr(colon + 1) : "";
  if (name == "fake") {
    if (has_arg)
      throw Error(cat("make_dataset: '", spec,
                      "': fake takes no argument (its shape, classes, "
                      "size and seed come from the FakeDataOptions)"));
    FakeDataOptions o = fake;
    if (!train) o.seed += 1;
    return std::make_shared<FakeData>(o);
  }
  if (name == "fashion-mnist") {
    if (!has_arg && !io::is_directory(kFashionMnistDir))
      throw Error(cat("make_dataset: fashion-mnist: the default directory ", kFashionMnistDir,
                      " does not exist; install the Debian package dataset-fashion-mnist or "
                      "write fashion-mnist:DIR"));
    const std::string dir = need_dir(spec, name, has_arg ? arg : kFashionMnistDir);
    return std::make_shared<MnistDataset>(dir, train, "fashion-mnist");
  }
  if (name == "mnist") return std::make_shared<MnistDataset>(need_dir(spec, name, arg), train);
  if (name == "cifar10") return std::make_shared<Cifar10Dataset>(need_dir(spec, name, arg), train);
  throw Error(
      cat("make_dataset: unknown dataset '", name, "' in '", spec, "'; expected one of ", kKnown));
}

}  // namespace lockstep::data
