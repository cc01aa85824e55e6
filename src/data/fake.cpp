// FakeData: synthetic examples (a fixed all-zero example, or seeded random ones) for benchmarks
// and tests that must not depend on files. Not a model of any real dataset's statistics.
#include "lockstep/data.h"
#include "util/check.h"

namespace lockstep::data {

using util::cat;

FakeData::FakeData(FakeDataOptions options) : options_(std::move(options)) {
  if (options_.shape.size() != 3)
    throw Error(cat("FakeData: shape ", shape_str(options_.shape),
                    " is not (C, H, W); pass three sizes, e.g. {3, 224, 224}"));
  for (int64_t d : options_.shape)
    if (d <= 0) throw Error(cat("FakeData: shape ", shape_str(options_.shape), " has a size <= 0"));
  if (options_.num_classes <= 0)
    throw Error(cat("FakeData: num_classes is ", options_.num_classes, "; it must be positive"));
  if (options_.size < 0)
    throw Error(cat("FakeData: size is ", options_.size, "; it must not be negative"));
}

std::string FakeData::name() const {
  return cat("fake (", options_.size, " x ", shape_str(options_.shape), ", ", options_.num_classes,
             " classes, ", options_.fixed ? "fixed" : "random", ", seed ", options_.seed, ")");
}

Example FakeData::get(int64_t index) const {
  if (index < 0 || index >= options_.size)
    throw Error(cat(name(), ": index ", index, " is out of range [0, ", options_.size, ")"));
  Example ex;
  ex.shape = options_.shape;
  ex.image.resize(static_cast<size_t>(shape_numel(options_.shape)));
  if (options_.fixed) return ex;  // zeros, label 0
  Rng rng(Rng::mix({options_.seed, static_cast<uint64_t>(index)}));
  ex.label = static_cast<int64_t>(rng.below(static_cast<uint64_t>(options_.num_classes)));
  for (float& v : ex.image) v = static_cast<float>(rng.uniform());
  return ex;
}

}  // namespace lockstep::data
