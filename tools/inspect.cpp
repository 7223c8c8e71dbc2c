// `ckptctl inspect FILE [--json]`: what the recognisers see in a file: its format, every segment,
// every tensor (name, dtype, shape, offset, length, compressed or exact) and the totals. Reads
// only headers, directories and data.pkl, never payloads.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "codec/format/recognise.hpp"
#include "fs/fuse/options.hpp"
#include "tools/commands.hpp"

namespace ckpt::tools {
namespace {

using namespace ckpt::format;

struct inspect_options {
  std::string path;
  bool json = false;
  bool segments = true;
  std::uint64_t min_bytes = fs::fuse::kDefaultMinTensor;  // what the mount codes by default
  int repeat = 0;
};

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  s += ']';
  return s;
}

nlohmann::json to_json(const layout& l) {
  nlohmann::json j;
  j["format"] = std::string(name(l.format));
  j["file_size"] = l.file_size;
  j["note"] = l.note;
  auto& segs = j["segments"] = nlohmann::json::array();
  for (const auto& s : l.segments) {
    nlohmann::json e{{"offset", s.offset}, {"length", s.length}};
    if (s.tensor)
      e["tensor"] = *s.tensor;
    else
      e["opaque"] = true;
    segs.push_back(std::move(e));
  }
  auto& ts = j["tensors"] = nlohmann::json::array();
  for (const auto& t : l.tensors)
    ts.push_back({{"name", t.name},
                  {"aliases", t.aliases},
                  {"dtype", std::string(name(t.type))},
                  {"shape", t.shape},
                  {"offset", t.offset},
                  {"length", t.length},
                  {"compress", t.compress}});
  auto& cs = j["crc_fields"] = nlohmann::json::array();
  for (const auto& f : l.fixups)
    cs.push_back({{"offset", f.field_offset}, {"member", l.members[f.member].name}});
  j["opaque_bytes"] = l.opaque_bytes();
  j["compress_bytes"] = l.tensor_bytes(true);
  j["exact_tensor_bytes"] = l.tensor_bytes(false);
  return j;
}

void print_text(const layout& l, bool with_segments) {
  std::printf("format  %s  (%llu bytes)%s%s\n", std::string(name(l.format)).c_str(),
              static_cast<unsigned long long>(l.file_size), l.note.empty() ? "" : "  ",
              l.note.c_str());
  if (with_segments) {
    std::printf("\nsegments (%zu)\n", l.segments.size());
    for (const auto& s : l.segments) {
      std::printf("  %14llu %14llu  %s\n", static_cast<unsigned long long>(s.offset),
                  static_cast<unsigned long long>(s.length),
                  s.tensor ? l.tensors[*s.tensor].name.c_str() : "(opaque)");
    }
  }
  std::printf("\ntensors (%zu)\n", l.tensors.size());
  std::printf("  %-8s %-5s %14s %14s  %-20s %s\n", "mode", "dtype", "offset", "length", "shape",
              "name");
  for (const auto& t : l.tensors) {
    std::string nm = t.name;
    if (!t.aliases.empty()) nm += "  (+" + std::to_string(t.aliases.size()) + " views)";
    std::printf("  %-8s %-5s %14llu %14llu  %-20s %s\n", t.compress ? "compress" : "exact",
                std::string(name(t.type)).c_str(), static_cast<unsigned long long>(t.offset),
                static_cast<unsigned long long>(t.length), shape_text(t.shape).c_str(), nm.c_str());
  }
  if (!l.fixups.empty())
    std::printf("\ncrc fields rewritten on replacement: %zu\n", l.fixups.size());
  std::printf("\ntotals  compress %llu B  exact tensors %llu B  opaque %llu B\n",
              static_cast<unsigned long long>(l.tensor_bytes(true)),
              static_cast<unsigned long long>(l.tensor_bytes(false)),
              static_cast<unsigned long long>(l.opaque_bytes()));
}

int run(const inspect_options& o) {
  recognise_options ro;
  ro.min_compress_bytes = o.min_bytes;
  // Count the bytes the recogniser reads: the benchmark's point is that it skips payloads.
  const auto file = file_source(o.path);
  auto bytes_read = std::make_shared<std::uint64_t>(0);
  const source counted(file.size(),
                       [file, bytes_read](std::uint64_t off, std::span<std::byte> out) {
                         *bytes_read += out.size();
                         file.read(off, out);
                       });
  if (o.repeat > 0) {
    // Hidden benchmark mode: recognise `repeat` times, report the median wall time.
    std::vector<double> ms;
    layout l;
    for (int i = 0; i < o.repeat; ++i) {
      *bytes_read = 0;
      const auto t0 = std::chrono::steady_clock::now();
      l = recognise(counted, ro);
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf(
        "%s: %s, %zu tensors, %llu bytes; recognise median %.3f ms (min %.3f, max %.3f) "
        "over %d runs, %llu bytes read per run\n",
        o.path.c_str(), std::string(name(l.format)).c_str(), l.tensors.size(),
        static_cast<unsigned long long>(l.file_size), ms[ms.size() / 2], ms.front(), ms.back(),
        o.repeat, static_cast<unsigned long long>(*bytes_read));
    return 0;
  }
  const auto l = recognise(counted, ro);
  if (o.json) {
    auto j = to_json(l);
    j["bytes_read"] = *bytes_read;
    std::cout << j.dump(1) << "\n";
  } else {
    print_text(l, o.segments);
  }
  return 0;
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto o = std::make_shared<inspect_options>();
  auto* cmd = app.add_subcommand("inspect", "Show how ckptfs sees a checkpoint file");
  cmd->add_option("FILE", o->path, "File to inspect")->required();
  cmd->add_flag("--json", o->json, "One JSON document instead of text");
  cmd->add_option("--min-compress-bytes", o->min_bytes,
                  "Float payloads smaller than this are kept exact (default: the mount's "
                  "min_tensor, 256)");
  cmd->add_flag("!--no-segments", o->segments, "Omit the segment list from the text output");
  cmd->add_option("--bench", o->repeat, "Time recognition over N runs (benchmark)")->group("");
  cmd->callback([o] { exit_status = run(*o); });
}

}  // namespace ckpt::tools
