// The Module base: registration of parameters, buffers and children, names as PyTorch's,
// train/eval, moving between devices and state dicts.
#include <algorithm>
#include <map>
#include <set>

#include "lockstep/autograd.h"
#include "lockstep/nn.h"
#include "nn/state_match.h"
#include "runtime/lazy.h"
#include "util/check.h"
#include "util/frames.h"

namespace lockstep::nn {

using util::cat;

Tensor Module::forward(const Tensor&) {
  throw Error("this module has no single-input forward(); call its own methods instead");
}

namespace {
// A parameter's or buffer's path, for graph dumps (runtime/lazy.h): set here, and prefixed with
// each module's name as the module is registered in its parent.
void name_tensor(const Tensor& t, const std::string& name) {
  if (t.defined()) t.impl()->name = std::make_shared<const std::string>(name);
}
}  // namespace

namespace {
// Registers `t` under `name`, in place of a tensor registered under it already.
void put(NamedTensors& list, const std::string& name, const Tensor& t) {
  for (auto& [n, old] : list)
    if (n == name) {
      old = t;
      return;
    }
  list.emplace_back(name, t);
}
}  // namespace

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  if (t.defined()) t.set_requires_grad(true);
  name_tensor(t, name);
  put(params_, name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  name_tensor(t, name);
  put(buffers_, name, t);
  return t;
}

void Module::set_parameter(const std::string& path, Tensor t) {
  set_tensor(path, std::move(t), true);
}
void Module::set_buffer(const std::string& path, Tensor t) {
  set_tensor(path, std::move(t), false);
}

void Module::set_tensor(const std::string& path, Tensor t, bool param) {
  const char* what = param ? "set_parameter" : "set_buffer";
  const size_t dot = path.find('.');
  if (dot != std::string::npos) {
    const std::string child = path.substr(0, dot);
    for (const auto& [name, c] : children_)
      if (name == child) return c->set_tensor(path.substr(dot + 1), std::move(t), param);
    throw Error(cat(what, ": no child module '", child, "' (of '", path, "')"));
  }
  NamedTensors& list = param ? params_ : buffers_;
  auto it = std::find_if(list.begin(), list.end(), [&](const auto& e) { return e.first == path; });
  if (it == list.end()) {
    std::string names;
    for (const auto& [n, x] : list) names += (names.empty() ? "" : ", ") + n;
    throw Error(cat(what, ": this module has no ", param ? "parameter" : "buffer", " '", path,
                    "'; it has: ", names.empty() ? std::string("none") : names));
  }
  if (param && t.defined()) t.set_requires_grad(true);
  it->second = t;
  if (Tensor* member = tensor_member(path)) *member = std::move(t);
}

Tensor Module::operator()(const Tensor& x, Loc loc) {
  return call(loc, [&] { return forward(x); });
}

void Module::call_impl(const Loc& loc, const std::function<void()>& body) {
  // This module's path: its parent's (the module whose call is under way) and its name there.
  const auto* parent = static_cast<const Module*>(util::current_module());
  std::shared_ptr<const std::string> path;
  if (!parent) {
    static const auto root = std::make_shared<const std::string>();
    path = root;
  } else {
    const std::string& base = *util::current_module_path();
    std::string name = "?";
    for (const auto& [n, child] : parent->children_)
      if (child.get() == this) name = n;
    path = std::make_shared<const std::string>(base.empty() ? name : base + "." + name);
  }
  util::ModuleFrame frame(this, std::move(path), loc);
  body();
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  std::set<const Module*> seen;
  std::function<void(const std::string&, Module*)> walk = [&](const std::string& path, Module* m) {
    if (!seen.insert(m).second) return;
    out.emplace_back(path, m);
    for (const auto& [name, child] : m->children_)
      walk(path.empty() ? name : path + "." + name, child.get());
  };
  walk("", this);
  return out;
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [name, child] : children_) child->apply(fn);
  fn(*this);
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  if (!m) throw Error(cat("register_module: module '", name, "' is null"));
  // A module inside itself would make every traversal (parameters, state_dict, train, apply,
  // ...) endless, and its shared ownership a cycle that is never freed.
  for (const auto& [path, sub] : m->named_modules())
    if (sub == this)
      throw Error(cat(
          "register_module: registering '", name,
          path.empty() ? std::string("' as a child of itself")
                       : cat("' would put the module inside itself (as '", name, ".", path, "')"),
          ". A module cannot contain itself; keep a reference that is not a "
          "registered child (e.g. a plain pointer or a Python attribute set with "
          "object.__setattr__)"));
  for (const auto& [path, t] : m->named_parameters()) name_tensor(t, name + "." + path);
  for (const auto& [path, t] : m->named_buffers()) name_tensor(t, name + "." + path);
  // A name registered already is replaced in its place, as torch's `self.decoder = nn.Linear(..)`
  // in a subclass of a module that registered a decoder of its own.
  for (auto& [child_name, child] : children_)
    if (child_name == name) {
      child = std::move(m);
      return;
    }
  children_.emplace_back(name, std::move(m));
}

void Module::collect(const std::string& prefix, bool params, NamedTensors* out) const {
  for (const auto& [name, t] : params ? params_ : buffers_)
    if (t.defined()) out->emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", params, out);
}

