#pragma once
// The `offload` stash policy catches what autograd saves (DESIGN.md, "offload/").
//
// Note [Saved-tensor hooks]
// installSavedTensorHooks() replaces LibTorch's default autograd engine (through
// torch::autograd::set_default_engine_stub) with a subclass whose
// get_default_saved_variable_hooks() returns pack/unpack hooks while a StashScope is
// active on the calling thread, and no hooks otherwise (then nothing changes). Call it
// before the first autograd call of the process. Works with LibTorch 2.11 (and 1.13).
//   pack:   the tensor joins the scope's SavedTensorGroup (deduplicated by storage,
//           offset, sizes and strides), unless it was marked skip() (resident weights:
//           kept by reference, never copied). With hooks, SavedVariable keeps no
//           reference to the data itself, so once the group hands its tensors to the
//           transfer manager (take()) the device memory goes when the copy is done.
//   unpack: returns the copy given back by restore() (the prefetched tensors).
// Using the graph between take() and restore() is a bug (InternalError).
//
// Note [Saved tensors go as they are used]
// Each collected tensor counts the hooks (SavedVariables) that may unpack it. Autograd
// destroys a SavedVariable's hooks once its node has run (release_variables(), unless
// retain_graph) or when the node dies. When the last one of a tensor goes, the group
// drops the tensor: during B the restored stash drains node by node, as the graph of
// `keep` does, instead of staying whole until the graph is gone; and a tensor whose
// users all went before take() (a graph branch freed during F) is not copied at all
// (take() hands an undefined tensor in its place).
//
// Note [Views of one storage]
// Deduplication is by view (storage, offset, sizes, strides): views of one storage that
// differ, e.g. a transformer block's saved attention operands, were copied each on its
// own, and overlapping ones more than once. The profiler measures saved bytes per storage
// (Note [Measured saved bytes] in planner/Profiler.h), so the restored stash came back
// larger than the stash the cost model charges: gpt2-tiny block0 and block1, 2233344
// saved bytes each, came back 2364416 (+131072) from the host (PlanRunsTest seed 1
// instance 14, pipefb-async-keep S=3 M=1 under offload: both backward devices of the
// blocks peaked 2.6-2.8% above the plan, two prefetched stashes each). So take() hands
// over, for a storage whose collected views together cover at least its bytes, the
// storage once (in the slot of its first view; undefined in the others), and restore()
// makes each view again on its copy. A view that alone or with others covers less of
// its storage still goes by itself (never more bytes than before).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace pipefb::offload {

class SavedTensorGroup {
 public:
  /// Tensors sharing `t`'s data pointer are kept by reference, not collected.
  void skip(const at::Tensor& t);
  /// The collected tensors, in collection order; the group forgets them. A tensor that
  /// nothing can unpack any more is undefined (Note [Saved tensors go as they are used]).
  std::vector<at::Tensor> take();
  /// Gives back the copies of what take() returned (same order, same count).
  void restore(std::vector<at::Tensor> tensors);
  size_t size() const;
  int64_t bytes() const;  // of the tensors the group holds now (collected or restored)

  // For the hooks.
  bool isSkipped(const at::Tensor& t) const;
  /// Collects `t` (or finds it) and counts one more user of it.
  int add(const at::Tensor& t);
  at::Tensor get(int index) const;
  /// One user of `index` is gone; the last one drops the tensor.
  void release(int index);

 private:
  mutable std::mutex mu_;
  std::set<const void*> skip_;
  struct Slot {
    const void* data;
    int64_t offset;
    std::vector<int64_t> sizes, strides;
    int dtype;
    int users = 0;  // hooks that may still unpack it
    int base =
        -1;  // after take(): the slot whose tensor is its storage (Note [Views of one storage])
  };
  std::vector<Slot> slots_;
  std::vector<at::Tensor> tensors_;
  bool taken_ = false, restored_ = false;
};

/// While alive, tensors autograd saves on this thread go to `group`. Nests.
class StashScope {
 public:
  explicit StashScope(std::shared_ptr<SavedTensorGroup> group);
  ~StashScope();
  StashScope(const StashScope&) = delete;
  StashScope& operator=(const StashScope&) = delete;

 private:
  std::shared_ptr<SavedTensorGroup> previous_;
};

/// Note [Hollow graph ends]
/// Once an offloaded stash's saved tensors are collected, the F's graph input (a leaf
/// that B's input gradient lands in) and its output (B's root) are needed for their
/// identity and shape only, so their data is swapped (set_data) for a hollow tensor.
/// That was a zero scalar expanded to the shape: 4 bytes (one float) the device held per
/// graph end, from F to B, for every stash in flight, which the cost model does not
/// charge: gpt2-tiny 1f1b-offload and pipedream-offload ran out of memory on device 0 at
/// budgets the plan filled exactly, 4 to 8 bytes short (PlanRunsTest seeds 2 to 4: S=3
/// M=1, 6915844 bytes needed at 6915840; S=2 M=2, 6589448 at 6589440), and every other
/// device peaked 8 or 16 bytes above its plan. On the CPU the hollow tensor is a view of
/// a static zero element and allocates nothing. Elsewhere (CUDA) it is still one element
/// of the device's allocator. It has stride 0 in every dimension, so an in-place write
/// into it fails (more than one element refers to one memory location).
at::Tensor hollowLike(const at::Tensor& t);

/// Idempotent, thread-safe. See Note [Saved-tensor hooks].
void installSavedTensorHooks();
bool savedTensorHooksInstalled();

}  // namespace pipefb::offload
