#include "fs/content/version_meta.hpp"

#include <nlohmann/json.hpp>

#include "codec/error.hpp"

namespace ckpt::fs {

std::string_view name(version_kind k) noexcept {
  switch (k) {
    case version_kind::exact:
      return "exact";
    case version_kind::keyframe:
      return "keyframe";
    case version_kind::delta:
      return "delta";
  }
  return "?";
}

namespace {

using nlohmann::json;

json layout_to_json(const format::layout& l) {
  json tensors = json::array();
  for (const auto& t : l.tensors) {
    tensors.push_back({{"n", t.name},
                       {"a", t.aliases},
                       {"y", int(t.type)},
                       {"s", t.shape},
                       {"o", t.offset},
                       {"l", t.length},
                       {"c", t.compress}});
    if (!t.state_name.empty()) tensors.back()["q"] = t.state_name;  // older daemons ignore it
  }
  json members = json::array();
  for (const auto& m : l.members)
    members.push_back({{"n", m.name}, {"o", m.data_offset}, {"l", m.data_length}, {"c", m.crc}});
  json fixups = json::array();
  for (const auto& f : l.fixups)
    fixups.push_back({{"o", f.field_offset}, {"m", f.member}, {"c", f.original}});
  return {{"f", int(l.format)}, {"z", l.file_size}, {"t", tensors},
          {"m", members},       {"x", fixups},      {"note", l.note}};
}

format::layout layout_from_json(const json& j) {
  format::layout l;
  l.format = format::file_format(j.at("f").get<int>());
  l.file_size = j.at("z").get<std::uint64_t>();
  for (const auto& t : j.at("t")) {
    format::tensor_info ti;
    ti.name = t.at("n").get<std::string>();
    ti.aliases = t.at("a").get<std::vector<std::string>>();
    ti.type = format::element_type(t.at("y").get<int>());
    ti.shape = t.at("s").get<std::vector<std::uint64_t>>();
    ti.offset = t.at("o").get<std::uint64_t>();
    ti.length = t.at("l").get<std::uint64_t>();
    ti.compress = t.at("c").get<bool>();
    ti.state_name = t.value("q", std::string());
    l.tensors.push_back(std::move(ti));
  }
  for (const auto& m : j.at("m"))
    l.members.push_back({m.at("n").get<std::string>(), m.at("o").get<std::uint64_t>(),
                         m.at("l").get<std::uint64_t>(), m.at("c").get<std::uint32_t>()});
  for (const auto& f : j.at("x"))
    l.fixups.push_back({f.at("o").get<std::uint64_t>(), f.at("m").get<std::size_t>(),
                        f.at("c").get<std::uint32_t>()});
  l.note = j.at("note").get<std::string>();
  format::finish_layout(l);  // rebuilds segments and re-checks the contract
  return l;
}

}  // namespace

std::vector<std::byte> encode_meta(const version_meta& m) {
  json exact = json::array();
  bool shared = false;
  for (const auto& r : m.exact) {
    if (m.exact_inline) {
      exact.push_back({{"o", r.offset}, {"l", r.length}, {"at", r.data_at}});
      continue;
    }
    json x{{"o", r.offset},       {"l", r.length}, {"at", r.data_at},
           {"bb", r.block_bytes}, {"b", r.blocks}, {"e", r.encoded_bytes}};
    if (r.src) {
      x["s"] = r.src;
      shared = true;
    }
    exact.push_back(std::move(x));
  }
  json tensors = json::array();
  for (const auto& t : m.tensors) {
    json f{{"i", t.tensor},   {"y", int(t.type)},     {"m", int(t.mode)}, {"bt", t.base_tensor},
           {"at", t.data_at}, {"e", t.encoded_bytes}, {"d", t.digest}};
    if (!t.blocks.empty()) {
      f["be"] = t.block_elements;
      f["bo"] = t.blocks;
    }
    if (t.ratio) f["r"] = true;
    if (t.intra_slabs) f["in"] = t.intra_slabs;
    if (t.grid_slabs) f["gd"] = t.grid_slabs;
    if (t.rounded) f["rd"] = true;
    if (t.round_bits) f["fb"] = t.round_bits;
    if (t.error) {
      f["ee"] = t.error->err;
      f["er"] = t.error->ref;
    }
    tensors.push_back(std::move(f));
  }
  json j{{"size", m.size},
         {"kind", int(m.kind)},
         {"layout", layout_to_json(m.layout)},
         // Regions in other versions' objects, or held inline, go under other keys, so that
         // a daemon from before them refuses the version (EIO) instead of misreading it.
         {m.exact_inline ? "exact_inline"
          : shared       ? "exact_shared"
                         : "exact",
          exact},
         {"tensors", tensors},
         {"crcs", m.member_crcs},
         {"bits", m.bits},
         {"ct", m.created_ns},
         {"cp",
          {{"b", m.coding.bits},
           {"g", m.coding.group},
           {"r", m.coding.rep},
           {"s", m.coding.scope},
           {"c", m.coding.coder},
           {"xo", m.coding.exact_optimizer},
           {"rl", m.coding.relative},
           {"rb", m.coding.ratio_bits},
           {"kb", m.coding.keyframe_bits}}}};
  if (!m.coding.grid.empty()) j["cp"]["gr"] = m.coding.grid;
  if (m.coding.refresh_bits) j["cp"]["rf"] = m.coding.refresh_bits;
  if (m.coding.weight_error > 0) {
    j["cp"]["we"] = m.coding.weight_error;
    j["cp"]["ge"] = m.coding.grid_error;
  }
  if (m.exact_inline) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(m.inline_exact.data());
    j["xb"] = json::binary(std::vector<std::uint8_t>(p, p + m.inline_exact.size()));
  }
  const auto bytes = json::to_cbor(j);
  return {reinterpret_cast<const std::byte*>(bytes.data()),
          reinterpret_cast<const std::byte*>(bytes.data() + bytes.size())};
}

