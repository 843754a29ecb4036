#include "pipefb/config/Config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include "pipefb/common/Error.h"
#include "pipefb/common/Precision.h"
#include "pipefb/common/Size.h"
#include "pipefb/common/Suggest.h"
#include "pipefb/schedules/Placement.h"
#include "pipefb/schedules/ScheduleKind.h"
#include "pipefb/schedules/StashPolicy.h"

namespace pipefb::config {

const std::vector<std::string>& scheduleNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v = {"none"};  // one device, no pipeline
    for (const auto& n : schedules::scheduleKindNames()) v.push_back(n);
    return v;
  }();
  return names;
}

const std::vector<std::string>& stashPolicyNames() {
  static const std::vector<std::string> names = schedules::stashPolicyNames();
  return names;
}

namespace {

/// A list key with one value per stage (or device): `n` values where `want` are needed is
/// a UserError "<source>: <key>: n values for want <things>; give one, or one per <one>".
void checkOnePer(const std::string& source, const std::string& key, std::size_t n,
                 std::int64_t want, const std::string& things, const std::string& one) {
  if (static_cast<std::int64_t>(n) == want) return;
  throw UserError(source + ": " + key + ": " + std::to_string(n) + " values for " +
                  std::to_string(want) + " " + things + "; give one, or one per " + one);
}

}  // namespace

std::vector<schedules::StashPolicy> stashPerStage(const Config& config, int stages) {
  const auto& p = config.pipeline;
  if (p.stage_stash.empty())
    return std::vector<schedules::StashPolicy>(stages, schedules::parseStashPolicy(p.stash));
  checkOnePer(config.source, "pipeline.stash", p.stage_stash.size(), stages, "stages", "stage");
  std::vector<schedules::StashPolicy> out;
  for (const auto& v : p.stage_stash) out.push_back(schedules::parseStashPolicy(v));
  return out;
}

