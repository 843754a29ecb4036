// GPT-2 as a chain of layers: embed (wte + wpe), one layer per transformer block,
// head (ln_f + lm_head). Parameter names are Hugging Face's GPT2LMHeadModel names
// (transformer.wte.weight, transformer.h.0.attn.c_attn.weight, ..., lm_head.weight);
// like HF's Conv1D, c_attn / c_proj / c_fc store their weight as (in, out).
//
// Differences from GPT2LMHeadModel, on purpose:
//  * lm_head is NOT tied to wte. A tied head would put one parameter in the first
//    and the last stage; untied, every stage owns its weights and pipeline stages
//    stay independent. (A HF checkpoint loads with lm_head.weight = wte.weight.)
//  * wpe has options.input_size rows (the sequence length we train at), not 1024.
//  * The causal mask is built in forward, not stored as the attn.bias buffer.
#include <cmath>

#include "Zoo.h"
#include "pipefb/common/Error.h"

namespace pipefb::model::detail {
namespace {

namespace nn = torch::nn;

constexpr double kInitStd = 0.02;
constexpr double kLayerNormEps = 1e-5;

/// HF's Conv1D: y = x W + b with W stored as (nx, nf).
class Conv1DImpl : public nn::Module {
 public:
  Conv1DImpl(int64_t nx, int64_t nf) {
    weight = register_parameter("weight", torch::empty({nx, nf}));
    bias = register_parameter("bias", torch::zeros({nf}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    // Note [Weight gradients into .grad] in Model.h.
    return model::linear(x, weight, bias, /*weightIsInByOut=*/true);
  }
  torch::Tensor weight, bias;
};
TORCH_MODULE(Conv1D);

class AttentionImpl : public nn::Module {
 public:
  AttentionImpl(int64_t dim, int64_t heads, double dropout)
      : dim_(dim), heads_(heads), dropout_(dropout) {
    c_attn = register_module("c_attn", Conv1D(dim, 3 * dim));
    c_proj = register_module("c_proj", Conv1D(dim, dim));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), hd = dim_ / heads_;
    auto qkv = c_attn->forward(x).split(dim_, /*dim=*/2);  // 3 x (B,T,D)
    auto heads = [&](const torch::Tensor& t) { return t.view({B, T, heads_, hd}).transpose(1, 2); };
    auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);  // (B,H,T,hd)
    auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    auto future = torch::ones({T, T}, x.options().dtype(torch::kBool)).triu(1);  // (T,T)
    att = torch::softmax(att.masked_fill(future, -std::numeric_limits<float>::infinity()), -1);
    if (dropout_ > 0) att = model::dropout(att, dropout_, is_training());
    auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, dim_});  // (B,T,D)
    y = c_proj->forward(y);
    if (dropout_ > 0) y = model::dropout(y, dropout_, is_training());
    return y;
  }
  Conv1D c_attn{nullptr}, c_proj{nullptr};

 private:
  int64_t dim_, heads_;
  double dropout_;
};
TORCH_MODULE(Attention);

class MlpImpl : public nn::Module {
 public:
  MlpImpl(int64_t dim, double dropout) : dropout_(dropout) {
    c_fc = register_module("c_fc", Conv1D(dim, 4 * dim));
    c_proj = register_module("c_proj", Conv1D(4 * dim, dim));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    // GPT-2's "gelu_new" is the tanh approximation.
    auto y = c_proj->forward(torch::gelu(c_fc->forward(x), "tanh"));
    if (dropout_ > 0) y = model::dropout(y, dropout_, is_training());
    return y;
  }
  Conv1D c_fc{nullptr}, c_proj{nullptr};

 private:
  double dropout_;
};
TORCH_MODULE(Mlp);

nn::LayerNorm layerNorm(int64_t dim) {
  return nn::LayerNorm(nn::LayerNormOptions({dim}).eps(kLayerNormEps));
}

