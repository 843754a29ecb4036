// The measured profiler (Profiler.h) on small models: sizes against Model::describe and
// closed forms of what LibTorch 1.13 saves, optimizer states, and the profile-file cache.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "pipefb/common/Error.h"
#include "pipefb/config/Config.h"
#include "pipefb/memory/FreedMemory.h"
#include "pipefb/model/Model.h"
#include "pipefb/planner/AnalyticProfile.h"
#include "pipefb/planner/DeviceSpec.h"
#include "pipefb/planner/ProfileFile.h"
#include "pipefb/planner/Profiler.h"

namespace pipefb::planner {
namespace {

namespace fs = std::filesystem;

config::Config loadCfg(const std::string& name, const std::vector<std::string>& sets) {
  return config::loadConfig(std::string(PIPEFB_SOURCE_DIR) + "/configs/" + name, sets);
}

ProfilerOptions quick() {
  ProfilerOptions o;
  o.warmup = 1;
  o.repeats = 3;
  return o;
}

// For tests that compare bytes only: one timing run, and an analytic spec whose times
// are not compared (any will do).
ProfilerOptions bytesOnly() {
  ProfilerOptions o = quick();
  o.warmup = 0;
  o.repeats = 1;
  return o;
}
DeviceSpec anySpec() {
  DeviceSpec cpu;
  cpu.peakFlops = 1e11;
  cpu.hbmBandwidth = 2e10;
  return cpu;
}

std::vector<model::LayerInfo> describe(const config::Config& cfg, std::int64_t b) {
  return model::buildModel(cfg.model)->describe(b);
}

void expectTimesPositive(const Profile& p) {
  for (const auto& l : p.layers) {
    EXPECT_GT(l.forward, 0) << l.name;
    EXPECT_GT(l.backward, 0) << l.name;
    EXPECT_GT(l.recompute, 0) << l.name;
    if (l.paramBytes > 0) EXPECT_GT(l.step, 0) << l.name;
  }
}

// mlp-tiny: input 1x8x8 (64 features), hidden [32, 32], 4 classes, batch 32, SGD with
// momentum 0.9. Every layer is (flatten) Linear (+ in-place ReLU).
TEST(ProfilerTest, MlpClosedForms) {
  const auto cfg = loadCfg("mlp-tiny.yaml", {});
  const Profile p = measureProfile(cfg, quick());
  const std::int64_t b = 32;
  ASSERT_EQ(p.microbatch, b);
  ASSERT_EQ(p.numLayers(), 3);
  EXPECT_EQ(p.inputBytes, b * 64 * 4);
  const auto info = describe(cfg, b);
  const std::int64_t in[] = {64, 32, 32}, out[] = {32, 32, 4};
  for (int i = 0; i < 3; ++i) {
    const auto& l = p.layers[i];
    EXPECT_EQ(l.name, info[i].name);
    EXPECT_EQ(l.paramBytes, info[i].param_bytes) << l.name;
    EXPECT_EQ(l.paramBytes, (in[i] * out[i] + out[i]) * 4) << l.name;
    EXPECT_EQ(l.gradBytes, l.paramBytes) << l.name;
    EXPECT_EQ(l.optimizerBytes, l.paramBytes) << l.name;  // one momentum buffer per param
    EXPECT_EQ(l.outputBytes, info[i].output_bytes) << l.name;
    EXPECT_EQ(l.outputBytes, b * out[i] * 4) << l.name;
    // What LibTorch 1.13 keeps for B: addmm saves its input (mat1, for the weight
    // gradient; mat2 is the weight's transpose, a view of the parameter, no new bytes);
    // the in-place ReLU saves its result, which is the output itself and is not counted
    // (Note [Measured saved bytes]). So exactly the input, b x in floats.
    EXPECT_EQ(l.savedBytes, b * in[i] * 4) << l.name;
    // All of it is the input itself (what a checkpointed B's recompute saves of its stash).
    EXPECT_EQ(l.savedInputBytes, b * in[i] * 4) << l.name;
    // That result is the output: all of it stays with the graph; fc3 has no ReLU.
    EXPECT_EQ(l.savedOutputBytes, i < 2 ? l.outputBytes : 0) << l.name;
    // B allocates at least the input gradient (except layer 0, whose input is data).
    EXPECT_GT(l.workingBytes, 0) << l.name;
    EXPECT_LT(l.workingBytes, 8 * (b * (in[i] + out[i]) * 4 + l.paramBytes)) << l.name;
    // A B that gathers holds the layer's own gradients when it ends (Note [Gathered
    // weight gradients] in CostModel.h); in place they go into .grad as they come.
    EXPECT_GE(l.gatheredWorkingBytes, std::max(l.workingBytes, l.gradBytes)) << l.name;
    // Of those, what does not scale with the microbatch is the layer's fresh gradients
    // (Note [Parameter-sized working sets] in LayerCost.h): fitted from 2 and 32 samples.
    // In place only the bias's: the weight's goes straight into .grad (Note [Weight
    // gradients into .grad] in model/Model.h).
    EXPECT_EQ(l.workingFixedBytes, out[i] * 4) << l.name;
    EXPECT_EQ(l.gatheredWorkingFixedBytes, l.gradBytes) << l.name;
    // Without autograd (Note [Forward without autograd] in CostModel.h): the input and
    // addmm's output, which the ReLU rectifies in place; nothing saved.
    EXPECT_EQ(l.noGradForwardBytes, b * (in[i] + out[i]) * 4) << l.name;
    EXPECT_EQ(l.bufferBytes, 0) << l.name;
  }
  EXPECT_EQ(p.targetBytes, b * 8);  // one int64 class id per sample
  // Note [Bytes at every microbatch] in LayerCost.h: every other divisor of the batch (32),
  // measured there: the same closed forms at that size.
  std::vector<std::int64_t> sizes;
  for (const MeasuredBytes& m : p.bytesAt) {
    sizes.push_back(m.microbatch);
    EXPECT_EQ(m.inputBytes, m.microbatch * 64 * 4);
    EXPECT_EQ(m.targetBytes, m.microbatch * 8);
    ASSERT_EQ(m.layers.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(m.layers[i].outputBytes, m.microbatch * out[i] * 4) << m.microbatch;
      EXPECT_EQ(m.layers[i].savedBytes, m.microbatch * in[i] * 4) << m.microbatch;
      EXPECT_EQ(m.layers[i].noGradForwardBytes, m.microbatch * (in[i] + out[i]) * 4)
          << m.microbatch;
    }
  }
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{1, 2, 4, 8, 16}));
  expectTimesPositive(p);
}