namespace {

const std::vector<std::string> kSections = {"model",    "data",        "training", "devices",
                                            "pipeline", "distributed", "output"};

/// Where a value came from, for error messages: "configs/x.yaml:12" or
/// "--set training.lr=abc".
struct Where {
  std::string text;
};

Where whereOf(const std::string& source, const YAML::Node& node) {
  YAML::Mark m = node.Mark();
  if (m.is_null()) return {source};
  return {source + ":" + std::to_string(m.line + 1)};
}

[[noreturn]] void fail(const Where& where, const std::string& key, const std::string& what) {
  throw UserError(where.text + ": " + key + ": " + what);
}

std::string shown(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return node.size() == 0 ? "an empty list" : "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
}

[[noreturn]] void expected(const Where& where, const std::string& key, const std::string& allowed,
                           const YAML::Node& node) {
  fail(where, key, "expected " + allowed + ", got " + shown(node));
}

// A key of the schema: how to read it into a Config and how to write it out.
struct KeySpec {
  std::string key;  // "section.key"
  std::function<void(Config&, const YAML::Node&, const Where&)> set;
  std::function<void(const Config&, YAML::Emitter&)> emit;
};

template <class T>
using Field = std::function<T&(Config&)>;

template <class T>
T& ref(const Field<T>& f, const Config& c) {
  return f(const_cast<Config&>(c));
}

std::string numText(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

KeySpec integer(std::string key, Field<int64_t> f, int64_t lo,
                int64_t hi = std::numeric_limits<int64_t>::max()) {
  std::string allowed = "an integer >= " + std::to_string(lo);
  if (hi != std::numeric_limits<int64_t>::max())
    allowed = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return {key,
          [=](Config& c, const YAML::Node& n, const Where& w) {
            int64_t v = 0;
            if (!n.IsScalar()) expected(w, key, allowed, n);
            try {
              v = n.as<int64_t>();
            } catch (const YAML::Exception&) {
              expected(w, key, allowed, n);
            }
            if (v < lo || v > hi) expected(w, key, allowed, n);
            f(c) = v;
          },
          [=](const Config& c, YAML::Emitter& e) { e << ref(f, c); }};
}

KeySpec unsignedInt(std::string key, Field<uint64_t> f) {
  std::string allowed = "a non-negative integer";
  return {key,
          [=](Config& c, const YAML::Node& n, const Where& w) {
            if (!n.IsScalar() || (!n.Scalar().empty() && n.Scalar()[0] == '-'))
              expected(w, key, allowed, n);
            try {
              f(c) = n.as<uint64_t>();
            } catch (const YAML::Exception&) {
              expected(w, key, allowed, n);
            }
          },
          [=](const Config& c, YAML::Emitter& e) { e << ref(f, c); }};
}

KeySpec number(std::string key, Field<double> f, double lo, double hi, bool loOpen = false) {
  std::string allowed = "a number in " + std::string(loOpen ? "(" : "[") + numText(lo) + ", " +
                        (std::isinf(hi) ? "inf)" : numText(hi) + "]");
  return {key,
          [=](Config& c, const YAML::Node& n, const Where& w) {
            double v = 0;
            if (!n.IsScalar()) expected(w, key, allowed, n);
            try {
              v = n.as<double>();
            } catch (const YAML::Exception&) {
              expected(w, key, allowed, n);
            }
            if (!std::isfinite(v) || v < lo || v > hi || (loOpen && v == lo))
              expected(w, key, allowed, n);
            f(c) = v;
          },
          [=](const Config& c, YAML::Emitter& e) { e << ref(f, c); }};
}

KeySpec boolean(std::string key, Field<bool> f) {
  return {key,
          [=](Config& c, const YAML::Node& n, const Where& w) {
            if (!n.IsScalar()) expected(w, key, "true | false", n);
            try {
              f(c) = n.as<bool>();
            } catch (const YAML::Exception&) {
              expected(w, key, "true | false", n);
            }
          },
          [=](const Config& c, YAML::Emitter& e) { e << ref(f, c); }};
}

KeySpec text(std::string key, Field<std::string> f) {
  return {key,
          [=](Config& c, const YAML::Node& n, const Where& w) {
            if (!n.IsScalar()) expected(w, key, "a string", n);
            f(c) = n.Scalar();
          },
          [=](const Config& c, YAML::Emitter& e) { e << YAML::DoubleQuoted << ref(f, c); }};
}

KeySpec choice(std::string key, Field<std::string> f, std::vector<std::string> names) {
  return {key,
          [=](Config& c, const YAML::Node& n, const Where& w) {
            if (!n.IsScalar()) expected(w, key, joinAllowed(names), n);
            const std::string& v = n.Scalar();
            for (const auto& name : names)
              if (v == name) {
                f(c) = v;
                return;
              }
            fail(w, key,
                 "unknown value '" + v + "'" + didYouMean(v, names) +
                     "; allowed: " + joinAllowed(names));
          },
          [=](const Config& c, YAML::Emitter& e) { e << ref(f, c); }};
}

std::string sizeText(int64_t bytes) {
  const std::pair<int64_t, const char*> units[] = {
      {1LL << 40, "TiB"}, {1LL << 30, "GiB"}, {1LL << 20, "MiB"}, {1LL << 10, "KiB"}};
  for (auto [mult, name] : units)
    if (bytes >= mult && bytes % mult == 0) return std::to_string(bytes / mult) + name;
  return std::to_string(bytes);
}

const char* const kSizeAllowed = "a size such as 512MiB or 2GiB (> 0), or unlimited";

std::optional<int64_t> sizeValue(const std::string& key, const std::string& allowed,
                                 const YAML::Node& n, const Where& w) {
  if (!n.IsScalar()) expected(w, key, allowed, n);
  if (n.Scalar() == "unlimited" || n.Scalar() == "null" || n.Scalar() == "~") return std::nullopt;
  auto v = parseSize(n.Scalar());
  if (!v || *v <= 0) expected(w, key, allowed, n);
  return *v;
}

std::string sizeOrUnlimited(const std::optional<int64_t>& v) {
  return v ? sizeText(*v) : std::string("unlimited");
}

KeySpec size(std::string key, Field<std::optional<int64_t>> f) {
  return {key,
          [=](Config& c, const YAML::Node& n, const Where& w) {
            f(c) = sizeValue(key, kSizeAllowed, n, w);
          },
          [=](const Config& c, YAML::Emitter& e) { e << sizeOrUnlimited(ref(f, c)); }};
}

// devices.memory: one size, or a list with one per device (Note [The plan is the
// program]); `memory` is then the smallest (unlimited counts as the largest).
KeySpec deviceMemoryKey() {
  const std::string key = "devices.memory";
  const std::string allowed = std::string(kSizeAllowed) + ", or a list of them (one per device)";
  return {key,
          [=](Config& c, const YAML::Node& n, const Where& w) {
            c.devices.device_memory.clear();
            if (!n.IsSequence()) {
              c.devices.memory = sizeValue(key, allowed, n, w);
              return;
            }
            if (n.size() == 0) expected(w, key, allowed, n);
            c.devices.memory = std::nullopt;
            for (const auto& item : n) {
              const auto v = sizeValue(key, allowed, item, w);
              c.devices.device_memory.push_back(v);
              if (v && (!c.devices.memory || *v < *c.devices.memory)) c.devices.memory = v;
            }
          },
          [](const Config& c, YAML::Emitter& e) {
            if (c.devices.device_memory.empty()) {
              e << sizeOrUnlimited(c.devices.memory);
              return;
            }
            e << YAML::Flow << YAML::BeginSeq;
            for (const auto& v : c.devices.device_memory) e << sizeOrUnlimited(v);
            e << YAML::EndSeq;
          }};
}

KeySpec intList(std::string key, Field<std::vector<int64_t>> f, int64_t lo) {
  std::string allowed = "a list of integers >= " + std::to_string(lo);
  return {key,
          [=](Config& c, const YAML::Node& n, const Where& w) {
            std::vector<int64_t> out;
            if (n.IsNull()) {
              f(c) = out;
              return;
            }
            if (!n.IsSequence()) expected(w, key, allowed, n);
            for (const auto& item : n) {
              if (!item.IsScalar()) expected(w, key, allowed, item);
              try {
                out.push_back(item.as<int64_t>());
              } catch (const YAML::Exception&) {
                expected(w, key, allowed, item);
              }
              if (out.back() < lo) expected(w, key, allowed, item);
            }
            f(c) = out;
          },
          [=](const Config& c, YAML::Emitter& e) {
            e << YAML::Flow << YAML::BeginSeq;
            for (auto v : ref(f, c)) e << v;
            e << YAML::EndSeq;
          }};
}

// pipeline.lookahead: one integer, or a list with one per stage.
KeySpec lookaheadKey() {
  const std::string key = "pipeline.lookahead";
  const std::string allowed = "an integer in [0, 1024], or a list of them (one per stage)";
  return {key,
          [=](Config& c, const YAML::Node& n, const Where& w) {
            auto one = [&](const YAML::Node& item) {
              int64_t v = -1;
              if (!item.IsScalar()) expected(w, key, allowed, item);
              try {
                v = item.as<int64_t>();
              } catch (const YAML::Exception&) {
                expected(w, key, allowed, item);
              }
              if (v < 0 || v > 1024) expected(w, key, allowed, item);
              return v;
            };
            c.pipeline.stage_lookahead.clear();
            if (n.IsSequence()) {
              if (n.size() == 0) expected(w, key, allowed, n);
              for (const auto& item : n) c.pipeline.stage_lookahead.push_back(one(item));
              c.pipeline.lookahead = *std::max_element(c.pipeline.stage_lookahead.begin(),
                                                       c.pipeline.stage_lookahead.end());
            } else {
              c.pipeline.lookahead = one(n);
            }
          },
          [](const Config& c, YAML::Emitter& e) {
            if (c.pipeline.stage_lookahead.empty()) {
              e << c.pipeline.lookahead;
              return;
            }
            e << YAML::Flow << YAML::BeginSeq;
            for (auto v : c.pipeline.stage_lookahead) e << v;
            e << YAML::EndSeq;
          }};
}

// A per-stage choice: one of `names`, or a non-empty list of them with one per stage.
// `list` holds the list (empty for one value); `summary` gets the value the list stands
// for where one value is read (summarise(list)), or the one value itself.
KeySpec choiceOrListKey(const std::string& key, const std::vector<std::string>& names,
                        std::string PipelineOptions::*summary,
                        std::vector<std::string> PipelineOptions::*list,
                        std::string (*summarise)(const std::vector<std::string>&)) {
  const std::string allowed = joinAllowed(names) + ", or a list of them (one per stage)";
  return {key,
          [=](Config& c, const YAML::Node& n, const Where& w) {
            auto one = [&](const YAML::Node& item) {
              if (!item.IsScalar()) expected(w, key, allowed, item);
              const std::string& v = item.Scalar();
              if (std::find(names.begin(), names.end(), v) == names.end())
                fail(w, key,
                     "unknown value '" + v + "'" + didYouMean(v, names) + "; allowed: " + allowed);
              return v;
            };
            auto& values = c.pipeline.*list;
            values.clear();
            if (!n.IsSequence()) {
              c.pipeline.*summary = one(n);
              return;
            }
            if (n.size() == 0) expected(w, key, allowed, n);
            for (const auto& item : n) values.push_back(one(item));
            c.pipeline.*summary = summarise(values);
          },
          [=](const Config& c, YAML::Emitter& e) {
            const auto& values = c.pipeline.*list;
            if (values.empty()) {
              e << c.pipeline.*summary;
              return;
            }
            e << YAML::Flow << YAML::BeginSeq;
            for (const auto& v : values) e << v;
            e << YAML::EndSeq;
          }};
}

// pipeline.stash: a policy, or a list with one per stage (`stash` is then the first).
KeySpec stashKey() {
  return choiceOrListKey("pipeline.stash", stashPolicyNames(), &PipelineOptions::stash,
                         &PipelineOptions::stage_stash,
                         [](const std::vector<std::string>& v) { return v.front(); });
}

// pipeline.optimizer_offload: none | host, or a list with one per stage (`optimizer_offload`
// is then host when any stage's is).
KeySpec optimizerOffloadKey() {
  return choiceOrListKey(
      "pipeline.optimizer_offload", {"none", "host"}, &PipelineOptions::optimizer_offload,
      &PipelineOptions::stage_optimizer_offload, [](const std::vector<std::string>& v) {
        return std::string(std::find(v.begin(), v.end(), "host") != v.end() ? "host" : "none");
      });
}

// output.trace_steps: [warm-up steps skipped, steps traced], e.g. [10, 20].
KeySpec traceStepsKey() {
  const std::string key = "output.trace_steps";
  const std::string allowed =
      "[skip, steps]: the warm-up steps skipped, then the steps traced (integers >= 0), e.g. "
      "[10, 20]";
  return {key,
          [=](Config& c, const YAML::Node& n, const Where& w) {
            if (!n.IsSequence() || n.size() != 2) expected(w, key, allowed, n);
            int64_t v[2] = {0, 0};
            for (size_t i = 0; i < 2; ++i) {
              if (!n[i].IsScalar()) expected(w, key, allowed, n[i]);
              try {
                v[i] = n[i].as<int64_t>();
              } catch (const YAML::Exception&) {
                expected(w, key, allowed, n[i]);
              }
              if (v[i] < 0) expected(w, key, allowed, n[i]);
            }
            c.output.trace_skip = v[0];
            c.output.trace_steps = v[1];
          },
          [](const Config& c, YAML::Emitter& e) {
            e << YAML::Flow << YAML::BeginSeq << c.output.trace_skip << c.output.trace_steps
              << YAML::EndSeq;
          }};
}

const double kInf = std::numeric_limits<double>::infinity();

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> specs = [] {
    std::vector<KeySpec> s;
    // model
    s.push_back(choice(
        "model.name", [](Config & c) -> auto& { return c.model.name; }, model::modelNames()));
    s.push_back(number(
        "model.width", [](Config & c) -> auto& { return c.model.width; }, 0, 16, true));
    s.push_back(integer(
        "model.input_size", [](Config & c) -> auto& { return c.model.input_size; }, 1, 4096));
    s.push_back(integer(
        "model.channels", [](Config & c) -> auto& { return c.model.channels; }, 1, 4096));
    s.push_back(integer(
        "model.num_classes", [](Config & c) -> auto& { return c.model.num_classes; }, 2, 1 << 24));
    s.push_back(choice(
        "model.size", [](Config & c) -> auto& { return c.model.size; }, model::gpt2Sizes()));
    s.push_back(intList(
        "model.hidden", [](Config & c) -> auto& { return c.model.hidden; }, 1));
    s.push_back(number(
        "model.dropout", [](Config & c) -> auto& { return c.model.dropout; }, 0, 0.99));
    s.push_back(boolean(
        "model.batch_norm", [](Config & c) -> auto& { return c.model.batch_norm; }));
    s.push_back(integer(
        "model.loss_chunk", [](Config & c) -> auto& { return c.model.loss_chunk; }, 0, 1 << 30));
    s.push_back(text(
        "model.path", [](Config & c) -> auto& { return c.model.path; }));
    s.push_back(intList(
        "model.sample_shape", [](Config & c) -> auto& { return c.model.sample_shape; }, 1));
    s.push_back(choice("model.input_dtype", [](Config & c) -> auto& { return c.model.input_dtype; },
                       {"float32", "float64", "int64"}));
    // data
    s.push_back(choice(
        "data.name", [](Config & c) -> auto& { return c.data.name; }, data::dataNames()));
    s.push_back(text(
        "data.path", [](Config & c) -> auto& { return c.data.path; }));
    s.push_back(text(
        "data.test_path", [](Config & c) -> auto& { return c.data.test_path; }));
    s.push_back(integer(
        "data.synthetic_train", [](Config & c) -> auto& { return c.data.synthetic_train; }, 1));
    s.push_back(integer(
        "data.synthetic_test", [](Config & c) -> auto& { return c.data.synthetic_test; }, 1));
    s.push_back(integer(
        "data.limit_train", [](Config & c) -> auto& { return c.data.limit_train; }, 0));
    s.push_back(integer(
        "data.limit_test", [](Config & c) -> auto& { return c.data.limit_test; }, 0));
    s.push_back(boolean(
        "data.normalize", [](Config & c) -> auto& { return c.data.normalize; }));
    s.push_back(boolean(
        "data.shuffle", [](Config & c) -> auto& { return c.data.shuffle; }));
    // training
    s.push_back(choice("training.optimizer",
                       [](Config & c) -> auto& { return c.training.optimizer; }, {"sgd", "adam"}));
    s.push_back(choice("training.precision",
                       [](Config & c) -> auto& { return c.training.precision; },
                       {"fp32", "bf16", "fp16"}));
    s.push_back(number(
        "training.loss_scale", [](Config & c) -> auto& { return c.training.loss_scale; }, 1, 1e30));
    s.push_back(integer(
        "training.loss_scale_window",
        [](Config & c) -> auto& { return c.training.loss_scale_window; }, 1));
    s.push_back(number(
        "training.lr", [](Config & c) -> auto& { return c.training.lr; }, 0, 10, true));
    s.push_back(number(
        "training.momentum", [](Config & c) -> auto& { return c.training.momentum; }, 0, 0.9999));
    s.push_back(number(
        "training.weight_decay", [](Config & c) -> auto& { return c.training.weight_decay; }, 0,
        1));
    s.push_back(number(
        "training.beta1", [](Config & c) -> auto& { return c.training.beta1; }, 0, 0.9999));
    s.push_back(number(
        "training.beta2", [](Config & c) -> auto& { return c.training.beta2; }, 0, 0.99999));
    s.push_back(choice("training.lr_schedule",
                       [](Config & c) -> auto& { return c.training.lr_schedule; },
                       {"constant", "cosine", "step"}));
    s.push_back(integer(
        "training.warmup_steps", [](Config & c) -> auto& { return c.training.warmup_steps; }, 0));
    s.push_back(integer(
        "training.step_every", [](Config & c) -> auto& { return c.training.step_every; }, 1));
    s.push_back(number(
        "training.step_gamma", [](Config & c) -> auto& { return c.training.step_gamma; }, 0, 1,
        true));
    s.push_back(number(
        "training.min_lr_ratio", [](Config & c) -> auto& { return c.training.min_lr_ratio; }, 0,
        1));
    s.push_back(integer(
        "training.batch", [](Config & c) -> auto& { return c.training.batch; }, 1, 1 << 20));
    s.push_back(integer(
        "training.epochs", [](Config & c) -> auto& { return c.training.epochs; }, 1, 100000));
    s.push_back(integer(
        "training.iterations", [](Config & c) -> auto& { return c.training.iterations; }, 0));
    s.push_back(unsignedInt(
        "training.seed", [](Config & c) -> auto& { return c.training.seed; }));
    s.push_back(integer(
        "training.log_every", [](Config & c) -> auto& { return c.training.log_every; }, 1));
    s.push_back(integer(
        "training.eval_batch", [](Config & c) -> auto& { return c.training.eval_batch; }, 1));
    s.push_back(boolean(
        "training.eval", [](Config & c) -> auto& { return c.training.eval; }));
    s.push_back(integer(
        "training.threads", [](Config & c) -> auto& { return c.training.threads; }, 0, 1024));
    s.push_back(boolean(
        "training.checkpoint", [](Config & c) -> auto& { return c.training.checkpoint; }));
    s.push_back(integer(
        "training.checkpoint_every",
        [](Config & c) -> auto& { return c.training.checkpoint_every; }, 0));
    s.push_back(integer(
        "training.keep_checkpoints",
        [](Config & c) -> auto& { return c.training.keep_checkpoints; }, 1, 1000));
    s.push_back(boolean(
        "training.deterministic", [](Config & c) -> auto& { return c.training.deterministic; }));
    s.push_back(choice("training.check_numerics",
                       [](Config & c) -> auto& { return c.training.check_numerics; },
                       {"off", "loss", "all"}));
    // devices
    s.push_back(integer(
        "devices.count", [](Config & c) -> auto& { return c.devices.count; }, 1, 4096));
    s.push_back(choice("devices.kind", [](Config & c) -> auto& { return c.devices.kind; },
                       {"cpu", "cuda"}));
    s.push_back(deviceMemoryKey());
    s.push_back(size(
        "devices.host_memory", [](Config & c) -> auto& { return c.devices.host_memory; }));
    s.push_back(choice("devices.bind", [](Config & c) -> auto& { return c.devices.bind; },
                       {"none", "cores"}));
    s.push_back(boolean(
        "devices.keep_freed_memory",
        [](Config & c) -> auto& { return c.devices.keep_freed_memory; }));
    // pipeline
    s.push_back(choice(
        "pipeline.schedule", [](Config & c) -> auto& { return c.pipeline.schedule; },
        scheduleNames()));
    s.push_back(integer(
        "pipeline.stages", [](Config & c) -> auto& { return c.pipeline.stages; }, 0, 4096));
    s.push_back(intList(
        "pipeline.partition", [](Config & c) -> auto& { return c.pipeline.partition; }, 1));
    s.push_back(choice("pipeline.partition_by",
                       [](Config & c) -> auto& { return c.pipeline.partition_by; },
                       {"planner", "params"}));
    s.push_back(integer(
        "pipeline.microbatches", [](Config & c) -> auto& { return c.pipeline.microbatches; }, 1,
        1 << 16));
    s.push_back(stashKey());
    s.push_back(lookaheadKey());
    s.push_back(text(
        "pipeline.placement", [](Config & c) -> auto& { return c.pipeline.placement; }));
    s.push_back(integer(
        "pipeline.virtual_stages", [](Config & c) -> auto& { return c.pipeline.virtual_stages; }, 0,
        4096));
    s.push_back(integer(
        "pipeline.async_lag", [](Config & c) -> auto& { return c.pipeline.async_lag; }, -1,
        1 << 16));
    s.push_back(choice("pipeline.weight_prediction",
                       [](Config & c) -> auto& { return c.pipeline.weight_prediction; },
                       {"auto", "none", "linear"}));
    s.push_back(choice("pipeline.offload_weights",
                       [](Config & c) -> auto& { return c.pipeline.offload_weights; },
                       {"auto", "none"}));
    s.push_back(number(
        "pipeline.stall_timeout", [](Config & c) -> auto& { return c.pipeline.stall_timeout; }, 0,
        86400, true));
    s.push_back(integer(
        "pipeline.replicas", [](Config & c) -> auto& { return c.pipeline.replicas; }, 1, 1024));
    s.push_back(optimizerOffloadKey());
    // distributed
    s.push_back(number(
        "distributed.timeout", [](Config & c) -> auto& { return c.distributed.timeout; }, 0, 86400,
        true));
    s.push_back(number(
        "distributed.bucket_mb", [](Config & c) -> auto& { return c.distributed.bucket_mb; }, 0,
        65536, true));
    s.push_back(boolean(
        "distributed.overlap", [](Config & c) -> auto& { return c.distributed.overlap; }));
    // output
    s.push_back(text(
        "output.dir", [](Config & c) -> auto& { return c.output.dir; }));
    s.push_back(boolean(
        "output.progress", [](Config & c) -> auto& { return c.output.progress; }));
    s.push_back(traceStepsKey());
    return s;
  }();
  return specs;
}

const KeySpec* findSpec(const std::string& key) {
  for (const auto& s : schema())
    if (s.key == key) return &s;
  return nullptr;
}

std::vector<std::string> keysOf(const std::string& section) {
  std::vector<std::string> out;
  for (const auto& s : schema())
    if (s.key.compare(0, section.size() + 1, section + ".") == 0)
      out.push_back(s.key.substr(section.size() + 1));
  return out;
}

/// A mapping key as text. YAML allows any node as a key ("? [a, b]: 1", "? {a: 1}: 2");
/// the config only has names, so anything but a scalar is a UserError, not a bad_conversion
/// escaping the parser (found by fuzz/ConfigFuzzer; ConfigTest.NonScalarKeyIsAUserError).
std::string keyName(const std::string& source, const YAML::Node& key, const std::string& what) {
  if (!key.IsScalar())
    throw UserError(whereOf(source, key).text + ": a " + what + " name must be plain text, got " +
                    shown(key));
  return key.Scalar();
}

void applyDocument(Config& config, const YAML::Node& root, const std::string& source) {
  if (root.IsNull()) return;
  if (!root.IsMap())
    throw UserError(whereOf(source, root).text + ": the config must be a mapping with sections " +
                    joinAllowed(kSections));
  // yaml-cpp keeps every pair of a mapping, duplicates included (a lookup finds the
  // first, iteration applies both, so the later one would silently win): refuse a
  // repeated section or key, naming both lines from the nodes' marks.
  std::map<std::string, YAML::Mark> seen;
  auto once = [&](const std::string& what, const std::string& name, const YAML::Node& key) {
    auto [it, fresh] = seen.emplace(name, key.Mark());
    if (fresh) return;
    throw UserError(whereOf(source, key).text + ": duplicate " + what + " '" + name +
                    "' (first at line " + std::to_string(it->second.line + 1) +
                    "); give it once, as YAML keeps only one of them");
  };
  for (const auto& sec : root) {
    const std::string section = keyName(source, sec.first, "section");
    Where secWhere = whereOf(source, sec.first);
    once("section", section, sec.first);
    bool known = false;
    for (const auto& k : kSections) known = known || k == section;
    if (!known)
      throw UserError(secWhere.text + ": unknown section '" + section + "'" +
                      didYouMean(section, kSections) + "; allowed: " + joinAllowed(kSections));
    if (sec.second.IsNull()) continue;
    if (!sec.second.IsMap())
      throw UserError(secWhere.text + ": " + section + ": expected a mapping of keys, got " +
                      shown(sec.second));
    for (const auto& kv : sec.second) {
      const std::string key = keyName(source, kv.first, section + " key");
      once("key", section + "." + key, kv.first);
      const KeySpec* spec = findSpec(section + "." + key);
      if (!spec) {
        auto keys = keysOf(section);
        throw UserError(whereOf(source, kv.first).text + ": unknown key '" + section + "." + key +
                        "'" + didYouMean(key, keys) + "; allowed in " + section + ": " +
                        joinAllowed(keys));
      }
      spec->set(config, kv.second, whereOf(source, kv.second));
    }
  }
}

}  // namespace

