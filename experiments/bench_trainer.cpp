// One training step of pipefb's single-device trainer against a plain LibTorch
// loop on the same model and batch, measured side by side in one run.
//
//   build/bench_trainer [--model vgg16] [--width 0.125] [--batch 64] [--steps 30]
//                       [--optimizer sgd|adam] [--lr 0.01] [--threads N]
//                       [--only both|pipefb|plain] [--json]
//
// --only runs one side alone (experiments/compare_baselines.sh runs each side in its own
// process to read its peak RSS); --json prints one JSON line instead of the text.
//
// Both sides use the same layers, the same optimizer type and the same data; the
// plain loop is what a user would write by hand: zero_grad, forward, cross
// entropy, backward, step. Rounds alternate in ABBA order so that drift in the
// machine and cache effects hit both alike. Prints the median step time of each and
// the ratio plain/pipefb (1.0 = no overhead; the goal is >= 0.97).
#include <sys/resource.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "pipefb/config/Config.h"
#include "pipefb/train/Optimizer.h"
#include "pipefb/train/Trainer.h"

using Clock = std::chrono::steady_clock;

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  CLI::App app{"bench_trainer: pipefb trainer step vs a plain LibTorch step"};
  std::string model = "vgg16";
  double width = 0.125;
  int64_t batch = 64, steps = 30, inputSize = 32, threads = 0;
  std::string optimizer = "sgd", only = "both";
  double lr = 0.01;
  bool asJson = false;
  app.add_option("--model", model);
  app.add_option("--optimizer", optimizer)->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--lr", lr)->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "intra-op threads (0: all cores)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--only", only)->check(CLI::IsMember({"both", "pipefb", "plain"}));
  app.add_flag("--json", asJson);
  app.add_option("--width", width);
  app.add_option("--batch", batch);
  app.add_option("--steps", steps);
  app.add_option("--input-size", inputSize);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help or the error line
    return code == 0 ? 0 : 2;      // bad flag: exit 2, like the tools
  }

  auto cfg = pipefb::config::parseConfig(
      "model: {name: " + model + ", width: " + std::to_string(width) +
          ", input_size: " + std::to_string(inputSize) +
          ", channels: 1, num_classes: 10}\n"
          "data: {name: synthetic, synthetic_train: " +
          std::to_string(batch * 4) +
          "}\n"
          "training: {optimizer: " +
          optimizer + ", lr: " + std::to_string(lr) + ", threads: " + std::to_string(threads) +
          ", batch: " + std::to_string(batch) +
          ", iterations: 1000000, eval: false, checkpoint: false}\n"
          "output: {dir: /tmp/pipefb_bench_trainer, progress: false}\n",
      {}, "bench");
  const bool runPipefb = only != "plain", runPlain = only != "pipefb";
  std::unique_ptr<pipefb::train::Trainer> trainer;
  if (runPipefb) trainer = std::make_unique<pipefb::train::Trainer>(cfg);  // sets the threads
  if (!runPipefb && threads > 0) at::set_num_threads(static_cast<int>(threads));

  // The plain side: an identical model (same seed), a hand-written loop.
  torch::manual_seed(cfg.training.seed);
  std::shared_ptr<pipefb::model::Model> plain;
  std::unique_ptr<torch::optim::Optimizer> plainOpt;
  if (runPlain) {
    plain = pipefb::model::buildModel(cfg.model);
    plain->train(true);
    plainOpt = pipefb::train::makeOptimizer(cfg.training, plain->parameters());
  }

  auto ds = pipefb::data::makeDataset(cfg.data, cfg.model, pipefb::data::Split::Train, 0);
  std::vector<int64_t> idx(batch);
  for (int64_t i = 0; i < batch; ++i) idx[i] = i;
  auto b = ds->get(idx);

  auto plainStep = [&] {
    plainOpt->zero_grad();
    torch::Tensor out = plain->forward(b.input);
    torch::Tensor loss = torch::nn::functional::cross_entropy(out, b.target);
    loss.backward();
    plainOpt->step();
    return loss.item<double>();
  };
  auto pipefbStep = [&] { trainer->step(b); };
  for (int i = 0; i < 3; ++i) {  // warm-up
    if (runPipefb) pipefbStep();
    if (runPlain) plainStep();
  }
  // ABBA order: each side runs first in half of the rounds.
  std::vector<double> tp, tl;
  auto timed = [](auto&& f) {
    auto t0 = Clock::now();
    f();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  for (int64_t i = 0; i < steps; ++i) {
    if (i % 2 == 0) {
      if (runPipefb) tp.push_back(timed(pipefbStep));
      if (runPlain) tl.push_back(timed(plainStep));
    } else {
      if (runPlain) tl.push_back(timed(plainStep));
      if (runPipefb) tp.push_back(timed(pipefbStep));
    }
  }
  auto sum = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s;
  };
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const double rssMiB = static_cast<double>(ru.ru_maxrss) / 1024.0;  // ru_maxrss is KiB
  if (asJson) {
    nlohmann::json j = {{"model", model},         {"width", width},
                        {"batch", batch},         {"steps", steps},
                        {"optimizer", optimizer}, {"threads", at::get_num_threads()},
                        {"only", only},           {"peak_rss_mib", rssMiB}};
    if (runPipefb)
      j["pipefb"] = {{"step_ms_median", median(tp) * 1e3},
                     {"samples_per_s_median", batch / median(tp)},
                     {"samples_per_s_mean", batch * steps / sum(tp)}};
    if (runPlain)
      j["plain"] = {{"step_ms_median", median(tl) * 1e3},
                    {"samples_per_s_median", batch / median(tl)},
                    {"samples_per_s_mean", batch * steps / sum(tl)}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model %s width %g batch %lld, %lld steps each, %d intra-op threads, %s\n",
              model.c_str(), width, (long long)batch, (long long)steps, at::get_num_threads(),
              optimizer.c_str());
  if (runPipefb) {
    const double mp = median(tp);
    std::printf("pipefb trainer step : %8.2f ms  (%7.1f samples/s)\n", mp * 1e3, batch / mp);
  }
  if (runPlain) {
    const double ml = median(tl);
    std::printf("plain LibTorch step : %8.2f ms  (%7.1f samples/s)\n", ml * 1e3, batch / ml);
  }
  if (runPipefb && runPlain)
    std::printf("ratio (pipefb throughput / plain throughput) = %.3f\n", median(tl) / median(tp));
  std::printf("peak RSS of this process: %.1f MiB\n", rssMiB);
  return 0;
}
