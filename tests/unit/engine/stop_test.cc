// StopStringFilter: text that may begin a stop string is withheld; a stop string never leaks.
#include "engine/stop.h"

#include "gtest/gtest.h"

namespace moe::engine {
namespace {

TEST(StopStringFilterTest, StopsAcrossPiecesAndDropsTheRest) {
  StopStringFilter f({"</end>"});
  bool stopped = false;
  std::string out = f.Push("Hello </e", &stopped);
  EXPECT_EQ(out, "Hello ");
  EXPECT_FALSE(stopped);
  out = f.Push("nd> trailing", &stopped);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "");
}

TEST(StopStringFilterTest, ReleasesAFalseStart) {
  StopStringFilter f({"STOP"});
  bool stopped = false;
  EXPECT_EQ(f.Push("ab ST", &stopped), "ab ");
  EXPECT_EQ(f.Push("ILL", &stopped), "STILL");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(f.Push("S", &stopped), "");
  EXPECT_EQ(f.Flush(), "S");
}

TEST(StopStringFilterTest, EarliestOfSeveral) {
  StopStringFilter f({"xyz", "b"});
  bool stopped = false;
  EXPECT_EQ(f.Push("aaxybzz", &stopped), "aaxy");
  EXPECT_TRUE(stopped);
}

TEST(StopConditionsTest, Validate) {
  StopConditions s;
  s.max_tokens = 0;
  EXPECT_NE(s.Validate(10).message().find("max_tokens"), std::string::npos);
  s.max_tokens = 5;
  s.stop_token_ids = {10};
  EXPECT_NE(s.Validate(10).message().find("stop_token_ids"), std::string::npos);
  s.stop_token_ids = {};
  s.stop_strings = {""};
  EXPECT_FALSE(s.Validate(10).ok());
}

}  // namespace
}  // namespace moe::engine