void applyOverride(Config& config, const std::string& assignment) {
  const std::string where = "--set " + assignment;
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UserError(where + ": expected section.key=value, e.g. --set training.lr=0.1");
  std::string key = assignment.substr(0, eq);
  std::string value = assignment.substr(eq + 1);
  const KeySpec* spec = findSpec(key);
  if (!spec) throw UserError(where + ": unknown key '" + key + "'" + didYouMean(key, knownKeys()));
  YAML::Node node;
  try {
    node = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    throw UserError(where + ": " + key + ": value is not valid YAML (" + e.msg + ")");
  }
  spec->set(config, node, Where{where});
}

int virtualStages(const Config& c) {
  const auto& p = c.pipeline;
  const auto kind = schedules::parseScheduleKind(p.schedule);
  const bool looped = schedules::info(kind).placement == schedules::DefaultPlacement::Looped;
  if (p.virtual_stages == 0) return schedules::Placement::kDefaultVirtualStages;
  if (!looped)
    throw UserError(
        c.source + ": pipeline.virtual_stages: " + std::to_string(p.virtual_stages) +
        " applies to interleaved-1f1b and interleaved-zb only (several stages per device), not " +
        p.schedule + "; allowed here: 0 (or remove the key)");
  if (p.virtual_stages < 2)
    throw UserError(c.source + ": pipeline.virtual_stages: " + std::to_string(p.virtual_stages) +
                    " stage per device; " + p.schedule + " needs >= 2 (use " +
                    (p.schedule == "interleaved-zb" ? "zb-h1" : "1f1b") + " for one)");
  return static_cast<int>(p.virtual_stages);
}

