// Without a GPU (every machine CI runs on): the programs link the CUDA LibTorch yet start
// without a GPU driver (Note [One LibTorch]), and devices.kind: cuda refuses to run and
// says why (Note [No silent fallback]). On a GPU host these tests skip.
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "TestUtil.h"
#include "pipefb/common/Error.h"
#include "pipefb/config/Config.h"
#include "pipefb/runtime/DeviceKind.h"

using namespace pipefb;

namespace {

std::string dynamicSection(const std::string& program) {
  const auto r = test::runCommand("readelf -d " + std::string(PIPEFB_BINARY_DIR) + "/" + program);
  EXPECT_EQ(r.code, 0) << r.out;
  return r.out;
}

}  // namespace

TEST(NoGpu, ProgramsLinkTheCudaLibTorchButNotTheDriver) {
  // The programs that run models link LibTorch; the planner's and the launcher's do not.
  const std::vector<std::string> torchPrograms = {"pipefb_train", "pipefb_profile"};
  for (const std::string program :
       {"pipefb_train", "pipefb_profile", "pipefb_plan", "pipefb_sweep", "pipefb_launch"}) {
    const std::string needed = dynamicSection(program);
    if (std::find(torchPrograms.begin(), torchPrograms.end(), program) != torchPrograms.end()) {
      EXPECT_NE(needed.find("[libtorch_cuda.so]"), std::string::npos) << program << ":\n" << needed;
      EXPECT_NE(needed.find("[libc10_cuda.so]"), std::string::npos) << program << ":\n" << needed;
    }
    EXPECT_EQ(needed.find("libcuda.so"), std::string::npos) << program << ":\n" << needed;
    // Every library it needs resolves on this machine, which has no driver.
    const auto ldd = test::runCommand("ldd " + std::string(PIPEFB_BINARY_DIR) + "/" + program);
    EXPECT_EQ(ldd.code, 0) << ldd.out;
    EXPECT_EQ(ldd.out.find("not found"), std::string::npos) << program << ":\n" << ldd.out;
    EXPECT_EQ(ldd.out.find("libcuda.so.1"), std::string::npos) << program << ":\n" << ldd.out;
  }
  // And the CUDA one starts: its CPU path runs to a clean exit.
  const auto help = test::runCommand(std::string(PIPEFB_BINARY_DIR) + "/pipefb_train --help");
  EXPECT_EQ(help.code, 0) << help.out;
}

TEST(NoGpu, StdSymbolsBindToTheSystemLibstdcxx) {
  // libtorch.so exports a std::filesystem of its own that crashes here (Note [One
  // LibTorch]): the system libstdc++ must come first among what a binary needs.
  const std::string needed = dynamicSection("pipefb_train");
  const auto first = needed.find("(NEEDED)");
  ASSERT_NE(first, std::string::npos) << needed;
  EXPECT_EQ(needed.find("[libstdc++.so.6]", first), needed.find('[', first)) << needed;
  const auto dir = std::filesystem::temp_directory_path() / "pipefb_no_gpu_fs";
  std::filesystem::create_directories(dir / "a" / "b");
  EXPECT_EQ(std::filesystem::remove_all(dir), 3u);
}

TEST(NoGpu, TheCudaBackendIsRegisteredAtStart) {
  // libtorch_cuda registers CUDA with ATen when it loads (--no-as-needed keeps it linked).
  EXPECT_TRUE(at::globalContext().hasCUDART());
}

TEST(NoGpu, DevicesKindCudaRefusesAndSaysWhy) {
  if (torch::cuda::device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  config::Config c;
  c.devices.kind = "cuda";
  try {
    runtime::checkDeviceKind(c);
    FAIL() << "devices.kind: cuda ran without a GPU";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("devices.kind: cuda cannot run here: ", 0), 0u) << what;
    EXPECT_NE(what.find("no GPU is visible"), std::string::npos) << what;
    EXPECT_NE(what.find("allowed here: devices.kind: cpu"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;  // one line
  }
  c.devices.kind = "cpu";
  EXPECT_EQ(runtime::checkDeviceKind(c), runtime::DeviceKind::Cpu);
}
