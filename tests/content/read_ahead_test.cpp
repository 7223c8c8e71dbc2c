// read_ahead: which tensors the read path decodes ahead of a reader.
#include <catch2/catch.hpp>

#include "fs/content/read_ahead.hpp"

using ckpt::fs::read_ahead;
using v = std::vector<std::size_t>;

namespace {
// Eight 10-byte tensors; predicted order 0 1 4 5 6 7 2 3 (like torch: keys 0 1 10 11 ... sorted
// as strings in the file), file order 0..7.
read_ahead make(std::uint64_t ahead_bytes) {
  return read_ahead({0, 1, 4, 5, 6, 7, 2, 3}, {0, 1, 2, 3, 4, 5, 6, 7},
                    std::vector<std::uint64_t>(8, 10), ahead_bytes);
}
}  // namespace

TEST_CASE("read_ahead: start queues the first tensors once", "[content][read_ahead]") {
  auto ra = make(25);
  CHECK(ra.start() == v{0, 1, 4});
  CHECK(ra.start().empty());
}

TEST_CASE("read_ahead: a zip reader's tail comes second, and counts once",
          "[content][read_ahead]") {
  read_ahead ra({0, 1, 4, 5, 6, 7, 2, 3}, {0, 1, 2, 3, 4, 5, 6, 7},
                std::vector<std::uint64_t>(8, 10), 25, true);
  CHECK(ra.start() == v{0, 7, 1, 4});
  CHECK(ra.touch(0) == v{5});  // 1 and 4 are queued: three tensors ahead
  CHECK(ra.touch(7).empty());  // the tail read queues nothing and changes nothing
  CHECK(ra.touch(0).empty());
  CHECK(ra.touch(1) == v{6});
  CHECK_FALSE(ra.following_file_order());
  CHECK(ra.touch(4) == v{7});  // the tail was read: queued again in its turn
  CHECK(ra.touch(5) == v{2});
  CHECK(ra.touch(6) == v{3});
  CHECK(ra.touch(7).empty());  // in sequence now: a normal step
  CHECK_FALSE(ra.following_file_order());
}

TEST_CASE("read_ahead: follows the predicted order by bytes, each tensor once",
          "[content][read_ahead]") {
  auto ra = make(20);
  CHECK(ra.touch(0) == v{1, 4});
  CHECK(ra.touch(0).empty());  // same tensor: nothing new
  CHECK(ra.touch(1) == v{5});  // 4 is queued already
  CHECK(ra.touch(4) == v{6});
  CHECK(ra.touch(5) == v{7});
  CHECK_FALSE(ra.following_file_order());
  CHECK(ra.touch(6) == v{2});
  CHECK(ra.touch(7) == v{3});
  CHECK(ra.touch(2).empty());
  CHECK(ra.touch(3).empty());  // the end
}

TEST_CASE("read_ahead: at least one tensor ahead, even past the budget", "[content][read_ahead]") {
  auto ra = make(1);
  CHECK(ra.touch(0) == v{1});
  CHECK(ra.touch(1) == v{4});
}

TEST_CASE("read_ahead: a front-to-back reader switches to file order and back",
          "[content][read_ahead]") {
  auto ra = make(20);
  CHECK(ra.touch(0) == v{1, 4});
  CHECK(ra.touch(1) == v{5});
  CHECK(ra.touch(2) == v{3});  // file successor of 1, not the predicted one (4)
  CHECK(ra.following_file_order());
  CHECK(ra.expects(6));        // following file order, every read is the reader's
  CHECK(ra.touch(3).empty());  // 4 is queued already
  CHECK(ra.touch(4) == v{6});  // 5 is queued
  CHECK(ra.touch(5) == v{7});  // 4 -> 5 is a step in both orders: stays in file order
  CHECK(ra.following_file_order());
  CHECK(ra.touch(6).empty());  // 7 is queued
  CHECK(ra.touch(7).empty());  // 6 -> 7 in both orders; the end of file order
  CHECK(ra.following_file_order());
  CHECK(ra.touch(2) == v{3});  // predicted successor of 7: back to the predicted order
  CHECK_FALSE(ra.following_file_order());
}

TEST_CASE("read_ahead: a tensor read is queued again on the next pass", "[content][read_ahead]") {
  auto ra = make(10);
  CHECK(ra.touch(0) == v{1});
  CHECK(ra.touch(1) == v{4});
  CHECK(ra.touch(0) == v{1});   // a second pass from the start
  CHECK(ra.touch(99).empty());  // not a tensor of the orders: ignored
}

TEST_CASE("read_ahead: the kernel reading past a tensor is not the reader's next step",
          "[content][read_ahead]") {
  // 15 stray bytes: reads up to that far past the reader's place along file order are the
  // kernel's read-ahead, not the reader's.
  read_ahead ra({0, 1, 4, 5, 6, 7, 2, 3}, {0, 1, 2, 3, 4, 5, 6, 7},
                std::vector<std::uint64_t>(8, 10), 20, false, 15);
  CHECK(ra.expects(3));  // before the first read the reader may be anywhere
  CHECK(ra.touch(0) == v{1, 4});
  CHECK(ra.touch(1) == v{5});
  CHECK(ra.expects(1));
  CHECK(ra.touch(2).empty());  // right after 1 in the file: queues nothing
  CHECK_FALSE(ra.expects(2));  // the kernel's read, not the reader's
  CHECK(ra.expects(1));
  CHECK(ra.touch(3).empty());  // 10 bytes past: still within the stray bytes
  CHECK_FALSE(ra.expects(3));
  CHECK_FALSE(ra.following_file_order());
  CHECK(ra.touch(4) == v{6});  // the reader's own next step, from 1
  CHECK(ra.expects(4));
  CHECK_FALSE(ra.following_file_order());
}

