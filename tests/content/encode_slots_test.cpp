// encode_slots: the write path's working memory is a few slab sets whatever the machine, so that
// it fits in the memory budget's fixed allowance (DESIGN.md §9 invariant 7).
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "fs/content/content_impl.hpp"
#include "fs/content/encode_slots.hpp"

using ckpt::fs::encode_slots;

TEST_CASE("encode_slots: one set per core, at least two, and never more than the allowance holds",
          "[content][slots]") {
  CHECK(encode_slots::count_for(0) == 2);  // hardware_concurrency() may not know
  CHECK(encode_slots::count_for(1) == 2);
  CHECK(encode_slots::count_for(2) == 2);
  CHECK(encode_slots::count_for(3) == 3);
  // A set resident after use is about 5.5 slabs; the sets of any machine stay well inside the
  // 512 MiB the budget allows besides cache= and buffer= (the rest of it: code, threads, object
  // writers, read-ahead: about 0.2 GiB with eight ranks saving at once).
  constexpr std::uint64_t allowance = std::uint64_t(512) << 20;
  for (unsigned cores : {4u, 8u, 16u, 64u, 96u, 256u}) {
    INFO(cores << " cores");
    CHECK(encode_slots::count_for(cores) * 6 * ckpt::fs::kSlabBytes <= allowance * 6 / 10);
  }
}

TEST_CASE("encode_slots: a put waits for a free set, and sets are reused", "[content][slots]") {
  encode_slots slots(2, 4096);
  auto a = slots.acquire();
  auto b = slots.acquire();
  CHECK(slots.in_use() == 2);
  std::byte* first = a.get().cur.data();
  std::atomic<bool> third_got{false};
  std::byte* third = nullptr;
  std::thread waiter([&] {
    auto c = slots.acquire();  // blocks until a set is given back
    third = c.get().cur.data();
    third_got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(third_got);
  { auto gone = std::move(a); }
  waiter.join();
  CHECK(third_got);
  CHECK(third == first);  // the set a held, not a new one
  CHECK(slots.count() == 2);
  CHECK(slots.resident_bytes() >= 2 * 3 * 4096);
}
