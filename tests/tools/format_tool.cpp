// Test helper for the format recognisers (not installed):
//   format_tool replace IN OUT [--seed S] [--min-bytes N]
//       Recognises IN, replaces every compression candidate's payload with the pattern
//       value(j) = ((j * 7 + S) % 251) - 125 (element j of the payload, exact in f32/f16/bf16),
//       and writes the served file to OUT through random-sized, out-of-order reads. Python then
//       checks the result with the real loaders (tests/formats/real_files.py).
//   format_tool crc-speed [MiB]
//       CRC-32 throughput of the assembly path (libdeflate) on one core, in GB/s.
//   format_tool hostile FILE...
//       Truncates each file at many offsets and flips many random bits; every variant must give
//       an opaque or a valid layout, and a valid one must assemble without error.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "codec/dtype.hpp"
#include "codec/error.hpp"
#include "codec/format/assemble.hpp"
#include "codec/format/crc32.hpp"
#include "codec/format/recognise.hpp"

using namespace ckpt::format;

namespace {

std::vector<std::byte> pattern(const tensor_info& t, std::uint64_t seed) {
  std::vector<std::byte> out(t.length);
  const auto n = t.elements();
  for (std::uint64_t j = 0; j < n; ++j) {
    const float v = float(std::int64_t((j * 7 + seed) % 251) - 125);
    if (t.type == element_type::f32) {
      std::memcpy(out.data() + 4 * j, &v, 4);
    } else {
      const std::uint16_t h =
          t.type == element_type::f16 ? ckpt::codec::f32_to_f16(v) : ckpt::codec::f32_to_bf16(v);
      std::memcpy(out.data() + 2 * j, &h, 2);
    }
  }
  return out;
}

std::vector<std::byte> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ckpt::error(ckpt::errc::io, "cannot open " + path);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

int replace(const std::string& in, const std::string& out_path, std::uint64_t seed,
            std::uint64_t min_bytes) {
  recognise_options opt;
  opt.min_compress_bytes = min_bytes;
  const auto src = file_source(in);
  auto l = recognise(src, opt);
  if (l.format == file_format::opaque) {
    std::fprintf(stderr, "format_tool: %s is opaque: %s\n", in.c_str(), l.note.c_str());
    return 1;
  }
  std::vector<bool> replaced(l.tensors.size());
  std::size_t count = 0;
  for (std::size_t i = 0; i < l.tensors.size(); ++i)
    if (l.tensors[i].compress) replaced[i] = true, ++count;
  // Generate payloads on demand so the >4 GiB test does not hold a second copy in memory.
  const auto tensors = l.tensors;
  served_file served(std::move(l), src, replaced,
                     [tensors, seed](std::size_t t, std::uint64_t off, std::span<std::byte> dst) {
                       const auto& ti = tensors[t];
                       const auto es = element_size(ti.type);
                       // Build the covering whole elements, then copy the requested bytes.
                       const auto first = off / es, last = (off + dst.size() + es - 1) / es;
                       tensor_info part = ti;
                       part.length = (last - first) * es;
                       std::vector<std::byte> tmp(part.length);
                       for (std::uint64_t j = first; j < last; ++j) {
                         const float v = float(std::int64_t((j * 7 + seed) % 251) - 125);
                         if (ti.type == element_type::f32) {
                           std::memcpy(tmp.data() + 4 * (j - first), &v, 4);
                         } else {
                           const std::uint16_t h = ti.type == element_type::f16
                                                       ? ckpt::codec::f32_to_f16(v)
                                                       : ckpt::codec::f32_to_bf16(v);
                           std::memcpy(tmp.data() + 2 * (j - first), &h, 2);
                         }
                       }
                       std::memcpy(dst.data(), tmp.data() + (off - first * es), dst.size());
                     });
  // Read in random-sized chunks, tail first then the rest, like torch.load's access pattern.
  std::FILE* f = std::fopen(out_path.c_str(), "wb");
  if (!f) throw ckpt::error(ckpt::errc::io, "cannot create " + out_path);
  std::mt19937_64 rng(seed);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> pieces;
  for (std::uint64_t at = 0; at < served.size();) {
    const std::uint64_t n = std::min<std::uint64_t>(served.size() - at, 1 + rng() % (8u << 20));
    pieces.emplace_back(at, n);
    at += n;
  }
  if (pieces.size() > 1) std::rotate(pieces.begin(), pieces.end() - 1, pieces.end());
  std::vector<std::byte> buf;
  for (const auto& [at, n] : pieces) {
    buf.resize(n);
    if (served.read(at, buf) != n) throw ckpt::error(ckpt::errc::io, "short served read");
    if (std::fseek(f, long(at), SEEK_SET) != 0 || std::fwrite(buf.data(), 1, n, f) != n)
      throw ckpt::error(ckpt::errc::io, "write failed: " + out_path);
  }
  if (std::fclose(f) != 0) throw ckpt::error(ckpt::errc::io, "close failed: " + out_path);
  std::printf("replaced %zu tensor(s) of %zu in %s\n", count, tensors.size(), in.c_str());
  return 0;
}

// Returns false (and prints why) if a variant broke a contract.
bool check_variant(const std::vector<std::byte>& bytes, const std::string& what) {
  const auto src = memory_source(bytes);
  recognise_options opt;
  opt.min_compress_bytes = 0;
  layout l;
  try {
    l = recognise(src, opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: recognise threw: %s\n", what.c_str(), e.what());
    return false;
  }
  try {
    validate(l);
    if (l.file_size != bytes.size()) throw ckpt::corrupt_error("layout size differs");
    if (l.format == file_format::opaque) return true;
    // Unreplaced: served bytes equal the input. Replaced: assembles without error.
    std::vector<std::byte> served_bytes(bytes.size());
    make_served_file(l, src, {}).read(0, served_bytes);
    if (served_bytes != bytes) throw ckpt::corrupt_error("unreplaced served file differs");
    std::vector<std::vector<std::byte>> rep(l.tensors.size());
    for (std::size_t i = 0; i < l.tensors.size(); ++i)
      if (l.tensors[i].compress) rep[i] = pattern(l.tensors[i], 1);
    make_served_file(l, src, std::move(rep)).read(0, served_bytes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", what.c_str(), e.what());
    return false;
  }
  return true;
}

int hostile(const std::vector<std::string>& files) {
  std::size_t variants = 0, failures = 0, opaque = 0;
  std::mt19937_64 rng(42);
  for (const auto& path : files) {
    const auto bytes = slurp(path);
    if (recognise(memory_source(bytes)).format == file_format::opaque) {
      std::fprintf(stderr, "%s: the unmodified file is opaque\n", path.c_str());
      ++failures;
      continue;
    }
    // Truncations: every length near both ends, and random ones in between.
    std::vector<std::size_t> lengths;
    for (std::size_t k = 0; k < std::min<std::size_t>(bytes.size(), 600); ++k) {
      lengths.push_back(k);
      lengths.push_back(bytes.size() - 1 - k);
    }
    for (int k = 0; k < 300; ++k) lengths.push_back(rng() % bytes.size());
    for (const auto n : lengths) {
      std::vector<std::byte> cut(bytes.begin(), bytes.begin() + std::ptrdiff_t(n));
      ++variants;
      if (!check_variant(cut, path + " truncated to " + std::to_string(n)))
        ++failures;
      else if (recognise(memory_source(cut)).format == file_format::opaque)
        ++opaque;
    }
    // Bit flips, biased towards the structure (first and last 4 KiB) where they matter.
    for (int k = 0; k < 1500; ++k) {
      auto flipped = bytes;
      std::size_t at = rng() % bytes.size();
      if (k % 3 == 0) at = rng() % std::min<std::size_t>(bytes.size(), 4096);
      if (k % 3 == 1) at = bytes.size() - 1 - rng() % std::min<std::size_t>(bytes.size(), 4096);
      flipped[at] ^= std::byte(1u << (rng() % 8));
      ++variants;
      if (!check_variant(flipped, path + " bit flip at " + std::to_string(at))) ++failures;
    }
  }
  std::printf("hostile: %zu variants, %zu opaque truncations, %zu failures\n", variants, opaque,
              failures);
  return failures == 0 ? 0 : 1;
}

int crc_speed(std::size_t mib) {
  std::vector<std::byte> buf(mib << 20);
  std::mt19937_64 rng(7);
  for (auto& b : buf) b = std::byte(rng());
  double best = 1e9;
  std::uint32_t crc = 0;
  for (int r = 0; r < 7; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    crc = crc32(0, buf);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("crc32 (libdeflate): %zu MiB in %.2f ms = %.2f GB/s (crc %08x)\n", mib, best * 1e3,
              double(buf.size()) / best / 1e9, crc);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.size() >= 3 && args[0] == "replace") {
      std::uint64_t seed = 3, min_bytes = 0;
      for (std::size_t i = 3; i + 1 < args.size(); i += 2) {
        if (args[i] == "--seed") seed = std::stoull(args[i + 1]);
        if (args[i] == "--min-bytes") min_bytes = std::stoull(args[i + 1]);
      }
      return replace(args[1], args[2], seed, min_bytes);
    }
    if (!args.empty() && args[0] == "crc-speed")
      return crc_speed(args.size() > 1 ? std::stoul(args[1]) : 256);
    if (args.size() >= 2 && args[0] == "hostile")
      return hostile(std::vector<std::string>(args.begin() + 1, args.end()));
    std::fprintf(stderr,
                 "usage: format_tool replace IN OUT [--seed S] [--min-bytes N]\n"
                 "       format_tool hostile FILE...\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "format_tool: %s\n", e.what());
    return 1;
  }
}