/// (B,T) token ids -> (B,T,D). Keys transformer.wte.weight, transformer.wpe.weight.
class EmbedLayer : public Layer {
 public:
  EmbedLayer(const Gpt2Config& c, double dropout)
      : Layer("embed", "transformer"), n_ctx_(c.n_ctx), dropout_(dropout) {
    wte_ = register_module("wte", nn::Embedding(c.vocab, c.n_embd));
    wpe_ = register_module("wpe", nn::Embedding(c.n_ctx, c.n_embd));
  }
  torch::Tensor forward(torch::Tensor idx) override {
    if (idx.dim() != 2 || idx.size(1) > n_ctx_) {
      throw UserError("model.input_size: gpt2 was built for sequences of at most " +
                      std::to_string(n_ctx_) + " tokens as (B,T) ids; got shape " +
                      c10::str(idx.sizes()));
    }
    auto pos = torch::arange(idx.size(1), idx.options().dtype(torch::kLong));  // (T)
    auto x = wte_->forward(idx) + wpe_->forward(pos);                          // (B,T,D)
    if (dropout_ > 0) x = model::dropout(x, dropout_, is_training());
    return x;
  }

 private:
  int64_t n_ctx_;
  double dropout_;
  nn::Embedding wte_{nullptr}, wpe_{nullptr};
};

/// Pre-LN block: x + attn(ln_1(x)), then + mlp(ln_2(.)). Keys transformer.h.<i>.*.
class BlockLayer : public Layer {
 public:
  BlockLayer(int64_t i, const Gpt2Config& c, double dropout)
      : Layer("block" + std::to_string(i), "transformer.h." + std::to_string(i)) {
    ln_1_ = register_module("ln_1", layerNorm(c.n_embd));
    attn_ = register_module("attn", Attention(c.n_embd, c.n_head, dropout));
    ln_2_ = register_module("ln_2", layerNorm(c.n_embd));
    mlp_ = register_module("mlp", Mlp(c.n_embd, dropout));
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = x + attn_->forward(ln_1_->forward(x));
    return x + mlp_->forward(ln_2_->forward(x));
  }

 private:
  nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  Attention attn_{nullptr};
  Mlp mlp_{nullptr};
};

/// ln_f + untied lm_head: (B,T,D) -> (B,T,V) logits. Keys transformer.ln_f.*, lm_head.weight.
class HeadLayer : public Layer {
 public:
  explicit HeadLayer(const Gpt2Config& c) : Layer("head", "") {
    // "transformer" is an empty holder so that ln_f's key is transformer.ln_f.*
    // (LibTorch module names cannot contain dots).
    auto holder = register_module("transformer", std::make_shared<nn::Module>());
    ln_f_ = holder->register_module("ln_f", layerNorm(c.n_embd));
    lm_head_ =
        register_module("lm_head", nn::Linear(nn::LinearOptions(c.n_embd, c.vocab).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) override {
    return model::linear(ln_f_->forward(x), lm_head_->weight, torch::Tensor());
  }

 private:
  nn::LayerNorm ln_f_{nullptr};
  nn::Linear lm_head_{nullptr};
};

}  // namespace

// GPT-2 init (HF _init_weights): linear / Conv1D / embedding weights normal(0, 0.02),
// biases 0, LayerNorm weight 1 bias 0, and the residual projections (c_proj.weight)
// normal(0, 0.02 / sqrt(2 * n_layer)).
Layers buildGpt2(const ModelOptions& o) {
  const Gpt2Config c = gpt2Config(o);
  Layers layers;
  layers.push_back(std::make_shared<EmbedLayer>(c, o.dropout));
  for (int64_t i = 0; i < c.n_layer; ++i)
    layers.push_back(std::make_shared<BlockLayer>(i, c, o.dropout));
  layers.push_back(std::make_shared<HeadLayer>(c));

  torch::NoGradGuard noGrad;
  const double projStd = kInitStd / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  for (const auto& layer : layers) {
    for (const auto& m : layer->named_modules("", /*include_self=*/true)) {
      const std::string& name = m.key();
      if (auto* conv = m.value()->as<Conv1D>()) {
        const bool proj = name.size() >= 6 && name.compare(name.size() - 6, 6, "c_proj") == 0;
        nn::init::normal_(conv->weight, 0.0, proj ? projStd : kInitStd);
        nn::init::zeros_(conv->bias);
      } else if (auto* lin = m.value()->as<nn::Linear>()) {
        nn::init::normal_(lin->weight, 0.0, kInitStd);
      } else if (auto* emb = m.value()->as<nn::Embedding>()) {
        nn::init::normal_(emb->weight, 0.0, kInitStd);
      } else if (auto* ln = m.value()->as<nn::LayerNorm>()) {
        nn::init::ones_(ln->weight);
        nn::init::zeros_(ln->bias);
      }
    }
  }
  return layers;
}

}  // namespace pipefb::model::detail
