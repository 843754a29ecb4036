// Torch-free checks and derived sizes of ModelOptions (library pipefb_model_options).
#include "pipefb/model/ModelOptions.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "pipefb/common/Error.h"

namespace pipefb::model {
namespace {

std::string joined(const std::vector<std::string>& xs) {
  std::string out;
  for (const auto& x : xs) out += (out.empty() ? "" : ", ") + x;
  return out;
}

[[noreturn]] void fail(const std::string& key, const std::string& msg) {
  throw UserError(key + ": " + msg);
}

bool contains(const std::vector<std::string>& xs, const std::string& x) {
  return std::find(xs.begin(), xs.end(), x) != xs.end();
}

}  // namespace

int64_t minInputSize(const std::string& modelName) {
  // vgg16: 32 -> 16 -> 8 -> 4 -> 2 -> 1 through five 2x2/2 max-pools; 31 would reach 0.
  if (modelName == "vgg16") return 32;
  // alexnet: conv 11x11/4 pad 2 gives floor((H-7)/4)+1, then three 3x3/2 max-pools
  // need 15 -> 7 -> 3 -> 1, so H - 7 >= 56.
  if (modelName == "alexnet") return 63;
  return 1;
}

int64_t scaled(int64_t base, double width) {
  return std::max<int64_t>(1,
                           static_cast<int64_t>(std::llround(static_cast<double>(base) * width)));
}

void validate(const ModelOptions& o) {
  if (!contains(modelNames(), o.name)) {
    fail("model.name", "unknown model '" + o.name + "'; allowed: " + joined(modelNames()));
  }
  if (!std::isfinite(o.width) || o.width <= 0.0) {
    std::ostringstream os;
    os << "got " << o.width
       << "; must be a finite number > 0 (1.0 gives the reference shapes, 0.125 a small model)";
    fail("model.width", os.str());
  }
  if (!std::isfinite(o.dropout) || o.dropout < 0.0 || o.dropout >= 1.0) {
    std::ostringstream os;
    os << "got " << o.dropout << "; must be in [0, 1)";
    fail("model.dropout", os.str());
  }
  if (o.num_classes < 1) {
    fail("model.num_classes", "got " + std::to_string(o.num_classes) +
                                  (o.name == "gpt2" ? " (the gpt2 vocabulary size)" : "") +
                                  "; must be >= 1");
  }
  if (o.batch_norm && o.name != "vgg16")
    fail("model.batch_norm", "only vgg16 has a batch-norm variant (vgg16_bn); got true for " +
                                 o.name + "; allowed: false");
  const int64_t minSize = minInputSize(o.name);
  if (o.input_size < minSize) {
    std::string why = o.name == "gpt2" ? " (the gpt2 sequence length)" : "";
    if (o.name == "alexnet") {
      why =
          " (alexnet's stride-4 first conv and three 3x3/2 max-pools need it; set "
          "model.input_size=64 and let the data be padded/resized)";
    } else if (o.name == "vgg16") {
      why =
          " (vgg16's five 2x2 max-pools need it; set model.input_size=32 and let the data be "
          "padded/resized)";
    }
    fail("model.input_size", "got " + std::to_string(o.input_size) + " for " + o.name +
                                 "; must be >= " + std::to_string(minSize) + why);
  }
  if (o.name != "gpt2" && o.channels < 1) {
    fail("model.channels", "got " + std::to_string(o.channels) + "; must be >= 1");
  }
  if (o.name == "gpt2" && !contains(gpt2Sizes(), o.size)) {
    fail("model.size", "unknown gpt2 size '" + o.size + "'; allowed: " + joined(gpt2Sizes()));
  }
  if (o.name == "mlp") {
    for (size_t i = 0; i < o.hidden.size(); ++i) {
      if (o.hidden[i] < 1) {
        fail("model.hidden", "entry " + std::to_string(i) + " is " + std::to_string(o.hidden[i]) +
                                 "; every hidden size must be >= 1");
      }
    }
  }
}

// Note [GPT-2 sizes]
// tiny is ours (2 layers, 128 dim, 4 heads) for tests; the others are OpenAI's.
// The width multiplier scales the embedding dim and rounds it to a multiple of the
// head count (at least one dim per head); layers and heads stay as they are.
Gpt2Config gpt2Config(const ModelOptions& o) {
  struct Row {
    const char* size;
    int64_t layers, dim, heads;
  };
  static const Row rows[] = {{"tiny", 2, 128, 4},
                             {"small", 12, 768, 12},
                             {"medium", 24, 1024, 16},
                             {"large", 36, 1280, 20},
                             {"xl", 48, 1600, 25}};
  for (const auto& r : rows) {
    if (o.size != r.size) continue;
    Gpt2Config c;
    c.n_layer = r.layers;
    c.n_head = r.heads;
    const double perHead = static_cast<double>(r.dim) * o.width / static_cast<double>(r.heads);
    c.n_embd = r.heads * std::max<int64_t>(1, static_cast<int64_t>(std::llround(perHead)));
    c.n_ctx = o.input_size;
    c.vocab = o.num_classes;
    return c;
  }
  fail("model.size", "unknown gpt2 size '" + o.size + "'; allowed: " + joined(gpt2Sizes()));
}

}  // namespace pipefb::model
