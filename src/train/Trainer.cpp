#include "pipefb/train/Trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "pipefb/common/Error.h"
#include "pipefb/common/NumericalError.h"
#include "pipefb/dist/ProcessGroup.h"
#include "pipefb/memory/DomainRegistry.h"
#include "pipefb/memory/FreedMemory.h"
#include "pipefb/memory/MemoryEvent.h"
#include "pipefb/memory/MemoryScope.h"
#include "pipefb/memory/TrackingAllocator.h"
#include "pipefb/report/Report.h"
#include "pipefb/report/StepTrace.h"
#include "pipefb/runtime/DeviceKind.h"
#include "pipefb/runtime/PipelineEngine.h"
#include "pipefb/schedules/ScheduleKind.h"
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

// Note [Trace window]: a 5-epoch pipefb-sync run traced every action, 290,470 of them in
// a 102 MB trace.json that Perfetto opens slowly if at all. Like PyTorch's profiler
// schedule (wait/warmup/active), trace.json covers a window: output.trace_steps =
// [skip, steps] skips the warm-up steps, then traces `steps` steps (spans, per-action
// memory samples, copy-engine jobs) and the ALLOC/FREE stream of the window's first
// step. The default [10, 10] keeps the default run's trace.json near 1 MB and its
// report.html (whose charts draw these samples) under 2 MB. The peaks in summary.json, memory.json
// and the report stay exact over the whole run (the domains' own peak counters). A run shorter than
// skip + steps traces its last `steps` steps. The 0-based index of the window's first step:
int64_t traceFirstStep(const config::OutputOptions& o, int64_t totalSteps) {
  return std::min(o.trace_skip, std::max<int64_t>(0, totalSteps - o.trace_steps));
}
constexpr int64_t kTraceEventSteps = 1;
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
Trainer::Trainer(config::Config config, TrainerHooks hooks)
    : hooks_(std::move(hooks)), config_(std::move(config)) {
  runtime::checkDeviceKind(config_);  // Note [No silent fallback]: before the run folder
  const auto& t = config_.training;
  // Note [Deterministic runs]: on CPU every kernel LibTorch runs here is already
  // reproducible for a fixed intra-op thread count, the loader's order is a function of
  // (seed, epoch), and a pipeline's gradient sums run in schedule order on one thread
  // per device, with dropout masks from per-(seed, layer, microbatch) streams (Note
  // [Dropout streams]); training.deterministic also makes torch refuse any
  // nondeterministic kernel.
  at::globalContext().setDeterministicAlgorithms(t.deterministic, /*warn_only=*/false);
  memory::installTrackingAllocator();
  // Note [Keeping freed memory]: before the data set and any device thread.
  if (config_.devices.keep_freed_memory && !memory::keepFreedMemory())
    spdlog::warn(
        "devices.keep_freed_memory: not available with this malloc; freed memory "
        "goes back to the system");
  device_ = &memory::configureDomain(memory::virtualDeviceName(0),
                                     config_.devices.memory.value_or(memory::kUnlimited));
  // LibTorch here starts with one intra-op thread; 0 means every core.
  at::set_num_threads(t.threads > 0
                          ? static_cast<int>(t.threads)
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  torch::manual_seed(t.seed);
  train_ = data::makeDataset(config_.data, config_.model, data::Split::Train, t.seed);
  if (t.eval) test_ = data::makeDataset(config_.data, config_.model, data::Split::Test, t.seed);
  loader_ = std::make_unique<data::Loader>(train_, t.batch, config_.data.shuffle, t.seed);
  totalSteps_ = plannedSteps(config_, train_->size());
  if (config_.training.precision == "fp16")  // Note [Loss scaling]
    lossScale_ = LossScale{config_.training.loss_scale, 0, 0};
  if (config_.pipeline.schedule != "none") {
    // Note [Pipeline in the trainer]: the model is built outside every device (it would
    // not fit one); the engine moves each stage's layers to its backward device and owns
    // the per-stage optimizers. step() delegates; totalSteps_ iterations are scheduled.
    {
      memory::MemoryScope scope(memory::unscopedDomain(), MemoryCategory::Weights);
      model_ = model::buildModel(config_.model);
      model_->train(true);
    }
    return;  // the engine is built by ensureEngine(), after a resume() if any
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

// Note [Checkpointing asynchronous pipelines]
// A synchronous schedule (gpipe, 1f1b, pipefb-sync) is idle between two step()s: every
// stage has applied the step, so a checkpoint reads the masters and optimizers as they
// are, and one engine runs all remaining steps. An asynchronous one (pipedream,
// pipefb-async) never is: the next iteration's forwards run on before the last one's
// backwards, on stashed weight versions. With training.checkpoint_every: N it therefore
// runs in segments of N steps, one engine each, aligned to multiples of N: a segment
// drains at its end (finish()), so the checkpoint holds no in-flight weight version
// (each stage's weight version is recorded in the manifest), and the next segment's
// engine starts from the masters and the optimizer state. A resumed run cuts its
// segments at the same steps as an uninterrupted one, so the two are identical. The
// drain costs one pipeline fill per N steps, like a PipeDream-2BW flush.
void Trainer::ensureEngine() {
  if (config_.pipeline.schedule == "none") return;
  const int64_t every = config_.training.checkpoint_every;
  const auto kind = schedules::parseScheduleKind(config_.pipeline.schedule);
  // Note [Overlapping iterations] (PipelineEngine.cpp): zb-h2 runs without a flush; like
  // an asynchronous schedule it is never idle between two step()s.
  const bool overlap = kind == schedules::ScheduleKind::ZbH2;
  const bool async = schedules::isAsync(kind) || overlap;
  if (stepsDone_ >= totalSteps_) return;  // nothing left to run (the last engine stays)
  if (engine_ && stepsDone_ < engineEnd_) return;
  if (engine_) {  // a segment is over: carry its optimizer state into the next
    const auto names = model_->namedParameters();
    pendingOptimizer_.clear();
    for (int s = 0; s < engine_->numStages(); ++s)
      for (auto& e : optimizerState(engine_->optimizer(s), engine_->optimizerParameters(s, names)))
        pendingOptimizer_.push_back(e);
    pendingSource_ = "the previous segment";
    if (lossScale_) lossScale_ = engine_->lossScale();
    engine_.reset();
  }
  int64_t end = totalSteps_;
  if (async && every > 0) end = std::min(totalSteps_, (stepsDone_ / every + 1) * every);
  runtime::EngineOptions eo;
  eo.iterations = std::max<int64_t>(1, end - stepsDone_);
  eo.stallTimeoutSeconds = config_.pipeline.stall_timeout;
  eo.overlapIterations = overlap;
  eo.totalSteps = totalSteps_;
  eo.firstStep = stepsDone_;
  eo.log = engineEnd_ == 0;  // the first engine of this process; segments repeat it
  // Note [Trace window]: record the event stream from the window's first step, if it
  // falls in this engine's steps.
  const int64_t traceFrom = traceFirstStep(config_.output, totalSteps_) - stepsDone_;
  eo.traceFirstIteration = traceFrom >= 0 ? traceFrom : eo.iterations;
  eo.traceIterations = std::min(kTraceEventSteps, config_.output.trace_steps);
  eo.group = group_;
  eo.lossScale = lossScale_;
  engine_ = std::make_unique<runtime::PipelineEngine>(*model_, config_, eo);
  engineEnd_ = end;
  if (!pendingOptimizer_.empty()) {
    const auto names = model_->namedParameters();
    int64_t used = 0;
    for (int s = 0; s < engine_->numStages(); ++s) {
      memory::MemoryScope scope(engine_->optimizerDomain(s), MemoryCategory::OptimizerState);
      used += loadOptimizerState(engine_->optimizer(s), engine_->optimizerParameters(s, names),
                                 pendingOptimizer_, pendingSource_);
    }
    if (used != static_cast<int64_t>(pendingOptimizer_.size()))
      throw UserError(pendingSource_ + ": " + std::to_string(pendingOptimizer_.size() - used) +
                      " optimizer state entries fit no parameter of training.optimizer " +
                      config_.training.optimizer +
                      "; resume with the optimizer the run was made with");
    pendingOptimizer_.clear();
  }
}

double Trainer::step(const data::Batch& batch) {
  if (config_.pipeline.schedule != "none") {
    ensureEngine();
    double loss = engine_->step(batch);
    ++stepsDone_;
    return loss;
  }
  const int64_t micro = config_.pipeline.microbatches;
  const int64_t n = batch.input.size(0);
  memory::ScopeLeader leader;
  memory::MemoryScope deviceScope(*device_, MemoryCategory::WorkingSet);
  // In place: the gradients stay allocated, charged once as grads (LibTorch 2.x defaults
  // to set_to_none, which would free and re-charge them every step).
  optimizer_->zero_grad(/*set_to_none=*/false);
  std::vector<torch::Tensor> inputs, targets;
  {
    memory::MemoryScope scope(MemoryCategory::CommBuffers);
    inputs = batch.input.clone().chunk(micro, 0);
    targets = batch.target.clone().chunk(micro, 0);
  }
  double total = 0;
  // Note [Numerics check] (pipefb/common/NumericalError.h); one device is stage 0.
  const std::string& numerics = config_.training.check_numerics;
  const int M = static_cast<int>(inputs.size());
  auto check = [&](const torch::Tensor& t, const std::string& what, int m) {
    if (!t.is_floating_point() || torch::isfinite(t).all().item<bool>()) return;
    const std::string v = t.isnan().any().item<bool>()                             ? "nan"
                          : t.masked_select(torch::isinf(t))[0].item<double>() > 0 ? "inf"
                                                                                   : "-inf";
    throw NumericalError(what, v, stepsDone_ + 1, 0, m, M);
  };
  for (int m = 0; m < M; ++m) {
    // Mean loss over the whole batch = sum over microbatches of loss_m * (n_m / n).
    double weight = static_cast<double>(inputs[m].size(0)) / static_cast<double>(n);
    torch::Tensor loss;
    {
      // Note [Dropout streams]: the masks a pipeline draws for this microbatch.
      model::DropoutKey masks(config_.training.seed, stepsDone_ * M + m);
      memory::MemoryScope scope(MemoryCategory::Stash);
      model::Autocast autocast(config_.training.precision, inputs[m].device().type());
      torch::Tensor out;
      if (numerics == "all") {  // layer by layer, to name the first bad one
        out = inputs[m];
        for (size_t i = 0; i < model_->numLayers(); ++i) {
          out = model_->forward(out, i, i + 1);
          check(out, "activation of layer " + model_->layer(i)->name(), m);
        }
      } else {
        out = model_->forward(inputs[m]);
      }
      loss = model_->loss(out, targets[m]) * weight;
    }
    if (numerics != "off") check(loss, "loss", m);
    {
      // Linear layers add their weight gradients straight into the resident .grad, as
      // the pipeline runtime's B does (Note on model::WeightGradientsIntoGrad).
      model::WeightGradientsIntoGrad into;
      if (lossScale_)  // Note [Loss scaling]
        loss.backward(torch::full_like(loss, lossScale_->scale));
      else
        loss.backward();
    }
    if (numerics == "all" && !lossScale_)  // under fp16 a non-finite gradient skips the step
      for (const auto& [name, p] : model_->namedParameters())
        check(p.grad(), "gradient of " + name, m);
    total += loss.item<double>();
  }
  setLearningRate(*optimizer_, learningRate(config_.training, stepsDone_, totalSteps_));
  bool steps = true;
  if (lossScale_) {  // Note [Loss scaling]: one device is stage 0
    std::vector<torch::Tensor> params;
    for (const auto& [name, p] : model_->namedParameters()) params.push_back(p);
    steps = gradsFinite(params);
    if (steps) unscaleGrads(params, lossScale_->scale);
    lossScale_ = afterVerdict(*lossScale_, steps ? -1 : 0, config_.training.loss_scale_window,
                              stepsDone_ + 1);
  }
  if (steps) {
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
  memory::MemoryScope scope(
      config_.pipeline.schedule != "none" ? memory::unscopedDomain() : *device_,
      MemoryCategory::WorkingSet);
  for (int64_t start = 0; start < test.size(); start += bs) {
    std::vector<int64_t> idx;
    for (int64_t i = start; i < std::min(test.size(), start + bs); ++i) idx.push_back(i);
    data::Batch b = test.get(idx);
    model::Autocast autocast(config_.training.precision, b.input.device().type());
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
      for (MemoryCategory c : kAllMemoryCategories)
        d.peak_by_category[toString(c)] = ds.atPeak[index(c)];
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

NamedTensors Trainer::mergedStateDict() const {
  NamedTensors sd = model_->stateDict();
  if (!engine_) return sd;
  // Split stages: forwards update the forward copy's buffers (BatchNorm statistics).
  std::map<const void*, torch::Tensor> current;
  const auto& part = engine_->partition();
  for (int s = 0; s < engine_->numStages(); ++s) {
    std::vector<torch::Tensor> master;
    for (int64_t i = part[s].first; i < part[s].last; ++i)
      for (auto& b : model_->layer(static_cast<size_t>(i))->buffers()) master.push_back(b);
    auto now = engine_->stageBuffers(s);
    PIPEFB_ASSERT(now.size() == master.size(), "stage " << s << " buffers do not match");
    for (size_t j = 0; j < master.size(); ++j) current[master[j].unsafeGetTensorImpl()] = now[j];
  }
  for (auto& [name, t] : sd) {
    auto it = current.find(t.unsafeGetTensorImpl());
    if (it != current.end()) t = it->second;
  }
  return sd;
}

// The weights model.pt holds: all of them, or with one process per device the stages whose
// masters this rank holds (those whose backward runs on its device: PipelineEngine's
// buildStage), in layer order. The ranks' files together are the model's state_dict.
NamedTensors Trainer::ownWeights() const {
  if (!group_ || !engine_) return model_->stateDict();
  const int device = group_->rank() % engine_->numDevices();
  NamedTensors out;
  for (int s = 0; s < engine_->numStages(); ++s) {
    if (engine_->schedule().placement.backward(s) != device) continue;
    const runtime::StageRange r = engine_->partition()[s];
    for (auto& e : model_->stateDict(r.first, r.last)) out.push_back(std::move(e));
  }
  return out;
}

CheckpointState Trainer::checkpointState(double lastLoss) {
  CheckpointState cs;
  cs.step = stepsDone_;
  cs.totalSteps = totalSteps_;
  cs.loss = lastLoss;
  cs.model = mergedStateDict();
  const auto names = model_->namedParameters();
  if (engine_) {
    for (int s = 0; s < engine_->numStages(); ++s)
      for (auto& e : optimizerState(engine_->optimizer(s), engine_->optimizerParameters(s, names)))
        cs.optimizer.push_back(e);
  } else if (optimizer_) {
    cs.optimizer = optimizerState(*optimizer_, names);
  }
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    cs.torchRng = gen.get_state();
  }
  if (lossScale_) cs.lossScale = engine_ ? engine_->lossScale() : *lossScale_;
  cs.loaderEpoch = loader_->epoch();
  cs.loaderPosition = loader_->position();
  cs.loaderSeed = config_.training.seed;
  cs.configYaml = config::toYaml(config_);
  cs.schedule = config_.pipeline.schedule;
  cs.microbatches = config_.pipeline.microbatches;
  const NamedTensors state = model_->stateDict();
  auto stageOf = [&](int64_t first, int64_t last, int f, int b, int64_t version) {
    CheckpointStage st{first, last, f, b, version, {}};
    std::set<const void*> mine;
    for (int64_t i = first; i < last; ++i) {
      for (auto& p : model_->layer(static_cast<size_t>(i))->parameters())
        mine.insert(p.unsafeGetTensorImpl());
      for (auto& p : model_->layer(static_cast<size_t>(i))->buffers())
        mine.insert(p.unsafeGetTensorImpl());
    }
    for (const auto& [name, t] : state)
      if (mine.count(t.unsafeGetTensorImpl())) st.names.push_back(name);
    return st;
  };
  if (engine_) {
    const auto& part = engine_->partition();
    for (int s = 0; s < engine_->numStages(); ++s)
      cs.stages.push_back(stageOf(part[s].first, part[s].last, engine_->forwardDevice(s),
                                  engine_->backwardDevice(s), engine_->weightVersion(s)));
  } else {
    cs.stages.push_back(stageOf(0, static_cast<int64_t>(model_->numLayers()), 0, 0, stepsDone_));
  }
  return cs;
}

std::string Trainer::writeCheckpointNow(double lastLoss) {
  CheckpointState cs = checkpointState(lastLoss);
  const int64_t step = stepsDone_;
  std::function<void()> hook;
  if (hooks_.beforeManifest) hook = [&] { hooks_.beforeManifest(step); };
  lastCheckpoint_ =
      writeCheckpoint(config_.output.dir, cs, config_.training.keep_checkpoints, hook);
  return lastCheckpoint_;
}

void Trainer::resume(const std::string& dir) {
  CheckpointState cs = readCheckpoint(dir);
  const std::string modelFile = dir + "/model.pt";
  // Weights: by name, so that any partition of this config takes them.
  std::map<std::string, torch::Tensor> saved(cs.model.begin(), cs.model.end());
  const NamedTensors mine = model_->stateDict();
  if (saved.size() != mine.size()) {
    std::string extra;
    for (const auto& [k, t] : saved) {
      bool found = false;
      for (const auto& m : mine) found = found || m.first == k;
      if (!found) {
        extra = k;
        break;
      }
    }
    throw UserError(modelFile + ": has " + std::to_string(saved.size()) + " tensors, model " +
                    config_.model.name + " has " + std::to_string(mine.size()) +
                    (extra.empty() ? "" : " (no '" + extra + "' in it)") +
                    "; resume with the model config the run was made with");
  }
  {
    torch::NoGradGuard noGrad;
    for (const auto& [name, t] : mine) {
      auto it = saved.find(name);
      if (it == saved.end())
        throw UserError(modelFile + ": no '" + name + "' for model " + config_.model.name +
                        "; resume with the model config the run was made with");
      if (!it->second.sizes().equals(t.sizes()))
        throw UserError(modelFile + ": '" + name + "' has shape " + c10::str(it->second.sizes()) +
                        " but the model has " + c10::str(t.sizes()) +
                        "; resume with the model config the run was made with");
      t.copy_(it->second);
    }
  }
  if (cs.loaderSeed != config_.training.seed)
    throw UserError(dir + "/manifest.json: training.seed " + std::to_string(cs.loaderSeed) +
                    " differs from the config's " + std::to_string(config_.training.seed) +
                    "; resume with the seed of the run");
  if (optimizer_) {
    memory::MemoryScope scope(*device_, MemoryCategory::OptimizerState);
    int64_t used = loadOptimizerState(*optimizer_, model_->namedParameters(), cs.optimizer,
                                      dir + "/optimizer.pt");
    if (used != static_cast<int64_t>(cs.optimizer.size()))
      throw UserError(dir + "/optimizer.pt: " + std::to_string(cs.optimizer.size() - used) +
                      " state entries fit no parameter of training.optimizer " +
                      config_.training.optimizer + "; resume with the optimizer of the run");
  } else {
    engine_.reset();
    engineEnd_ = 0;
    pendingOptimizer_ = cs.optimizer;
    pendingSource_ = dir + "/optimizer.pt";
  }
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    try {
      gen.set_state(cs.torchRng);
    } catch (const std::exception&) {
      throw UserError(dir + "/rng.pt: not a CPU generator state; the checkpoint is corrupt");
    }
  }
  // Note [Loss scaling]: a checkpoint of another precision has none; the config's then.
  if (lossScale_ && cs.lossScale) lossScale_ = cs.lossScale;
  loader_->seek(cs.loaderEpoch, cs.loaderPosition);
  stepsDone_ = cs.step;
  lastCheckpoint_ = dir;
  spdlog::info("resumed from {} at step {} of {} (epoch {}, batch {} of the epoch)", dir,
               stepsDone_, totalSteps_, cs.loaderEpoch, cs.loaderPosition);
}

namespace {
// metrics.csv of a resumed run: the rows up to the checkpoint's step stay, later ones
// (computed after it, before the run died) go; new rows are appended.
void trimMetrics(const std::string& path, int64_t steps) {
  std::ifstream in(path);
  std::string line, kept;
  bool header = true;
  while (std::getline(in, line)) {
    if (header) {
      kept += line + "\n";
      header = false;
      continue;
    }
    if (std::atoll(line.c_str()) <= steps) kept += line + "\n";
  }
  writeFileAtomically(path, kept);
}
}  // namespace

RunSummary Trainer::run() {
  const auto& t = config_.training;
  RunSummary summary;
  summary.run_dir = config_.output.dir;
  try {
    fs::create_directories(config_.output.dir);
  } catch (const fs::filesystem_error& e) {
    throw UserError(config_.source + ": output.dir: cannot create '" + config_.output.dir + "' (" +
                    e.code().message() + "); give a folder you can write, such as runs/" +
                    config_.model.name);
  }
  writeFileAtomically(config_.output.dir + "/config.yaml", config::toYaml(config_));
  if (!planYaml_.empty()) writeFileAtomically(config_.output.dir + "/plan.yaml", planYaml_);
  const std::string metricsPath = config_.output.dir + "/metrics.csv";
  const int64_t firstStep = stepsDone_;
  if (firstStep > 0 && fs::exists(metricsPath)) trimMetrics(metricsPath, firstStep);
  std::ofstream metrics(metricsPath,
                        firstStep > 0 && fs::exists(metricsPath) ? std::ios::app : std::ios::trunc);
  if (!(firstStep > 0) || fs::file_size(metricsPath) == 0)
    metrics << "step,epoch,loss,lr,samples_per_s,elapsed_s\n";

  spdlog::info("pipefb_train: model {} ({} layers), data {} ({} samples), {} steps of batch {}",
               config_.model.name, model_->numLayers(), train_->describe(), train_->size(),
               totalSteps_, t.batch);
  // A single device has no runtime trace: record one (Note [Chrome trace]).
  std::unique_ptr<report::StepTrace> stepTrace;
  const int64_t traceFrom = traceFirstStep(config_.output, totalSteps_);  // Note [Trace window]
  const int64_t traceTo = traceFrom + config_.output.trace_steps;
  int64_t traceFromNs = 0, traceToNs = std::numeric_limits<int64_t>::max();
  if (config_.output.trace_steps == 0) traceToNs = -1;  // metadata only
  if (config_.pipeline.schedule == "none")
    stepTrace =
        std::make_unique<report::StepTrace>(*device_, std::max<int64_t>(0, traceFrom - firstStep),
                                            config_.output.trace_steps, kTraceEventSteps);
  const auto t0 = Clock::now();
  double windowLoss = 0;
  int64_t windowSteps = 0;
  auto windowStart = Clock::now();
  int64_t windowSamples = 0;
  double lastLoss = 0;
  const int64_t every = t.checkpoint_every;
  auto lastGood = [&] {
    return lastCheckpoint_.empty()
               ? std::string("no checkpoint was taken (training.checkpoint_every: ") +
                     std::to_string(every) + ")"
               : "the last good checkpoint " + lastCheckpoint_ +
                     " is kept (pipefb_train --resume " + config_.output.dir + ")";
  };
  try {
    for (int64_t s = firstStep; s < totalSteps_; ++s) {
      data::Batch batch = loader_->next();
      if (hooks_.beforeStep) hooks_.beforeStep(s + 1, batch);
      double lr = learningRate(t, stepsDone_, totalSteps_);
      // A window from step 0 keeps everything before it too: the engine's first actions
      // (weight syncs, receives posted) can start before this step's clock mark.
      if (s == traceFrom && s > 0) traceFromNs = memory::nowNs();
      lastLoss = step(batch);
      if (stepTrace) stepTrace->stepDone();
      if (s + 1 == traceTo) traceToNs = memory::nowNs();
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
      if (every > 0 && (s + 1) % every == 0) {
        // Note [Checkpointing asynchronous pipelines]: an async segment ends here.
        if (engine_ && engineEnd_ == s + 1) engine_->finish();
        metrics.flush();
        const auto c0 = Clock::now();
        writeCheckpointNow(lastLoss);
        if (config_.output.progress)
          spdlog::info("checkpoint {} ({:.0f} ms)", lastCheckpoint_, 1e3 * secondsSince(c0));
      }
      if (hooks_.afterStep) hooks_.afterStep(s + 1);
    }
    if (engine_) engine_->finish();  // asynchronous schedules run on after the last step()
  } catch (const NumericalError& e) {
    throw NumericalError(e.kind(), e.value(), e.step(), e.stage(), e.microbatch(),
                         config_.pipeline.microbatches, lastGood());
  } catch (const runtime::PipelineError& e) {
    try {
      if (e.cause()) std::rethrow_exception(e.cause());
    } catch (const NumericalError& n) {
      throw NumericalError(n.kind(), n.value(), n.step(), n.stage(), n.microbatch(),
                           config_.pipeline.microbatches, lastGood());
    } catch (...) {
    }
    throw;
  }
  double trainSeconds = secondsSince(t0);
  metrics.close();
  summary.steps = totalSteps_;
  summary.final_loss = lastLoss;
  summary.throughput_samples_per_s = summary.samples / std::max(trainSeconds, 1e-9);

  if (t.eval) {
    const auto& test = test_;
    auto [acc, loss] = evaluate(*test);
    summary.test_accuracy = acc;
    summary.test_loss = loss;
    spdlog::info("test accuracy {:.4f} (loss {:.4f}) on {} samples", acc, loss, test->size());
  }
  if (t.checkpoint) {
    summary.checkpoint = config_.output.dir + "/model.pt";
    saveStateDict(summary.checkpoint, ownWeights());
  }
  summary.wall_seconds = secondsSince(t0);
  summary.devices = deviceSummaries();

  nlohmann::json j;
  j["steps"] = summary.steps;
  j["samples"] = summary.samples;
  j["final_loss"] = summary.final_loss;
  j["test_accuracy"] =
      summary.test_accuracy >= 0 ? nlohmann::json(summary.test_accuracy) : nlohmann::json(nullptr);
  j["test_loss"] =
      summary.test_loss >= 0 ? nlohmann::json(summary.test_loss) : nlohmann::json(nullptr);
  j["throughput_samples_per_s"] = summary.throughput_samples_per_s;
  j["wall_seconds"] = summary.wall_seconds;
  j["model"] = config_.model.name;
  j["schedule"] = config_.pipeline.schedule;
  j["precision"] = config_.training.precision;  // Note [Autocast]
  if (lossScale_) {                             // Note [Loss scaling]
    const LossScale l = engine_ ? engine_->lossScale() : *lossScale_;
    j["loss_scale"] = {{"scale", l.scale}, {"skipped_steps", l.skipped}};
  }
  j["checkpoint"] = summary.checkpoint;
  j["devices"] = nlohmann::json::array();
  for (const auto& d : summary.devices) {
    nlohmann::json dj;
    dj["name"] = d.name;
    dj["capacity_bytes"] =
        d.capacity_bytes >= 0 ? nlohmann::json(d.capacity_bytes) : nlohmann::json(nullptr);
    dj["peak_bytes"] = d.peak_bytes;
    dj["peak_by_category"] = d.peak_by_category;
    j["devices"].push_back(dj);
  }
  if (engine_) {
    j["pipeline"] = nlohmann::json::parse(engine_->summaryJson());
    engine_->writeTrace(config_.output.dir + "/trace.json", traceFromNs, traceToNs);
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
