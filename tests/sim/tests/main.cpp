#include <gtest/gtest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  // The simulated machine these tests assume: two devices of 1 GiB and 512 MiB. Set before the
  // driver's cuInit reads them; death-test children inherit them.
  setenv("VASWAP_SIM_DEVICES", "2", 1);
  setenv("VASWAP_SIM_DEVICE_MEMORY", "1GiB,512MiB", 1);
  ::testing::InitGoogleTest(&argc, argv);
  // Stream worker threads exist: re-execute for death tests instead of forking a threaded process.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  return RUN_ALL_TESTS();
}