// BatchNorm's running statistics are buffers: resident beside the weights, not parameters.
TEST(ProfilerTest, BufferBytesAreTheModelsBuffers) {
  const auto cfg = loadCfg("resnet50.yaml", {"model.width=0.125", "model.input_size=32",
                                             "training.batch=4", "pipeline.microbatches=1"});
  const Profile p = measureProfile(cfg, quick());
  const auto info = describe(cfg, 4);
  ASSERT_EQ(p.numLayers(), static_cast<int>(info.size()));
  std::int64_t total = 0;
  for (int i = 0; i < p.numLayers(); ++i) {
    EXPECT_EQ(p.layers[i].bufferBytes, info[i].buffer_bytes) << p.layers[i].name;
    total += p.layers[i].bufferBytes;
  }
  EXPECT_GT(total, 0);
}

TEST(ProfilerTest, OptimizerStates) {
  auto sgd = loadCfg("mlp-tiny.yaml", {"training.optimizer=sgd", "training.momentum=0.9"});
  auto adam = loadCfg("mlp-tiny.yaml", {"training.optimizer=adam"});
  auto plain = loadCfg("mlp-tiny.yaml", {"training.optimizer=sgd", "training.momentum=0"});
  const Profile ps = measureProfile(sgd, quick());
  const Profile pa = measureProfile(adam, quick());
  const Profile pp = measureProfile(plain, quick());
  EXPECT_NE(profileKey(ps), profileKey(pa));  // the optimizer is part of the key
  for (int i = 0; i < ps.numLayers(); ++i) {
    EXPECT_EQ(ps.layers[i].optimizerBytes, ps.layers[i].paramBytes);
    // exp_avg and exp_avg_sq; LibTorch 1.13's C++ AdamParamState keeps `step` as an
    // int64_t member, not a tensor, so exactly 2x (no amsgrad).
    EXPECT_EQ(pa.layers[i].optimizerBytes, 2 * pa.layers[i].paramBytes);
    EXPECT_EQ(pp.layers[i].optimizerBytes, 0);
    // Note [Step working set]: Adam's step makes temporaries (exp_avg_sq.sqrt() / c and
    // the update) one parameter at a time: more than nothing, at most ~2x the layer.
    if (pa.layers[i].paramBytes > 0) {
      EXPECT_GT(pa.layers[i].stepWorkingBytes, 0) << pa.layers[i].name;
      EXPECT_LE(pa.layers[i].stepWorkingBytes, 2 * pa.layers[i].paramBytes + 4096)
          << pa.layers[i].name;
    }
  }
}