int pipelineStages(const Config& c) {
  const std::string& src = c.source;
  const auto& p = c.pipeline;
  const auto kind = schedules::parseScheduleKind(p.schedule);
  const int v = virtualStages(c);
  int64_t S = p.stages;
  if (!p.partition.empty()) {
    const int64_t fromCuts = static_cast<int64_t>(p.partition.size()) + 1;
    if (S > 0 && S != fromCuts)
      throw UserError(src + ": pipeline.stages: " + std::to_string(S) +
                      " disagrees with pipeline.partition (" + std::to_string(fromCuts - 1) +
                      " cut points make " + std::to_string(fromCuts) +
                      " stages); drop one of them or make them agree");
    S = fromCuts;
  }
  const int64_t count = c.devices.count;
  if (!p.placement.empty()) {  // it says its stages and its devices
    const auto placement = schedules::Placement::parse(p.placement, src + ": pipeline.placement");
    if (S > 0 && S != placement.numStages())
      throw UserError(src + ": pipeline.placement: " + std::to_string(placement.numStages()) +
                      " entries for " + std::to_string(S) +
                      " stages; give one <forward>/<backward> per stage");
    if (count != placement.numDevices())
      throw UserError(src + ": devices.count: " + std::to_string(count) +
                      " but pipeline.placement " + placement.toString() + " uses " +
                      std::to_string(placement.numDevices()) +
                      " devices; set devices.count: " + std::to_string(placement.numDevices()));
    placement.checkFor(p.schedule, static_cast<int>(count), src + ": pipeline.placement");
    return placement.numStages();
  }
  // Note [Stages per device] (schedules/Placement.h): the default placement's ratio.
  const auto ratio = schedules::Placement::stagesPerDevice(kind, v);
  if (S == 0) {
    S = schedules::Placement::stagesOn(kind, static_cast<int>(count), v);
    if (S == 0)
      throw UserError(src + ": devices.count: " + std::to_string(count) + " is odd, but " +
                      p.schedule +
                      " runs the forward and the backward of a stage on different devices "
                      "(2 devices per stage); use an even count or set pipeline.stages");
    return static_cast<int>(S);
  }
  const int64_t need = schedules::Placement::devicesFor(kind, static_cast<int>(S), v);
  if (need == 0)  // looped: S not a multiple of v; vShape: S odd
    throw UserError(src + ": " +
                    (p.virtual_stages > 0 ? "pipeline.virtual_stages" : "pipeline.stages") + ": " +
                    std::to_string(S) + " stages of " + p.schedule + " do not split into " +
                    std::to_string(ratio.stages) + " stages per device; give a multiple of " +
                    std::to_string(ratio.stages) + " stages");
  if (count != need)
    throw UserError(
        src + ": devices.count: " + std::to_string(count) + " but " + p.schedule + " with " +
        std::to_string(S) + " stages needs " + std::to_string(need) + " devices" +
        (ratio.devices > 1  ? " (F and B of each stage on their own device)"
         : ratio.stages > 1 ? " (" + std::to_string(ratio.stages) + " stages per device)"
                            : std::string()) +
        "; set devices.count: " + std::to_string(need));
  return static_cast<int>(S);
}

