// The lineage registry: every stored version and every lineage, their journal records (c.v,
// c.l), replay, the references names hold, and what `ckptctl ls`/`stat` show.
#include <map>
#include <set>

#include "codec/error.hpp"
#include "codec/format/layout.hpp"
#include "fs/content/content_impl.hpp"
#include "fs/content/lineage_key.hpp"

namespace ckpt::fs {

using nlohmann::json;

version_rec content_store::impl::get(std::uint64_t v) const {
  std::lock_guard lock(mu);
  auto it = versions.find(v);
  if (it == versions.end()) throw corrupt_error("content: unknown version " + std::to_string(v));
  return it->second;
}

// For decoding: also a reclaimed version whose object is still there (see graveyard).
version_rec content_store::impl::get_for_read(std::uint64_t v) const {
  std::lock_guard lock(mu);
  if (auto it = versions.find(v); it != versions.end()) return it->second;
  if (auto it = graveyard.find(v); it != graveyard.end()) return it->second;
  throw corrupt_error("content: unknown version " + std::to_string(v));
}

// Deltas between v and the keyframe its chain ends in (0 for a keyframe or none); caller holds
// mu. Counted on the chain, not taken from the records' counters: a rekey turns a version
// inside a chain into a keyframe without rewriting the records of the versions above it.
std::uint64_t content_store::impl::deltas_since_keyframe(std::uint64_t v) const {
  std::uint64_t n = 0;
  for (auto it = versions.find(v); it != versions.end() && it->second.kind == version_kind::delta;
       it = versions.find(it->second.base))
    if (++n > versions.size()) throw corrupt_error("content: base chain does not end");
  return n;
}

bool content_store::impl::is_head(const version_rec& r) const {
  if (!r.lineage) return false;
  auto it = lineages.find(r.lineage);
  return it != lineages.end() && it->second.head == r.id;
}

bool content_store::impl::image_pays(std::uint64_t lineage, std::uint64_t head,
                                     std::uint64_t besides) const {
  for (const auto& [id, r] : versions)
    if (r.lineage == lineage && id != head && id != besides && r.refs) return true;
  return false;
}

json content_store::impl::version_json(const version_rec& r) {
  json j{{"t", "c.v"},           {"v", r.id},   {"o", r.obj.id},    {"os", r.obj.size},
         {"oc", r.obj.checksum}, {"z", r.size}, {"k", int(r.kind)}, {"f", r.format},
         {"l", r.lineage},       {"b", r.base}, {"p", r.path},      {"q", r.since_keyframe},
         {"ct", r.created_ns}};
  if (!r.donors.empty()) j["d"] = r.donors;
  if (r.donors_released) j["dr"] = true;
  if (r.rounded_bits >= 0) j["rb"] = r.rounded_bits;
  if (r.values_elements >= 0) j["ve"] = r.values_elements;
  return j;
}

json content_store::impl::lineage_json(const lineage_rec& l) {
  return {{"t", "c.l"}, {"l", l.id}, {"s", l.signature}, {"pk", l.path_key}};
}

void content_store::impl::apply_version(const json& j) {
  version_rec r;
  r.id = j.at("v").get<std::uint64_t>();
  r.obj = {j.at("o").get<std::uint64_t>(), j.at("os").get<std::uint64_t>(),
           j.at("oc").get<std::uint64_t>()};
  r.size = j.at("z").get<std::uint64_t>();
  r.kind = version_kind(j.at("k").get<int>());
  r.format = j.at("f").get<std::string>();
  r.lineage = j.at("l").get<std::uint64_t>();
  r.base = j.at("b").get<std::uint64_t>();
  r.path = j.at("p").get<std::string>();
  r.since_keyframe = j.at("q").get<std::uint64_t>();
  r.created_ns = j.value("ct", std::int64_t(0));
  r.donors = j.value("d", std::vector<std::uint64_t>{});
  r.donors_released = j.value("dr", false);
  r.rounded_bits = j.value("rb", -1);
  r.values_elements = j.value("ve", std::int64_t(-1));
  // Stores from before the feature record: their donors need it in the next snapshot too.
  if (!r.donors.empty() || r.donors_released) shared_extents = true;
  next_version = std::max(next_version, r.id + 1);
  max_object = std::max(max_object, r.obj.id);
  if (r.lineage) {
    auto& l = lineages[r.lineage];
    if (r.id >= l.head) {  // a rewritten older version (rekey) does not move the head back
      l.head = r.id;
      l.since_keyframe = r.since_keyframe;
    }
  }
  if (auto old = versions.find(r.id); old != versions.end() && old->second.obj.id != r.obj.id)
    replaced.push_back(old->second.obj.id);
  versions[r.id] = std::move(r);
}

// Moves every version of lineage `from` into `into`, whose head it then is; caller holds mu.
// Returns the superseded head of `into` (0 if none).
std::uint64_t content_store::impl::join_lineage(std::uint64_t from, std::uint64_t into) {
  auto f = lineages.find(from);
  auto t = lineages.find(into);
  if (f == lineages.end() || t == lineages.end() || from == into)
    throw corrupt_error("content: a lineage join names an unknown lineage");
  std::uint64_t superseded = 0;
  if (f->second.head > t->second.head) {
    superseded = t->second.head;
    t->second.head = f->second.head;
    t->second.since_keyframe = f->second.since_keyframe;
    // Whether the new head's image is wanted is the fork's to say (renamed() asks again at once).
    t->second.single = f->second.single;
  }
  for (auto& [id, r] : versions)
    if (r.lineage == from) r.lineage = into;
  for (auto& [id, r] : graveyard)
    if (r.lineage == from) r.lineage = into;
  if (chain_hints.erase(from)) chain_hints.insert(into);
  lineages.erase(f);
  joined_into[from] = into;
  return superseded;
}

nlohmann::json content_store::impl::feature_json(std::string_view feature) {
  return {{"t", "c.f"}, {"f", feature}};
}

nlohmann::json content_store::impl::join_json(std::uint64_t from, std::uint64_t into) {
  return {{"t", "c.j"}, {"l", from}, {"into", into}};
}

void content_store::renamed(const content_ref& ref, std::string_view new_path) {
  auto& m = *impl_;
  std::uint64_t superseded = 0, drop_image = 0;
  {
    std::lock_guard lock(m.mu);
    const auto v = m.versions.find(ref.version);
    if (v == m.versions.end() || !v->second.lineage) return;
    const auto l = m.lineages.find(v->second.lineage);
    if (l == m.lineages.end() || l->second.head != ref.version || !l->second.journaled) return;
    const std::string key = lineage_path_key(new_path);
    // Never across ranks or shards (the fork's rows are its own rank's).
    if (key == l->second.path_key ||
        lineage_rank_tokens(key) != lineage_rank_tokens(l->second.path_key))
      return;
    // The lineage the new name keys; with several (an older fork), the most recently extended.
    lineage_rec* into = nullptr;
    for (auto& [lid, o] : m.lineages)
      if (lid != l->first && o.journaled && o.path_key == key &&
          o.signature == l->second.signature && (!into || o.head > into->head))
        into = &o;
    if (!into) return;
    std::uint64_t oldest = ref.version;
    for (const auto& [id, r] : m.versions)
      if (r.lineage == l->first) oldest = std::min(oldest, id);
    // Joined only when it stays a chain in completion order: every version of the fork is newer
    // than the other lineage's head.
    if (into->head >= oldest) return;
    // Not while either encodes: a put holds its lineage's encode lock and reads its head (and a
    // put that chose the fork before it went looks again once it has the lock: lock_lineage,
    // delta_base.cpp).
    const std::shared_ptr<std::mutex> mu_from = l->second.encode_mu, mu_into = into->encode_mu;
    std::unique_lock a(*mu_from, std::try_to_lock);
    std::unique_lock b(*mu_into, std::try_to_lock);
    if (!a.owns_lock() || !b.owns_lock()) return;
    const std::uint64_t from = l->first, to = into->id;
    m.journal.append(to_bytes(impl::join_json(from, to)));
    superseded = m.join_lineage(from, to);
    if (superseded) m.collect(superseded, m.unneeded);
    // The fork's head was its lineage's first file, which keeps its image; joined, it may be
    // the only live file of the lineage it continues (the file it was renamed over already
    // released: a commit that ran behind the rename), where no image pays.
    drop_image = m.image_unpaid(to);
  }
  if (superseded && m.heads) m.heads->drop(superseded);
  if (drop_image) m.heads->drop(drop_image);
}

bool content_store::apply(std::span<const std::byte> record) {
  json j;
  try {
    j = json::from_cbor(reinterpret_cast<const std::uint8_t*>(record.data()),
                        reinterpret_cast<const std::uint8_t*>(record.data() + record.size()));
  } catch (const json::exception&) {
    return false;
  }
  if (!j.is_object() || !j.contains("t") || !j["t"].is_string()) return false;
  const auto t = j["t"].get<std::string>();
  if (t.rfind("c.", 0) != 0) return false;
  std::lock_guard lock(impl_->mu);
  try {
    if (t == "c.v") {
      impl_->apply_version(j);
    } else if (t == "c.l") {
      auto& l = impl_->lineages[j.at("l").get<std::uint64_t>()];
      l.id = j.at("l").get<std::uint64_t>();
      l.signature = j.at("s").get<std::uint64_t>();
      l.path_key = j.at("pk").get<std::string>();
      impl_->next_lineage = std::max(impl_->next_lineage, l.id + 1);
    } else if (t == "c.f") {
      // A feature that changes what other records mean: a daemon that does not know it must
      // refuse the store instead of misreading it (an older one throws at the record type).
      const auto f = j.at("f").get<std::string>();
      if (f != kFeatureSharedExtents)
        throw corrupt_error("content: the store uses a feature this daemon does not know: " + f);
      impl_->shared_extents = true;
    } else if (t == "c.j") {
      impl_->join_lineage(j.at("l").get<std::uint64_t>(), j.at("into").get<std::uint64_t>());
    } else {
      throw corrupt_error("content: unknown record " + t);
    }
  } catch (const json::exception& e) {
    throw corrupt_error(std::string("content: bad record: ") + e.what());
  }
  return true;
}

void content_store::replay_done(std::span<const content_ref> live) {
  // Records of reclaimed versions stay in the journal until it is compacted, and their objects
  // are removed again at every replay: their ids must never name a new object.
  impl_->objects.reserve_through(impl_->max_object);
  std::vector<std::uint64_t> doomed;
  std::map<std::uint64_t, head_store::expected> heads;
  {
    std::lock_guard lock(impl_->mu);
    auto& vs = impl_->versions;
    for (auto& [id, r] : vs) r.refs = r.dependents = 0;
    for (const auto& ref : live)
      if (auto it = vs.find(ref.version); it != vs.end()) ++it->second.refs;
    for (auto& [id, r] : vs) {
      if (r.base)
        if (auto b = vs.find(r.base); b != vs.end()) ++b->second.dependents;
      if (!r.refs && !r.donors.empty()) {  // kept as a donor at most (reclaim.cpp)
        r.donors.clear();
        r.donors_released = true;
      }
      for (const std::uint64_t d : r.donors)
        if (auto b = vs.find(d); b != vs.end()) ++b->second.dependents;
    }
    // Newest first: a delta's reclaim lowers its base's dependents before the base is looked at.
    std::vector<std::uint64_t> ids;
    for (auto& [id, r] : vs) ids.push_back(id);
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) impl_->collect(*it, doomed);
    // Chains left by deletions before the restart are looked at once (chain_rewrite.cpp).
    for (const auto& [lid, l] : impl_->lineages) impl_->chain_hints.insert(lid);
    // A rewritten version's old object: its new record is durable (we just replayed it).
    std::set<std::uint64_t> in_use;
    for (const auto& [id, r] : vs) in_use.insert(r.obj.id);
    for (auto o : impl_->replaced)
      if (!in_use.count(o)) doomed.push_back(o);
    impl_->replaced.clear();
    // Head images on disk that still match their lineage's newest version are kept, where the
    // lineage keeps other live files (image_pays; one pass here, a store may hold thousands of
    // lineages); the others' files go, and none is rebuilt: their next saves make no image
    // either (lineage_rec::single).
    std::set<std::uint64_t> others_live;
    for (const auto& [id, r] : vs)
      if (r.refs && !impl_->is_head(r)) others_live.insert(r.lineage);
    for (auto& [lid, l] : impl_->lineages) {
      const auto it = vs.find(l.head);
      if (it == vs.end()) continue;
      if (impl_->opt.heads_always || others_live.count(lid))
        heads[l.head] = {it->second.obj.checksum, it->second.size};
      else
        l.single = it->second.size >= impl_->opt.head_min;
    }
  }
  impl_->remove_objects(doomed);
  if (!impl_->heads) return;
  impl_->heads->scan(heads);
  // Large heads without an image on disk get one in the background, decoded through their
  // chains; their first reads meanwhile decode as any older version does.
  for (const auto& [v, e] : heads)
    if (!impl_->heads->get(v)) impl_->rebuild_head(v, e.checksum, e.size);
}

