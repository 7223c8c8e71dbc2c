// cache::lru_cache: a byte budget with least-recently-used eviction, loads run once per key at a
// time, failed loads cache nothing, present() sees loads in flight.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>

#include "cache/lru_cache.hpp"

using cache_t = ckpt::cache::lru_cache<int, std::string>;

namespace {
std::shared_ptr<const std::string> value(const char* s) {
  return std::make_shared<const std::string>(s);
}
}  // namespace

TEST_CASE("lru_cache keeps its byte budget, evicting the least recently used", "[cache][lru]") {
  cache_t c(100);
  c.put(1, value("a"), 40);
  c.put(2, value("b"), 40);
  REQUIRE(c.bytes() == 80);
  REQUIRE(c.get(1));  // 1 is now the most recently used
  c.put(3, value("c"), 40);
  CHECK(c.bytes() == 80);
  CHECK(c.get(1));
  CHECK_FALSE(c.get(2));  // evicted: least recently used
  CHECK(c.get(3));
  // Larger than the whole budget: returned by its loader, never kept, nothing evicted for it.
  auto big = c.get_or_load(4, [] { return std::pair{value("big"), std::uint64_t(101)}; });
  CHECK(*big == "big");
  CHECK_FALSE(c.get(4));
  CHECK(c.get(1));
  CHECK(c.get(3));
  // Replacing a key charges the new size only.
  c.put(1, value("a2"), 10);
  CHECK(c.bytes() == 50);
  CHECK(*c.get(1) == "a2");
  c.erase(1);
  CHECK(c.bytes() == 40);
  c.clear();
  CHECK(c.bytes() == 0);
  CHECK_FALSE(c.get(3));
}

