// Note [TorchScript models] (Model.h): a module saved from Python as a chain of layers.
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/csrc/jit/runtime/jit_exception.h>
#include <torch/library.h>
#include <torch/script.h>

#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "Zoo.h"
#include "pipefb/common/Error.h"

namespace pipefb::model {
namespace {

// Note [Dropout streams]: the scripted dropouts, rewritten to these, draw from the thread's
// stream like the zoo's.
torch::Tensor scriptedDropout(const torch::Tensor& x, double p, bool train) {
  return model::dropout(x, p, train);
}
torch::Tensor scriptedFeatureDropout(const torch::Tensor& x, double p, bool train) {
  return model::featureDropout(x, p, train);
}

TORCH_LIBRARY(pipefb, m) {
  m.def("dropout(Tensor input, float p, bool train) -> Tensor", &scriptedDropout);
  m.def("feature_dropout(Tensor input, float p, bool train) -> Tensor", &scriptedFeatureDropout);
}

torch::ScalarType inputType(const ModelOptions& o) {
  return o.input_dtype == "int64"     ? torch::kLong
         : o.input_dtype == "float64" ? torch::kDouble
                                      : torch::kFloat;
}

// What an exception says, in one short line: the interpreter's own report ends with the
// failed op's error; a long first sentence keeps only itself.
std::string firstLine(const std::string& s) {
  std::string line = s.substr(0, s.find('\n'));
  if (line.rfind("The following operation failed", 0) == 0) {
    std::istringstream in(s);
    for (std::string l; std::getline(in, l);)
      if (l.find_first_not_of(" \t") != std::string::npos) line = l;
  }
  const size_t stop = line.find(". ");
  if (stop != std::string::npos) line = line.substr(0, stop);
  return line.size() > 300 ? line.substr(0, 300) + "..." : line;
}

std::string shapeText(torch::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

// Ops that draw random numbers, which a recompute could not repeat; dropout and
// feature_dropout are rewritten instead (rewriteRandomOps).
const std::set<std::string>& randomOps() {
  static const std::set<std::string> ops = {"aten::alpha_dropout",
                                            "aten::alpha_dropout_",
                                            "aten::feature_alpha_dropout",
                                            "aten::feature_alpha_dropout_",
                                            "aten::native_dropout",
                                            "aten::bernoulli",
                                            "aten::bernoulli_",
                                            "aten::rand",
                                            "aten::rand_like",
                                            "aten::randn",
                                            "aten::randn_like",
                                            "aten::randint",
                                            "aten::randint_like",
                                            "aten::randperm",
                                            "aten::normal",
                                            "aten::normal_",
                                            "aten::uniform_",
                                            "aten::multinomial",
                                            "aten::rrelu",
                                            "aten::rrelu_",
                                            "aten::rrelu_with_noise",
                                            "aten::exponential_"};
  return ops;
}

// Note [Dropout streams] for a TorchScript model: aten::dropout and aten::feature_dropout
// (and their in-place forms) become pipefb::dropout and pipefb::feature_dropout in every function
// of the module's compilation unit (its methods and the functions they call), before any runs; any
// other random op is refused. `owner` names the function for the message.
void rewriteRandomOps(torch::jit::Block* block, const std::string& file, const std::string& owner) {
  static const auto dropoutSym = c10::Symbol::fromQualString("aten::dropout");
  static const auto featureSym = c10::Symbol::fromQualString("aten::feature_dropout");
  // In place (nn.Dropout(inplace=True), and F.dropout's branch for it): run out of place,
  // its result replacing the in-place one's uses.
  static const auto dropoutInPlace = c10::Symbol::fromQualString("aten::dropout_");
  static const auto featureInPlace = c10::Symbol::fromQualString("aten::feature_dropout_");
  static const auto ours = c10::Symbol::fromQualString("pipefb::dropout");
  static const auto oursFeature = c10::Symbol::fromQualString("pipefb::feature_dropout");
  static const auto sdpa = c10::Symbol::fromQualString("aten::scaled_dot_product_attention");
  auto zero = [](torch::jit::Value* v) {
    const auto c = torch::jit::toIValue(v);
    return c.has_value() && (c->isDouble() || c->isInt()) && c->toScalar().toDouble() == 0.0;
  };
  for (auto it = block->nodes().begin(); it != block->nodes().end(); ++it) {
    torch::jit::Node* n = *it;
    for (torch::jit::Block* b : n->blocks()) rewriteRandomOps(b, file, owner);
    const c10::Symbol k = n->kind();
    const bool plain = k == dropoutSym || k == dropoutInPlace;
    if (plain || k == featureSym || k == featureInPlace) {
      torch::jit::Node* r =
          block->owningGraph()->create(plain ? ours : oursFeature, n->inputs(), 1);
      r->insertBefore(n);
      r->output()->setType(n->output()->type());
      n->output()->replaceAllUsesWith(r->output());
      it.destroyCurrent();
    } else if (k == sdpa && n->inputs().size() > 4 && !zero(n->input(4))) {
      // Its dropout_p draws inside the op, from the global generator.
      throw UserError(file + ": " + owner +
                      " calls aten::scaled_dot_product_attention with a dropout_p that is not "
                      "a constant 0, whose random draws a recompute cannot repeat; give "
                      "dropout_p=0.0 and an nn.Dropout after it");
    } else if (randomOps().count(k.toQualString())) {
      throw UserError(file + ": " + owner + " calls " + k.toQualString() +
                      ", whose random draws a recompute cannot repeat; pipefb replays "
                      "nn.Dropout and nn.Dropout1d/2d/3d only");
    }
  }
}

class Holder : public torch::nn::Module {};

// Registers the scripted module's own parameters and buffers on `into` (the same tensors)
// and mirrors its children, so that named_parameters() and named_buffers() of `into`
// walk the module's state_dict keys and update the tensors the script runs on.
void mirror(torch::nn::Module& into, const torch::jit::Module& from) {
  for (const auto& p : from.named_parameters(/*recurse=*/false))
    into.register_parameter(p.name, p.value, /*requires_grad=*/true);
  for (const auto& b : from.named_buffers(/*recurse=*/false)) into.register_buffer(b.name, b.value);
  for (const auto& c : from.named_children()) {
    auto h = std::make_shared<Holder>();
    into.register_module(c.name, h);
    mirror(*h, c.value);
  }
}

// Mirrors `from` at `prefix` under `into` (a dotted path of holders; "" is `into` itself).
void mirrorAt(torch::nn::Module& into, const std::string& prefix, const torch::jit::Module& from) {
  if (prefix.empty()) return mirror(into, from);
  const size_t dot = prefix.find('.');
  const std::string head = prefix.substr(0, dot);
  std::shared_ptr<torch::nn::Module> h;
  for (const auto& c : into.named_children())
    if (c.key() == head) h = c.value();
  if (!h) h = into.register_module(head, std::make_shared<Holder>());
  mirrorAt(*h, dot == std::string::npos ? "" : prefix.substr(dot + 1), from);
}

// One layer: a child, or leading children without parameters and the first child with
// some (a stage's output must need a gradient: a Flatten alone would be a stage with
// nothing to train and no graph to run backward through).
class ScriptedLayer : public Layer {
 public:
  struct Child {
    std::string name, prefix;
    torch::jit::Module module;
  };
  explicit ScriptedLayer(std::vector<Child> children)
      : Layer(joinedNames(children), ""), children_(std::move(children)) {
    for (auto& c : children_) mirrorAt(*this, c.prefix, c.module);
  }
  torch::Tensor forward(torch::Tensor x) override {
    for (auto& c : children_) {
      try {
        x = c.module.forward({std::move(x)}).toTensor();
      } catch (const torch::jit::JITException& e) {
        // A Python exception inside the script (a BatchNorm on one value a channel, say)
        // fails like a LibTorch op does, as c10::Error (the profiler skips such sizes).
        TORCH_CHECK(false, "child '", c.name, "': ", e.what());
      }
    }
    return x;
  }
  void train(bool on) override {
    Layer::train(on);
    for (auto& c : children_) c.module.train(on);
  }
  std::vector<Child>& children() { return children_; }

 private:
  static std::string joinedNames(const std::vector<Child>& cs) {
    std::string out;
    for (const auto& c : cs) out += (out.empty() ? "" : "+") + c.name;
    return out;
  }
  std::vector<Child> children_;
};

// Note [TorchScript models]: the checks run once per file and process (the runtime loads
// the file again for each stage's weight copies).
void checkChain(const ModelOptions& o, torch::jit::Module& top,
                const std::vector<std::shared_ptr<ScriptedLayer>>& layers) {
  const std::string& file = o.path;
  const bool tokens = o.input_dtype == "int64";
  std::vector<int64_t> shape = {2};
  shape.insert(shape.end(), o.sample_shape.begin(), o.sample_shape.end());
  auto gen = at::detail::createCPUGenerator(0);
  const torch::Tensor input = tokens ? torch::randint(0, o.num_classes, shape, gen, torch::kLong)
                                     : torch::randn(shape, gen, inputType(o));
  torch::NoGradGuard noGrad;
  top.eval();
  for (auto& l : layers) l->eval();
  torch::Tensor x = input;
  std::string from =
      "the input (model.sample_shape " + shapeText(o.sample_shape) + ", " + o.input_dtype + ")";
  std::string last;
  for (auto& l : layers)
    for (auto& c : l->children()) {
      c10::IValue y;
      try {
        y = c.module.forward({x});
      } catch (const std::exception& e) {
        throw UserError(file + ": child '" + c.name + "' fails on " + from + " of shape " +
                        shapeText(x.sizes()) + ": " + firstLine(e.what()));
      }
      if (!y.isTensor())
        throw UserError(file + ": child '" + c.name + "' returns a " + y.tagKind() +
                        "; every child must return one tensor, the next child's input");
      x = y.toTensor();
      from = "child '" + c.name + "''s output";
      last = c.name;
    }
  const bool classes = x.dim() == 2 && x.size(1) == o.num_classes;
  const bool perToken =
      tokens && x.dim() == 3 && x.size(1) == o.sample_shape[0] && x.size(2) == o.num_classes;
  if (!(tokens ? perToken : classes))
    throw UserError(file + ": the last child '" + last + "' gives " + shapeText(x.sizes()) +
                    " for a batch of 2; the loss takes " +
                    (tokens
                         ? "(B, T, model.num_classes) = (2, " + std::to_string(o.sample_shape[0]) +
                               ", " + std::to_string(o.num_classes) + ")"
                         : "(B, model.num_classes) = (2, " + std::to_string(o.num_classes) + ")") +
                    "; set model.num_classes, or end the chain with the classifier");
  // The children in order must be the module's own forward (a ResNet's flatten between
  // its pool and its classifier is not a child, for one).
  if (auto fwd = top.find_method("forward")) {
    c10::IValue whole;
    try {
      whole = (*fwd)({input});
    } catch (const std::exception& e) {
      throw UserError(file +
                      ": the module's own forward fails on the input: " + firstLine(e.what()));
    }
    if (!whole.isTensor() || !whole.toTensor().sizes().equals(x.sizes()) ||
        !torch::allclose(whole.toTensor(), x, 1e-5, 1e-6))
      throw UserError(file +
                      ": the module's forward is not its children run one after another; "
                      "export an nn.Sequential of its blocks (python/pipefb_export.py)");
  }
}

}  // namespace

namespace detail {

std::shared_ptr<Model> buildTorchScript(const ModelOptions& o) {
  // Note [TorchScript models]: the interpreter runs each op as eager LibTorch does (its
  // autograd, saved-tensor hooks and allocations), with no fusion or graph-level autograd.
  torch::jit::setGraphExecutorOptimize(false);
  const std::string& file = o.path;
  torch::jit::Module top;
  try {
    top = torch::jit::load(file, torch::kCPU);
  } catch (const std::exception& e) {
    throw UserError(file + ": not a TorchScript file torch.jit.save wrote (model.path): " +
                    firstLine(e.what()));
  }
  const auto cu = top._ivalue()->compilation_unit();
  for (torch::jit::Function* f : cu->get_functions())
    if (auto* g = torch::jit::tryToGraphFunction(*f))
      rewriteRandomOps(g->graph()->block(), file, f->qualname().qualifiedName());
  std::vector<std::string> prefixes;
  if (top.hasattr("pipefb_key_prefixes")) {
    for (const auto& v : top.attr("pipefb_key_prefixes").toListRef())
      prefixes.push_back(v.toStringRef());
  }
  std::vector<ScriptedLayer::Child> children;
  for (const auto& c : top.named_children()) {
    const size_t i = children.size();
    children.push_back({c.name, i < prefixes.size() ? prefixes[i] : c.name, c.value});
  }
  if (children.empty())
    throw UserError(file +
                    ": the module has no children; pipefb trains a chain of layers, a module's "
                    "children run one after another (an nn.Sequential)");
  if (!prefixes.empty() && prefixes.size() != children.size())
    throw UserError(file + ": pipefb_key_prefixes has " + std::to_string(prefixes.size()) +
                    " entries for " + std::to_string(children.size()) + " children");
  std::vector<std::shared_ptr<ScriptedLayer>> scripted;
  std::vector<ScriptedLayer::Child> leading;  // children without parameters, not yet placed
  for (auto& c : children) {
    leading.push_back(std::move(c));
    const bool params = leading.back().module.parameters(/*recurse=*/true).size() > 0;
    if (params || !scripted.empty()) {
      scripted.push_back(std::make_shared<ScriptedLayer>(std::move(leading)));
      leading.clear();
    }
  }
  if (scripted.empty())
    throw UserError(file + ": the module has no parameters; there is nothing to train");
  // A tensor in two children (tied weights) would be two parameters of two stages.
  std::map<const void*, std::string> owner;
  for (const auto& l : scripted)
    for (const auto& p : l->named_parameters()) {
      const std::string key = detail::joinKey(l->keyPrefix(), p.key());
      auto [it, fresh] = owner.emplace(p.value().unsafeGetTensorImpl(), key);
      if (!fresh)
        throw UserError(file + ": parameters " + it->second + " and " + key +
                        " are one tensor (tied weights); pipefb partitions children, so a "
                        "shared tensor must live in one child");
    }
  static std::mutex mu;
  static std::set<std::string> checked;
  const std::string key = modelKey(o);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!checked.count(key)) {
      checkChain(o, top, scripted);
      checked.insert(key);
    }
  }
  Layers layers(scripted.begin(), scripted.end());
  return std::make_shared<Model>(o, std::move(layers), o.sample_shape, inputType(o));
}

}  // namespace detail
}  // namespace pipefb::model
