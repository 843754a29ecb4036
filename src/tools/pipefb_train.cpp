// pipefb_train --config configs/vgg16.yaml [--set section.key=value ...]
//
// Exit codes: 0 success; 2 bad input (config, flag, data file), with one line on
// stderr naming the key or file; 1 any other failure (out of memory, numerical).
#include <spdlog/spdlog.h>

#include <iostream>

#include "pipefb/common/Program.h"
#include "pipefb/config/Config.h"
#include "pipefb/train/Trainer.h"

int main(int argc, char** argv) {
  CLI::App app{"pipefb_train: pipeline-parallel training for devices short of memory"};
  std::string configPath;
  std::vector<std::string> overrides;
  app.add_option("--config,-c", configPath, "YAML config file (e.g. configs/vgg16.yaml)")
      ->required();
  app.add_option("--set,-s", overrides, "override a key: --set training.lr=0.1 (repeatable)");
  return pipefb::runProgram("pipefb_train", app, argc, argv, [&] {
    pipefb::config::Config config = pipefb::config::loadConfig(configPath, overrides);
    pipefb::train::Trainer trainer(std::move(config));
    auto summary = trainer.run();
    if (summary.test_accuracy >= 0) std::cout << "test_accuracy " << summary.test_accuracy << "\n";
    return 0;
  });
}