namespace {

// Each tensor once, under the first name it was found by: a module (or a parameter) shared
// between several places is listed once, as PyTorch's named_parameters() does, so that an
// optimizer does not update it twice per step.
NamedTensors first_occurrences(NamedTensors all) {
  std::set<const detail::TensorImpl*> seen;
  NamedTensors out;
  for (auto& [name, t] : all)
    if (seen.insert(t.impl()).second) out.emplace_back(std::move(name), std::move(t));
  return out;
}

}  // namespace

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", true, &out);
  return first_occurrences(std::move(out));
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", false, &out);
  return first_occurrences(std::move(out));
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<Tensor> Module::buffers() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers()) out.push_back(t);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::to(Device device) {
  // Every copy is recorded before any tensor changes: an unavailable device leaves all as it was.
  struct Move {
    Tensor t, value, grad;
  };
  std::vector<Move> moves;
  NoGrad no_grad;
  for (auto& [name, t] : first_occurrences(state_dict())) {
    if (t.device() == device) continue;
    const Tensor g = t.grad();
    moves.push_back({t, t.to(device), g.defined() && !(g.device() == device) ? g.to(device) : g});
  }
  for (Move& m : moves) {
    runtime::set_value(*m.t.impl(), runtime::current_node(*m.value.impl()), "Module::to");
    m.t.set_grad(m.grad);  // gradients move along, as PyTorch's Module.to
  }
}

NamedTensors Module::state_dict() const {
  // Every name, shared tensors under each of theirs (as PyTorch's state_dict).
  NamedTensors out, b;
  collect("", true, &out);
  collect("", false, &b);
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

std::vector<std::pair<Tensor, Tensor>> match_state(const NamedTensors& mine,
                                                   const NamedTensors& state, bool strict,
                                                   const char* what, const std::string& hint) {
  std::vector<std::string> missing, unexpected, mismatched;
  std::vector<std::pair<Tensor, Tensor>> copies;  // (destination, source)
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state) given[name] = &t;
  for (const auto& [name, dst] : mine) {
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
      continue;
    }
    const Tensor& src = *it->second;
    if (!src.defined() || src.shape() != dst.shape() || src.dtype() != dst.dtype()) {
      mismatched.push_back(cat(name, " (expected ", dtype_name(dst.dtype()), shape_str(dst.shape()),
                               ", got ",
                               src.defined() ? cat(dtype_name(src.dtype()), shape_str(src.shape()))
                                             : std::string("an empty tensor"),
                               ")"));
      continue;
    }
    copies.emplace_back(dst, src);
  }
  std::set<std::string> known;
  for (const auto& [name, t] : mine) known.insert(name);
  for (const auto& [name, t] : given)
    if (!known.count(name)) unexpected.push_back(name);
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 20; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > 20) s += cat(", ... (", v.size(), " in all)");
    return s;
  };
  std::string problems;
  if (!mismatched.empty()) problems += "mismatched: " + list(mismatched) + ". ";
  if (strict && !missing.empty()) problems += "missing: " + list(missing) + ". ";
  if (strict && !unexpected.empty()) problems += "unexpected: " + list(unexpected) + ". ";
  if (!problems.empty()) throw Error(cat(what, ": ", problems, "Nothing was loaded. ", hint));
  return copies;
}

namespace {

std::string module_hint(bool strict) {
  return cat("Check that the state comes from the same model architecture",
             strict ? " (or pass strict=false to skip missing and unexpected names)" : "");
}

}  // namespace

void Module::check_state_dict(const NamedTensors& state, bool strict) const {
  match_state(state_dict(), state, strict, "load_state_dict", module_hint(strict));
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  std::vector<std::pair<Tensor, Tensor>> copies =
      match_state(state_dict(), state, strict, "load_state_dict", module_hint(strict));
  NoGrad no_grad;
  for (auto& [dst, src] : copies)
    dst.copy_(src.device() == dst.device() ? src : src.to(dst.device()));
}

Sequential& Sequential::add(std::shared_ptr<Module> m) {
  register_module(std::to_string(layers_.size()), m);
  layers_.push_back(std::move(m));
  return *this;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& layer : layers_) h = (*layer)(h);
  return h.is_same(x) ? clone(x) : h;
}

}  // namespace lockstep::nn

namespace lockstep::nn {

ModuleList& ModuleList::push_back(std::shared_ptr<Module> m) {
  register_module(std::to_string(modules_.size()), m);
  modules_.push_back(std::move(m));
  return *this;
}

std::shared_ptr<Module> ModuleList::operator[](size_t i) const {
  if (i >= modules_.size())
    throw Error(cat("ModuleList: index ", i, " is out of range for ", modules_.size(), " modules"));
  return modules_[i];
}

ModuleDict& ModuleDict::insert(const std::string& name, std::shared_ptr<Module> m) {
  if (name.empty() || name.find('.') != std::string::npos)
    throw Error(cat("ModuleDict: name '", name,
                    "' must be non-empty and contain no '.' (it becomes part of parameter paths)"));
  if (modules_.count(name))
    throw Error(cat("ModuleDict: a module named '", name, "' is already there"));
  register_module(name, m);
  order_.push_back(name);
  modules_[name] = std::move(m);
  return *this;
}

bool ModuleDict::contains(const std::string& name) const { return modules_.count(name) > 0; }

std::shared_ptr<Module> ModuleDict::operator[](const std::string& name) const {
  auto it = modules_.find(name);
  if (it == modules_.end()) {
    std::string known;
    for (const std::string& k : order_) known += (known.empty() ? "" : ", ") + k;
    throw Error(cat("ModuleDict: no module named '", name, "' (it has: ", known, ")"));
  }
  return it->second;
}

std::vector<std::string> ModuleDict::keys() const { return order_; }

}  // namespace lockstep::nn
