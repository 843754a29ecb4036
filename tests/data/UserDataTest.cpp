// The user's own data (Notes [Tensors from Python] and [Token files] in
// src/data/UserData.cpp): token files in nanoGPT's and llm.c's layouts, and tensors
// written by Python's torch.save.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

#include "../TestUtil.h"
#include "pipefb/common/Error.h"
#include "pipefb/data/Dataset.h"

namespace fs = std::filesystem;
using namespace pipefb::data;

namespace {

pipefb::model::ModelOptions gpt2Tiny(std::int64_t t) {
  pipefb::model::ModelOptions m;
  m.name = "gpt2";
  m.size = "tiny";
  m.input_size = t;
  m.num_classes = 256;
  return m;
}

void writeTokens(const fs::path& p, const std::vector<std::uint16_t>& tokens, bool llmc) {
  std::ofstream out(p, std::ios::binary);
  if (llmc) {
    std::vector<std::int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 1;
    header[2] = static_cast<std::int32_t>(tokens.size());
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
  }
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(2 * tokens.size()));
}

}  // namespace

// A window of T + 1 tokens starts every T tokens: the input is its first T, the target its
// last T, in both layouts; the header is not read as tokens.
TEST(TokenFiles, WindowsOfBothLayoutsShiftTheTargetByOne) {
  const fs::path dir = pipefb::test::freshDir("token_files");
  std::vector<std::uint16_t> tokens(41);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>(i * 3 % 256);
  for (const bool llmc : {false, true}) {
    SCOPED_TRACE(llmc ? "llm.c" : "raw");
    const fs::path file = dir / (llmc ? "llmc.bin" : "raw.bin");
    writeTokens(file, tokens, llmc);
    DataOptions d;
    d.name = "tokens";
    d.path = file.string();
    auto set = makeDataset(d, gpt2Tiny(8), Split::Train, 0);
    ASSERT_EQ(set->size(), 5);  // (41 - 1) / 8
    EXPECT_EQ(set->numClasses(), 256);
    Batch b = set->get({0, 4});
    ASSERT_EQ(b.input.sizes(), (std::vector<std::int64_t>{2, 8}));
    ASSERT_EQ(b.input.scalar_type(), torch::kLong);
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(b.input[0][j].item<std::int64_t>(), tokens[j]);
      EXPECT_EQ(b.target[0][j].item<std::int64_t>(), tokens[j + 1]);
      EXPECT_EQ(b.input[1][j].item<std::int64_t>(), tokens[32 + j]);
      EXPECT_EQ(b.target[1][j].item<std::int64_t>(), tokens[33 + j]);
    }
  }
}

TEST(TokenFiles, AnIdBeyondTheVocabularyNamesTheFile) {
  const fs::path dir = pipefb::test::freshDir("token_files_vocab");
  writeTokens(dir / "t.bin", std::vector<std::uint16_t>(20, 300), false);
  DataOptions d;
  d.name = "tokens";
  d.path = (dir / "t.bin").string();
  try {
    makeDataset(d, gpt2Tiny(8), Split::Train, 0);
    FAIL() << "expected a UserError";
  } catch (const pipefb::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("t.bin: token id 300 does not fit model.num_classes 256"),
              std::string::npos)
        << e.what();
  }
}

// A file torch.save wrote in Python: float samples become float32, integer targets int64,
// and batches gather the rows asked for.
TEST(TensorsFromPython, ReadsWhatTorchSaveWrote) {
  const fs::path dir = pipefb::test::freshDir("tensors_from_python");
  const fs::path file = dir / "d.pt";
  auto r = pipefb::test::runCommand(
      std::string(PIPEFB_PYTHON) +
      " -c \"import torch; x = torch.arange(40, dtype=torch.float64).reshape(10, 1, 2, 2); "
      "torch.save({'x': x, 'y': torch.arange(10, dtype=torch.int32) % 3}, '" +
      file.string() + "')\"");
  ASSERT_EQ(r.code, 0) << r.out;
  DataOptions d;
  d.name = "tensors";
  d.path = file.string();
  pipefb::model::ModelOptions m;
  m.name = "mlp";
  m.channels = 1;
  m.input_size = 2;
  m.num_classes = 3;
  auto set = makeDataset(d, m, Split::Train, 0);
  ASSERT_EQ(set->size(), 10);
  Batch b = set->get({7, 2});
  ASSERT_EQ(b.input.scalar_type(), torch::kFloat);
  ASSERT_EQ(b.target.scalar_type(), torch::kLong);
  EXPECT_EQ(b.input.sizes(), (std::vector<std::int64_t>{2, 1, 2, 2}));
  EXPECT_EQ(b.input[0][0][0][0].item<float>(), 28.0f);
  EXPECT_EQ(b.input[1][0][1][1].item<float>(), 11.0f);
  EXPECT_EQ(b.target[0].item<std::int64_t>(), 1);
  EXPECT_EQ(b.target[1].item<std::int64_t>(), 2);
}