void validate(const Config& c, ConfigUse use) {
  const std::string& src = c.source;
  // The pipeline's shape rules hold for the trainer only (ConfigUse).
  const bool train = use == ConfigUse::Train;
  if (c.training.batch % c.pipeline.microbatches != 0)
    throw UserError(src + ": pipeline.microbatches: " + std::to_string(c.pipeline.microbatches) +
                    " does not divide training.batch " + std::to_string(c.training.batch) +
                    "; please choose a divisor of the batch");
  const config::TrainingOptions defaults;
  if (c.training.precision != "fp16" &&
      (c.training.loss_scale != defaults.loss_scale ||
       c.training.loss_scale_window != defaults.loss_scale_window))
    throw UserError(src +
                    ": training.loss_scale: loss scaling is for training.precision fp16, got " +
                    c.training.precision + "; set training.precision: fp16, or leave it out");
  const bool tokens = model::isTokenModel(c.model);
  if (tokens && c.data.name != "synthetic" && c.data.name != "tokens" && c.data.name != "tensors")
    throw UserError(src + ": data.name: model " + c.model.name +
                    " takes tokens; allowed with it: synthetic, tokens, tensors");
  if (!tokens && c.data.name == "tokens")
    throw UserError(src + ": data.name: tokens feeds a token model; allowed with " + c.model.name +
                    ": fashion-mnist, cifar10, synthetic, tensors");
  if ((c.data.name == "tensors" || c.data.name == "tokens") && c.data.path.empty())
    throw UserError(src + ": data.path: data.name " + c.data.name +
                    " needs the training file; set data.path");
  if ((c.data.name == "tensors" || c.data.name == "tokens") && c.data.test_path.empty() &&
      c.training.eval)
    throw UserError(src + ": data.test_path: data.name " + c.data.name +
                    " evaluates on a test file; set data.test_path, or training.eval: false");
  if (!tokens && c.model.num_classes > 1000000)
    throw UserError(src + ": model.num_classes: " + std::to_string(c.model.num_classes) +
                    " is too many for a classifier; allowed: 2..1000000");
  if (train && c.pipeline.schedule == "none" && c.devices.count != 1)
    throw UserError(src + ": devices.count: pipeline.schedule none trains on one device, got " +
                    std::to_string(c.devices.count) +
                    "; set devices.count: 1 or choose a pipeline schedule");
  if (train && c.pipeline.weight_prediction == "linear" && c.pipeline.schedule != "pipefb-async")
    throw UserError(src + ": pipeline.weight_prediction: " + c.pipeline.weight_prediction +
                    " needs pipeline.schedule=pipefb-async (got " + c.pipeline.schedule +
                    "); allowed here: auto, none");
  if (train && c.pipeline.optimizer_offload != "none" && c.pipeline.schedule == "none")
    throw UserError(src + ": pipeline.optimizer_offload: " + c.pipeline.optimizer_offload +
                    " needs a pipeline schedule (the host pool belongs to the pipeline "
                    "runtime); set pipeline.optimizer_offload: none, or choose a schedule");
  if (train && c.pipeline.schedule != "none") {
    // Note [Loss scaling] (train/LossScaler.h); the engine checks it again for plans.
    const std::string fp16 =
        c.training.precision != "fp16"
            ? ""
            : fp16Refusal(src,
                          schedules::isAsync(schedules::parseScheduleKind(c.pipeline.schedule)),
                          c.pipeline.schedule);
    if (!fp16.empty()) throw UserError(fp16);
    const int64_t stages = pipelineStages(c);
    if (c.pipeline.async_lag > c.pipeline.microbatches)
      throw UserError(
          src + ": pipeline.async_lag: " + std::to_string(c.pipeline.async_lag) +
          " is more than pipeline.microbatches (" + std::to_string(c.pipeline.microbatches) +
          "); allowed: -1 (a whole iteration) or 0.." + std::to_string(c.pipeline.microbatches));
    if (!c.pipeline.stage_optimizer_offload.empty())
      checkOnePer(src, "pipeline.optimizer_offload", c.pipeline.stage_optimizer_offload.size(),
                  stages, "stages", "stage");
    if (!c.pipeline.stage_stash.empty())
      checkOnePer(src, "pipeline.stash", c.pipeline.stage_stash.size(), stages, "stages", "stage");
    if (!c.devices.device_memory.empty())
      checkOnePer(src, "devices.memory", c.devices.device_memory.size(), c.devices.count,
                  "devices (devices.count)", "device");
    if (!c.pipeline.stage_lookahead.empty())
      checkOnePer(src, "pipeline.lookahead", c.pipeline.stage_lookahead.size(), stages, "stages",
                  "stage");
  }
  for (size_t i = 1; i < c.pipeline.partition.size(); ++i)
    if (c.pipeline.partition[i] <= c.pipeline.partition[i - 1])
      throw UserError(src + ": pipeline.partition: cut points must be strictly increasing, got " +
                      std::to_string(c.pipeline.partition[i - 1]) + " then " +
                      std::to_string(c.pipeline.partition[i]));
  if (c.output.dir.empty())
    throw UserError(src + ": output.dir: must not be empty; give a run folder such as runs/vgg16");
}

