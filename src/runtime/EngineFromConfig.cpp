// The engine from a config: the only runtime code that reads config::Config (Note [The
// plan is the program]). It resolves the plan and copies the runtime options.
#include "pipefb/runtime/DeviceKind.h"
#include "pipefb/runtime/PipelineEngine.h"
#include "pipefb/runtime/ResolvePlan.h"

namespace pipefb::runtime {

namespace {

ModelLayers layersOf(const model::Model& model) {
  ModelLayers out;
  out.name = model.options().name;
  for (const auto& l : model.layers()) {
    int64_t b = 0;
    for (const auto& t : l->parameters()) b += static_cast<int64_t>(t.numel() * t.element_size());
    out.paramBytes.push_back(b);
  }
  return out;
}

EngineOptions withConfig(EngineOptions o, const config::Config& c) {
  o.training = c.training;
  o.bind = c.devices.bind;
  o.bucketMb = c.distributed.bucket_mb;
  o.overlap = c.distributed.overlap;
  o.weightPrediction = c.pipeline.weight_prediction != "none";  // auto: on
  o.source = c.source;
  return o;
}

}  // namespace

PipelineEngine::PipelineEngine(model::Model& model, const config::Config& config,
                               EngineOptions options)
    // Note [No silent fallback] (DeviceKind.h): before any domain or thread exists.
    : PipelineEngine(model,
                     (checkDeviceKind(config),
                      resolvePlan(config, layersOf(model), options.iterations, options.log)),
                     withConfig(options, config)) {}

}  // namespace pipefb::runtime
