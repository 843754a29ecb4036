// The measured profiler (Profiler.h; Note [Measured saved bytes]).
#include "pipefb/planner/Profiler.h"

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "pipefb/common/Error.h"
#include "pipefb/memory/FreedMemory.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/model/Model.h"
#include "pipefb/model/SplitBackward.h"
#include "pipefb/planner/AnalyticProfile.h"
#include "pipefb/planner/DeviceSpec.h"
#include "pipefb/planner/ProfileFile.h"
#include "pipefb/planner/Setup.h"
#include "pipefb/train/Optimizer.h"

namespace pipefb::planner {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::int64_t storageBytes(const torch::Tensor& t) {
  return t.defined() ? static_cast<std::int64_t>(t.storage().nbytes()) : 0;
}

std::int64_t tensorBytes(const std::vector<torch::Tensor>& ts) {
  std::int64_t n = 0;
  for (const auto& t : ts)
    if (t.defined()) n += static_cast<std::int64_t>(t.nbytes());
  return n;
}

/// Restores the intra-op thread count on scope exit.
class ThreadCount {
 public:
  explicit ThreadCount(int n) : previous_(at::get_num_threads()) {
    if (n > 0) at::set_num_threads(n);
  }
  ~ThreadCount() { at::set_num_threads(previous_); }

