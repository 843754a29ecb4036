#pragma once
// What the runtime's equivalence tests share (PipelineEngineTest.cpp, TorchScriptTest.cpp):
// configs, batches, the single-device reference and checkEquivalence. Test-only.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "../PipelineBatch.h"
#include "../PipelineConfig.h"
#include "../TestUtil.h"
#include "pipefb/runtime/PipelineEngine.h"
#include "pipefb/schedules/Placement.h"
#include "pipefb/train/Optimizer.h"

namespace pipefb::test::equivalence {

using test::buildSeeded;  // ../PipelineBatch.h
using test::makeBatch;

struct Case {
  std::string name;
  model::ModelOptions model;
  int64_t batch = 8;
  std::string precision = "fp32";  // training.precision (Note [Autocast] in model/Model.h)
};

inline model::ModelOptions mlpOptions() { return test::mlpOptions(6, {24, 20, 16}); }  // 4 layers

inline model::ModelOptions visionOptions(const std::string& name) {
  model::ModelOptions o;
  o.name = name;
  o.width = 0.0625;
  o.input_size = 32;
  o.channels = 3;
  o.num_classes = 10;
  return o;
}

inline model::ModelOptions gpt2Options() {
  model::ModelOptions o;
  o.name = "gpt2";
  o.size = "tiny";
  o.input_size = 8;    // T
  o.num_classes = 32;  // V
  return o;
}

// `stash`: one policy, or "a,b,c,d" with one per stage (pipeline.stash as a list).
inline config::Config makeConfig(const model::ModelOptions& m, const std::string& schedule, int S,
                                 int M, const std::string& stash, int64_t batch) {
  std::vector<std::string> perStage;
  std::stringstream in(stash);
  for (std::string v; std::getline(in, v, ',');) perStage.push_back(v);
  auto c = test::pipelineConfig(m, schedule, S, M, perStage.front(), batch);
  if (perStage.size() > 1) c.pipeline.stage_stash = perStage;
  return c;
}

// The reference: Trainer::step's gradient accumulation on one device.
struct Reference {
  std::shared_ptr<model::Model> model;
  std::unique_ptr<torch::optim::Optimizer> opt;
  config::Config config;
  int64_t steps = 0;
  // fp16: the scaler as train::Trainer::step runs it (Note [Loss scaling]).
  train::LossScale scale;
  explicit Reference(const config::Config& c) : config(c), scale{c.training.loss_scale, 0, 0} {
    model = buildSeeded(c.model);
    for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);
    opt = train::makeOptimizer(c.training, model->parameters());
  }
  double step(const data::Batch& b, int64_t total) {
    const int64_t M = config.pipeline.microbatches, n = b.input.size(0);
    opt->zero_grad();
    auto xs = b.input.chunk(M, 0);
    auto ts = b.target.chunk(M, 0);
    double sum = 0;
    for (size_t m = 0; m < xs.size(); ++m) {
      // Note [Dropout streams]: the masks Trainer::step draws, and a pipeline too.
      model::DropoutKey masks(config.training.seed, steps * M + static_cast<int64_t>(m));
      torch::Tensor l;
      {
        model::Autocast autocast(config.training.precision, xs[m].device().type());
        l = model->loss(model->forward(xs[m]), ts[m]) *
            (static_cast<double>(xs[m].size(0)) / static_cast<double>(n));
      }
      const bool fp16 = config.training.precision == "fp16";
      l.backward(torch::full_like(l, fp16 ? scale.scale : 1.0));
      sum += l.item<double>();
    }
    train::setLearningRate(*opt, train::learningRate(config.training, steps++, total));
    bool take = true;
    if (config.training.precision == "fp16") {
      take = train::gradsFinite(model->parameters());
      if (take) train::unscaleGrads(model->parameters(), scale.scale);
      scale = train::afterStep(scale, !take, config.training.loss_scale_window);
    }
    if (take) opt->step();
    return sum;
  }
};

