// base_prefetch: a bounded pool of read-ahead units (two buffers and a thread each), taken only
// when free; reads run on the unit's thread, errors come back at wait(), and a unit goes back to
// the pool only after its read in flight is done.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "fs/content/base_prefetch.hpp"

using ckpt::fs::base_prefetch;

TEST_CASE("base_prefetch: at most `units` leases, given back when dropped", "[content][prefetch]") {
  base_prefetch pool(2, 1 << 20);
  REQUIRE(pool.resident_bytes() == 0);  // nothing made before first use
  auto a = pool.try_acquire();
  auto b = pool.try_acquire();
  REQUIRE(a);
  REQUIRE(b);
  CHECK_FALSE(pool.try_acquire());  // never waits
  CHECK(pool.resident_bytes() == 2 * 2 * (std::uint64_t(1) << 20));
  // Two distinct buffers per unit, alternating by slab index, none shared between units.
  CHECK((*a)->buffer(0) != (*a)->buffer(1));
  CHECK((*a)->buffer(0) == (*a)->buffer(2));
  CHECK((*a)->buffer(0) != (*b)->buffer(0));
  CHECK((*a)->buffer(1) != (*b)->buffer(1));
  a.reset();
  auto c = pool.try_acquire();
  CHECK(c);
  CHECK(pool.resident_bytes() == 2 * 2 * (std::uint64_t(1) << 20));  // the unit was kept
}

TEST_CASE("base_prefetch: reads run on the unit's thread, and their errors reach wait()",
          "[content][prefetch]") {
  base_prefetch pool(1, 4096);
  auto u = pool.try_acquire();
  REQUIRE(u);
  CHECK_FALSE((*u)->in_flight());
  (*u)->wait();  // nothing in flight: returns at once
  std::thread::id ran_on;
  (*u)->start([&] { ran_on = std::this_thread::get_id(); });
  CHECK((*u)->in_flight());
  (*u)->wait();
  CHECK_FALSE((*u)->in_flight());
  CHECK(ran_on != std::thread::id{});
  CHECK(ran_on != std::this_thread::get_id());
  (*u)->start([] { throw std::runtime_error("disk gone"); });
  CHECK_THROWS_WITH((*u)->wait(), "disk gone");
  (*u)->start([] {});  // usable again after an error
  CHECK_NOTHROW((*u)->wait());
}

TEST_CASE("base_prefetch: a lease dropped with a read in flight waits for it",
          "[content][prefetch]") {
  base_prefetch pool(1, 4096);
  std::atomic<bool> done{false};
  {
    auto u = pool.try_acquire();
    REQUIRE(u);
    (*u)->start([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      done = true;
    });
  }  // the encode that took it failed before waiting: the lease waits, not the next user
  CHECK(done);
  auto again = pool.try_acquire();
  REQUIRE(again);
  CHECK_FALSE((*again)->in_flight());
  // An error nobody waited for does not reach the next lease.
  {
    auto u = std::move(again);
    (*u)->start([] { throw std::runtime_error("late"); });
  }
  auto last = pool.try_acquire();
  REQUIRE(last);
  CHECK_NOTHROW((*last)->wait());
}