 private:
  int previous_;
};

/// The microbatch input of layer 0: (b, sampleShape...) floats, or token ids.
torch::Tensor sampleInput(const model::Model& m, std::int64_t b) {
  std::vector<int64_t> shape{b};
  shape.insert(shape.end(), m.sampleShape().begin(), m.sampleShape().end());
  if (m.inputDtype() == torch::kLong)
    return torch::randint(0, std::max<int64_t>(m.options().num_classes, 2), shape, torch::kLong);
  return torch::randn(shape);
}

/// FNV-1a: a file-name hash that is the same on every build (std::hash need not be).
std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

void zeroGrads(const std::vector<torch::Tensor>& params) {
  for (const auto& p : params)
    if (p.grad().defined()) p.mutable_grad().zero_();
}

/// Note [Measured saved bytes]: one layer's memory passes on its input `in` (no graph):
/// F and B as the runtime's B on the master runs them, B gathering, what the graph keeps
/// of the output, and F without autograd. The layer's parameters have gradients already;
/// its buffers (BatchNorm's statistics) are put back afterwards. Used at the profile's
/// microbatch size and at every other (Note [Bytes at every microbatch] in LayerCost.h).
LayerBytes layerBytes(model::Layer& layer, const torch::Tensor& in, bool inputGrad,
                      memory::MemoryDomain& dom) {
  LayerBytes out;
  memory::MemoryScope scope(dom, MemoryCategory::WorkingSet);
  std::vector<torch::Tensor> buffers;
  {
    torch::NoGradGuard noGrad;
    for (const auto& t : layer.buffers()) buffers.push_back(t.clone());
  }
  const std::vector<torch::Tensor> params = layer.parameters();
  torch::Tensor gy;
  {
    zeroGrads(params);
    torch::Tensor s;
    if (inputGrad) s = torch::zeros({}, in.options().requires_grad(true));
    const std::int64_t live0 = dom.liveBytes();
    dom.resetPeak();
    torch::Tensor x = inputGrad ? in + s : in.clone();
    torch::Tensor y = layer.forward(x);
    const std::int64_t peakF = dom.peakBytes();
    // The input's bytes the graph keeps: what dropping the last handle on it leaves
    // allocated.
    const std::int64_t inStorage = storageBytes(x), liveX = dom.liveBytes();
    x = torch::Tensor();
    const std::int64_t live1 = dom.liveBytes();
    out.savedInputBytes = std::clamp<std::int64_t>(inStorage - (liveX - live1), 0, inStorage);
    out.outputBytes = static_cast<std::int64_t>(y.nbytes());
    out.savedBytes = std::max<std::int64_t>(0, live1 - live0 - storageBytes(y));
    {
      torch::NoGradGuard noGrad;
      gy = torch::randn_like(y);  // B's output gradient, outside the measured peaks
    }
    torch::Tensor g = gy.clone();
    const std::int64_t liveB = dom.liveBytes();
    dom.resetPeak();
    std::vector<torch::Tensor> wrt;
    for (const auto& p : params)
      if (p.requires_grad()) wrt.push_back(p);
    if (s.defined()) wrt.push_back(s);
    if (!wrt.empty()) {
      // As the runtime's B on the master runs it (Note [In-place weight gradients] in
      // src/runtime/StageCompute.cpp, Note [Gathered weight gradients] in CostModel.h):
      // each parameter's gradient is added into its (zeroed, defined) .grad as autograd
      // makes it, so the fresh gradient is part of this transient only until then. A B
      // that gathers holds the later layers' gradients beside it: the cost model adds
      // those from gradBytes. Linear layers add theirs straight into .grad (Note [Weight
      // gradients into .grad] in model/Model.h).
      model::WeightGradientsIntoGrad into;
      torch::autograd::backward({y}, {g}, /*retain_graph=*/false, /*create_graph=*/false, wrt);
    }
    const std::int64_t peakB = dom.peakBytes();
    if (s.defined()) s.mutable_grad() = torch::Tensor();
    out.forwardWorkingBytes = std::max<std::int64_t>(0, peakF - live1);
    out.workingBytes = std::max<std::int64_t>({0, peakF - live1, peakB - liveB});
    // The same B gathering: the parameters' gradients come back as fresh tensors, held
    // until B ends (a B on another copy, or one filling gradient buckets).
    y = torch::Tensor();
    g = torch::Tensor();
    x = inputGrad ? in + s : in.clone();
    y = layer.forward(x);
    x = torch::Tensor();
    g = gy.clone();
    const std::int64_t liveG = dom.liveBytes();
    dom.resetPeak();
    if (!wrt.empty()) {
      auto held = torch::autograd::grad({y}, wrt, {g}, /*retain_graph=*/false,
                                        /*create_graph=*/false, /*allow_unused=*/true);
    }
    out.gatheredWorkingBytes = std::max<std::int64_t>({0, peakF - live1, dom.peakBytes() - liveG});
  }
  // The output's bytes the graph keeps: drop the last handle on the output while its graph
  // lives; what is not freed, the graph holds.
  {
    torch::Tensor s;
    if (inputGrad) s = torch::zeros({}, in.options().requires_grad(true));
    torch::Tensor x = inputGrad ? in + s : in.clone();
    torch::Tensor y = layer.forward(x);
    x = torch::Tensor();
    std::shared_ptr<torch::autograd::Node> graph = y.grad_fn();
    const std::int64_t outStorage = storageBytes(y), live = dom.liveBytes();
    y = torch::Tensor();
    const std::int64_t freed = live - dom.liveBytes();
    out.savedOutputBytes = std::clamp<std::int64_t>(outStorage - freed, 0, out.outputBytes);
    graph.reset();
  }
  // What a split backward's I keeps for W, with the runtime's own I (Note [Split backward
  // in the runtime] in model/SplitBackward.h). The model's first layer has no input
  // gradient: stage 0's W runs from the output.
  out.keptGradBytes = 0;
  if (inputGrad) {
    torch::Tensor s = torch::zeros({}, in.options().requires_grad(true));
    torch::Tensor x = in + s;
    model::DeferredWeightGrad w;
    w.output = layer.forward(x);
    w.gradOut = gy.clone();
    model::inputGradient(w, x, params);
    out.keptGradBytes = model::keptBytes(w);
  }
  // F without autograd (Note [Forward without autograd] in CostModel.h): input, output and
  // temporaries, nothing saved.
  {
    torch::NoGradGuard noGrad;
    const std::int64_t live0 = dom.liveBytes();
    dom.resetPeak();
    torch::Tensor x = in.clone();
    torch::Tensor y = layer.forward(x);
    out.noGradForwardBytes = std::max<std::int64_t>(0, dom.peakBytes() - live0);
  }
  torch::NoGradGuard noGrad;
  auto current = layer.buffers();
  for (size_t j = 0; j < buffers.size(); ++j) current[j].copy_(buffers[j]);
  return out;
}

/// The loss as the last stage's B runs it (startBackward), on the model's output `output`
/// for `b` samples: from the output and the targets to the gradient of the output, which B
/// then holds; and as a recomputing last stage's B takes it, inside the output's graph
/// (Note [Loss in the recomputed graph] in schedules/Lowering.h). Sets `m`'s two loss fields.
void lossBytes(model::Model& model, const torch::Tensor& output, std::int64_t b,
               memory::MemoryDomain& dom, MeasuredBytes& m) {
  memory::MemoryScope scope(dom, MemoryCategory::WorkingSet);
  torch::Tensor target =
      model.inputDtype() == torch::kLong
          ? sampleInput(model, b)
          : torch::randint(0, std::max<int64_t>(model.options().num_classes, 2), {b}, torch::kLong);
  torch::Tensor out = output.detach().clone().requires_grad_(true);
  const std::int64_t live0 = dom.liveBytes();
  dom.resetPeak();
  {
    torch::Tensor l = model.loss(out, target);
    torch::Tensor g = torch::autograd::grad({l}, {out})[0];
    m.lossWorkingBytes = std::max<std::int64_t>(0, dom.peakBytes() - live0);
  }
  // The output here is made by an add that saves nothing of it (as the head's matmul), so
  // it is freed as in B.
  out = torch::Tensor();
  torch::Tensor leaf = torch::zeros({}, output.options()).requires_grad_(true);
  const std::int64_t live1 = dom.liveBytes();
  dom.resetPeak();
  {
    torch::Tensor y = output.detach() + leaf;
    torch::Tensor l = model.loss(y, target) * 1.0;  // scaled, as B does
    y = torch::Tensor();
    torch::Tensor g = torch::autograd::grad({l}, {leaf})[0];
    m.recomputedLossBytes = std::max<std::int64_t>(0, dom.peakBytes() - live1);
  }
}

/// Every layer's and the loss's bytes at `b` samples (Note [Bytes at every microbatch] in
/// LayerCost.h); nullopt when the model cannot run at that size (BatchNorm on a 1x1 map
/// in training takes two samples) or it does not fit in memory.
std::optional<MeasuredBytes> measureBytesAt(model::Model& model, std::int64_t b,
                                            memory::MemoryDomain& dom) {
  MeasuredBytes m;
  m.microbatch = b;
  try {
    torch::Tensor input = sampleInput(model, b);
    m.inputBytes = static_cast<std::int64_t>(input.nbytes());
    m.targetBytes = input.scalar_type() == torch::kLong
                        ? m.inputBytes
                        : b * static_cast<std::int64_t>(sizeof(std::int64_t));
    for (size_t i = 0; i < model.numLayers(); ++i) {
      auto& layer = *model.layer(i);
      const bool inputGrad = i > 0 && input.is_floating_point();
      m.layers.push_back(layerBytes(layer, input, inputGrad, dom));
      torch::NoGradGuard noGrad;
      input = layer.forward(input.detach()).detach();
    }
    lossBytes(model, input, b, dom, m);
  } catch (const c10::Error&) {
    return std::nullopt;
  } catch (const std::bad_alloc&) {
    return std::nullopt;
  }
  return m;
}
}  // namespace

