// dist_worker: one rank of a multi-process pipeline test (DistTest.cpp), started by
// pipefb_launch. Rendezvous from torchrun's env vars (pipefb/dist/ProcessGroup.h), runs
// `--iterations` iterations of a DistCase.h case with this rank's device only, and
// writes OUT/rank<r>.pt: the gradients after the first iteration of the parameters
// whose stage has its backward device here, and the losses.
//   --kill-at N  SIGKILLs rank --fault-rank (1) before its action N (the failure test)
//   --stop-at N  SIGSTOPs it there instead (a rank that stops answering)
//   --fp16 --poison-step K  trains at fp16; rank --fault-rank writes an inf into the .grad
//                of its first stepped stage before its first STEP of iteration K. Every
//                iteration appends the sum of this rank's stepped weights to OUT/rank<r>.pt
//                ("__weight_sums__"), and the run ends with "rank R scale X skipped N".
// Exit codes as pipefb_train's (pipefb/common/Program.h).
#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <limits>

#include "DistCase.h"
#include "pipefb/common/Program.h"
#include "pipefb/dist/ProcessGroup.h"
#include "pipefb/runtime/PipelineEngine.h"

int main(int argc, char** argv) {
  using namespace pipefb;
  CLI::App app{"dist_worker: one rank of a multi-process pipeline test"};
  std::string modelName = "mlp", schedule = "1f1b", stash = "checkpoint-offload", out;
  int S = 2, M = 4, replicas = 1, iterations = 1, killAt = -1, stopAt = -1, faultRank = 1,
      devices = 0, poisonStep = -1;
  bool fp16 = false;
  int64_t batch = 8;
  double timeout = 30, bucketMb = 25;
  bool overlap = true;
  app.add_option("--model", modelName)->check(CLI::IsMember({"mlp", "vgg16"}));
  app.add_option("--schedule", schedule);
  app.add_option("--stages", S);
  app.add_option("--microbatches", M);
  app.add_option("--stash", stash);
  app.add_option("--batch", batch);
  app.add_option("--replicas", replicas, "pipeline.replicas");
  app.add_option("--iterations", iterations);
  app.add_option("--devices", devices, "devices.count (default: the schedule's)");
  app.add_option("--timeout", timeout, "distributed.timeout");
  app.add_option("--bucket-mb", bucketMb, "distributed.bucket_mb");
  app.add_option("--overlap", overlap, "distributed.overlap");
  app.add_option("--kill-at", killAt);
  app.add_option("--stop-at", stopAt);
  app.add_option("--fault-rank", faultRank, "the rank --kill-at/--stop-at apply to");
  app.add_option("--out", out);
  app.add_flag("--fp16", fp16, "training.precision: fp16");
  app.add_option("--poison-step", poisonStep, "the iteration whose gradient turns inf");
  return runProgram("dist_worker", app, argc, argv, [&] {
    auto env = dist::envFromTorchrun();
    if (!env) throw UserError("dist_worker runs under pipefb_launch (WORLD_SIZE is not set)");
    auto cfg = test::distConfig(modelName, schedule, S, M, stash, batch);
    cfg.distributed.timeout = timeout;
    if (devices > 0) cfg.devices.count = devices;
    cfg.pipeline.replicas = replicas;
    cfg.distributed.bucket_mb = bucketMb;
    cfg.distributed.overlap = overlap;
    if (fp16) cfg.training.precision = "fp16";
    config::validate(cfg);
    auto group = dist::makeGlooGroup(*env, {cfg.distributed.timeout});
    auto model = test::buildSeeded(cfg.model);
    runtime::EngineOptions eo;
    eo.iterations = iterations;
    eo.log = env->rank == 0;
    eo.recordMemoryEvents = false;
    eo.group = group;
    eo.stallTimeoutSeconds = 4 * timeout;  // the c10d timeout must fire first
    std::atomic<runtime::PipelineEngine*> self{nullptr};
    bool poisoned = false;
    if (env->rank == faultRank)
      eo.beforeAction = [&](int d, int i) {
        if (i == killAt) std::raise(SIGKILL);
        if (i == stopAt) std::raise(SIGSTOP);
        if (!self || poisoned || poisonStep < 0) return;
        const auto& a = self.load()->schedule().devices[d][i];
        if (a.type != schedules::ActionType::Step || a.index != poisonStep) return;
        // After this device's all-reduces: only this replica's gradient turns inf.
        const auto range = self.load()->partition()[a.stage];
        auto p = model->layer(static_cast<size_t>(range.first))->parameters().front();
        p.grad().view(-1)[0].fill_(std::numeric_limits<float>::infinity());
        poisoned = true;
      };
    runtime::PipelineEngine engine(*model, cfg, eo);
    self = &engine;
    auto steppedWeightSum = [&] {
      double sum = 0;
      for (int s = 0; s < engine.numStages(); ++s) {
        if (engine.backwardDevice(s) != env->rank % engine.numDevices()) continue;
        const auto& r = engine.partition()[s];
        for (int64_t i = r.first; i < r.last; ++i)
          for (const auto& p : model->layer(static_cast<size_t>(i))->parameters())
            sum += p.detach().to(torch::kFloat64).sum().item<double>();
      }
      return sum;
    };
    std::vector<double> sums{steppedWeightSum()};
    torch::serialize::OutputArchive archive;
    std::vector<double> losses;
    for (int k = 0; k < iterations; ++k) {
      auto b = test::makeBatch(*model, batch, cfg.model.num_classes, 100 + k);
      losses.push_back(engine.step(b));
      sums.push_back(steppedWeightSum());
      if (k > 0) continue;
      // Parameters of the stages whose master (and .grad) lives on this rank.
      auto named = model->namedParameters();
      for (int s = 0; s < engine.numStages(); ++s) {
        if (engine.backwardDevice(s) != env->rank % engine.numDevices()) continue;
        const auto& r = engine.partition()[s];
        for (int64_t i = r.first; i < r.last; ++i)
          for (const auto& p : model->layer(static_cast<size_t>(i))->parameters())
            for (const auto& [name, q] : named)
              if (q.is_same(p)) archive.write(name, p.grad().clone());
      }
    }
    engine.finish();
    // Note [Gradient buckets]: how many started while a B's autograd call still ran.
    int buckets = 0, early = 0;
    const auto rec = engine.records();
    for (const auto& b : engine.bucketRecords()) {
      ++buckets;
      const int d = env->rank % engine.numDevices();
      const bool beforeEnd =
          b.backwardAction >= 0 &&
          b.startNs < engine.clockOriginNs() +
                          std::llround(rec[d].at(static_cast<size_t>(b.backwardAction)).end * 1e9);
      if (b.duringBackward && b.startNs < b.backwardDoneNs && beforeEnd) ++early;
    }
    if (replicas > 1)
      std::printf("rank %d buckets %d started-during-backward %d\n", env->rank, buckets, early);
    archive.write("__losses__", torch::tensor(losses, torch::kFloat64));
    archive.write("__weight_sums__", torch::tensor(sums, torch::kFloat64));
    if (fp16)
      std::printf("rank %d scale %g skipped %lld\n", env->rank, engine.lossScale().scale,
                  static_cast<long long>(engine.lossScale().skipped));
    if (!out.empty()) archive.save_to(out + "/rank" + std::to_string(env->rank) + ".pt");
    std::printf("rank %d done, loss %.6f\n", env->rank, losses[0]);
    return 0;
  });
}
