// The membership records read back from the store (dist/membership.h parse_decision,
// parse_round, parse_epoch, View::from_json): anything malformed is an IoError naming the
// record, never another exception or a view the group code cannot index.
#include <gtest/gtest.h>

#include "atoll/core/errors.h"
#include "atoll/dist/membership.h"

namespace atl {
namespace {

TEST(MembershipRecords, WrittenRecordsReadBack) {
  const View v{.epoch = 4, .islands = {0, 2, 3}, .joining = {3}, .tokens = {{"0.0", "h:1:a"}}};
  EXPECT_EQ(View::from_json(v.to_json()).to_json(), v.to_json());
  const Decision d = parse_decision(R"({"commit": true, "next": )" + v.to_json() + "}");
  EXPECT_TRUE(d.commit);
  ASSERT_TRUE(d.next.has_value());
  EXPECT_EQ(d.next->to_json(), v.to_json());
  EXPECT_EQ(parse_decision(R"({"commit": false, "why": "worker 1.0 failed"})").why, "worker 1.0 failed");
  EXPECT_EQ(parse_round("[0, 1, 5]"), (std::vector<int>{0, 1, 5}));
  EXPECT_EQ(parse_epoch("17"), 17u);
}

TEST(MembershipRecords, MalformedRecordsAreIoErrors) {
  for (const char* bad : {R"({"epoch": 1, "islands": [1, 0], "joining": [], "tokens": {}})",
                          R"({"epoch": 1, "islands": [-1], "joining": [], "tokens": {}})",
                          R"({"epoch": 1, "islands": [0, 0], "joining": [], "tokens": {}})",
                          R"({"epoch": 1, "islands": [0], "joining": [2], "tokens": {}})",
                          R"({"epoch": "1", "islands": [0], "joining": [], "tokens": {}})",
                          R"({"epoch": 1e30, "islands": [0], "joining": [], "tokens": {}})",
                          R"({"epoch": 1.5, "islands": [0], "joining": [], "tokens": {}})",
                          R"({"epoch": 1, "islands": [0.5], "joining": [], "tokens": {}})", "[]", "{"})
    EXPECT_THROW(View::from_json(bad), IoError) << bad;
  for (const char* bad :
       {R"({"commit": 1})", R"({"commit": true, "why": 3})", "[true]", "", R"({"commit": true, "next": {"epoch": 2}})"})
    EXPECT_THROW(parse_decision(bad), IoError) << bad;
  for (const char* bad : {"[1, 0]", "[\"0\"]", "{}", "[0, 4294967296]", "nul"})
    EXPECT_THROW(parse_round(bad), IoError) << bad;
  for (const char* bad : {"", "-1", "12a", "99999999999999999999", " 3"})
    EXPECT_THROW(parse_epoch(bad), IoError) << bad;
}

}  // namespace
}  // namespace atl