void ProfilerOptions::validate() const {
  if (warmup < 0) throw UserError("--warmup: must be >= 0, got " + std::to_string(warmup));
  if (repeats < 1) throw UserError("--repeats: must be >= 1, got " + std::to_string(repeats));
  if (threads < 0)
    throw UserError("--threads: must be >= 0 (0 = LibTorch's default), got " +
                    std::to_string(threads));
  if (device.empty()) throw UserError("--device: must not be empty");
  if (times != "measured" && times != "analytic")
    throw UserError("--times: must be measured or analytic, got '" + times + "'");
}

Profile profileHeader(const config::Config& cfg, const ProfilerOptions& o) {
  Profile p;
  const auto& t = cfg.training;
  std::string opt = t.optimizer;
  if (t.optimizer == "sgd" && t.momentum > 0) opt += "-momentum";
  p.model = model::modelKey(cfg.model) + " optimizer=" + opt;
  // Note [Autocast]: a profile measured under bf16 is another profile.
  if (cfg.training.precision != "fp32") p.model += " precision=" + cfg.training.precision;
  p.precision = parsePrecision(cfg.training.precision).value_or(Precision::FP32);
  p.device = o.device;
  if (o.threads != 1) p.device += " threads=" + std::to_string(o.threads);
  // Note [Keeping freed memory]: times with glibc's defaults are another device.
  if (!cfg.devices.keep_freed_memory) p.device += " malloc=system";
  if (o.times == "analytic") p.device += " times=analytic";
  p.source = "measured";
  const std::int64_t m = std::max<std::int64_t>(cfg.pipeline.microbatches, 1);
  if (t.batch % m != 0)
    throw UserError("training.batch (" + std::to_string(t.batch) +
                    ") must be divisible by pipeline.microbatches (" + std::to_string(m) + ")");
  p.microbatch = t.batch / m;
  return p;
}

