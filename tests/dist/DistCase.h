#pragma once
// What the multi-process tests (DistTest.cpp) and their worker (dist_worker.cpp) share:
// the model, config and batch of a case, so that the worker's ranks and the test's
// single-process reference see the same weights and microbatches.
#include <torch/torch.h>

#include <string>

#include "../PipelineBatch.h"
#include "../PipelineConfig.h"
#include "pipefb/config/Config.h"
#include "pipefb/data/Dataset.h"
#include "pipefb/model/Model.h"

namespace pipefb::test {

inline model::ModelOptions distModel(const std::string& name) {
  model::ModelOptions o;
  o.name = name;
  if (name == "mlp") {
    o.input_size = 6;
    o.channels = 1;
    o.num_classes = 5;
    o.hidden = {24, 20, 16};  // 4 layers
  } else {                    // vgg16 at width 1/16 on 32x32
    o.width = 0.0625;
    o.input_size = 32;
    o.channels = 3;
    o.num_classes = 10;
  }
  return o;
}

inline config::Config distConfig(const std::string& model, const std::string& schedule, int S,
                                 int M, const std::string& stash, int64_t batch) {
  return pipelineConfig(distModel(model), schedule, S, M, stash, batch, "<dist test>");
}

}  // namespace pipefb::test
