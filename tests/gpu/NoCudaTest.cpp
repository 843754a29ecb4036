// With a CPU-only LibTorch (the Debian build): devices.kind: cuda refuses to run and says
// why (Note [No silent fallback]); the GPU tests themselves are type-checked only (Note
// [CUDA sources]).
#include <gtest/gtest.h>

#include "pipefb/common/Error.h"
#include "pipefb/config/Config.h"
#include "pipefb/runtime/DeviceKind.h"

using namespace pipefb;

TEST(NoCuda, DevicesKindCudaRefusesAndSaysWhy) {
  config::Config c;
  c.devices.kind = "cuda";
  try {
    runtime::checkDeviceKind(c);
    FAIL() << "devices.kind: cuda ran with a CPU-only LibTorch";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("devices.kind: cuda cannot run here: this LibTorch (", 0), 0u) << what;
    EXPECT_NE(what.find("is built without CUDA"), std::string::npos) << what;
    EXPECT_NE(what.find("allowed here: devices.kind: cpu"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;  // one line
  }
  c.devices.kind = "cpu";
  EXPECT_EQ(runtime::checkDeviceKind(c), runtime::DeviceKind::Cpu);
}