Config parseConfig(const std::string& yamlText, const std::vector<std::string>& overrides,
                   const std::string& source, ConfigUse use) {
  Config config;
  config.source = source;
  YAML::Node root;
  try {
    root = YAML::Load(yamlText);
  } catch (const YAML::ParserException& e) {
    throw UserError(source + ":" + std::to_string(e.mark.line + 1) + ": malformed YAML: " + e.msg);
  }
  applyDocument(config, root, source);
  for (const auto& o : overrides) applyOverride(config, o);
  validate(config, use);
  return config;
}

Config loadConfig(const std::string& path, const std::vector<std::string>& overrides,
                  ConfigUse use) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UserError(path + ": is a directory; --config takes a YAML file such as " +
                    "configs/vgg16.yaml");
  std::ifstream in(path);
  if (!in) throw UserError(path + ": cannot open config file (does it exist?)");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // An empty file (or one of comments only) would train every default, a full-width
  // VGG16 at 224 px: refuse it. parseConfig("") stays the defaults, for tests and --set.
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException&) {
    root = YAML::Node(YAML::NodeType::Map);  // parseConfig reports it with its line
  }
  if (root.IsNull())
    throw UserError(path + ": the config file is empty; give at least one section (" +
                    joinAllowed(kSections) + "), e.g. start from configs/vgg16.yaml");
  return parseConfig(text, overrides, path, use);
}

std::string toYaml(const Config& config) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  std::string section;
  for (const auto& spec : schema()) {
    auto dot = spec.key.find('.');
    std::string sec = spec.key.substr(0, dot);
    if (sec != section) {
      if (!section.empty()) e << YAML::EndMap;
      e << YAML::Key << sec << YAML::Value << YAML::BeginMap;
      section = sec;
    }
    e << YAML::Key << spec.key.substr(dot + 1) << YAML::Value;
    spec.emit(config, e);
  }
  if (!section.empty()) e << YAML::EndMap;
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

std::vector<std::string> knownKeys() {
  std::vector<std::string> out;
  for (const auto& s : schema()) out.push_back(s.key);
  return out;
}

}  // namespace pipefb::config
