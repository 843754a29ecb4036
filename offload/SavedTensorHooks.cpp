#include "pipefb/offload/SavedTensorHooks.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>

#include "pipefb/common/Error.h"

namespace pipefb::offload {

namespace {
thread_local std::shared_ptr<SavedTensorGroup> tlsGroup;
std::atomic<bool> installed{false};

struct Hooks final : torch::autograd::SavedVariableHooks {
  explicit Hooks(std::shared_ptr<SavedTensorGroup> g) : group(std::move(g)) {}
  // Autograd destroys the hooks when their SavedVariable is reset (its node ran) or dies.
  ~Hooks() override {
    if (index >= 0) group->release(index);
  }
  void call_pack_hook(const at::Tensor& t) override {
    if (group->isSkipped(t))
      direct = t;
    else
      index = group->add(t);
  }
  at::Tensor call_unpack_hook() override { return index < 0 ? direct : group->get(index); }
  std::shared_ptr<SavedTensorGroup> group;
  int index = -1;
  at::Tensor direct;
};

struct HookedEngine final : torch::autograd::Engine {
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (tlsGroup) return std::make_unique<Hooks>(tlsGroup);
    return torch::autograd::Engine::get_default_saved_variable_hooks();
  }
};

torch::autograd::Engine& hookedEngine() {
  // Never destroyed: LibTorch's engine lives for the whole process (engine.h).
  static auto* engine = new HookedEngine();
  return *engine;
}
}  // namespace

void SavedTensorGroup::skip(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || !t.data_ptr()) return;
  std::lock_guard<std::mutex> lock(mu_);
  skip_.insert(t.data_ptr());
}

bool SavedTensorGroup::isSkipped(const at::Tensor& t) const {
  if (!t.has_storage() || !t.data_ptr()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return skip_.count(t.data_ptr()) > 0;
}

int SavedTensorGroup::add(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(mu_);
  PIPEFB_ASSERT(!taken_, "a tensor was saved into an offloaded stash after its offload");
  Slot s{t.has_storage() ? t.storage().data() : nullptr, t.storage_offset(), t.sizes().vec(),
         t.strides().vec(), static_cast<int>(t.scalar_type())};
  if (s.data)
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& o = slots_[i];
      if (o.data == s.data && o.offset == s.offset && o.sizes == s.sizes &&
          o.strides == s.strides && o.dtype == s.dtype && tensors_[i].defined()) {
        ++slots_[i].users;
        return static_cast<int>(i);
      }
    }
  s.users = 1;
  slots_.push_back(std::move(s));
  tensors_.push_back(t.detach());
  return static_cast<int>(tensors_.size()) - 1;
}

std::vector<at::Tensor> SavedTensorGroup::take() {
  std::lock_guard<std::mutex> lock(mu_);
  PIPEFB_ASSERT(!taken_, "stash taken twice");
  taken_ = true;
  // Note [Views of one storage]: the collected views of a storage that they cover at
  // least whole go as that storage, once.
  struct Group {
    std::vector<size_t> slots;
    int64_t viewBytes = 0;
  };
  std::vector<std::pair<std::pair<const void*, int>, Group>> groups;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const at::Tensor& t = tensors_[i];
    if (!t.defined() || !slots_[i].data) continue;
    const std::pair<const void*, int> key{slots_[i].data, slots_[i].dtype};
    auto g =
        std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == key; });
    if (g == groups.end()) g = groups.insert(groups.end(), {key, Group{}});
    g->second.slots.push_back(i);
    g->second.viewBytes += static_cast<int64_t>(t.numel()) * t.element_size();
  }
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    slots_[i].base = -1;
    out.push_back(tensors_[i]);
  }
  for (auto& [key, g] : groups) {
    if (g.slots.size() < 2) continue;
    const at::Tensor& t = tensors_[g.slots.front()];
    const int64_t item = t.element_size();
    const int64_t nbytes = static_cast<int64_t>(t.storage().nbytes());
    if (nbytes % item != 0 || g.viewBytes < nbytes) continue;
    at::Tensor base = at::empty({0}, t.options()).set_(t.storage(), 0, {nbytes / item}, {1});
    const int b = static_cast<int>(g.slots.front());
    out[static_cast<size_t>(b)] = base;
    for (size_t i : g.slots) {
      slots_[i].base = b;
      if (static_cast<int>(i) != b) out[i] = at::Tensor();
    }
  }
  for (auto& s : slots_) s.data = nullptr;  // the pointers may be reused after the copy
  tensors_.clear();
  return out;
}

