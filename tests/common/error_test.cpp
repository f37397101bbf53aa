// The hints of errors the CLI prints: what they tell the user to do follows the reason.
#include "common/error.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace spritetorch {
namespace {

std::string failed_write(int error) {
  return std::string("cannot write /tmp/x.pt: ") + std::strerror(error);
}

TEST(MakeRoomHint, FollowsTheReasonAWriteFailed) {
  EXPECT_EQ(make_room_hint(failed_write(ENOSPC)), "free some space");
  EXPECT_EQ(make_room_hint(failed_write(EDQUOT)), "free some space");
  // A file-size limit or a read-only folder is not helped by freeing space.
  EXPECT_NE(make_room_hint(failed_write(EFBIG)).find("ulimit -f"), std::string::npos);
  EXPECT_EQ(make_room_hint(failed_write(EACCES)), "make the folder writable");
  EXPECT_EQ(make_room_hint(failed_write(EROFS)), "make the folder writable");
}

TEST(FirstLine, StopsAtTheFirstNewline) {
  EXPECT_EQ(first_line("one\ntwo\n"), "one");
  EXPECT_EQ(first_line("only"), "only");
  EXPECT_EQ(first_line(""), "");
}

}  // namespace
}  // namespace spritetorch