TEST_CASE("read_ahead: reads served out of order neither move the reader back nor jump",
          "[content][read_ahead]") {
  read_ahead ra({0, 1, 4, 5, 6, 7, 2, 3}, {0, 1, 2, 3, 4, 5, 6, 7},
                std::vector<std::uint64_t>(8, 10), 20, false, 15);
  CHECK(ra.touch(0) == v{1, 4});
  CHECK(ra.touch(4) == v{5, 6});  // ahead within what is queued: the reader moved on
  CHECK(ra.touch(1).empty());     // 10 bytes behind, served late
  CHECK_FALSE(ra.expects(1));
  CHECK(ra.expects(4));
  CHECK(ra.touch(5) == v{7});
  CHECK(ra.touch(0) == v{1});     // 30 bytes behind: a jump (the next one only)
  CHECK(ra.touch(1) == v{4, 5});  // going on from 0 in predicted order: read again, queued again
}

TEST_CASE("read_ahead: a jump queues one tensor until the reader goes on from it",
          "[content][read_ahead]") {
  read_ahead ra({0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 6, 7},
                std::vector<std::uint64_t>(8, 10), 30, false, 0);
  CHECK(ra.touch(0) == v{1, 2, 3});
  CHECK(ra.touch(5) == v{6});  // a jump: the next one only
  CHECK(ra.expects(5));        // the reader is where it jumped to
  CHECK(ra.touch(6) == v{7});  // a step from it: the whole budget (here the end)
}

TEST_CASE("read_ahead: a front-to-back reader switches to file order past the stray bytes",
          "[content][read_ahead]") {
  read_ahead ra({0, 4, 5, 6, 7, 1, 2, 3}, {0, 1, 2, 3, 4, 5, 6, 7},
                std::vector<std::uint64_t>(8, 10), 20, false, 15);
  CHECK(ra.touch(0) == v{4, 5});
  CHECK(ra.touch(1).empty());  // could be the kernel's read-ahead
  CHECK(ra.touch(2).empty());  // 10 bytes past 0 along the file
  CHECK_FALSE(ra.following_file_order());
  CHECK(ra.touch(3).empty());  // 20 bytes past: the reader's own; 4 and 5 are queued
  CHECK(ra.following_file_order());
  CHECK(ra.touch(4) == v{6});
}

TEST_CASE("read_ahead: stored tensors are places, never queued, and steps skip them",
          "[content][read_ahead]") {
  // Tensor 1 is served as it is stored: the page cache may hold it, so its reads may never be
  // seen; the step from 0 to 2 is the reader's next one.
  read_ahead ra({0, 1, 2, 3, 4, 5}, {0, 1, 2, 3, 4, 5}, std::vector<std::uint64_t>(6, 10), 20,
                false, 15, {false, true, false, false, false, false});
  CHECK(ra.start() == v{0, 2});  // 1 costs nothing of the budget
  CHECK(ra.touch(0) == v{3});
  CHECK(ra.touch(2) == v{4});  // not a read 10 bytes past the place: the next step
  CHECK(ra.touch(1).empty());  // behind: never queued
  CHECK(ra.touch(3) == v{5});
}

TEST_CASE("read_ahead: the zip tail is the last decoded tensor, also behind a stored one",
          "[content][read_ahead]") {
  read_ahead ra({0, 1, 2, 3}, {0, 1, 2, 3}, std::vector<std::uint64_t>(4, 10), 20, true, 0,
                {false, false, false, true});
  CHECK(ra.start() == v{0, 2, 1});  // 2, not the stored 3, is the tail's decoded tensor
  CHECK(ra.touch(0).empty());
  CHECK(ra.touch(2).empty());  // the tail read: nothing moves
  CHECK(ra.touch(1) == v{2});  // in its turn, the tail is queued again
}

TEST_CASE("read_ahead: a queued tensor the kernel reads ahead of the reader stays expected",
          "[content][read_ahead]") {
  // Predicted 0 1 4 5 6 7 2 3, file 0 1 2 ... 7, 10-byte tensors, 35 stray bytes: from 1, the
  // kernel's read-ahead past it along the file reaches 2 (not queued) and 5 (queued).
  read_ahead ra({0, 1, 4, 5, 6, 7, 2, 3}, {0, 1, 2, 3, 4, 5, 6, 7},
                std::vector<std::uint64_t>(8, 10), 20, false, 35);
  CHECK(ra.touch(0) == v{1, 4});
  CHECK(ra.touch(1) == v{5});
  CHECK(ra.touch(5).empty());  // 30 bytes past 1 along the file: the kernel's
  CHECK(ra.expects(5));        // still queued for the reader, who has not been there
  CHECK(ra.expects(1));        // the reader's place
  CHECK(ra.touch(2).empty());  // the kernel's too, and not queued
  CHECK_FALSE(ra.expects(2));
  CHECK(ra.touch(4) == v{6});  // the reader's step: 5 is queued still, 6 next
  CHECK(ra.expects(4));
  CHECK_FALSE(ra.expects(1));  // behind the reader now
  CHECK(ra.touch(5) == v{7});  // its next step: 5 was never queued twice
}
