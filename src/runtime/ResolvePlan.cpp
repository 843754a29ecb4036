// The one resolver: config -> PipelinePlan (Note [The plan is the program]).
#include "pipefb/runtime/ResolvePlan.h"

#include <spdlog/spdlog.h>

#include "pipefb/common/Error.h"
#include "pipefb/common/Suggest.h"
#include "pipefb/runtime/Partition.h"
#include "pipefb/schedules/Lowering.h"

namespace pipefb::runtime {

namespace {

std::vector<StageRange> partitionOf(const config::Config& config, const ModelLayers& model, int S,
                                    bool log) {
  const auto& p = config.pipeline;
  const auto L = static_cast<std::int64_t>(model.paramBytes.size());
  if (!p.partition.empty()) return partitionFromCuts(p.partition, L);
  if (S > L)
    throw UserError(config.source + ": pipeline.stages: " + std::to_string(S) +
                    " stages but model " + model.name + " has only " + std::to_string(L) +
                    " layers; allowed: 1.." + std::to_string(L) +
                    " (lower pipeline.stages or devices.count)");
  auto partition = balancedPartition(model.paramBytes, S);
  if (log) {
    std::string sizes;
    for (const auto& r : partition) {
      std::int64_t b = 0;
      for (std::int64_t i = r.first; i < r.last; ++i) b += model.paramBytes[i];
      sizes += (sizes.empty() ? "" : ", ") + std::to_string(b / 1024) + " KiB";
    }
    spdlog::info("pipeline: partition balanced by parameter bytes: {} ({})", toString(partition),
                 sizes);
  }
  return partition;
}

schedules::Placement placementOf(const config::Config& config, schedules::ScheduleKind kind,
                                 int S) {
  const auto& p = config.pipeline;
  if (p.placement.empty())
    return schedules::Placement::defaultFor(kind, S, config::virtualStages(config));
  const std::string where = config.source + ": pipeline.placement";
  auto placement = schedules::Placement::parse(p.placement, where);
  if (placement.numStages() != S)
    throw UserError(where + ": " + std::to_string(placement.numStages()) + " entries for " +
                    std::to_string(S) + " stages; give one <forward>/<backward> per stage");
  placement.checkFor(toString(kind), static_cast<int>(config.devices.count), where);
  return placement;
}

}  // namespace

schedules::PipelinePlan resolvePlan(const config::Config& config, const ModelLayers& model,
                                    std::int64_t iterations, bool log) {
  const auto& p = config.pipeline;
  if (p.schedule == "none")
    throw UserError(config.source + ": pipeline.schedule: none has no pipeline; allowed: " +
                    joinAllowed(schedules::scheduleKindNames()));
  schedules::PipelinePlan plan;
  plan.kind = schedules::parseScheduleKind(p.schedule);
  const int S = stagesFor(config);
  plan.microbatches = static_cast<int>(p.microbatches);
  plan.iterations = static_cast<int>(std::max<std::int64_t>(1, iterations));
  plan.replicas = static_cast<int>(p.replicas);
  plan.asyncLag = static_cast<int>(p.async_lag);
  plan.offloadWeights = p.offload_weights != "none";  // Note [Weight-version offload]

  const auto partition = partitionOf(config, model, S, log);
  const auto placement = placementOf(config, plan.kind, S);
  const auto stash = config::stashPerStage(config, S);
  const auto lookahead = schedules::lookaheadPerStage(
      p.stage_lookahead.empty()
          ? std::vector<int>{static_cast<int>(p.lookahead)}
          : std::vector<int>(p.stage_lookahead.begin(), p.stage_lookahead.end()),
      S);
  for (int s = 0; s < S; ++s) {
    schedules::PipelineStage st;
    st.first = partition[s].first;
    st.last = partition[s].last;
    st.forwardDevice = placement.forward(s);
    st.backwardDevice = placement.backward(s);
    st.stash = stash[s];
    st.lookahead = lookahead[s];
    const auto& perStage = p.stage_optimizer_offload;
    const std::string& where = perStage.empty() ? p.optimizer_offload : perStage.at(s);
    st.optimizer = where == "host" ? schedules::OptimizerPlacement::Host
                                   : schedules::OptimizerPlacement::BackwardDevice;
    plan.stages.push_back(st);
  }

  // Capacities: devices.memory is one value for every device, or one per device.
  const int D = plan.numDevices();
  const auto& perDevice = config.devices.device_memory;
  if (!perDevice.empty() && static_cast<int>(perDevice.size()) != D)
    throw UserError(config.source + ": devices.memory: " + std::to_string(perDevice.size()) +
                    " values for " + std::to_string(D) + " devices; give one, or one per device");
  for (int d = 0; d < D; ++d) {
    const auto& cap = perDevice.empty() ? config.devices.memory : perDevice[d];
    plan.deviceCapacity.push_back(cap.value_or(schedules::kNoLimit));
  }
  plan.hostCapacity = config.devices.host_memory.value_or(schedules::kNoLimit);
  schedules::lowerPlan(plan, config.source);
  return plan;
}

}  // namespace pipefb::runtime