// Note [Analytic step transient]: the analytic profile's step transient and optimizer
// state are the measured ones, byte for byte, on every layer of the zoo's models and
// under every optimizer setting the config offers (a plan at the smallest feasible
// budget has no byte to spare: pipedream VGG16/4 went OOM in STEP with the transient at 0).
TEST(ProfilerTest, AnalyticStepTransientIsTheMeasuredOne) {
  struct Case {
    const char* config;
    std::vector<std::string> sets;
  };
  const std::vector<Case> models = {
      {"vgg16-single.yaml", {"model.width=0.0625", "training.batch=4"}},
      {"alexnet.yaml", {"model.width=0.0625", "training.batch=2"}},
      {"resnet50.yaml", {"model.width=0.0625", "model.input_size=32", "training.batch=2"}},
      {"gpt2-tiny.yaml", {"model.input_size=16", "training.batch=2"}},
      {"mlp-tiny.yaml", {"training.batch=4"}}};
  const std::vector<std::vector<std::string>> optimizers = {
      {"training.optimizer=adam", "training.weight_decay=0"},
      {"training.optimizer=adam", "training.weight_decay=0.01"},
      {"training.optimizer=sgd", "training.momentum=0.9", "training.weight_decay=0"},
      {"training.optimizer=sgd", "training.momentum=0.9", "training.weight_decay=0.01"},
      {"training.optimizer=sgd", "training.momentum=0", "training.weight_decay=0"}};
  const DeviceSpec cpu = anySpec();
  const ProfilerOptions o = bytesOnly();
  for (const Case& c : models)
    for (const auto& opt : optimizers) {
      std::vector<std::string> sets = c.sets;
      sets.insert(sets.end(), opt.begin(), opt.end());
      const auto cfg = loadCfg(c.config, sets);
      const Profile measured = measureProfile(cfg, o);
      const Profile analytic =
          analyticProfile(modelWork(cfg.model), measured.microbatch, cpu,
                          optimizerMemory(cfg.training.optimizer, cfg.training.momentum,
                                          cfg.training.weight_decay));
      ASSERT_EQ(analytic.numLayers(), measured.numLayers()) << c.config;
      for (int i = 0; i < measured.numLayers(); ++i) {
        const auto &a = analytic.layers[i], &m = measured.layers[i];
        const std::string at = std::string(c.config) + " " + m.name + " " + opt[0] +
                               (opt.size() > 1 ? " " + opt[1] : "") + " " + opt.back();
        EXPECT_EQ(a.paramBytes, m.paramBytes) << at;
        EXPECT_EQ(a.optimizerBytes, m.optimizerBytes) << at;
        EXPECT_EQ(a.stepWorkingBytes, m.stepWorkingBytes) << at;
      }
    }
}

