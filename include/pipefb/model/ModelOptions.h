#pragma once
// Options of a model in the zoo. Torch-free so that the config layer and the
// planner can carry them without LibTorch. The checks (validate) and the derived
// sizes below live in the torch-free library pipefb_model_options.
#include <cstdint>
#include <string>
#include <vector>

namespace pipefb::model {

struct ModelOptions {
  /// vgg16 | alexnet | resnet50 | gpt2 | mlp | torchscript
  std::string name = "vgg16";
  /// torchscript only (Note [TorchScript models] in Model.h): the file torch.jit.save
  /// wrote, one sample's shape (no batch dimension) and its dtype (float32 | int64, or
  /// float64 for a model exported in double precision, to check against float64).
  std::string path;
  std::vector<int64_t> sample_shape;
  std::string input_dtype = "float32";
  /// Channel / hidden-size multiplier. 1.0 gives torchvision's shapes.
  double width = 1.0;
  /// Image side H = W (images), or sequence length T (gpt2).
  int64_t input_size = 224;
  /// Input channels (images). Ignored by gpt2.
  int64_t channels = 3;
  /// Output classes; for gpt2 the vocabulary size.
  int64_t num_classes = 1000;
  /// gpt2 only: tiny | small | medium | large | xl.
  std::string size = "small";
  /// mlp only: hidden layer sizes (before the width multiplier).
  std::vector<int64_t> hidden = {256, 256};
  /// Dropout probability where the reference model has dropout (vgg, alexnet, gpt2).
  /// Default 0 so that pipelined and single-device runs are comparable bit for bit.
  double dropout = 0.0;
  /// vgg16 only: torchvision's vgg16_bn (BatchNorm2d after every conv).
  bool batch_norm = false;
  /// gpt2 only: the loss over chunks of this many tokens (Note [Chunked loss] in
  /// model/ChunkedLoss.h); 0 = torch's cross_entropy over the whole microbatch.
  int64_t loss_chunk = 0;
};

/// The names the zoo knows, for error messages.
inline const std::vector<std::string>& modelNames() {
  static const std::vector<std::string> names = {"vgg16", "alexnet", "resnet50",
                                                 "gpt2",  "mlp",     "torchscript"};
  return names;
}
inline const std::vector<std::string>& gpt2Sizes() {
  static const std::vector<std::string> sizes = {"tiny", "small", "medium", "large", "xl"};
  return sizes;
}

/// Throws pipefb::UserError naming the key (model.name, model.width, model.size,
/// model.input_size, model.channels, model.num_classes, model.hidden, model.dropout),
/// the value it got and what is allowed. buildModel calls it; the config layer may
/// call it earlier without linking LibTorch.
void validate(const ModelOptions& options);

/// Takes token ids (int64 samples, a target per position): gpt2, and a torchscript model
/// with model.input_dtype int64.
bool isTokenModel(const ModelOptions& options);

/// One sample's shape, without the batch dimension: {T} for a token model, {C, H, H} for
/// the zoo's image models, model.sample_shape for a torchscript model.
std::vector<int64_t> sampleShape(const ModelOptions& options);

/// A key naming the model and every option that changes its shapes (profiles and plans
/// carry it, to be checked against a config). A torchscript model's names its file and
/// the CRC-32 of its bytes, so that a re-exported file is another model.
std::string modelKey(const ModelOptions& options);

/// Smallest model.input_size the model accepts: 32 for vgg16 (five 2x2 max-pools),
/// 63 for alexnet (stride-4 conv and three 3x3/2 max-pools), 1 otherwise.
int64_t minInputSize(const std::string& modelName);

/// A base channel / hidden count scaled by the width multiplier: max(1, round(base * width)).
int64_t scaled(int64_t base, double width);

/// GPT-2 hyper-parameters after the width multiplier (see Note [GPT-2 sizes] in Gpt2.cpp).
struct Gpt2Config {
  int64_t n_layer = 0;
  int64_t n_embd = 0;  // divisible by n_head
  int64_t n_head = 0;
  int64_t n_ctx = 0;  // = options.input_size (rows of wpe)
  int64_t vocab = 0;  // = options.num_classes
};
/// Requires options.name == "gpt2" and a valid options.size.
Gpt2Config gpt2Config(const ModelOptions& options);

}  // namespace pipefb::model