Profile measureProfile(const config::Config& cfg, const ProfilerOptions& o) {
  o.validate();
  Profile prof = profileHeader(cfg, o);
  if (!memory::trackingAllocatorInstalled()) memory::installTrackingAllocator();
  // Note [Keeping freed memory]: the allocator the trainer will run with.
  if (cfg.devices.keep_freed_memory) memory::keepFreedMemory();
  ThreadCount threads(o.threads);
  // With intra-op helpers, their allocations are charged to this thread's scope
  // (Note [Intra-op threads] in MemoryScope.h); with one thread nothing changes.
  memory::ScopeLeader leader;
  torch::manual_seed(cfg.training.seed);

  auto model = model::buildModel(cfg.model);
  model->train(true);
  // Note [Autocast] (model/Model.h): every forward and loss measured as the runtime runs it.
  model::Autocast autocast(cfg.training.precision, c10::DeviceType::CPU);
  const std::int64_t b = prof.microbatch;
  memory::MemoryDomain& dom = memory::getOrCreateDomain("profiler");

  torch::Tensor input = sampleInput(*model, b);  // layer i's input (no graph)
  prof.inputBytes = static_cast<std::int64_t>(input.nbytes());
  // Model::loss: token ids (B,T) like the input for gpt2, one class id per sample otherwise.
  prof.targetBytes = input.scalar_type() == torch::kLong
                         ? prof.inputBytes
                         : b * static_cast<std::int64_t>(sizeof(std::int64_t));
  const int runs = o.warmup + o.repeats;
  // Note [Microbatch scaling] in LayerCost.h: layer i's input at a second microbatch size,
  // 2 (not 1: BatchNorm on a 1x1 map needs two samples in training), or the whole batch
  // when the profile's is 1 or 2 (none when that is no larger).
  const std::int64_t b2 = b > 2 ? 2 : std::max(cfg.training.batch, b);
  torch::Tensor input2;
  if (b2 != b) input2 = sampleInput(*model, b2);

  for (size_t i = 0; i < model->numLayers(); ++i) {
    auto& layer = *model->layer(i);
    LayerCost c;
    c.name = layer.name();
    const std::vector<torch::Tensor> params = layer.parameters();
    c.paramBytes = tensorBytes(params);
    c.bufferBytes = tensorBytes(layer.buffers());
    // Layer 0's input is data (no gradient), as in a pipeline's first stage.
    const bool inputGrad = i > 0 && input.is_floating_point();

    // Times: F, B and the recompute (F with grad again) on `in`, medians of `repeats`.
    // Also makes the parameter gradients exist before the memory pass. `gy` is B's output
    // gradient, made at the first run.
    struct Times {
      double forward, backward, recompute;
    };
    auto timePasses = [&](const torch::Tensor& in, torch::Tensor& gy) {
      std::vector<double> tf, tb, tr;
      for (int r = 0; r < runs; ++r) {
        torch::Tensor x = in.detach();
        if (inputGrad) x.requires_grad_(true);
        auto t0 = Clock::now();
        torch::Tensor y = layer.forward(x);
        auto t1 = Clock::now();
        if (!gy.defined()) gy = torch::randn_like(y);
        {
          model::WeightGradientsIntoGrad into;  // as the runtime's B on the master
          torch::autograd::backward({y}, {gy});
        }
        auto t2 = Clock::now();
        y = torch::Tensor();
        auto t3 = Clock::now();
        torch::Tensor y2 = layer.forward(x);  // recompute: forward with grad again
        auto t4 = Clock::now();
        y2 = torch::Tensor();
        if (r >= o.warmup) {
          tf.push_back(seconds(t0, t1));
          tb.push_back(seconds(t1, t2));
          tr.push_back(seconds(t3, t4));
        }
      }
      return Times{median(tf), median(tb), median(tr)};
    };
    torch::Tensor gy;
    const Times t = timePasses(input, gy);
    c.forward = t.forward;
    c.backward = t.backward;
    c.recompute = t.recompute;
    // Note [Microbatch scaling] in LayerCost.h: the same at the second size, for each
    // pass's fixed time per pass (the intercept of a line through both).
    if (input2.defined()) {
      torch::Tensor gy2;
      const Times t2 = timePasses(input2, gy2);
      c.forwardFixed = fitFixedTime(t.forward, double(b), t2.forward, double(b2));
      c.backwardFixed = fitFixedTime(t.backward, double(b), t2.backward, double(b2));
      c.recomputeFixed = fitFixedTime(t.recompute, double(b), t2.recompute, double(b2));
    }
    std::vector<torch::Tensor> grads;
    for (const auto& p : params) grads.push_back(p.grad());
    c.gradBytes = tensorBytes(grads);

    // Memory (Note [Measured saved bytes]).
    {
      const LayerBytes w = layerBytes(layer, input, inputGrad, dom);
      c.outputBytes = w.outputBytes;
      c.savedBytes = w.savedBytes;
      c.savedOutputBytes = w.savedOutputBytes;
      c.savedInputBytes = w.savedInputBytes;
      c.workingBytes = w.workingBytes;
      c.gatheredWorkingBytes = w.gatheredWorkingBytes;
      c.forwardWorkingBytes = w.forwardWorkingBytes;
      c.noGradForwardBytes = w.noGradForwardBytes;
      c.keptGradBytes = w.keptGradBytes;
    }

    // A weight snapshot (Note [Weight snapshots] in CostModel.h): the runtime clones every
    // parameter of the stage into fresh tensors; the median of `repeats` clones.
    if (!params.empty()) {
      std::vector<double> ts;
      for (int r = 0; r < runs; ++r) {
        std::vector<torch::Tensor> copies;
        torch::NoGradGuard noGrad;
        auto t0 = Clock::now();
        for (const auto& p : params) copies.push_back(p.detach().clone());
        auto t1 = Clock::now();
        if (r >= o.warmup) ts.push_back(seconds(t0, t1));
      }
      c.snapshot = median(ts);
    }

    // Optimizer: state bytes = live bytes the first step leaves; step time = median.
    if (!params.empty()) {
      auto optimizer = train::makeOptimizer(cfg.training, params);
      {
        memory::MemoryScope scope(dom, MemoryCategory::OptimizerState);
        const std::int64_t before = dom.liveBytes();
        optimizer->step();
        c.optimizerBytes = dom.liveBytes() - before;
      }
      // The step's transient peak beyond the state (Note [Step working set]), from a step
      // with the state in place, as every step after the first.
      {
        memory::MemoryScope scope(dom, MemoryCategory::OptimizerState);
        const std::int64_t before = dom.liveBytes();
        dom.resetPeak();
        optimizer->step();
        c.stepWorkingBytes = std::max<std::int64_t>(0, dom.peakBytes() - before);
      }
      std::vector<double> ts;
      for (int r = 0; r < runs; ++r) {
        auto t0 = Clock::now();
        optimizer->step();
        if (r >= o.warmup) ts.push_back(seconds(t0, Clock::now()));
      }
      c.step = median(ts);

      // Note [Backward after a step] in CostModel.h: B of the first microbatch after a
      // step, as the runtime's B on the master runs it (stale gradients zeroed, then
      // accumulated in place, Note [In-place weight gradients]).
      std::vector<torch::Tensor> wrt;
      for (const auto& p : params)
        if (p.requires_grad()) wrt.push_back(p);
      std::vector<double> tas;
      for (int r = 0; r < runs && !wrt.empty(); ++r) {
        optimizer->step();
        torch::Tensor x = input.detach();
        if (inputGrad) x.requires_grad_(true);
        torch::Tensor y = layer.forward(x);
        std::vector<torch::Tensor> in = wrt;
        if (inputGrad) in.push_back(x);
        auto t0 = Clock::now();
        {
          torch::NoGradGuard noGrad;
          zeroGrads(params);
        }
        {
          model::WeightGradientsIntoGrad into;
          torch::autograd::backward({y}, {gy}, /*retain_graph=*/false, /*create_graph=*/false, in);
        }
        auto t1 = Clock::now();
        if (inputGrad) x.mutable_grad() = torch::Tensor();
        if (r >= o.warmup) tas.push_back(seconds(t0, t1));
      }
      c.backwardAfterStep = tas.empty() ? c.backward : median(tas);
    }

    {
      torch::NoGradGuard noGrad;
      input = layer.forward(input.detach()).detach();
      if (input2.defined()) input2 = layer.forward(input2.detach()).detach();
    }
    prof.layers.push_back(c);
  }
  {
    MeasuredBytes at;
    lossBytes(*model, input, b, dom, at);
    prof.lossWorkingBytes = at.lossWorkingBytes;
    prof.recomputedLossBytes = at.recomputedLossBytes;
  }
  // Note [Bytes at every microbatch] in LayerCost.h: every other size the planner may pick,
  // each divisor of the batch, and the second size of the fits.
  for (std::int64_t size = 1; o.otherSizes && size <= cfg.training.batch; ++size)
    if ((cfg.training.batch % size == 0 || size == b2) && size != b)
      if (auto at = measureBytesAt(*model, size, dom)) prof.bytesAt.push_back(std::move(*at));
  // Note [Parameter-sized working sets] in LayerCost.h: B's working sets at the second size
  // too, for the bytes that do not scale (the parameters' fresh gradients).
  for (const MeasuredBytes& m : prof.bytesAt) {
    if (m.microbatch != b2) continue;
    for (size_t l = 0; l < prof.layers.size(); ++l) {
      LayerCost& c = prof.layers[l];
      c.workingFixedBytes =
          fitFixedBytes(c.workingBytes, double(b), m.layers[l].workingBytes, double(b2));
      c.gatheredWorkingFixedBytes = fitFixedBytes(c.gatheredWorkingBytes, double(b),
                                                  m.layers[l].gatheredWorkingBytes, double(b2));
    }
  }
  if (o.times == "analytic") {
    if (cfg.model.name == "torchscript")
      throw UserError(
          "--times: analytic needs a model of the zoo; a torchscript model's "
          "times are measured (--times measured)");
    // Note [Analytic times in a measured profile]: the bytes above, the times of the roofline.
    const DeviceSpec spec = findDeviceSpec(o.device, configsDirFor(cfg.source) + "/devices");
    const Profile a = analyticProfile(
        modelWork(cfg.model), prof.microbatch, spec,
        optimizerMemory(cfg.training.optimizer, cfg.training.momentum, cfg.training.weight_decay));
    PIPEFB_ASSERT(
        a.layers.size() == prof.layers.size(),
        "analytic profile of " << a.layers.size() << " layers, measured " << prof.layers.size());
    for (size_t i = 0; i < prof.layers.size(); ++i) {
      LayerCost& c = prof.layers[i];
      const LayerCost& t = a.layers[i];
      c.forward = t.forward;
      c.backward = t.backward;
      c.recompute = t.recompute;
      c.forwardFixed = t.forwardFixed;
      c.backwardFixed = t.backwardFixed;
      c.recomputeFixed = t.recomputeFixed;
      c.step = t.step;
      c.snapshot = t.snapshot;
      c.backwardAfterStep = 0;  // = backward
    }
  }
  return prof;
}