// Note [Fresh gradients in the analytic profile]: the analytic profile's fixed part of
// B's working sets is the measured one wherever a layer's gradients come from linear
// layers and embeddings (the CPU convolution's backward keeps a column buffer besides, so
// convolutions are left out): in place a linear layer's bias, gathering all its
// parameters. The fits take 2 and the batch's samples.
TEST(ProfilerTest, AnalyticFreshGradientsAreTheMeasuredOnes) {
  const DeviceSpec cpu = anySpec();
  const ProfilerOptions o = bytesOnly();
  auto profiles = [&](const char* config, const std::vector<std::string>& sets) {
    const auto cfg = loadCfg(config, sets);
    Profile measured = measureProfile(cfg, o);
    Profile analytic = analyticProfile(
        modelWork(cfg.model), measured.microbatch, cpu,
        optimizerMemory(cfg.training.optimizer, cfg.training.momentum, cfg.training.weight_decay));
    EXPECT_EQ(analytic.numLayers(), measured.numLayers()) << config;
    return std::make_pair(std::move(analytic), std::move(measured));
  };
  {  // every layer linear: in place the bias, gathered the weight and the bias
    const auto [a, m] = profiles("mlp-tiny.yaml", {"model.hidden=[512,256]", "training.batch=8"});
    const std::int64_t out[] = {512, 256, 4};
    ASSERT_EQ(m.numLayers(), 3);
    for (int i = 0; i < m.numLayers(); ++i) {
      EXPECT_EQ(a.layers[i].workingFixedBytes, m.layers[i].workingFixedBytes) << m.layers[i].name;
      EXPECT_EQ(a.layers[i].workingFixedBytes, out[i] * 4) << m.layers[i].name;
      EXPECT_EQ(a.layers[i].gatheredWorkingFixedBytes, m.layers[i].paramBytes) << m.layers[i].name;
      EXPECT_EQ(a.layers[i].gatheredWorkingFixedBytes, m.layers[i].gatheredWorkingFixedBytes)
          << m.layers[i].name;
    }
  }
  {  // VGG16's fc6 to fc8
    const auto [a, m] = profiles("vgg16-single.yaml",
                                 {"model.width=0.0625", "model.input_size=32", "training.batch=8"});
    int linears = 0;
    for (int i = 0; i < m.numLayers(); ++i) {
      if (m.layers[i].name.rfind("fc", 0) != 0) continue;
      ++linears;
      EXPECT_GT(m.layers[i].workingFixedBytes, 0) << m.layers[i].name;
      EXPECT_EQ(a.layers[i].workingFixedBytes, m.layers[i].workingFixedBytes) << m.layers[i].name;
      EXPECT_EQ(a.layers[i].gatheredWorkingFixedBytes, m.layers[i].gatheredWorkingFixedBytes)
          << m.layers[i].name;
    }
    EXPECT_EQ(linears, 3);
  }
  {  // GPT-2 in place: the embedding wte's and wpe's, the head ln_f's 4E; a block is
     // charged 4E, measured c_proj's bias (E)
    const auto [a, m] = profiles("gpt2-tiny.yaml", {"model.input_size=16", "training.batch=8"});
    const std::int64_t E = 128;
    ASSERT_EQ(m.layers.front().paramBytes, (256 + 16) * E * 4);  // the sizes assumed here
    EXPECT_EQ(m.layers.front().workingFixedBytes, m.layers.front().paramBytes);
    for (int i = 0; i < m.numLayers(); ++i) {
      const bool block = m.layers[i].name.rfind("block", 0) == 0;
      EXPECT_GT(m.layers[i].workingFixedBytes, 0) << m.layers[i].name;
      EXPECT_EQ(a.layers[i].workingFixedBytes,
                m.layers[i].workingFixedBytes + (block ? 3 * E * 4 : 0))
          << m.layers[i].name;
    }
    EXPECT_EQ(m.layers.back().workingFixedBytes, 4 * E * 4);
  }
}