TEST_CASE("lru_cache loads a key once for concurrent callers, and present() sees the load",
          "[cache][lru]") {
  cache_t c(1000);
  std::promise<void> release;
  std::shared_future<void> go = release.get_future().share();
  std::atomic<int> loads{0};
  auto loader = [&] {
    ++loads;
    go.wait();
    return std::pair{value("x"), std::uint64_t(10)};
  };
  CHECK_FALSE(c.present(7));
  auto first = std::async(std::launch::async, [&] { return c.get_or_load(7, loader); });
  while (!c.present(7)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK_FALSE(c.get(7));  // loading is not cached yet
  auto second = std::async(std::launch::async, [&] { return c.get_or_load(7, loader); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  release.set_value();
  auto a = first.get();
  auto b = second.get();
  CHECK(a == b);  // the same value object: one load
  CHECK(loads == 1);
  CHECK(c.present(7));
  CHECK_FALSE(c.present(8));
}

TEST_CASE("lru_cache caches nothing for a load that throws, and every waiter sees the error",
          "[cache][lru]") {
  cache_t c(1000);
  CHECK_THROWS_AS(
      c.get_or_load(1,
                    []() -> std::pair<std::shared_ptr<const std::string>, std::uint64_t> {
                      throw std::runtime_error("decode failed");
                    }),
      std::runtime_error);
  CHECK_FALSE(c.present(1));
  CHECK(c.bytes() == 0);
  // The next call loads again.
  CHECK(*c.get_or_load(1, [] { return std::pair{value("ok"), std::uint64_t(2)}; }) == "ok");
}

TEST_CASE(
    "lru_cache never evicts a value being filled, and keeps nothing that cannot fit beside "
    "the pinned ones",
    "[cache][lru]") {
  cache_t c(100);
  c.put(1, value("a"), 30);
  auto filling = c.put_pinned(2, value("b"), 50);
  REQUIRE(filling);
  CHECK(c.bytes() == 80);
  CHECK(c.pinned_bytes() == 50);
  CHECK(c.get(2));  // readable while pinned, and reading does not unpin it
  // Room is made from unpinned values only: 1 goes, the pinned 2 stays.
  c.put(3, value("c"), 40);
  CHECK_FALSE(c.get(1));
  CHECK(c.get(2));
  CHECK(c.get(3));
  CHECK(c.bytes() == 90);
  // More than the budget less what is pinned: not kept, and the value it would replace goes.
  c.put(3, value("c2"), 60);
  CHECK_FALSE(c.get(3));
  CHECK(c.get(2));
  CHECK(c.bytes() == 50);
  auto refused = c.put_pinned(4, value("d"), 51);
  CHECK_FALSE(refused);
  CHECK_FALSE(c.get(4));
  CHECK(c.bytes() == 50);
  // clear() leaves a value its filler still holds, charged.
  c.put(5, value("e"), 10);
  c.clear();
  CHECK_FALSE(c.get(5));
  CHECK(c.get(2));
  CHECK(c.bytes() == 50);
  // Released, it is an ordinary value (the most recently used) and can be evicted.
  filling.release();
  CHECK_FALSE(filling);
  CHECK(c.pinned_bytes() == 0);
  CHECK(c.bytes() == 50);
  c.put(6, value("f"), 60);
  CHECK_FALSE(c.get(2));
  CHECK(c.get(6));
  CHECK(c.bytes() == 60);
}

TEST_CASE("lru_cache releases only the value a pin pinned", "[cache][lru]") {
  cache_t c(100);
  {
    auto p = c.put_pinned(1, value("a"), 40);
    REQUIRE(p);
    c.erase(1);  // erased while pinned: its charge goes with it
    CHECK(c.bytes() == 0);
    CHECK(c.pinned_bytes() == 0);
    auto q = c.put_pinned(1, value("b"), 40);  // the key filled again by someone else
    REQUIRE(q);
    p.release();  // not the value it pinned: b stays pinned
    CHECK(c.pinned_bytes() == 40);
    auto moved = std::move(q);
    CHECK_FALSE(q);
    CHECK(moved);
  }  // moved goes out of scope: b released once
  CHECK(c.pinned_bytes() == 0);
  CHECK(c.bytes() == 40);
  c.put(2, value("c"), 100);  // b is evictable now
  CHECK_FALSE(c.get(1));
  CHECK(c.bytes() == 100);
  // The same value object pinned again under the key (as a value at a freed value's address
  // would be): the first pin's release leaves the second pinning alone.
  c.clear();
  const auto same = value("s");
  auto first = c.put_pinned(3, same, 30);
  c.erase(3);
  auto second = c.put_pinned(3, same, 30);
  REQUIRE(second);
  first.release();
  CHECK(c.pinned_bytes() == 30);
  second.release();
  CHECK(c.pinned_bytes() == 0);
}

TEST_CASE("lru_cache reserve: part of the budget kept for memory held elsewhere", "[cache][lru]") {
  cache_t c(100);
  c.put(1, value("a"), 30);
  c.put(2, value("b"), 30);
  c.put(3, value("c"), 30);
  REQUIRE(c.get(1));  // 2 is now the least recently used
  c.reserve(30);
  CHECK(c.budget() == 70);
  CHECK(c.reserved() == 30);
  CHECK(c.bytes() == 60);
  CHECK_FALSE(c.get(2));  // evicted to make the reserve, oldest first
  CHECK(c.get(1));
  CHECK(c.get(3));
  c.put(4, value("d"), 30);  // fits only by evicting again: the reserve holds for inserts
  CHECK(c.bytes() == 60);
  CHECK_FALSE(c.put_pinned(5, value("e"), 71));  // larger than what is left
  c.reserve(500);                                // more than the budget: all of it
  CHECK(c.budget() == 0);
  CHECK(c.bytes() == 0);
  c.reserve(0);
  CHECK(c.budget() == 100);
  c.put(6, value("f"), 100);
  CHECK(c.bytes() == 100);
}

TEST_CASE("lru_cache reserve leaves pinned values, refusing inserts until they fit",
          "[cache][lru]") {
  cache_t c(100);
  auto filling = c.put_pinned(1, value("a"), 60);
  REQUIRE(filling);
  c.put(2, value("b"), 30);
  c.reserve(50);  // the pinned 60 stay though over what is left; the unpinned go
  CHECK(c.bytes() == 60);
  CHECK(c.get(1));
  CHECK_FALSE(c.get(2));
  c.put(3, value("c"), 10);
  CHECK_FALSE(c.get(3));  // no room beside the pinned bytes
  filling.release();
  c.put(3, value("c"), 10);  // now 1 is evictable: it goes
  CHECK(c.get(3));
  CHECK_FALSE(c.get(1));
  CHECK(c.bytes() == 10);
}

TEST_CASE("lru_cache take_unshared hands over a value only the cache holds", "[cache][lru]") {
  cache_t c(100);
  c.put(1, value("a"), 40);
  c.put(2, value("b"), 30);
  SECTION("held by nobody else: out of the cache, its charge gone") {
    auto v = c.take_unshared(1);
    REQUIRE(v);
    CHECK(*v == "a");
    CHECK(v.use_count() == 1);
    CHECK(c.bytes() == 30);
    CHECK_FALSE(c.get(1));
    CHECK_FALSE(c.take_unshared(1));  // gone
  }
  SECTION("a reader holds it: refused, the cache unchanged") {
    const auto reader = c.get(1);
    CHECK_FALSE(c.take_unshared(1));
    CHECK(c.bytes() == 70);
    CHECK(c.get(1) == reader);
  }
  SECTION("pinned by its filler: refused") {
    auto pin = c.put_pinned(3, value("c"), 20);
    REQUIRE(pin);
    CHECK_FALSE(c.take_unshared(3));
    CHECK(c.pinned_bytes() == 20);
    pin.release();
    CHECK(c.take_unshared(3));
    CHECK(c.bytes() == 70);
  }
  CHECK_FALSE(c.take_unshared(9));  // never there
}