void content_store::ref(const content_ref& ref) {
  if (!ref.version) return;
  std::lock_guard lock(impl_->mu);
  auto it = impl_->versions.find(ref.version);
  if (it != impl_->versions.end()) ++it->second.refs;
}

version_info content_store::info(const content_ref& ref) const {
  version_info i;
  if (!ref.version) {
    i.format = "empty";
    i.kind = "exact";
    return i;
  }
  const version_rec r = impl_->get(ref.version);
  i.version = r.id;
  i.format = r.format;
  i.kind = std::string(name(r.kind));
  i.lineage = r.lineage;
  i.base = r.base;
  i.logical_bytes = r.size;
  i.stored_bytes = impl_->objects.disk_bytes(r.obj.id);
  i.path = r.path;
  i.created_ns = r.created_ns;
  i.refs = r.refs;
  i.object = r.obj.id;
  i.donors = r.donors;
  if (impl_->heads)
    if (const auto h = impl_->heads->get(r.id); h && h->published_fd() >= 0)
      i.head_bytes = h->size();
  return i;
}

void content_store::snapshot(std::vector<std::vector<std::byte>>& out) const {
  std::lock_guard lock(impl_->mu);
  if (impl_->shared_extents) out.push_back(to_bytes(impl::feature_json(kFeatureSharedExtents)));
  for (const auto& [id, l] : impl_->lineages)
    if (l.journaled) out.push_back(to_bytes(impl::lineage_json(l)));
  for (const auto& [id, r] : impl_->versions) out.push_back(to_bytes(impl::version_json(r)));
}