// Note [Forward without autograd]: the analytic profile's F peak without autograd is at
// least the measured one on every GPT-2 layer (a checkpointed forward device is charged it),
// and the block's within 1%: its MLP at short sequences, its attention at long ones.
TEST(ProfilerTest, AnalyticForwardWithoutAutogradCoversTheMeasuredOne) {
  const DeviceSpec cpu = anySpec();
  for (const char* T : {"32", "128"}) {
    const auto cfg =
        loadCfg("gpt2-tiny.yaml", {std::string("model.input_size=") + T, "training.batch=2"});
    const Profile m = measureProfile(cfg, bytesOnly());
    const Profile a = analyticProfile(modelWork(cfg.model), m.microbatch, cpu, OptimizerMemory{});
    ASSERT_EQ(a.numLayers(), m.numLayers());
    for (int i = 0; i < m.numLayers(); ++i) {
      const LayerCost &x = a.layers[i], &y = m.layers[i];
      const std::int64_t analytic = x.noGradForwardBytes >= 0
                                        ? x.noGradForwardBytes
                                        : x.outputBytes + x.forwardWorkingBytes +
                                              (i == 0 ? a.inputBytes : a.layers[i - 1].outputBytes);
      EXPECT_GE(analytic, y.noGradForwardBytes) << y.name << " T=" << T;
      if (y.name.rfind("block", 0) == 0)
        EXPECT_LE(analytic, y.noGradForwardBytes * 101 / 100) << y.name << " T=" << T;
    }
  }
}

// VGG16 at width 1/16 on 32 px: 16 layers (13 conv+ReLU[+pool], fc6..fc8).
TEST(ProfilerTest, TinyVgg) {
  const auto cfg =
      loadCfg("vgg16-single.yaml", {"model.width=0.0625", "model.input_size=32", "training.batch=8",
                                    "training.optimizer=sgd", "training.momentum=0.9"});
  const Profile p = measureProfile(cfg, quick());
  const auto info = describe(cfg, 8);
  ASSERT_EQ(p.numLayers(), static_cast<int>(info.size()));
  for (int i = 0; i < p.numLayers(); ++i) {
    const auto& l = p.layers[i];
    EXPECT_EQ(l.paramBytes, info[i].param_bytes) << l.name;
    EXPECT_EQ(l.outputBytes, info[i].output_bytes) << l.name;
    EXPECT_GT(l.savedBytes, 0) << l.name;
    EXPECT_EQ(l.optimizerBytes, l.paramBytes) << l.name;
  }
  // conv1_1 (1 -> 4 channels, 32x32, no pool): the conv saves its input (8x1x32x32
  // floats), ReLU its output (the layer output, not counted).
  EXPECT_EQ(p.layers[0].savedBytes, 8 * 1 * 32 * 32 * 4);
  // That is the input itself; the convolutions that follow save their input too (the
  // previous ReLU's result, Note [Measured saved bytes]), the classifier's linears theirs.
  for (const auto& l : p.layers) {
    EXPECT_GT(l.savedInputBytes, 0) << l.name;
    EXPECT_LE(l.savedInputBytes, l.savedBytes) << l.name;
  }
  EXPECT_EQ(p.layers[0].savedInputBytes, 8 * 1 * 32 * 32 * 4);
  // The graph keeps an in-place ReLU's result: the whole output of a conv without a pool
  // and of fc6, fc7 (no dropout); none of a max-pool's output (it saves its input and
  // indices) or of fc8 (no ReLU). Note [Measured saved bytes].
  for (const auto& l : p.layers) {
    const bool pooled = l.name == "conv1_2" || l.name == "conv2_2" || l.name == "conv3_3" ||
                        l.name == "conv4_3" || l.name == "conv5_3";
    const bool savesOutput = !pooled && l.name != "fc8";
    EXPECT_EQ(l.savedOutputBytes, savesOutput ? l.outputBytes : 0) << l.name;
  }
  expectTimesPositive(p);
}