std::string defaultProfilePath(const Profile& header) {
  const std::string key = profileKey(header);
  std::string name = header.model.substr(0, header.model.find(' '));
  std::string dev;
  for (char ch : header.device) dev += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  std::ostringstream s;
  s << "profiles/" << name << "-mb" << header.microbatch << "-" << dev << "-" << std::hex
    << (fnv1a(key) & 0xffffffffu) << ".yaml";
  return s.str();
}

ProfileResult loadOrMeasureProfile(const config::Config& cfg, const ProfilerOptions& o,
                                   std::string path, bool force) {
  namespace fs = std::filesystem;
  const Profile header = profileHeader(cfg, o);
  if (path.empty()) path = defaultProfilePath(header);
  ProfileResult r;
  r.path = path;
  if (!force && fs::exists(path)) {
    // Note [Profile method]: the key the file was written with, method included (a key
    // recomputed from the cached fields would carry today's method).
    std::ifstream in(path);
    std::string line, stored;
    while (std::getline(in, line))
      if (line.rfind("key: \"", 0) == 0) {
        stored = line.substr(6, line.size() >= 7 ? line.size() - 7 : 0);
        break;
      }
    Profile cached = readProfileFile(path);
    if (stored == profileKey(header) && profileKey(cached) == profileKey(header)) {
      r.profile = std::move(cached);
      r.fromCache = true;
      return r;
    }
  }
  r.profile = measureProfile(cfg, o);
  const fs::path dir = fs::path(path).parent_path();
  if (!dir.empty()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw UserError("cannot create the directory '" + dir.string() + "': " + ec.message());
  }
  writeProfileFile(path, r.profile);
  return r;
}

}  // namespace pipefb::planner