version_meta decode_meta(std::span<const std::byte> cbor) {
  try {
    const auto j =
        json::from_cbor(reinterpret_cast<const std::uint8_t*>(cbor.data()),
                        reinterpret_cast<const std::uint8_t*>(cbor.data() + cbor.size()));
    version_meta m;
    m.size = j.at("size").get<std::uint64_t>();
    m.kind = version_kind(j.at("kind").get<int>());
    m.layout = layout_from_json(j.at("layout"));
    const auto shared = j.find("exact_shared");
    const auto inline_regions = j.find("exact_inline");
    if (inline_regions != j.end()) {
      m.exact_inline = true;
      const auto& xb = j.at("xb").get_binary();
      m.inline_exact.assign(reinterpret_cast<const std::byte*>(xb.data()),
                            reinterpret_cast<const std::byte*>(xb.data() + xb.size()));
      std::uint64_t at = 0;
      for (const auto& r : *inline_regions) {
        exact_region x;
        x.offset = r.at("o").get<std::uint64_t>();
        x.length = r.at("l").get<std::uint64_t>();
        x.data_at = r.at("at").get<std::uint64_t>();
        // Back to back, in order, covering the inline bytes exactly.
        if (x.data_at != at || x.length > m.inline_exact.size() - at)
          throw corrupt_error("content: inline exact regions do not tile their bytes");
        at += x.length;
        m.exact.push_back(std::move(x));
      }
      if (at != m.inline_exact.size())
        throw corrupt_error("content: inline exact bytes beyond their regions");
    } else {
      for (const auto& r : shared != j.end() ? *shared : j.at("exact"))
        m.exact.push_back({r.at("o").get<std::uint64_t>(), r.at("l").get<std::uint64_t>(),
                           r.at("at").get<std::uint64_t>(), r.at("bb").get<std::uint32_t>(),
                           r.at("b").get<std::vector<std::uint64_t>>(),
                           r.at("e").get<std::uint64_t>(), r.value("s", std::uint64_t(0))});
    }
    for (std::size_t i = 0; i < m.exact.size(); ++i) {
      const auto& r = m.exact[i];
      if (!m.exact_inline &&
          (r.block_bytes == 0 || r.blocks.size() != (r.length + r.block_bytes - 1) / r.block_bytes))
        throw corrupt_error("content: exact region block index does not cover it");
      if (i && r.offset < m.exact[i - 1].offset + m.exact[i - 1].length)
        throw corrupt_error("content: exact regions overlap");
      if (r.offset > m.size || r.length > m.size - r.offset)
        throw corrupt_error("content: exact region outside the file");
    }
    for (const auto& t : j.at("tensors")) {
      std::optional<codec::error_sums> error;
      if (t.contains("ee") && t.contains("er"))
        error = codec::error_sums{t.at("ee").get<double>(), t.at("er").get<double>()};
      m.tensors.push_back({t.at("i").get<std::size_t>(), codec::dtype(t.at("y").get<int>()),
                           tensor_mode(t.at("m").get<int>()), t.at("bt").get<std::size_t>(),
                           t.at("at").get<std::uint64_t>(), t.at("e").get<std::uint64_t>(),
                           t.value("d", std::uint64_t(0)), t.value("be", std::uint32_t(0)),
                           t.value("bo", std::vector<std::uint64_t>{}), t.value("r", false),
                           t.value("in", std::uint32_t(0)), error, t.value("rd", false)});
      m.tensors.back().grid_slabs = t.value("gd", std::uint32_t(0));
      m.tensors.back().round_bits = t.value("fb", 0);
      if (m.tensors.back().round_bits < 0 || m.tensors.back().round_bits > 23)
        throw corrupt_error("content: a frame's rounding bits out of range");
    }
    m.member_crcs = j.at("crcs").get<std::vector<std::pair<std::size_t, std::uint32_t>>>();
    m.bits = j.at("bits").get<int>();
    m.created_ns = j.value("ct", std::int64_t(0));
    if (auto cp = j.find("cp"); cp != j.end()) {
      m.coding.bits = cp->at("b").get<int>();
      m.coding.group = cp->at("g").get<int>();
      m.coding.rep = cp->at("r").get<std::string>();
      m.coding.scope = cp->at("s").get<std::string>();
      m.coding.coder = cp->at("c").get<std::string>();
      m.coding.exact_optimizer = cp->at("xo").get<bool>();
      m.coding.relative = cp->value("rl", false);
      m.coding.ratio_bits = cp->value("rb", 0);
      m.coding.keyframe_bits = cp->value("kb", 0);
      m.coding.grid = cp->value("gr", std::string());
      m.coding.refresh_bits = cp->value("rf", 0);
      m.coding.weight_error = cp->value("we", 0.0);
      m.coding.grid_error = cp->value("ge", 0.0);
    }
    if (m.layout.file_size != m.size) throw corrupt_error("content: layout size mismatch");
    for (const auto& t : m.tensors) {
      if (t.tensor >= m.layout.tensors.size()) throw corrupt_error("content: tensor index");
      if (t.type > codec::dtype::bytes || t.mode > tensor_mode::delta)
        throw corrupt_error("content: frame dtype or mode");
      // A block index must start at the frame's start and increase within it.
      if (!t.blocks.empty() && (t.block_elements == 0 || t.blocks.front() != 0))
        throw corrupt_error("content: block index");
      for (std::size_t b = 1; b < t.blocks.size(); ++b)
        if (t.blocks[b] <= t.blocks[b - 1]) throw corrupt_error("content: block index order");
      if (!t.blocks.empty() && t.blocks.back() >= t.encoded_bytes)
        throw corrupt_error("content: block index beyond its frame");
      // One entry per block of the tensor's elements (a wrong count would misplace chunks).
      if (!t.blocks.empty()) {
        const std::uint64_t es = codec::element_size(t.type);
        const std::uint64_t elements = m.layout.tensors[t.tensor].length / es;
        if (elements == 0 ||
            t.blocks.size() != (elements + t.block_elements - 1) / t.block_elements)
          throw corrupt_error("content: block index does not cover its tensor");
      }
    }
    return m;
  } catch (const nlohmann::json::exception& e) {
    throw corrupt_error(std::string("content: metadata: ") + e.what());
  }
}

}  // namespace ckpt::fs