void SavedTensorGroup::restore(std::vector<at::Tensor> tensors) {
  std::lock_guard<std::mutex> lock(mu_);
  PIPEFB_ASSERT(taken_ && tensors.size() == slots_.size(),
                "restore of " << tensors.size() << " tensors into a stash of " << slots_.size());
  // Note [Views of one storage]: each view again, on its storage's copy.
  std::vector<at::Tensor> views(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.base < 0)
      views[i] = tensors[i];
    else if (tensors[static_cast<size_t>(s.base)].defined())
      views[i] = tensors[static_cast<size_t>(s.base)].as_strided(s.sizes, s.strides, s.offset);
  }
  tensors.clear();
  // Users that went while the stash was away (a dropped graph) need nothing back.
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].users == 0) views[i] = at::Tensor();
  tensors_ = std::move(views);
  restored_ = true;
}

size_t SavedTensorGroup::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.size();
}

int64_t SavedTensorGroup::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t b = 0;
  for (const auto& t : tensors_)
    if (t.defined()) b += static_cast<int64_t>(t.numel()) * t.element_size();
  return b;
}

void SavedTensorGroup::release(int index) {
  at::Tensor last;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  // Called from ~Hooks: must not throw. Every Hooks with an index counted one user.
  if (index < 0 || static_cast<size_t>(index) >= slots_.size()) return;
  auto& slot = slots_[static_cast<size_t>(index)];
  if (slot.users <= 0 || --slot.users > 0) return;
  // Note [Saved tensors go as they are used]. Between take() and restore() the group
  // holds nothing (tensors_ is empty); restore() then leaves this slot undefined.
  if (static_cast<size_t>(index) < tensors_.size()) last = std::move(tensors_[index]);
}

at::Tensor SavedTensorGroup::get(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  PIPEFB_ASSERT(
      !taken_ || restored_,
      "autograd used an offloaded stash before it was acquired (saved tensor " << index << ")");
  const at::Tensor& t = tensors_.at(static_cast<size_t>(index));
  PIPEFB_ASSERT(t.defined(), "saved tensor " << index << " was unpacked after its last user went");
  return t;
}

StashScope::StashScope(std::shared_ptr<SavedTensorGroup> group) : previous_(std::move(tlsGroup)) {
  PIPEFB_ASSERT(installed.load(),
                "StashScope without installSavedTensorHooks(): saved tensors would not be caught");
  tlsGroup = std::move(group);
}

StashScope::~StashScope() { tlsGroup = std::move(previous_); }

void installSavedTensorHooks() {
  static std::once_flag once;
  std::call_once(once, [] {
    torch::autograd::set_default_engine_stub(&hookedEngine);
    installed = true;
  });
}

at::Tensor hollowLike(const at::Tensor& t) {
  // Note [Hollow graph ends]: one element of any dtype, never written (stride 0).
  alignas(16) static unsigned char zero[16] = {};
  if (t.device().is_cpu() && t.element_size() <= static_cast<int64_t>(sizeof zero))
    return torch::from_blob(zero, {}, t.options().requires_grad(false)).expand(t.sizes());
  return torch::zeros({}, t.options().requires_grad(false)).expand(t.sizes());
}

bool savedTensorHooksInstalled() {
  return installed.load() && &torch::autograd::Engine::get_default_engine() == &hookedEngine();
}

}  // namespace pipefb::offload