TEST(ProfilerTest, CacheHitReturnsIdenticalValues) {
  const auto cfg = loadCfg("mlp-tiny.yaml", {});
  const fs::path dir =
      fs::temp_directory_path() / ("pipefb_profiler_test_" + std::to_string(::getpid()));
  const std::string path = (dir / "sub" / "mlp.yaml").string();
  const ProfileResult first = loadOrMeasureProfile(cfg, quick(), path);
  EXPECT_FALSE(first.fromCache);
  ASSERT_TRUE(fs::exists(path));
  const ProfileResult second = loadOrMeasureProfile(cfg, quick(), path);
  EXPECT_TRUE(second.fromCache);
  EXPECT_EQ(profileToYaml(second.profile), profileToYaml(first.profile));
  {  // Note [Profile method]: a file written by an older method is measured again.
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    std::string yaml = text.str();
    const std::string key = profileKey(first.profile);
    const size_t at = yaml.find(key);
    ASSERT_NE(at, std::string::npos);
    const std::string older = key.substr(0, key.rfind("method=")) + "method=0";
    yaml.replace(at, key.size(), older);
    std::ofstream(path) << yaml;
    const ProfileResult again = loadOrMeasureProfile(cfg, quick(), path);
    EXPECT_FALSE(again.fromCache);
    EXPECT_EQ(profileKey(again.profile), key);
  }
  // Another microbatch is another key: measured again, and the file replaced.
  const auto other = loadCfg("mlp-tiny.yaml", {"training.batch=16"});
  const ProfileResult third = loadOrMeasureProfile(other, quick(), path);
  EXPECT_FALSE(third.fromCache);
  EXPECT_EQ(third.profile.microbatch, 16);
  const ProfileResult forced = loadOrMeasureProfile(other, quick(), path, /*force=*/true);
  EXPECT_FALSE(forced.fromCache);
  fs::remove_all(dir);
  // The default path is derived from the key.
  EXPECT_NE(defaultProfilePath(profileHeader(cfg, quick())),
            defaultProfilePath(profileHeader(other, quick())));
}

// Note [Analytic times in a measured profile]: the bytes are the measured profile's, the
// times the analytic profile's, and two measurements give the same file (a timed one
// differs: its medians are noise, and its key is another).
TEST(ProfilerTest, AnalyticTimesRepeatAndKeepTheMeasuredBytes) {
  const auto cfg = loadCfg("gpt2-tiny.yaml", {"model.input_size=16", "training.batch=4"});
  ProfilerOptions analytic = quick();
  analytic.times = "analytic";
  const Profile a1 = measureProfile(cfg, analytic), a2 = measureProfile(cfg, analytic);
  const Profile timed = measureProfile(cfg, quick());
  EXPECT_EQ(profileToYaml(a1), profileToYaml(a2));
  EXPECT_EQ(a1.device, "cpu times=analytic");
  EXPECT_NE(profileKey(a1), profileKey(timed));
  const Profile roof = analyticProfile(
      modelWork(cfg.model), a1.microbatch,
      findDeviceSpec("cpu", std::string(PIPEFB_SOURCE_DIR) + "/configs/devices"),
      optimizerMemory(cfg.training.optimizer, cfg.training.momentum, cfg.training.weight_decay));
  ASSERT_EQ(a1.layers.size(), timed.layers.size());
  ASSERT_EQ(a1.layers.size(), roof.layers.size());
  EXPECT_EQ(a1.inputBytes, timed.inputBytes);
  EXPECT_EQ(a1.lossWorkingBytes, timed.lossWorkingBytes);
  for (size_t i = 0; i < a1.layers.size(); ++i) {
    const LayerCost &l = a1.layers[i], &t = timed.layers[i], &r = roof.layers[i];
    SCOPED_TRACE(l.name);
    EXPECT_EQ(l.forward, r.forward);
    EXPECT_EQ(l.backward, r.backward);
    EXPECT_EQ(l.recompute, r.recompute);
    EXPECT_EQ(l.forwardFixed, r.forwardFixed);
    EXPECT_EQ(l.backwardFixed, r.backwardFixed);
    EXPECT_EQ(l.recomputeFixed, r.recomputeFixed);
    EXPECT_EQ(l.step, r.step);
    EXPECT_EQ(l.snapshot, r.snapshot);
    EXPECT_EQ(l.backwardAfterStep, 0);
    for (auto bytes :
         {&LayerCost::outputBytes, &LayerCost::savedBytes, &LayerCost::savedOutputBytes,
          &LayerCost::savedInputBytes, &LayerCost::workingBytes, &LayerCost::gatheredWorkingBytes,
          &LayerCost::paramBytes, &LayerCost::gradBytes, &LayerCost::optimizerBytes,
          &LayerCost::stepWorkingBytes, &LayerCost::forwardWorkingBytes,
          &LayerCost::noGradForwardBytes, &LayerCost::bufferBytes})
      EXPECT_EQ(l.*bytes, t.*bytes);
  }
  ProfilerOptions bad = quick();
  bad.times = "median";
  EXPECT_THROW(bad.validate(), UserError);
}

