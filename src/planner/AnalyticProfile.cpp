// Analytic per-layer work of the zoo models (Note [Analytic timing] in AnalyticProfile.h).
// The layer chains mirror src/model/Vision.cpp and Gpt2.cpp; model_test-style checks
// compare parameter and output sizes with Model::describe() for small models.
#include "pipefb/planner/AnalyticProfile.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "pipefb/common/Error.h"

namespace pipefb::planner {

namespace {

constexpr std::int64_t kF = 4;  // bytes per fp32 element
constexpr std::int64_t kL = 8;  // bytes per int64 (pooling indices, token ids)
// Note [Analytic step transient]: the 0-dim tensors LibTorch wraps an optimizer's scalars
// in (beta1, momentum, ...) while a parameter's update runs; measured 12 bytes on every
// layer of VGG16 under Adam, Adam with weight decay and SGD with momentum, 0 under plain
// SGD. A plan at the smallest feasible budget has no room for them otherwise (1f1b:
// needed 154,157,068 bytes at a 154,157,056 budget).
constexpr std::int64_t kStepScalarBytes = 12;

int64_t convOut(int64_t h, int64_t k, int64_t s, int64_t p) { return (h + 2 * p - k) / s + 1; }

// conv (k x k, stride s, pad p) + ReLU [+ max-pool pk/ps], input (cin, h, h).
LayerWork convRelu(const std::string& name, int64_t cin, int64_t cout, int64_t& h, int64_t k,
                   int64_t s, int64_t p, int64_t pk = 0, int64_t ps = 0) {
  LayerWork w;
  w.name = name;
  const int64_t ho = convOut(h, k, s, p);
  const double in = double(cin) * h * h, pre = double(cout) * ho * ho;
  w.flops = 2.0 * cin * k * k * cout * ho * ho + 2 * pre;  // MACs + bias + ReLU
  w.params = cin * k * k * cout + cout;
  w.largestParam = cin * k * k * cout;
  w.freshGradient = w.params;       // convolution_backward: the weight's and the bias's at once
  w.weightLayout = w.largestParam;  // Note [Convolution weight layout]
  int64_t hout = ho;
  std::int64_t indices = 0;
  if (pk > 0) {
    hout = (ho - pk) / ps + 1;
    indices = cout * hout * hout * kL;
    w.flops += pre;
  }
  w.outputBytes = cout * hout * hout * kF;
  // conv saves its input; ReLU (in place) its output, which max-pool also reads.
  w.savedBytes = static_cast<std::int64_t>(in + pre) * kF + indices;
  w.savedWideBytes = indices;
  w.keptGradBytes = static_cast<std::int64_t>(pre) * kF;  // into the convolution's node
  w.workingBytes = static_cast<std::int64_t>(2 * std::max(in, pre)) * kF;
  w.bytesMoved = (in + 2 * pre) * kF + w.params * kF;
  h = hout;
  return w;
}

// [adaptive avg-pool to a x a + flatten] linear [+ ReLU], input `in` features.
LayerWork linear(const std::string& name, int64_t in, int64_t out, bool relu,
                 int64_t pooledFrom = 0) {
  LayerWork w;
  w.name = name;
  w.flops = 2.0 * in * out + (relu ? out : 0);
  w.params = in * out + out;
  w.largestParam = in * out;
  w.freshGradient = out;  // the bias's; model::linear adds the weight's into .grad
  w.outputBytes = out * kF;
  w.savedBytes = (in + (relu ? out : 0)) * kF;
  w.keptGradBytes = out * kF;  // into addmm's node
  w.workingBytes = 2 * std::max(in + pooledFrom, out) * kF;
  w.bytesMoved = double(in + out + w.params) * kF;
  return w;
}

ModelWork vgg16(const model::ModelOptions& o) {
  ModelWork m;
  const std::vector<std::vector<int64_t>> blocks = {
      {64, 64}, {128, 128}, {256, 256, 256}, {512, 512, 512}, {512, 512, 512}};
  int64_t in = o.channels, h = o.input_size;
  m.inputBytes = in * h * h * kF;
  for (size_t b = 0; b < blocks.size(); ++b)
    for (size_t i = 0; i < blocks[b].size(); ++i) {
      const int64_t out = model::scaled(blocks[b][i], o.width);
      const bool last = i + 1 == blocks[b].size();
      const int64_t hin = h;
      m.layers.push_back(convRelu("conv" + std::to_string(b + 1) + "_" + std::to_string(i + 1), in,
                                  out, h, 3, 1, 1, last ? 2 : 0, last ? 2 : 0));
      if (o.batch_norm) {  // vgg16_bn: BatchNorm2d on the conv output (hin x hin, padding 1)
        LayerWork& w = m.layers.back();
        const double pre = double(out) * hin * hin;
        w.flops += 8 * pre;
        w.params += 2 * out;
        w.freshGradient = std::max(w.freshGradient, 2 * out);  // its own node
        w.bufferBytes += 2 * out * kF + kL;  // running mean and variance, batch counter
        w.savedBytes += static_cast<std::int64_t>(pre) * kF;  // its input; ReLU saves its output
        w.bytesMoved += 2 * pre * kF;
      }
      in = out;
    }
  const int64_t hidden = model::scaled(4096, o.width);
  m.layers.push_back(linear("fc6", in * 49, hidden, true, in * h * h));
  m.layers.push_back(linear("fc7", hidden, hidden, true));
  m.layers.push_back(linear("fc8", hidden, o.num_classes, false));
  return m;
}

ModelWork alexnet(const model::ModelOptions& o) {
  ModelWork m;
  const int64_t c1 = model::scaled(64, o.width), c2 = model::scaled(192, o.width),
                c3 = model::scaled(384, o.width), c4 = model::scaled(256, o.width),
                c5 = model::scaled(256, o.width);
  int64_t h = o.input_size;
  m.inputBytes = o.channels * h * h * kF;
  m.layers.push_back(convRelu("conv1", o.channels, c1, h, 11, 4, 2, 3, 2));
  m.layers.push_back(convRelu("conv2", c1, c2, h, 5, 1, 2, 3, 2));
  m.layers.push_back(convRelu("conv3", c2, c3, h, 3, 1, 1));
  m.layers.push_back(convRelu("conv4", c3, c4, h, 3, 1, 1));
  m.layers.push_back(convRelu("conv5", c4, c5, h, 3, 1, 1, 3, 2));
  const int64_t hidden = model::scaled(4096, o.width);
  m.layers.push_back(linear("fc6", c5 * 36, hidden, true, c5 * h * h));
  m.layers.push_back(linear("fc7", hidden, hidden, true));
  m.layers.push_back(linear("fc8", hidden, o.num_classes, false));
  return m;
}

// conv without bias + batch norm (+ ReLU): counts into w.
void convBn(LayerWork& w, int64_t cin, int64_t cout, int64_t h, int64_t k, int64_t s, int64_t p,
            bool relu, int64_t* hout) {
  const int64_t ho = convOut(h, k, s, p);
  const double in = double(cin) * h * h, out = double(cout) * ho * ho;
  w.flops += 2.0 * cin * k * k * cout * ho * ho + 8 * out;
  w.params += cin * k * k * cout + 2 * cout;
  w.largestParam = std::max(w.largestParam, cin * k * k * cout);
  w.weightLayout =
      std::max(w.weightLayout, cin * k * k * cout);  // Note [Convolution weight layout]
  w.bufferBytes += 2 * cout * kF + kL;  // BN's running mean and variance, batch counter
  // The convolution's node (no bias) and the batch norm's (weight and bias), one at a time.
  w.freshGradient = std::max({w.freshGradient, cin * k * k * cout, 2 * cout});
  // conv input, BN input (+ stats), ReLU output.
  w.savedBytes += static_cast<std::int64_t>(in + out + (relu ? out : 0)) * kF;
  w.keptGradBytes += static_cast<std::int64_t>(2 * out) * kF;  // into the conv's and BN's nodes
  w.workingBytes = std::max<std::int64_t>(w.workingBytes, static_cast<std::int64_t>(2 * out) * kF);
  w.bytesMoved += (in + 3 * out) * kF;
  *hout = ho;
}

ModelWork resnet50(const model::ModelOptions& o) {
  ModelWork m;
  int64_t h = o.input_size;
  m.inputBytes = o.channels * h * h * kF;
  int64_t inplanes = model::scaled(64, o.width);
  {
    LayerWork w;
    w.name = "stem";
    int64_t ho;
    convBn(w, o.channels, inplanes, h, 7, 2, 3, true, &ho);
    const int64_t hp = convOut(ho, 3, 2, 1);
    w.savedBytes += inplanes * hp * hp * kL;
    w.savedWideBytes += inplanes * hp * hp * kL;
    w.outputBytes = inplanes * hp * hp * kF;
    h = hp;
    m.layers.push_back(w);
  }
  const int64_t blocks[4] = {3, 4, 6, 3};
  const int64_t planes[4] = {64, 128, 256, 512};
  for (int s = 0; s < 4; ++s) {
    const int64_t p = model::scaled(planes[s], o.width);
    for (int64_t i = 0; i < blocks[s]; ++i) {
      const int64_t stride = (s > 0 && i == 0) ? 2 : 1;
      LayerWork w;
      w.name = "layer" + std::to_string(s + 1) + "." + std::to_string(i);
      int64_t h1, h2, h3;
      convBn(w, inplanes, p, h, 1, 1, 0, true, &h1);
      convBn(w, p, p, h1, 3, stride, 1, true, &h2);
      convBn(w, p, p * 4, h2, 1, 1, 0, true, &h3);
      if (stride != 1 || inplanes != p * 4) {
        int64_t hd;
        convBn(w, inplanes, p * 4, h, 1, stride, 0, false, &hd);
      }
      w.outputBytes = p * 4 * h3 * h3 * kF;
      inplanes = p * 4;
      h = h3;
      m.layers.push_back(w);
    }
  }
  m.layers.push_back(linear("head", inplanes, o.num_classes, false, inplanes * h * h));
  return m;
}

ModelWork gpt2(const model::ModelOptions& o) {
  ModelWork m;
  const model::Gpt2Config c = model::gpt2Config(o);
  const int64_t T = o.input_size, E = c.n_embd, V = c.vocab, H = c.n_head;
  m.inputBytes = T * kL;
  m.targetBytes = T * kL;
  {
    LayerWork w;
    w.name = "embed";
    w.params = (V + c.n_ctx) * E;
    w.largestParam = std::max(V, c.n_ctx) * E;  // wte
    // Measured: wte's and wpe's gradients at once (wpe's is the size of its incoming
    // gradient, T x E, summed over the batch: one or the other is live beside wte's).
    w.freshGradient = w.params;
    w.flops = double(T) * E;
    w.outputBytes = T * E * kF;
    w.savedBytes = 2 * T * kL;  // token and position ids
    w.savedWideBytes = w.savedBytes;
    w.workingBytes = 2 * T * E * kF;
    w.bytesMoved = 3.0 * T * E * kF;
    m.layers.push_back(w);
  }
  for (int64_t l = 0; l < c.n_layer; ++l) {
    LayerWork w;
    w.name = "block" + std::to_string(l);
    w.params = 12 * E * E + 13 * E;
    w.largestParam = 4 * E * E;  // c_attn (E x 3E) < c_fc, c_proj (E x 4E)
    // The Conv1Ds' weights go straight into .grad; c_fc's bias (4E) and a LayerNorm's
    // (weight and bias, 2E, and as much again of partial sums, measured on ln_f) are the
    // largest left.
    w.freshGradient = 4 * E;
    // QKV, projection and MLP matmuls (24 E^2 per token) and the two attention matmuls.
    w.flops = double(T) * (24.0 * E * E + 4.0 * T * E);
    w.outputBytes = T * E * kF;
    // Per token: LN inputs and outputs, q/k/v, attention output, projection input, MLP
    // input, GELU input and output (16 E); per head: probabilities and scores (3 T).
    w.savedBytes = (16 * T * E + 3 * H * T * T) * kF;
    // Into the weight nodes, per token: two LayerNorms (E each), c_attn (3E), the attention
    // projection (E), c_fc (4E) and the MLP projection (E).
    w.keptGradBytes = 11 * T * E * kF;
    w.workingBytes = 2 * std::max(H * T * T, 4 * T * E) * kF;
    // Without autograd (a checkpointed F): the input, the residual stream, LayerNorm's
    // output and the MLP's 4E hidden and activation with a GELU temporary (12 E per token),
    // or in attention the input, LayerNorm, q/k/v and the output (5 E) beside the scores,
    // their masked copy and the probabilities (3 T per head) and the causal mask (T x T
    // bytes). Measured (pipefb_profile, microbatch 2, GPT-2 tiny): 12 TE at T = 32, 5 TE +
    // 3 HTT + T^2 at T = 128 (2244608 bytes); input + output + working (10 TE) was 17%
    // below at T = 32, and a checkpointed forward device went over its plan.
    w.noGradForwardBytes = std::max((12 * T * E) * kF, (5 * T * E + 3 * H * T * T) * kF + T * T);
    w.noGradWideBytes = T * T;
    w.bytesMoved = double(w.params + 16 * T * E + 3 * H * T * T) * kF;
    m.layers.push_back(w);
  }
  {
    LayerWork w;
    w.name = "head";
    w.params = E * V + 2 * E;
    w.largestParam = E * V;  // lm_head
    // ln_f's weight and bias and their partial sums (4E, measured); lm_head's (no bias)
    // goes straight into .grad.
    w.freshGradient = 4 * E;
    w.flops = 2.0 * T * E * V;
    w.outputBytes = T * V * kF;
    w.savedBytes = (2 * T * E + T * V) * kF;  // LN input, lm_head input, log-softmax
    w.keptGradBytes = T * (E + V) * kF;       // into ln_f's and lm_head's nodes
    w.workingBytes = 2 * T * V * kF;
    // The loss runs in fp32 at any precision: its log-softmax and the logits' gradient.
    w.savedWideBytes = T * V * kF;
    w.workingWideBytes = w.workingBytes;
    if (o.loss_chunk > 0) {
      // Note [Chunked loss]: the logits in their dtype (for the loss's backward) and an
      // fp32 logsumexp per token; their gradient in their dtype, and one fp32 chunk.
      w.savedWideBytes = T * kF;
      w.savedBytes = (2 * T * E + T * V) * kF + w.savedWideBytes;
      w.workingBytes = T * V * kF;
      w.workingWideBytes = 0;
      w.lossChunk = o.loss_chunk;
      w.lossWidth = V;
    }
    w.bytesMoved = double(w.params + 2 * T * V) * kF;
    m.layers.push_back(w);
  }
  return m;
}

ModelWork mlp(const model::ModelOptions& o) {
  ModelWork m;
  int64_t in = o.channels * o.input_size * o.input_size;
  m.inputBytes = in * kF;
  for (size_t i = 0; i <= o.hidden.size(); ++i) {
    const bool last = i == o.hidden.size();
    const int64_t out = last ? o.num_classes : model::scaled(o.hidden[i], o.width);
    m.layers.push_back(linear("fc" + std::to_string(i + 1), in, out, !last));
    in = out;
  }
  return m;
}

}  // namespace

ModelWork modelWork(const model::ModelOptions& o) {
  model::validate(o);
  ModelWork m;
  if (o.name == "vgg16")
    m = vgg16(o);
  else if (o.name == "alexnet")
    m = alexnet(o);
  else if (o.name == "resnet50")
    m = resnet50(o);
  else if (o.name == "gpt2")
    m = gpt2(o);
  else if (o.name == "mlp")
    m = mlp(o);
  else
    throw UserError("model.name: " + o.name +
                    " has no analytic profile (pipefb measures its layers); profile it with "
                    "pipefb_profile --config CONFIG and pass the file with --profile");
  m.model = model::modelKey(o);
  return m;
}

OptimizerMemory optimizerMemory(const std::string& optimizer, double momentum, double weightDecay) {
  const int decay = weightDecay != 0 ? 1 : 0;
  if (optimizer == "adam") return {2, 2 + decay};
  return {momentum != 0 ? 1 : 0, decay};
}

namespace {
double layerTime(double flops, double flopRate, double bytes, const DeviceSpec& d) {
  return std::max(flops / (flopRate * d.efficiency), bytes / (d.hbmBandwidth * d.efficiency));
}
}  // namespace

Profile analyticProfile(const ModelWork& work, std::int64_t microbatch, const DeviceSpec& d,
                        OptimizerMemory optimizer, Precision precision) {
  const int statesPerParam = optimizer.statesPerParam;
  // Note [Half-precision training] (common/Precision.h): `a` bytes an activation element;
  // what is wide keeps its bytes.
  const std::int64_t a = activationBytes(precision);
  const bool half = precision != Precision::FP32;
  auto act = [&](std::int64_t bytes, std::int64_t wide) {
    return half ? wide + ((bytes - wide) * a + kF - 1) / kF : bytes;
  };
  const double flopRate = flopsAt(d, precision);
  Profile p;
  p.precision = precision;
  p.model = work.model;
  p.device = d.name;
  p.source = "analytic";
  p.microbatch = microbatch;
  p.inputBytes = work.inputBytes * microbatch;
  p.targetBytes = work.targetBytes * microbatch;
  const double mb = static_cast<double>(microbatch);
  for (const LayerWork& w : work.layers) {
    LayerCost c;
    c.name = w.name;
    const double paramBytes = double(w.params) * kF;
    // Activations scale with the microbatch; the weights (F and B's copy) are read once per pass.
    const double fwdBytes = (w.bytesMoved - paramBytes) / kF * a * mb + double(w.params) * a;
    c.forward = layerTime(w.flops * mb, flopRate, fwdBytes, d) + d.layerOverhead;
    c.backward = layerTime(2 * w.flops * mb, flopRate, 2 * fwdBytes, d) + 2 * d.layerOverhead;
    c.recompute = c.forward;
    // Note [Microbatch scaling]: the overhead is per pass, whatever the microbatch.
    c.forwardFixed = c.recomputeFixed = d.layerOverhead;
    c.backwardFixed = 2 * d.layerOverhead;
    // The fp32 master and, at half, the copy F and B run on. .grad and the states are fp32.
    c.paramBytes = w.params * kF + (half ? w.params * a : 0);
    c.gradBytes = w.params * kF;
    c.halfCopyBytes = half ? w.params * a : 0;  // Note [Half-precision weights on a device]
    c.optimizerBytes = w.params * kF * statesPerParam;
    // Note [Analytic step transient]
    c.stepWorkingBytes =
        w.largestParam * kF * optimizer.stepTransients +
        (optimizer.statesPerParam + optimizer.stepTransients > 0 ? kStepScalarBytes : 0);
    // Read weights, grads and states, write weights and states.
    // At half, the step also writes the half copy.
    c.step = (paramBytes * (3 + 2 * statesPerParam) + (half ? double(w.params) * a : 0)) /
             (d.hbmBandwidth * d.efficiency);
    // A weight snapshot (Note [Weight snapshots] in CostModel.h) reads and writes the
    // weights once. backwardAfterStep stays 0 (= backward): a GPU caching allocator keeps
    // its blocks, so the first B after a step does not touch fresh pages.
    c.snapshot = 2.0 * double(c.paramBytes) / (d.hbmBandwidth * d.efficiency);
    c.outputBytes = act(w.outputBytes, 0) * microbatch;
    c.savedBytes = act(w.savedBytes, w.savedWideBytes) * microbatch;
    c.keptGradBytes = act(w.keptGradBytes, 0) * microbatch;
    // savedOutputBytes stays 0: savedBytes here already counts an output ReLU saves
    // (convRelu, linear), unlike a measured profile's (Note [Measured saved bytes]).
    // savedInputBytes stays 0: a checkpointed B's recomputed graph is charged whole beside
    // its stash (Note [Backward layer by layer] in CostModel.h), never less.
    // Note [Fresh gradients in the analytic profile]: B's working set in place holds the
    // largest node's fresh gradients beside the activations; gathering, all of the layer's.
    // Note [Convolution weight layout]: a convolution's weight in the library's layout
    // beside them.
    // At half, fresh gradients and the layout copy are of the half weights.
    const std::int64_t layout = w.weightLayout * a;
    const std::int64_t working = act(w.workingBytes, w.workingWideBytes);
    // Note [Chunked loss]: two fp32 chunks at any precision, charged whole: the planner scales
    // a profile to other microbatches keeping its fixed bytes, and a microbatch of at least
    // lossChunk tokens fills a chunk.
    const std::int64_t lossChunks = 2 * w.lossChunk * w.lossWidth * kF;
    c.workingFixedBytes = w.freshGradient * a + layout + lossChunks;
    c.workingBytes = working * microbatch + c.workingFixedBytes;
    c.gatheredWorkingFixedBytes = w.params * a + layout + lossChunks;
    c.gatheredWorkingBytes = working * microbatch + c.gatheredWorkingFixedBytes;
    c.forwardWorkingBytes = working * microbatch;  // F makes no gradient
    if (w.noGradForwardBytes >= 0)
      c.noGradForwardBytes = act(w.noGradForwardBytes, w.noGradWideBytes) * microbatch;
    c.bufferBytes = w.bufferBytes;
    p.layers.push_back(c);
  }
  // The model's first layer has no input gradient (LayerWork::keptGradBytes).
  if (!p.layers.empty()) p.layers[0].keptGradBytes = 0;
  return p;
}

std::vector<double> analyticSpeeds(const ModelWork& work, std::int64_t microbatch,
                                   const std::vector<DeviceSpec>& devices, Precision precision) {
  std::vector<double> out;
  if (devices.empty()) return out;
  auto total = [&](const DeviceSpec& d) {
    Profile p = analyticProfile(work, microbatch, d, OptimizerMemory{}, precision);
    double t = 0;
    for (const auto& l : p.layers) t += l.forward + l.backward;
    return t;
  };
  const double ref = total(devices.front());
  for (const auto& d : devices) out.push_back(ref / total(d));
  return out;
}

}  // namespace pipefb::planner
