// The image models (vgg16, alexnet, resnet50) and the mlp. Parameter names follow
// torchvision; see Note [Parameter names] in Model.h.
#include <array>
#include <string>

#include "Zoo.h"
#include "pipefb/common/Error.h"

namespace pipefb::model::detail {
namespace {

namespace nn = torch::nn;
namespace F = torch::nn::functional;

/// conv [-> batch norm] -> ReLU [-> max-pool]. The conv is registered as
/// features.<index>, its batch norm (vgg16_bn) as features.<index+1>.
class ConvLayer : public Layer {
 public:
  struct Spec {
    int64_t in, out, kernel, stride = 1, padding = 0;
    int64_t poolKernel = 0, poolStride = 0;  // 0: no pool after the ReLU
    bool batchNorm = false;
  };
  ConvLayer(std::string name, std::string prefix, const std::string& local, const Spec& s)
      : Layer(std::move(name), std::move(prefix)), spec_(s) {
    conv_ = register_module(
        local,
        nn::Conv2d(nn::Conv2dOptions(s.in, s.out, s.kernel).stride(s.stride).padding(s.padding)));
    if (s.batchNorm)
      bn_ = register_module(std::to_string(std::stoll(local) + 1), nn::BatchNorm2d(s.out));
  }
  torch::Tensor forward(torch::Tensor x) override {
    // relu_ works on the conv's (or batch norm's) fresh output, never on the layer input
    // (a stage input may be a checkpoint that must stay intact).
    auto y = conv_->forward(x);
    if (spec_.batchNorm) y = bn_->forward(y);
    y = y.relu_();
    if (spec_.poolKernel > 0) y = torch::max_pool2d(y, spec_.poolKernel, spec_.poolStride);
    return y;
  }

 private:
  Spec spec_;
  nn::Conv2d conv_{nullptr};
  nn::BatchNorm2d bn_{nullptr};
};

/// [avgpool+flatten] [dropout] linear [ReLU] [dropout], registered as classifier.<index>.
class LinearLayer : public Layer {
 public:
  struct Spec {
    int64_t in, out;
    int64_t avgPool = 0;    // >0: adaptive avg-pool to avgPool x avgPool, then flatten
    bool flatten = false;   // flatten (B, ...) to (B, N) first (mlp)
    double dropBefore = 0;  // alexnet puts dropout before its linears
    bool relu = true;
    double dropAfter = 0;  // vgg puts it after the ReLU
  };
  LinearLayer(std::string name, std::string prefix, const std::string& local, const Spec& s)
      : Layer(std::move(name), std::move(prefix)), spec_(s) {
    fc_ = register_module(local, nn::Linear(s.in, s.out));
  }
  torch::Tensor forward(torch::Tensor x) override {
    if (spec_.avgPool > 0) {
      x = torch::adaptive_avg_pool2d(x, {spec_.avgPool, spec_.avgPool}).flatten(1);
    } else if (spec_.flatten) {
      x = x.flatten(1);
    }
    if (spec_.dropBefore > 0) x = model::dropout(x, spec_.dropBefore, is_training());
    x = model::linear(x, fc_->weight, fc_->bias);  // Note [Weight gradients into .grad]
    if (spec_.relu) x = x.relu_();
    if (spec_.dropAfter > 0) x = model::dropout(x, spec_.dropAfter, is_training());
    return x;
  }

 private:
  Spec spec_;
  nn::Linear fc_{nullptr};
};

nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(pad).bias(false));
}

/// ResNet stem: conv1 7x7/2, bn1, ReLU, max-pool 3x3/2. Keys conv1.*, bn1.*.
class StemLayer : public Layer {
 public:
  StemLayer(int64_t in, int64_t out) : Layer("stem", "") {
    conv1_ = register_module("conv1", conv(in, out, 7, 2, 3));
    bn1_ = register_module("bn1", nn::BatchNorm2d(out));
  }
  torch::Tensor forward(torch::Tensor x) override {
    auto y = bn1_->forward(conv1_->forward(x)).relu_();
    return torch::max_pool2d(y, 3, 2, 1);
  }

 private:
  nn::Conv2d conv1_{nullptr};
  nn::BatchNorm2d bn1_{nullptr};
};