// A token file made here (a Markov chain over 64 ids: the successor 3 times in 4) in dir:
// train.bin raw (nanoGPT), val.bin its first 2000 tokens with llm.c's header.
static void markovTokenFiles(const fs::path& dir) {
  std::vector<std::uint16_t> tokens(20000);
  std::uint64_t s = 12345;
  auto next = [&] { return s = s * 6364136223846793005ULL + 1442695040888963407ULL; };
  for (size_t i = 1; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::uint16_t>((next() >> 62) != 0 ? (tokens[i - 1] * 7 + 1) % 64
                                                               : (next() >> 33) % 64);
  writeTokens(dir / "train.bin", tokens, false);
  writeTokens(dir / "val.bin", std::vector<std::uint16_t>(tokens.begin(), tokens.begin() + 2000),
              true);
}

// The losses of RUN/metrics.csv, a step each.
static std::vector<double> lossesOf(const fs::path& run) {
  std::ifstream csv(run / "metrics.csv");
  std::string line;
  std::getline(csv, line);  // header: step,epoch,loss,...
  std::vector<double> loss;
  while (std::getline(csv, line)) {
    const auto a = line.find(','), b = line.find(',', a + 1);
    loss.push_back(std::stod(line.substr(b + 1, line.find(',', b + 1) - b - 1)));
  }
  return loss;
}

// The first step's loss near ln 256 = 5.55, and the mean of the last five 1.5 nats below it.
static void expectLossFalls(const std::vector<double>& loss) {
  ASSERT_FALSE(loss.empty());
  EXPECT_GT(loss.front(), 5.0);
  double last = 0;
  for (size_t i = loss.size() - 5; i < loss.size(); ++i) last += loss[i] / 5;
  EXPECT_LT(last, loss.front() - 1.5) << "first " << loss.front() << ", last five " << last;
}

// Issue 34's goal: GPT-2 tiny on a token file made here trains in a pipeline, and its loss
// falls from about ln 256.
TEST(TokenFiles, Gpt2TinyLearnsATokenFileInAPipeline) {
  const fs::path dir = pipefb::test::freshDir("token_files_train");
  markovTokenFiles(dir);
  auto r = pipefb::test::runCommand(
      "cd " + dir.string() + " && " + PIPEFB_BINARY_DIR + "/pipefb_train --config " +
      PIPEFB_SOURCE_DIR +
      "/configs/gpt2-tiny.yaml --set data.name=tokens --set data.path=train.bin"
      " --set data.test_path=val.bin --set pipeline.schedule=1f1b --set devices.count=2"
      " --set pipeline.microbatches=2 --set training.lr=0.001 --set training.iterations=60"
      " --set output.dir=run");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("tokens train: 20000 tokens from train.bin (raw uint16 (nanoGPT))"),
            std::string::npos)
      << r.out;
  // The llm.c file's 2000 tokens after its header: (2000 - 1) / 64 windows.
  EXPECT_NE(r.out.find("on 31 samples"), std::string::npos) << r.out;
  const std::vector<double> loss = lossesOf(dir / "run");
  ASSERT_EQ(loss.size(), 60u);
  expectLossFalls(loss);
}

// And a GPT-like model written in Python (python/examples/tiny_gpt.py, with dropout),
// exported by the helper, trains on the same file in a pipeline (Note [TorchScript models]).
TEST(TokenFiles, AScriptedGptLearnsTheSameFile) {
  const fs::path dir = pipefb::test::freshDir("token_files_script");
  markovTokenFiles(dir);
  auto e =
      pipefb::test::runCommand("cd " + std::string(PIPEFB_SOURCE_DIR) + " && " + PIPEFB_PYTHON +
                               " python/pipefb_export.py module python.examples.tiny_gpt:make"
                               " --sample-shape 64 --input-dtype int64 -o " +
                               (dir / "gpt.pt").string());
  ASSERT_EQ(e.code, 0) << e.out;
  auto r = pipefb::test::runCommand(
      "cd " + dir.string() + " && " + PIPEFB_BINARY_DIR + "/pipefb_train --config " +
      PIPEFB_SOURCE_DIR +
      "/configs/gpt2-tiny.yaml --set model.name=torchscript --set model.path=gpt.pt"
      " --set model.sample_shape=[64] --set model.input_dtype=int64 --set model.num_classes=256"
      " --set data.name=tokens --set data.path=train.bin --set data.test_path=val.bin"
      " --set pipeline.schedule=pipefb-sync --set pipeline.stash=checkpoint"
      " --set devices.count=4 --set pipeline.microbatches=2 --set training.lr=0.001"
      " --set training.iterations=60 --set output.dir=run");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<double> loss = lossesOf(dir / "run");
  ASSERT_EQ(loss.size(), 60u);
  expectLossFalls(loss);
}
