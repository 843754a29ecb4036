#include "pipefb/sim/CostTable.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pipefb/common/Error.h"
#include "pipefb/common/Size.h"
#include "pipefb/common/Suggest.h"

namespace pipefb::sim {

const LinkCost& CostTable::link(int src, int dst) const {
  auto it = links.find({src, dst});
  return it == links.end() ? defaultLink : it->second;
}

const LinkCost& CostTable::hostLink(int device) const {
  auto it = hostLinks.find(device);
  return it == hostLinks.end() ? defaultHostLink : it->second;
}

SplitBackward splitBackward(double backward, double inputGrad, double weightGrad) {
  const bool haveI = inputGrad >= 0, haveW = weightGrad >= 0;
  if (haveI && haveW) return {inputGrad, weightGrad};
  if (haveI) return {inputGrad, std::max(0.0, backward - inputGrad)};
  if (haveW) return {std::max(0.0, backward - weightGrad), weightGrad};
  return {backward / 2, backward / 2};
}

double StageCosts::inputGradTime() const {
  return splitBackward(backward, inputGrad, weightGrad).input;
}
double StageCosts::weightGradTime() const {
  return splitBackward(backward, inputGrad, weightGrad).weight;
}

CostTable CostTable::uniform(int numStages) {
  CostTable t;
  t.stages.assign(numStages, StageCosts{});
  return t;
}

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& where, const std::string& why) {
  throw UserError(where + ": " + why);
}

// Seconds: a number, or a string "1.5ms", "20us", "3ns", "2s".
double readTime(const json& v, const std::string& where) {
  if (v.is_number()) {
    double x = v.get<double>();
    if (x >= 0 && std::isfinite(x)) return x;
  } else if (v.is_string()) {
    std::string s = v.get<std::string>();
    size_t used = 0;
    double x = 0;
    try {
      x = std::stod(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    std::string unit = s.substr(used);
    while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
    double mult = unit == "s" || unit.empty() ? 1
                  : unit == "ms"              ? 1e-3
                  : unit == "us"              ? 1e-6
                  : unit == "ns"              ? 1e-9
                                              : -1;
    if (used > 0 && mult > 0 && x >= 0) return x * mult;
  }
  bad(where,
      "expected a time in seconds (a number >= 0, or a string like \"1.5ms\", \"20us\"), got " +
          v.dump());
}

// Bytes: an integer, or a size string "4MiB", "1.5GB".
std::int64_t readBytes(const json& v, const std::string& where) {
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return v.get<std::int64_t>();
  if (v.is_number_float() && v.get<double>() >= 0)
    return static_cast<std::int64_t>(v.get<double>());
  if (v.is_string())
    if (auto b = parseSize(v.get<std::string>()); b && *b >= 0) return *b;
  bad(where, "expected a size in bytes (an integer, or a string like \"4MiB\"), got " + v.dump());
}

void requireObject(const json& v, const std::string& where) {
  if (!v.is_object()) bad(where, "expected an object, got " + v.dump());
}

void checkKeys(const json& obj, const std::vector<std::string>& allowed, const std::string& where) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool ok = false;
    for (const auto& a : allowed) ok |= it.key() == a;
    if (!ok)
      bad(where, "unknown key '" + it.key() + "'" + didYouMean(it.key(), allowed) +
                     "; allowed: " + joinAllowed(allowed));
  }
}

void readStage(const json& obj, StageCosts& sc, const std::string& where) {
  requireObject(obj, where);
  static const std::vector<std::string> keys = {"forward",
                                                "backward",
                                                "input_grad",
                                                "weight_grad",
                                                "recompute",
                                                "step",
                                                "allreduce",
                                                "activation_bytes",
                                                "gradient_bytes",
                                                "stash_bytes",
                                                "deferred_bytes",
                                                "checkpoint_bytes",
                                                "weight_version_bytes",
                                                "weights_bytes",
                                                "forward_weights_bytes",
                                                "grads_bytes",
                                                "optimizer_state_bytes",
                                                "working_set_bytes",
                                                "forward_working_set_bytes",
                                                "weight_working_set_bytes",
                                                "step_working_bytes"};
  checkKeys(obj, keys, where);
  auto time = [&](const char* k, double& out) {
    if (obj.contains(k)) out = readTime(obj[k], where + "." + k);
  };
  auto bytes = [&](const char* k, std::int64_t& out) {
    if (obj.contains(k)) out = readBytes(obj[k], where + "." + k);
  };
  time("forward", sc.forward);
  time("backward", sc.backward);
  time("input_grad", sc.inputGrad);
  time("weight_grad", sc.weightGrad);
  time("recompute", sc.recompute);
  time("step", sc.step);
  time("allreduce", sc.allReduce);
  bytes("activation_bytes", sc.activationBytes);
  bytes("gradient_bytes", sc.gradientBytes);
  bytes("stash_bytes", sc.stashBytes);
  bytes("deferred_bytes", sc.deferredBytes);
  bytes("checkpoint_bytes", sc.checkpointBytes);
  bytes("weight_version_bytes", sc.weightVersionBytes);
  bytes("weights_bytes", sc.weightsBytes);
  bytes("forward_weights_bytes", sc.forwardWeightsBytes);
  bytes("grads_bytes", sc.gradsBytes);
  bytes("optimizer_state_bytes", sc.optimizerStateBytes);
  bytes("working_set_bytes", sc.workingSetBytes);
  bytes("forward_working_set_bytes", sc.forwardWorkingSetBytes);
  bytes("weight_working_set_bytes", sc.weightWorkingSetBytes);
  bytes("step_working_bytes", sc.stepWorkingBytes);
}