/// torchvision's Bottleneck (v1.5: the stride sits on the 3x3 conv). Keys
/// layer<s>.<i>.{conv1,bn1,conv2,bn2,conv3,bn3,downsample.0,downsample.1}.*.
class BottleneckLayer : public Layer {
 public:
  static constexpr int64_t kExpansion = 4;
  BottleneckLayer(std::string name, std::string prefix, int64_t inplanes, int64_t planes,
                  int64_t stride)
      : Layer(std::move(name), std::move(prefix)) {
    conv1_ = register_module("conv1", conv(inplanes, planes, 1, 1, 0));
    bn1_ = register_module("bn1", nn::BatchNorm2d(planes));
    conv2_ = register_module("conv2", conv(planes, planes, 3, stride, 1));
    bn2_ = register_module("bn2", nn::BatchNorm2d(planes));
    conv3_ = register_module("conv3", conv(planes, planes * kExpansion, 1, 1, 0));
    bn3_ = register_module("bn3", nn::BatchNorm2d(planes * kExpansion));
    if (stride != 1 || inplanes != planes * kExpansion) {
      downsample_ = register_module(
          "downsample", nn::Sequential(conv(inplanes, planes * kExpansion, 1, stride, 0),
                                       nn::BatchNorm2d(planes * kExpansion)));
    }
  }
  torch::Tensor forward(torch::Tensor x) override {
    auto out = bn1_->forward(conv1_->forward(x)).relu_();
    out = bn2_->forward(conv2_->forward(out)).relu_();
    out = bn3_->forward(conv3_->forward(out));
    // out is fresh, so the in-place add and ReLU leave x alone.
    out += downsample_ ? downsample_->forward(x) : x;
    return out.relu_();
  }

 private:
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr}, bn3_{nullptr};
  nn::Sequential downsample_{nullptr};
};

/// ResNet head: adaptive avg-pool to 1x1, flatten, fc. Keys fc.*.
class ResNetHead : public Layer {
 public:
  ResNetHead(int64_t in, int64_t classes) : Layer("head", "") {
    fc_ = register_module("fc", nn::Linear(in, classes));
  }
  torch::Tensor forward(torch::Tensor x) override {
    return model::linear(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1), fc_->weight, fc_->bias);
  }

 private:
  nn::Linear fc_{nullptr};
};

// torchvision's re-initialisation loop (VGG.__init__, ResNet.__init__): convs get
// kaiming_normal_(fan_out, relu) and zero bias, BatchNorm weight 1 and bias 0, and,
// for vgg only, linears normal(0, 0.01) and zero bias. Everything else keeps the
// PyTorch default init that LibTorch's modules also use.
void initTorchvision(const Layers& layers, bool initLinear) {
  torch::NoGradGuard noGrad;
  for (const auto& layer : layers) {
    for (const auto& m : layer->modules(/*include_self=*/true)) {
      if (auto* c = m->as<nn::Conv2d>()) {
        nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
        if (c->bias.defined()) nn::init::zeros_(c->bias);
      } else if (auto* b = m->as<nn::BatchNorm2d>()) {
        nn::init::ones_(b->weight);
        nn::init::zeros_(b->bias);
      } else if (auto* l = m->as<nn::Linear>(); l && initLinear) {
        nn::init::normal_(l->weight, 0.0, 0.01);
        nn::init::zeros_(l->bias);
      }
    }
  }
}

enum class Dropout { AfterReLU, BeforeLinear };

// The fc6, fc7, fc8 head that torchvision's vgg and alexnet share: fc6 pools the
// `channels` feature maps to pool x pool and flattens, fc6 and fc7 are Linear + ReLU with
// model.dropout after the ReLU (vgg) or before the Linear (alexnet), fc8 is a bare Linear.
// `index` is each Linear's position in torchvision's `classifier` Sequential.
void appendClassifier(Layers& layers, int64_t channels, int64_t pool, const ModelOptions& o,
                      Dropout at, const std::array<const char*, 3>& index) {
  const int64_t hidden = scaled(4096, o.width);
  LinearLayer::Spec fc6{channels * pool * pool, hidden}, fc7{hidden, hidden},
      fc8{hidden, o.num_classes};
  fc6.avgPool = pool;
  for (LinearLayer::Spec* fc : {&fc6, &fc7})
    (at == Dropout::AfterReLU ? fc->dropAfter : fc->dropBefore) = o.dropout;
  fc8.relu = false;
  layers.push_back(std::make_shared<LinearLayer>("fc6", "classifier", index[0], fc6));
  layers.push_back(std::make_shared<LinearLayer>("fc7", "classifier", index[1], fc7));
  layers.push_back(std::make_shared<LinearLayer>("fc8", "classifier", index[2], fc8));
}

}  // namespace

