// buffer_pool: chunk-sized buffers come back for reuse (the same memory, so no fresh pages),
// small requests are never inflated to a pool buffer, and the free list stays bounded.
#include <catch2/catch.hpp>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "fs/content/buffer_pool.hpp"

using ckpt::fs::buffer_pool;
using ckpt::store::page_buffer;

TEST_CASE("buffer_pool: pool-sized buffers are reused", "[buffer_pool]") {
  buffer_pool pool(1 << 20, 2);
  page_buffer a = pool.take(1 << 20);
  REQUIRE(a.size() == (1u << 20));
  REQUIRE(a.capacity() == (1u << 20));
  std::byte* const first = a.data();
  pool.give(std::move(a));
  REQUIRE(pool.free_count() == 1);
  // Anything from half the buffer size up gets the recycled buffer, sized as asked.
  page_buffer b = pool.take((1 << 19) + 1);
  REQUIRE(b.data() == first);
  REQUIRE(b.size() == (1u << 19) + 1);
  REQUIRE(b.capacity() == (1u << 20));
  REQUIRE(pool.free_count() == 0);
}

TEST_CASE("buffer_pool: small and oversized requests bypass the pool", "[buffer_pool]") {
  buffer_pool pool(1 << 20, 4);
  page_buffer small = pool.take(1000);
  REQUIRE(small.size() == 1000);
  REQUIRE(small.capacity() == 1000);
  page_buffer big = pool.take((1 << 20) + 1);
  REQUIRE(big.capacity() == (1u << 20) + 1);
  pool.give(std::move(small));
  pool.give(std::move(big));
  REQUIRE(pool.free_count() == 0);  // neither is kept
  page_buffer none = pool.take(0);
  REQUIRE(none.size() == 0);
}

TEST_CASE("buffer_pool: the free list is bounded", "[buffer_pool]") {
  buffer_pool pool(4096, 2);
  std::vector<page_buffer> out;
  for (int i = 0; i < 5; ++i) out.push_back(pool.take(4096));
  for (auto& b : out) pool.give(std::move(b));
  REQUIRE(pool.free_count() == 2);
}

TEST_CASE("buffer_pool: concurrent take and give hand each buffer to one owner", "[buffer_pool]") {
  buffer_pool pool(8192, 8);
  std::vector<std::jthread> threads;
  std::atomic<bool> clash{false};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        page_buffer b = pool.take(8192);
        // Stamp the buffer; another owner at the same time would overwrite the stamp.
        for (std::size_t j = 0; j < b.size(); j += 512) b.data()[j] = std::byte(t);
        for (std::size_t j = 0; j < b.size(); j += 512)
          if (b.data()[j] != std::byte(t)) clash = true;
        pool.give(std::move(b));
      }
    });
  threads.clear();
  REQUIRE_FALSE(clash);
  REQUIRE(pool.free_count() <= 8);
}

TEST_CASE("page_buffer: resize_within keeps the memory and refuses growth", "[buffer_pool]") {
  page_buffer b(10000);
  std::byte* const p = b.data();
  b.resize_within(10);
  REQUIRE(b.size() == 10);
  REQUIRE(b.data() == p);
  b.resize_within(10000);
  REQUIRE(b.size() == 10000);
  REQUIRE_THROWS_AS(b.resize_within(10001), std::length_error);
  page_buffer moved = std::move(b);
  REQUIRE(moved.capacity() == 10000);
  REQUIRE(b.capacity() == 0);
}