void readLink(const json& obj, LinkCost& l, const std::string& where,
              std::vector<std::string> extraKeys = {}) {
  requireObject(obj, where);
  extraKeys.push_back("bandwidth");
  extraKeys.push_back("latency");
  checkKeys(obj, extraKeys, where);
  if (obj.contains("bandwidth"))  // bytes per second; a size string means that many per second
    l.bandwidth = static_cast<double>(readBytes(obj["bandwidth"], where + ".bandwidth"));
  if (obj.contains("latency")) l.latency = readTime(obj["latency"], where + ".latency");
}

int readDevice(const json& obj, const char* key, const std::string& where) {
  if (!obj.contains(key) || !obj[key].is_number_integer() || obj[key].get<int>() < 0)
    bad(where, std::string("needs '") + key + "', a device number >= 0");
  return obj[key].get<int>();
}

}  // namespace

CostTable CostTable::fromJson(const std::string& text, int numStages, const std::string& source) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    bad(source, std::string("not valid JSON: ") + e.what());
  }
  requireObject(root, source);
  checkKeys(root, {"stage", "stages", "link", "links", "host_link", "host_links"}, source);
  CostTable t = uniform(numStages);
  if (root.contains("stage"))
    for (int s = 0; s < numStages; ++s) readStage(root["stage"], t.stages[s], source + ": stage");
  if (root.contains("stages")) {
    const json& arr = root["stages"];
    if (!arr.is_array() || static_cast<int>(arr.size()) != numStages)
      bad(source, "'stages' must be an array of " + std::to_string(numStages) +
                      " objects (one per stage), got " +
                      (arr.is_array() ? std::to_string(arr.size()) + " entries" : arr.dump()) +
                      "; use 'stage' for costs shared by every stage");
    for (int s = 0; s < numStages; ++s)
      readStage(arr[s], t.stages[s], source + ": stages[" + std::to_string(s) + "]");
  }
  if (root.contains("link")) readLink(root["link"], t.defaultLink, source + ": link");
  if (root.contains("host_link"))
    readLink(root["host_link"], t.defaultHostLink, source + ": host_link");
  if (root.contains("links")) {
    if (!root["links"].is_array()) bad(source, "'links' must be an array");
    for (size_t j = 0; j < root["links"].size(); ++j) {
      std::string where = source + ": links[" + std::to_string(j) + "]";
      const json& e = root["links"][j];
      requireObject(e, where);
      LinkCost l = t.defaultLink;
      readLink(e, l, where, {"src", "dst"});
      t.links[{readDevice(e, "src", where), readDevice(e, "dst", where)}] = l;
    }
  }
  if (root.contains("host_links")) {
    if (!root["host_links"].is_array()) bad(source, "'host_links' must be an array");
    for (size_t j = 0; j < root["host_links"].size(); ++j) {
      std::string where = source + ": host_links[" + std::to_string(j) + "]";
      const json& e = root["host_links"][j];
      requireObject(e, where);
      LinkCost l = t.defaultHostLink;
      readLink(e, l, where, {"device"});
      t.hostLinks[readDevice(e, "device", where)] = l;
    }
  }
  return t;
}

CostTable CostTable::load(const std::string& path, int numStages) {
  std::ifstream f(path);
  if (!f) throw UserError("cannot open cost file '" + path + "' (or pass --costs uniform)");
  std::stringstream ss;
  ss << f.rdbuf();
  return fromJson(ss.str(), numStages, path);
}

}  // namespace pipefb::sim