// torchvision vgg16 (configuration "D"; vgg16_bn with model.batch_norm). Layers: conv1_1 .. conv5_3
// (each conv+ReLU, the following max-pool folded into the conv before it), then
// fc6 (avgpool 7x7 + flatten + classifier.0 + ReLU + dropout), fc7, fc8: 16 layers.
Layers buildVgg16(const ModelOptions& o) {
  // 'M' (max-pool) entries of torchvision's cfg are folded into the conv before them.
  const std::vector<std::vector<int64_t>> blocks = {
      {64, 64}, {128, 128}, {256, 256, 256}, {512, 512, 512}, {512, 512, 512}};
  Layers layers;
  int64_t in = o.channels;
  int64_t index = 0;  // index in torchvision's features Sequential
  for (size_t b = 0; b < blocks.size(); ++b) {
    for (size_t i = 0; i < blocks[b].size(); ++i) {
      const int64_t out = scaled(blocks[b][i], o.width);
      const bool last = i + 1 == blocks[b].size();
      ConvLayer::Spec s{in, out, 3, 1, 1, last ? 2 : 0, last ? 2 : 0, o.batch_norm};
      layers.push_back(
          std::make_shared<ConvLayer>("conv" + std::to_string(b + 1) + "_" + std::to_string(i + 1),
                                      "features", std::to_string(index), s));
      index += (last ? 3 : 2) + (o.batch_norm ? 1 : 0);  // conv, [BN,] ReLU [, MaxPool]
      in = out;
    }
  }
  appendClassifier(layers, in, 7, o, Dropout::AfterReLU, {"0", "3", "6"});
  initTorchvision(layers, /*initLinear=*/true);
  return layers;
}

// torchvision alexnet. Layers: conv1 (+pool), conv2 (+pool), conv3, conv4, conv5
// (+pool), fc6 (avgpool 6x6 + flatten + dropout + classifier.1 + ReLU), fc7, fc8:
// 8 layers. torchvision keeps PyTorch's default init here, and so do we.
Layers buildAlexNet(const ModelOptions& o) {
  const int64_t c1 = scaled(64, o.width), c2 = scaled(192, o.width), c3 = scaled(384, o.width),
                c4 = scaled(256, o.width), c5 = scaled(256, o.width);
  Layers layers;
  layers.push_back(std::make_shared<ConvLayer>("conv1", "features", "0",
                                               ConvLayer::Spec{o.channels, c1, 11, 4, 2, 3, 2}));
  layers.push_back(std::make_shared<ConvLayer>("conv2", "features", "3",
                                               ConvLayer::Spec{c1, c2, 5, 1, 2, 3, 2}));
  layers.push_back(
      std::make_shared<ConvLayer>("conv3", "features", "6", ConvLayer::Spec{c2, c3, 3, 1, 1}));
  layers.push_back(
      std::make_shared<ConvLayer>("conv4", "features", "8", ConvLayer::Spec{c3, c4, 3, 1, 1}));
  layers.push_back(std::make_shared<ConvLayer>("conv5", "features", "10",
                                               ConvLayer::Spec{c4, c5, 3, 1, 1, 3, 2}));
  appendClassifier(layers, c5, 6, o, Dropout::BeforeLinear, {"1", "4", "6"});
  return layers;
}

// torchvision resnet50: stem, 3+4+6+3 bottlenecks, head = 18 layers.
Layers buildResNet50(const ModelOptions& o) {
  const int64_t blocks[4] = {3, 4, 6, 3};
  const int64_t planes[4] = {64, 128, 256, 512};
  Layers layers;
  int64_t inplanes = scaled(64, o.width);
  layers.push_back(std::make_shared<StemLayer>(o.channels, inplanes));
  for (int s = 0; s < 4; ++s) {
    const int64_t p = scaled(planes[s], o.width);
    for (int64_t i = 0; i < blocks[s]; ++i) {
      const std::string key = "layer" + std::to_string(s + 1) + "." + std::to_string(i);
      const int64_t stride = (s > 0 && i == 0) ? 2 : 1;
      layers.push_back(std::make_shared<BottleneckLayer>(key, key, inplanes, p, stride));
      inplanes = p * BottleneckLayer::kExpansion;
    }
  }
  layers.push_back(std::make_shared<ResNetHead>(inplanes, o.num_classes));
  initTorchvision(layers, /*initLinear=*/false);
  return layers;
}

// mlp: flatten, then (Linear + ReLU) per hidden size x width, then a Linear
// classifier; one layer each. Keys are those of an nn.Sequential(Linear, ReLU,
// Linear, ReLU, ..., Linear) named "layers" applied to the flattened input:
// layers.0.*, layers.2.*, ... PyTorch's default init.
Layers buildMlp(const ModelOptions& o) {
  Layers layers;
  int64_t in = o.channels * o.input_size * o.input_size;
  for (size_t i = 0; i <= o.hidden.size(); ++i) {
    const bool last = i == o.hidden.size();
    LinearLayer::Spec s{in, last ? o.num_classes : scaled(o.hidden[i], o.width)};
    s.flatten = i == 0;
    s.relu = !last;
    layers.push_back(std::make_shared<LinearLayer>("fc" + std::to_string(i + 1), "layers",
                                                   std::to_string(2 * i), s));
    in = s.out;
  }
  return layers;
}

}  // namespace pipefb::model::detail