std::vector<version_info> content_store::versions() const {
  std::vector<std::uint64_t> ids;
  {
    std::lock_guard lock(impl_->mu);
    for (const auto& [id, r] : impl_->versions) ids.push_back(id);
  }
  std::vector<version_info> out;
  out.reserve(ids.size());
  for (auto id : ids) {
    try {
      out.push_back(info({id, 0}));
    } catch (const corrupt_error&) {
      // reclaimed meanwhile
    }
  }
  return out;
}

version_detail content_store::detail(const content_ref& ref) {
  version_detail d;
  d.info = info(ref);
  if (!ref.version) return d;
  const auto m = impl_->meta_of(ref.version);
  const version_meta& meta = *m->meta;
  d.coding = meta.coding;
  if (!d.coding.bits && meta.bits) d.coding.bits = meta.bits;  // written before coding_params
  for (const auto& r : meta.exact) d.exact_stored_bytes += r.encoded_bytes;
  if (meta.exact_inline) {
    // In the metadata, compressed with it: what the object holds beyond the tensors' frames.
    std::uint64_t frames = 0;
    for (const auto& f : meta.tensors) frames += f.encoded_bytes;
    d.exact_stored_bytes = d.info.stored_bytes > frames ? d.info.stored_bytes - frames : 0;
  }
  std::map<std::string, std::pair<std::uint64_t, codec::error_sums>> classes;
  for (const auto& f : meta.tensors) {
    const auto& t = meta.layout.tensors.at(f.tensor);
    const bool delta = f.mode == tensor_mode::delta;
    // Lossless frames with an error: a lossy keyframe's rounded tensors, and a rekeyed delta's
    // (it reads as the delta did, so the delta's error still holds).
    const bool lossy = delta || f.error;
    d.tensors.push_back({t.name, t.state_name, std::string(format::name(t.type)), t.elements(),
                         !delta          ? (f.intra_slabs ? "intra"
                                            : f.rounded   ? "rounded"
                                                          : "lossless")
                         : f.ratio       ? (f.intra_slabs ? "ratio+intra" : "ratio")
                         : f.grid_slabs  ? (f.intra_slabs ? "grid+intra" : "grid")
                         : f.intra_slabs ? "intra"
                                         : "delta",
                         f.encoded_bytes,
                         !lossy    ? 0.0
                         : f.error ? f.error->relative()
                                   : -1.0});
    if (!lossy || !f.error) continue;
    auto& c = classes[tensor_class(t.role())];
    ++c.first;
    c.second.merge(*f.error);
  }
  for (const auto& [name, c] : classes) d.fidelity.push_back({name, c.first, c.second.relative()});
  return d;
}

}  // namespace ckpt::fs
