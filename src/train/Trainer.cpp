#include "pipefb/train/Trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <thread>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pipefb/common/Error.h"
#include "pipefb/memory/DomainRegistry.h"
#include "pipefb/memory/MemoryScope.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/report/Report.h"
#include "pipefb/report/StepTrace.h"
#include "pipefb/runtime/PipelineEngine.h"
#include "pipefb/train/Checkpoint.h"
#include "pipefb/train/Optimizer.h"
#include "pipefb/train/Progress.h"

namespace pipefb::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {
double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

int64_t plannedSteps(const config::Config& c, int64_t trainSamples) {
  if (c.training.iterations > 0) return c.training.iterations;
  int64_t perEpoch = trainSamples / c.training.batch;
  if (perEpoch == 0)
    throw UserError(c.source + ": training.batch: " + std::to_string(c.training.batch) +
                    " is larger than the training set (" + std::to_string(trainSamples) +
                    " samples); lower the batch or raise data.limit_train");
  return perEpoch * c.training.epochs;
}

// Note [Single-device memory categories]
// The trainer runs on virtual device cpu:0, whose capacity is devices.memory.
// Weights are made under `weights`; gradients are allocated up front under
// `grads`, so backward accumulates into them in place; what forward leaves alive
// for backward is the `stash`; temporaries of backward are `working_set`; the
// optimizer's buffers are `optimizer_state`; the input batch is a `comm_buffers`
// charge (it is what a real device receives). A ScopeLeader makes intra-op pool
// threads charge the compute thread's scope.
Trainer::Trainer(config::Config config) : config_(std::move(config)) {
  const auto& t = config_.training;
  memory::installTrackingAllocator();
  device_ = &memory::configureDomain(memory::virtualDeviceName(0),
                                     config_.devices.memory.value_or(memory::kUnlimited));
  // LibTorch here starts with one intra-op thread; 0 means every core.
  at::set_num_threads(t.threads > 0 ? static_cast<int>(t.threads)
                                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  torch::manual_seed(t.seed);
  train_ = data::makeDataset(config_.data, config_.model, data::Split::Train, t.seed);
  loader_ = std::make_unique<data::Loader>(train_, t.batch, /*shuffle=*/true, t.seed);
  totalSteps_ = plannedSteps(config_, train_->size());
  if (config_.pipeline.schedule != "none") {
    // Note [Pipeline in the trainer]: the model is built outside every device (it would
    // not fit one); the engine moves each stage's layers to its backward device and owns
    // the per-stage optimizers. step() delegates; totalSteps_ iterations are scheduled.
    {
      memory::MemoryScope scope(memory::unscopedDomain(), MemoryCategory::Weights);
      model_ = model::buildModel(config_.model);
      model_->train(true);
    }
    runtime::EngineOptions eo;
    eo.iterations = totalSteps_;
    eo.totalSteps = totalSteps_;
    engine_ = std::make_unique<runtime::PipelineEngine>(*model_, config_, eo);
    return;
  }
  memory::ScopeLeader leader;
  {
    memory::MemoryScope scope(*device_, MemoryCategory::Weights);
    model_ = model::buildModel(config_.model);
    model_->train(true);
  }
  {
    memory::MemoryScope scope(*device_, MemoryCategory::Grads);
    for (auto& p : model_->parameters()) p.mutable_grad() = torch::zeros_like(p);
  }
  optimizer_ = makeOptimizer(t, model_->parameters());
}

Trainer::~Trainer() = default;

double Trainer::step(const data::Batch& batch) {
  if (engine_) {
    double loss = engine_->step(batch);
    ++stepsDone_;
    return loss;
  }
  const int64_t micro = config_.pipeline.microbatches;
  const int64_t n = batch.input.size(0);
  memory::ScopeLeader leader;
  memory::MemoryScope deviceScope(*device_, MemoryCategory::WorkingSet);
  optimizer_->zero_grad();  // zeroes the grads in place (LibTorch 1.13)
  std::vector<torch::Tensor> inputs, targets;
  {
    memory::MemoryScope scope(MemoryCategory::CommBuffers);
    inputs = batch.input.clone().chunk(micro, 0);
    targets = batch.target.clone().chunk(micro, 0);
  }
  double total = 0;
  for (size_t m = 0; m < inputs.size(); ++m) {
    // Mean loss over the whole batch = sum over microbatches of loss_m * (n_m / n).
    double weight = static_cast<double>(inputs[m].size(0)) / static_cast<double>(n);
    torch::Tensor loss;
    {
      memory::MemoryScope scope(MemoryCategory::Stash);
      torch::Tensor out = model_->forward(inputs[m]);
      loss = model_->loss(out, targets[m]) * weight;
    }
    loss.backward();
    total += loss.item<double>();
  }
  setLearningRate(*optimizer_, learningRate(config_.training, stepsDone_, totalSteps_));
  {
    memory::MemoryScope scope(MemoryCategory::OptimizerState);
    optimizer_->step();
  }
  ++stepsDone_;
  return total;
}

std::pair<double, double> Trainer::evaluate(data::Dataset& test) {
  torch::NoGradGuard noGrad;
  model_->train(false);
  int64_t correct = 0, seen = 0;
  double lossSum = 0;
  const int64_t bs = config_.training.eval_batch;
  memory::ScopeLeader leader;
  // A pipeline's stages live on several devices; its evaluation runs outside them.
  memory::MemoryScope scope(engine_ ? memory::unscopedDomain() : *device_,
                            MemoryCategory::WorkingSet);
  for (int64_t start = 0; start < test.size(); start += bs) {
    std::vector<int64_t> idx;
    for (int64_t i = start; i < std::min(test.size(), start + bs); ++i) idx.push_back(i);
    data::Batch b = test.get(idx);
    torch::Tensor out = model_->forward(b.input);
    lossSum += model_->loss(out, b.target).item<double>() * static_cast<double>(idx.size());
    correct += out.argmax(-1).eq(b.target).sum().item<int64_t>();
    seen += b.target.numel();
  }
  model_->train(true);
  return {seen ? static_cast<double>(correct) / seen : 0.0,
          test.size() ? lossSum / static_cast<double>(test.size()) : 0.0};
}

std::vector<DeviceSummary> Trainer::deviceSummaries() const {
  if (engine_) {
    std::vector<DeviceSummary> out;
    for (const auto& ds : engine_->deviceStats()) {
      DeviceSummary d;
      d.name = ds.name;
      d.capacity_bytes = ds.capacity;
      d.live_bytes = ds.live;
      d.peak_bytes = ds.peak;
      for (MemoryCategory c : kAllMemoryCategories) d.peak_by_category[toString(c)] = ds.atPeak[index(c)];
      out.push_back(d);
    }
    return out;
  }
  memory::MemoryStats st = device_->stats();
  DeviceSummary d;
  d.name = device_->name();
  d.capacity_bytes = device_->unlimited() ? -1 : device_->capacity();
  d.live_bytes = st.bytes.current;
  d.peak_bytes = st.bytes.peak;
  for (MemoryCategory c : kAllMemoryCategories)
    d.peak_by_category[toString(c)] = st.bytes_at_peak[index(c)];
  return {d};
}

RunSummary Trainer::run() {
  const auto& t = config_.training;
  RunSummary summary;
  summary.run_dir = config_.output.dir;
  fs::create_directories(config_.output.dir);
  writeFileAtomically(config_.output.dir + "/config.yaml", config::toYaml(config_));
  std::ofstream metrics(config_.output.dir + "/metrics.csv");
  metrics << "step,epoch,loss,lr,samples_per_s,elapsed_s\n";

  spdlog::info("pipefb_train: model {} ({} layers), data {} ({} samples), {} steps of batch {}",
               config_.model.name, model_->numLayers(), train_->describe(), train_->size(),
               totalSteps_, t.batch);
  // A single device has no runtime trace: record one (Note [Chrome trace]).
  std::unique_ptr<report::StepTrace> stepTrace;
  if (!engine_) stepTrace = std::make_unique<report::StepTrace>(*device_);
  const auto t0 = Clock::now();
  double windowLoss = 0;
  int64_t windowSteps = 0;
  auto windowStart = Clock::now();
  int64_t windowSamples = 0;
  double lastLoss = 0;
  for (int64_t s = 0; s < totalSteps_; ++s) {
    data::Batch batch = loader_->next();
    double lr = learningRate(t, stepsDone_, totalSteps_);
    lastLoss = step(batch);
    if (stepTrace) stepTrace->stepDone();
    if (!std::isfinite(lastLoss))
      throw std::runtime_error("loss is " + std::to_string(lastLoss) + " at step " +
                               std::to_string(s + 1) +
                               "; lower training.lr or check the data");
    windowLoss += lastLoss;
    ++windowSteps;
    windowSamples += batch.input.size(0);
    summary.samples += batch.input.size(0);
    double elapsed = secondsSince(t0);
    double sps = summary.samples / std::max(elapsed, 1e-9);
    metrics << (s + 1) << ',' << loader_->epoch() << ',' << lastLoss << ',' << lr << ',' << sps
            << ',' << elapsed << '\n';
    bool last = s + 1 == totalSteps_;
    if (config_.output.progress && ((s + 1) % t.log_every == 0 || last)) {
      ProgressState p;
      p.step = s + 1;
      p.total_steps = totalSteps_;
      p.epoch = loader_->epoch();
      p.loss = windowLoss / windowSteps;
      p.samples_per_s = windowSamples / std::max(secondsSince(windowStart), 1e-9);
      p.elapsed_s = elapsed;
      for (const auto& d : deviceSummaries())
        p.memory.push_back({d.name, d.live_bytes, d.peak_bytes, d.capacity_bytes});
      spdlog::info("{}", formatProgress(p));
      windowLoss = 0;
      windowSteps = 0;
      windowSamples = 0;
      windowStart = Clock::now();
    }
  }
  if (engine_) engine_->finish();  // asynchronous schedules run on after the last step()
  double trainSeconds = secondsSince(t0);
  metrics.close();
  summary.steps = totalSteps_;
  summary.final_loss = lastLoss;
  summary.throughput_samples_per_s = summary.samples / std::max(trainSeconds, 1e-9);

  if (t.eval) {
    auto test = data::makeDataset(config_.data, config_.model, data::Split::Test, t.seed);
    auto [acc, loss] = evaluate(*test);
    summary.test_accuracy = acc;
    summary.test_loss = loss;
    spdlog::info("test accuracy {:.4f} (loss {:.4f}) on {} samples", acc, loss, test->size());
  }
  if (t.checkpoint) {
    summary.checkpoint = config_.output.dir + "/model.pt";
    saveStateDict(summary.checkpoint, model_->stateDict());
  }
  summary.wall_seconds = secondsSince(t0);
  summary.devices = deviceSummaries();

  nlohmann::json j;
  j["steps"] = summary.steps;
  j["samples"] = summary.samples;
  j["final_loss"] = summary.final_loss;
  j["test_accuracy"] = summary.test_accuracy >= 0 ? nlohmann::json(summary.test_accuracy)
                                                  : nlohmann::json(nullptr);
  j["test_loss"] = summary.test_loss >= 0 ? nlohmann::json(summary.test_loss) : nlohmann::json(nullptr);
  j["throughput_samples_per_s"] = summary.throughput_samples_per_s;
  j["wall_seconds"] = summary.wall_seconds;
  j["model"] = config_.model.name;
  j["schedule"] = config_.pipeline.schedule;
  j["checkpoint"] = summary.checkpoint;
  j["devices"] = nlohmann::json::array();
  for (const auto& d : summary.devices) {
    nlohmann::json dj;
    dj["name"] = d.name;
    dj["capacity_bytes"] = d.capacity_bytes >= 0 ? nlohmann::json(d.capacity_bytes) : nlohmann::json(nullptr);
    dj["peak_bytes"] = d.peak_bytes;
    dj["peak_by_category"] = d.peak_by_category;
    j["devices"].push_back(dj);
  }
  if (engine_) {
    j["pipeline"] = nlohmann::json::parse(engine_->summaryJson());
    engine_->writeTrace(config_.output.dir + "/trace.json");
  }
  if (stepTrace) stepTrace->write(config_.output.dir + "/trace.json");
  writeFileAtomically(config_.output.dir + "/summary.json", j.dump(2) + "\n");
  try {  // the report only reads the run folder; `pipefb_report RUN_DIR` rebuilds it
    report::writeReport(config_.output.dir);
  } catch (const std::exception& e) {
    spdlog::warn("report.html not written: {}", e.what());
  }
  spdlog::info("run folder {}: {:.1f} samples/s, {:.1f} s wall", config_.output.dir,
               summary.throughput_samples_per_s, summary.wall_seconds);
  return summary;
}

}  // namespace pipefb::train