// Note [Keeping freed memory]: measuring applies devices.keep_freed_memory to the process
// (as pipefb_train does), and a profile measured with glibc's defaults is another key.
TEST(ProfilerTest, KeepsFreedMemoryAndKeysTheAllocator) {
  const auto kept = loadCfg("mlp-tiny.yaml", {});
  const auto system = loadCfg("mlp-tiny.yaml", {"devices.keep_freed_memory=false"});
  EXPECT_EQ(profileHeader(kept, quick()).device, "cpu");
  EXPECT_EQ(profileHeader(system, quick()).device, "cpu malloc=system");
  EXPECT_NE(profileKey(profileHeader(kept, quick())), profileKey(profileHeader(system, quick())));
  (void)measureProfile(kept, quick());
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  EXPECT_TRUE(memory::keepingFreedMemory());
#endif
}

// pipefb_profile: measures, then says it reads the cache; bad flags exit 2 with one line.
std::pair<int, std::string> run(const std::string& args) {
  const std::string cmd = std::string(PIPEFB_BINARY_DIR) + "/pipefb_profile " + args + " 2>&1";
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return {-1, ""};
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  const int status = ::pclose(f);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(ProfilerTest, Cli) {
  const fs::path dir =
      fs::temp_directory_path() / ("pipefb_profile_cli_" + std::to_string(::getpid()));
  const std::string cfg = std::string(PIPEFB_SOURCE_DIR) + "/configs/mlp-tiny.yaml";
  const std::string out = (dir / "mlp.yaml").string();
  const std::string base = "--config " + cfg + " --out " + out + " --repeats 2 --warmup 1";
  auto [rc1, out1] = run(base);
  EXPECT_EQ(rc1, 0) << out1;
  EXPECT_NE(out1.find("measured profile " + out), std::string::npos) << out1;
  EXPECT_NE(out1.find("fc3"), std::string::npos) << out1;
  auto [rc2, out2] = run(base);
  EXPECT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("cached profile " + out), std::string::npos) << out2;
  auto [rc3, out3] = run(base + " --force");
  EXPECT_NE(out3.find("measured profile"), std::string::npos) << out3;
  auto [rc4, out4] = run(base + " --repeats 0");
  EXPECT_EQ(rc4, 2) << out4;
  EXPECT_EQ(std::count(out4.begin(), out4.end(), '\n'), 1) << out4;
  auto [rc5, out5] = run(base + " --set model.widht=2");
  EXPECT_EQ(rc5, 2) << out5;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pipefb::planner
