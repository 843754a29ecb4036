// Note [Split backward in the runtime] (model/SplitBackward.h): I's input gradient and W's
// weight gradients are B's, W runs none of the activation-gradient chain again, and a
// weight used twice in a stage is not counted twice.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include "pipefb/model/Model.h"
#include "pipefb/model/SplitBackward.h"

namespace pipefb::model {
namespace {

double relErr(const torch::Tensor& got, const torch::Tensor& want) {
  const auto d = (got - want).abs().max().item<double>();
  return d / std::max(want.abs().max().item<double>(), 1e-300);
}

// Counts the calls of the node it is put on.
struct CountCalls : torch::autograd::FunctionPreHook {
  explicit CountCalls(int* n) : n_(n) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& g) override {
    ++*n_;
    return g;
  }
  int* n_;
};

// y = W2 relu(W1 x + b1) (+ W1 again when `shared`), in float64.
struct Net {
  torch::Tensor w1 = torch::randn({6, 5}, torch::kFloat64).requires_grad_(true);
  torch::Tensor b1 = torch::randn({6}, torch::kFloat64).requires_grad_(true);
  torch::Tensor w2 = torch::randn({5, 6}, torch::kFloat64).requires_grad_(true);
  std::vector<torch::Tensor> params() const { return {w1, b1, w2}; }
  torch::Tensor forward(const torch::Tensor& x, bool shared) const {
    auto h = torch::relu(torch::addmm(b1, x, w1.t()));
    auto y = torch::mm(h, w2.t());
    return shared ? torch::mm(torch::tanh(y), w1.t().narrow(0, 0, 5).narrow(1, 0, 5)) + y : y;
  }
};

TEST(SplitBackward, GivesBsGradientsWhetherOrNotAWeightIsUsedTwice) {
  torch::manual_seed(5);
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "W1 used twice" : "each weight once");
    Net net;
    const auto x0 = torch::randn({4, 5}, torch::kFloat64);
    const auto gy = torch::randn({4, 5}, torch::kFloat64);
    // B: every gradient at once.
    auto x = x0.clone().requires_grad_(true);
    std::vector<torch::Tensor> wrt = net.params();
    wrt.push_back(x);
    const auto want = torch::autograd::grad({net.forward(x, shared)}, wrt, {gy});
    // I, then W.
    x = x0.clone().requires_grad_(true);
    DeferredWeightGrad w;
    w.output = net.forward(x, shared);
    w.gradOut = gy;
    const auto gin = inputGradient(w, x, net.params());
    EXPECT_FALSE(w.output.defined());  // I lets the output go
    EXPECT_GT(keptBytes(w), 0);
    ASSERT_TRUE(gin.defined());
    EXPECT_LT(relErr(gin, want[3]), 1e-12);
    const auto g = weightGradients(w, net.params());
    ASSERT_EQ(g.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(g[i].defined()) << i;
      EXPECT_LT(relErr(g[i], want[i]), 1e-12) << "parameter " << i;
    }
  }
}

TEST(SplitBackward, WRunsNoActivationGradientAgain) {
  torch::manual_seed(6);
  Net net;
  auto x = torch::randn({4, 5}, torch::kFloat64).requires_grad_(true);
  DeferredWeightGrad w;
  w.output = net.forward(x, false);
  w.gradOut = torch::ones_like(w.output);
  // relu's node lies between the two weight nodes, on the input's path only.
  const auto relu = w.output.grad_fn()->next_edge(0).function;
  ASSERT_NE(relu, nullptr);
  ASSERT_NE(std::string(relu->name()).find("Relu"), std::string::npos) << relu->name();
  int calls = 0;
  relu->add_pre_hook(std::make_unique<CountCalls>(&calls));
  inputGradient(w, x, net.params());
  EXPECT_EQ(calls, 1);
  // mm's kept gradient is the output's: 4 x 5; addmm's, 4 x 6.
  EXPECT_EQ(keptBytes(w), (4 * 5 + 4 * 6) * 8);
  const auto g = weightGradients(w, net.params());
  EXPECT_EQ(calls, 1);  // W went from the weight nodes straight to the weights
  EXPECT_TRUE(g[0].defined() && g[1].defined() && g[2].defined());
}

TEST(SplitBackward, AStageWithoutAnInputGradientRunsWFromItsOutput) {
  torch::manual_seed(7);
  Net net;
  const auto x = torch::randn({4, 5}, torch::kFloat64);  // stage 0: no input gradient
  const auto want = torch::autograd::grad({net.forward(x, false)}, net.params(),
                                          {torch::ones({4, 5}, torch::kFloat64)});
  DeferredWeightGrad w;
  w.output = net.forward(x, false);
  w.gradOut = torch::ones_like(w.output);
  EXPECT_FALSE(inputGradient(w, x, net.params()).defined());
  EXPECT_EQ(keptBytes(w), 0);
  const auto g = weightGradients(w, net.params());
  for (size_t i = 0; i < 3; ++i) EXPECT_LT(relErr(g[i], want[i]), 1e-12) << "parameter " << i;
}

}  // namespace
}  // namespace pipefb::model
