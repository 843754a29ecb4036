// One training step of pipefb's single-device trainer against a plain LibTorch
// loop on the same model and batch, measured side by side in one run.
//
//   build/bench_trainer [--model vgg16] [--width 0.125] [--batch 64] [--steps 30]
//
// Both sides use the same layers, the same optimizer type and the same data; the
// plain loop is what a user would write by hand: zero_grad, forward, cross
// entropy, backward, step. Rounds alternate in ABBA order so that drift in the
// machine and cache effects hit both alike. Prints the median step time of each and
// the ratio plain/pipefb (1.0 = no overhead; the goal is >= 0.97).
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

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
  int64_t batch = 64, steps = 30, inputSize = 32;
  app.add_option("--model", model);
  app.add_option("--width", width);
  app.add_option("--batch", batch);
  app.add_option("--steps", steps);
  app.add_option("--input-size", inputSize);
  CLI11_PARSE(app, argc, argv);

  auto cfg = pipefb::config::parseConfig(
      "model: {name: " + model + ", width: " + std::to_string(width) +
          ", input_size: " + std::to_string(inputSize) +
          ", channels: 1, num_classes: 10}\n"
          "data: {name: synthetic, synthetic_train: " + std::to_string(batch * 4) + "}\n"
          "training: {optimizer: sgd, lr: 0.01, batch: " + std::to_string(batch) +
          ", iterations: 1000000, eval: false, checkpoint: false}\n"
          "output: {dir: /tmp/pipefb_bench_trainer, progress: false}\n",
      {}, "bench");
  pipefb::train::Trainer trainer(cfg);

  // The plain side: an identical model (same seed), a hand-written loop.
  torch::manual_seed(cfg.training.seed);
  auto plain = pipefb::model::buildModel(cfg.model);
  plain->train(true);
  auto plainOpt = pipefb::train::makeOptimizer(cfg.training, plain->parameters());

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
  for (int i = 0; i < 3; ++i) {  // warm-up
    trainer.step(b);
    plainStep();
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
      tp.push_back(timed([&] { trainer.step(b); }));
      tl.push_back(timed(plainStep));
    } else {
      tl.push_back(timed(plainStep));
      tp.push_back(timed([&] { trainer.step(b); }));
    }
  }
  double mp = median(tp), ml = median(tl);
  std::printf("model %s width %g batch %lld, %lld steps each, %d intra-op threads\n",
              model.c_str(), width, (long long)batch, (long long)steps, at::get_num_threads());
  std::printf("pipefb trainer step : %8.2f ms  (%7.1f samples/s)\n", mp * 1e3, batch / mp);
  std::printf("plain LibTorch step : %8.2f ms  (%7.1f samples/s)\n", ml * 1e3, batch / ml);
  std::printf("ratio (pipefb throughput / plain throughput) = %.3f\n", ml / mp);
  return 0;
}