inline double relErr(const torch::Tensor& a, const torch::Tensor& b) {
  double scale = b.abs().max().item<double>();
  double diff = (a - b).abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

// Largest relative error over the named parameters (grads if `grads`).
inline double maxRelErr(const model::Model& got, const model::Model& want, bool grads,
                        std::string* worst) {
  auto g = got.namedParameters(), w = want.namedParameters();
  EXPECT_EQ(g.size(), w.size());
  double e = 0;
  for (size_t i = 0; i < g.size() && i < w.size(); ++i) {
    auto a = grads ? g[i].second.grad() : g[i].second;
    auto b = grads ? w[i].second.grad() : w[i].second;
    if (!a.defined() || !b.defined()) {
      *worst = g[i].first + " (undefined)";
      return 1e9;
    }
    double r = relErr(a, b);
    if (r > e) {
      e = r;
      *worst = g[i].first;
    }
  }
  return e;
}

inline runtime::EngineOptions quietOptions(int64_t iterations) {
  runtime::EngineOptions o;
  o.iterations = iterations;
  o.log = false;
  o.recordMemoryEvents = false;
  o.stallTimeoutSeconds = 30;
  return o;
}

// How a pipeline's stages sit on its devices: the schedule's default placement, PipeFB
// folded onto S devices (Note [Folded placements]), or v stages per device
// (interleaved-1f1b).
struct Layout {
  Layout(const char* s) : schedule(s) {}  // the schedule's default placement
  Layout(std::string s, bool f, int v = 0) : schedule(std::move(s)), folded(f), virtualStages(v) {}
  // A given pipeline.placement (Note [Decoupled partitions]), on the devices it names.
  static Layout placed(std::string s, std::string placement) {
    Layout l(std::move(s), false);
    l.placement = std::move(placement);
    return l;
  }
  std::string schedule;
  bool folded = false;
  int virtualStages = 0;
  std::string placement;
  std::string name() const {
    return schedule + (folded ? " folded" : "") +
           (virtualStages ? " v=" + std::to_string(virtualStages) : "") +
           (placement.empty() ? "" : " [" + placement + "]");
  }
  // Whether S stages x M microbatches make this layout.
  bool takes(int S, int M) const {
    if (folded) return S >= 2;
    if (virtualStages) return S % virtualStages == 0 && M % (S / virtualStages) == 0;
    if (!placement.empty()) return schedules::Placement::parse(placement, "test").numStages() == S;
    return true;
  }
  void apply(config::Config& c) const {
    if (folded) test::fold(c);
    if (virtualStages) test::interleave(c, virtualStages);
    if (!placement.empty()) test::place(c, placement);
  }
};
const std::vector<Layout> kOneStagePerDevice = {"gpipe", "1f1b", "pipefb-sync"};
// Devices that host several stages: a forward and another stage's backward (folded), or
// several stages (interleaved).
const std::vector<Layout> kFolded = {{"pipefb-sync", true}};
const std::vector<Layout> kInterleaved = {{"interleaved-1f1b", false, 2},
                                          {"interleaved-zb", false, 2}};
// Note [Decoupled partitions]: one forward device feeding three backward devices (a
// forward range whose layers go to three backward devices); two forward ranges whose
// layers one backward range spans ([0,3) on device 2); a device running a forward range
// and another range's backward (device 1: F of 2..3, B of 0); a forward range and a
// backward range on one device that overlap (device 1: F and B of stage 2).
const std::vector<Layout> kDecoupled = {
    Layout::placed("pipefb-sync", "0/1 0/2 0/3"), Layout::placed("pipefb-sync", "0/2 0/2 1/2 1/3"),
    Layout::placed("pipefb-sync", "0/1 0/2 1/2 1/3"), Layout::placed("pipefb-sync", "0/2 1/2 1/0"),
    Layout::placed("pipefb-sync", "0/2 1/1 1/0")};
const std::vector<std::string> kAllStashes = {"keep", "checkpoint", "offload",
                                              "checkpoint-offload"};

// One iteration: gradients equal; three: weights equal (and losses).
inline void checkEquivalence(const Case& c, const std::vector<int>& stageCounts,
                             const std::vector<int>& microbatches,
                             const std::vector<std::string>& stashes = {"keep", "checkpoint"},
                             const std::vector<Layout>& layouts = kOneStagePerDevice) {
  constexpr int kIters = 3;
  for (const Layout& layout : layouts) {
    int ran = 0;  // a layout that takes none of the shapes would pass without running
    for (const std::string& stash : stashes)
      for (int S : stageCounts)
        for (int M : microbatches) {
          if (!layout.takes(S, M)) continue;
          ++ran;
          SCOPED_TRACE(c.name + " " + layout.name() + " " + stash + " S=" + std::to_string(S) +
                       " M=" + std::to_string(M));
          auto cfg = makeConfig(c.model, layout.schedule, S, M, stash, c.batch);
          cfg.training.precision = c.precision;
          layout.apply(cfg);
          Reference ref(cfg);
          auto model = buildSeeded(c.model);
          runtime::PipelineEngine engine(*model, cfg, quietOptions(kIters));
          EXPECT_EQ(engine.numDevices(), cfg.devices.count);
          if (layout.folded)
            EXPECT_EQ(engine.schedule().placement, schedules::Placement::folded(S));
          if (!layout.placement.empty())
            EXPECT_EQ(engine.schedule().placement.toString(), layout.placement);
          std::vector<data::Batch> batches;
          for (int k = 0; k < kIters; ++k)
            batches.push_back(makeBatch(*model, c.batch, c.model.num_classes, 100 + k));
          for (int k = 0; k < kIters; ++k) {
            double want = ref.step(batches[k], kIters);
            double got = engine.step(batches[k]);
            EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::abs(want)))
                << "loss of iteration " << k;
            if (k == 0) {
              std::string worst;
              double e = maxRelErr(*model, *ref.model, /*grads=*/true, &worst);
              EXPECT_LE(e, 1e-5) << "gradient of " << worst;
            }
          }
          engine.finish();
          std::string worst;
          double e = maxRelErr(*model, *ref.model, /*grads=*/false, &worst);
          EXPECT_LE(e, 1e-5) << "weights after " << kIters << " steps: " << worst;
        }
    EXPECT_GT(ran, 0) << layout.name() << " takes none of the stage counts";
  }
}

}  // namespace pipefb::test::equivalence
