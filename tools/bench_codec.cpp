// `ckptctl bench codec`: bits per parameter, ratio and encode/decode throughput of every codec
// mode on synthetic (Gaussian, Laplacian) and real (tests/bench/make_real_deltas.py) deltas, with
// zstd -1 on the raw fp32 delta measured in the same run as the baseline. Every run also checks
// that decoding returns exactly the encoder's reconstruction.
#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#include <zstd.h>

#include <algorithm>
#include <boost/filesystem.hpp>
#include <boost/filesystem/fstream.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "codec/error.hpp"
#include "codec/mantissa.hpp"
#include "codec/scratch.hpp"
#include "codec/tensor_codec.hpp"
#include "tools/commands.hpp"
#include "tools/ctl_util.hpp"

namespace ckpt::tools {
namespace {

namespace fs = boost::filesystem;
using namespace ckpt::codec;

struct dataset {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::byte> prev, cur;  // prev plays the reconstruction of the previous version
  std::vector<std::size_t> tensor_elements;  // boundaries for per-tensor buckets
  std::size_t elements() const { return cur.size() / element_size(type); }
};

struct mode {
  std::string name;
  int bits = 0;  // 0: not lossy
  int group = 0;
  entropy_policy policy = entropy_policy::best;
  bucket_scope scope = bucket_scope::checkpoint;
  representative rep = representative::mean;
  enum kind_t { lossy, lossless, zstd_delta } kind = lossy;
  bool relative = false;  // nonnegative tensors as ratios (the mount's relative=on)
  int round_bits = 0;     // reconstructions rounded (a chain on a lossy keyframe), the base too
  bool grid = false;      // difference tables by codec::select_difference (the mount's grid=auto)
  bool v_only = false;    // only on Adam's v (the mount codes other tensors otherwise)
};

struct options {
  std::vector<int> threads{1};
  bool json = false;
  std::string data_dir;
  std::size_t elements = 16u << 20;
  std::string dtype_name = "f32";
  int repeats = 5;
  std::size_t block_bytes = default_block_bytes;
};

std::vector<std::byte> convert(const std::vector<float>& v, dtype t) {
  std::vector<std::byte> out(v.size() * element_size(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == dtype::f32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const std::uint16_t h = t == dtype::f16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

dataset synthetic(const std::string& kind, std::size_t n, dtype t) {
  std::mt19937_64 rng(kind == "gauss" ? 1 : 2);
  std::normal_distribution<float> weights(0.0f, 0.02f);
  std::normal_distribution<float> gauss(0.0f, 1e-3f);
  std::exponential_distribution<float> expo(1.0f / 1e-3f);
  std::bernoulli_distribution coin(0.5);
  std::vector<float> prev(n), cur(n);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = weights(rng);
    const float d = kind == "gauss" ? gauss(rng) : (coin(rng) ? 1.0f : -1.0f) * expo(rng);
    cur[i] = prev[i] + d;
  }
  dataset d{kind, t, convert(prev, t), convert(cur, t), {n}};
  if (t != dtype::f32) {
    // Round-tripped through the 16-bit type, prev must be what a reader would have seen.
    d.name += "-" + std::string(name(t));
  }
  return d;
}

// Adam's second moment between two saves: v' = β2·v + (1 − β2)·g² with β2 = 0.999, 200 steps
// apart, each element's gradient scale drifting between the saves (log-normal, σ = 0.7), the
// previous version rounded to moment_bits = 2 (the mount's chain keeps v at 2 mantissa bits).
// Four tensors, so that the per-tensor modes (the mount's) run on it too.
dataset adam_v(std::size_t n, dtype t) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> grad(0.0f, 1.0f), drift(0.0f, 0.7f);
  std::lognormal_distribution<float> scale(-7.0f, 1.0f);  // per-element gradient scale
  std::vector<float> prev(n), cur(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float s = scale(rng), s_next = s * std::exp(drift(rng));
    const float v = s * s;
    prev[i] = v;
    // 200 steps of the recurrence in closed form for the decay; the new gradients' mean square,
    // plus the noise of one of them.
    const float decay = 0.81865f;  // 0.999^200
    const float g = s_next * grad(rng);
    cur[i] = decay * v + (1.0f - decay) * (s_next * s_next + 0.1f * g * g);
  }
  dataset d{"adam-v", t, convert(prev, t), convert(cur, t), {}};
  round_mantissa(t, d.prev, d.prev, 2);
  for (int q = 0; q < 4; ++q) d.tensor_elements.push_back(n / 4 + (q == 3 ? n % 4 : 0));
  if (t != dtype::f32) d.name += "-" + std::string(name(t));
  return d;
}

std::vector<std::byte> read_file(const fs::path& p) {
  fs::ifstream f(p, std::ios::binary);
  if (!f) throw error(errc::io, "cannot read " + p.string());
  std::vector<std::byte> v(fs::file_size(p));
  f.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size()));
  return v;
}

// A real pair written by tests/bench/make_real_deltas.py: <name>.json lists the tensors,
// <name>.prev.f32 / <name>.cur.f32 hold them flattened in the same order.
dataset real(const fs::path& json_path) {
  fs::ifstream f(json_path);
  const auto meta = nlohmann::json::parse(f);
  dataset d;
  d.name = meta.at("name").get<std::string>();
  const fs::path dir = json_path.parent_path();
  d.prev = read_file(dir / meta.at("prev").get<std::string>());
  d.cur = read_file(dir / meta.at("cur").get<std::string>());
  std::size_t total = 0;
  for (const auto& t : meta.at("tensors")) {
    d.tensor_elements.push_back(t.at("numel").get<std::size_t>());
    total += d.tensor_elements.back();
  }
  if (d.prev.size() != d.cur.size() || total * 4 != d.cur.size())
    throw error(errc::invalid, "inconsistent bench data in " + json_path.string());
  return d;
}

template <class F>
double median_seconds(int repeats, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct result {
  double bits_per_param, ratio, encode_gbps, decode_gbps, zero_fraction = -1;
};

std::vector<delta_input> split(const dataset& d, bucket_scope scope) {
  std::vector<delta_input> in;
  const std::size_t es = element_size(d.type);
  if (scope == bucket_scope::checkpoint || d.tensor_elements.size() <= 1) {
    in.push_back({d.type, d.cur, d.prev});
    return in;
  }
  std::size_t at = 0;
  for (auto n : d.tensor_elements) {
    in.push_back(
        {d.type, std::span(d.cur).subspan(at, n * es), std::span(d.prev).subspan(at, n * es)});
    at += n * es;
  }
  return in;
}

result run_lossy(const dataset& data, const mode& m, const options& o) {
  // A chain on a lossy keyframe: its base has the kept bits already (codec.md, "Lossy
  // keyframes").
  dataset rounded_base;
  if (m.round_bits) {
    rounded_base = data;
    round_mantissa(data.type, data.prev, rounded_base.prev, m.round_bits);
  }
  const dataset& d = m.round_bits ? rounded_base : data;
  const auto inputs = split(d, m.scope);
  lossy_params p{m.bits, m.group, m.rep, m.policy, m.round_bits};
  std::vector<std::byte> recon(d.cur.size()), decoded(d.cur.size());
  std::vector<std::vector<std::byte>> frames(inputs.size());
  const double enc = median_seconds(o.repeats, [&] {
    // grid: each tensor's statistics once, then its table as the mount's grid=auto picks it.
    std::vector<quant_table> tables;
    if (m.grid) {
      for (const auto& in : inputs) {
        const auto kind = choose_kind(in, m.relative);
        const auto st = gather_stats(std::span(&in, 1), m.rep == representative::midrange, kind);
        tables.push_back(kind == delta_kind::difference ? select_difference(st, m.bits, m.rep)
                                                        : select_buckets(st, m.bits, m.rep, kind));
      }
    } else {
      tables = plan_tables(inputs, m.bits, m.rep, m.scope, m.relative);
    }
    std::size_t at = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      frames[i].clear();
      encode_delta_into(inputs[i], tables[i], p, std::span(recon).subspan(at, inputs[i].cur.size()),
                        frames[i], o.block_bytes);
      at += inputs[i].cur.size();
    }
  });
  const double dec = median_seconds(o.repeats, [&] {
    std::size_t at = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const std::size_t len = inputs[i].cur.size();
      decode(frames[i], inputs[i].base, std::span(decoded).subspan(at, len));
      at += len;
    }
  });
  if (decoded != recon) throw error(errc::corrupt, "bench: decode differs from reconstruction");
  std::size_t bytes = 0;
  for (auto& f : frames) bytes += f.size();
  // Fraction of elements left at their base (the zero symbol), a measure of the skew.
  std::size_t same = 0;
  const std::size_t es = element_size(d.type);
  for (std::size_t i = 0; i < d.elements(); ++i)
    same += std::memcmp(recon.data() + i * es, d.prev.data() + i * es, es) == 0;
  const double n = double(d.elements());
  return {8.0 * double(bytes) / n, double(d.cur.size()) / double(bytes),
          double(d.cur.size()) / enc / 1e9, double(d.cur.size()) / dec / 1e9, double(same) / n};
}

// round_bits > 0: the tensor rounded to that many mantissa bits first, as the mount rounds its
// keyframes (keyframe_bits); the rounding is not timed.
result run_lossless(const dataset& d, const mode& m, const options& o) {
  std::vector<std::byte> cur = d.cur;
  if (m.round_bits && m.round_bits < mantissa_bits(d.type))
    round_mantissa(d.type, cur, cur, m.round_bits);
  std::vector<std::byte> frame, decoded(cur.size());
  const double enc = median_seconds(o.repeats, [&] {
    frame.clear();
    encode_exact_into(d.type, cur, frame, o.block_bytes);
  });
  const double dec = median_seconds(o.repeats, [&] { decode(frame, {}, decoded); });
  if (decoded != cur) throw error(errc::corrupt, "bench: lossless round trip differs");
  const double n = double(d.elements());
  return {8.0 * double(frame.size()) / n, double(d.cur.size()) / double(frame.size()),
          double(d.cur.size()) / enc / 1e9, double(d.cur.size()) / dec / 1e9};
}

// The baseline a user could run today: zstd -1 over the exact fp32 delta (single-threaded, as
// the zstd library is here; compare it with the threads=1 rows).
result run_zstd_delta(const dataset& d, const options& o) {
  const std::size_t n = d.elements();
  std::vector<float> delta(n), back(n);
  std::vector<char> z(ZSTD_compressBound(n * 4));
  std::size_t zsize = 0;
  auto to_f32 = [&](const std::vector<std::byte>& v, std::size_t i) {
    if (d.type == dtype::f32) {
      float f;
      std::memcpy(&f, v.data() + 4 * i, 4);
      return f;
    }
    std::uint16_t h;
    std::memcpy(&h, v.data() + 2 * i, 2);
    return d.type == dtype::f16 ? f16_to_f32(h) : bf16_to_f32(h);
  };
  const double enc = median_seconds(o.repeats, [&] {
    for (std::size_t i = 0; i < n; ++i) delta[i] = to_f32(d.cur, i) - to_f32(d.prev, i);
    zsize = ZSTD_compress(z.data(), z.size(), delta.data(), n * 4, 1);
  });
  if (ZSTD_isError(zsize)) throw error(errc::io, "zstd failed");
  const double dec =
      median_seconds(o.repeats, [&] { ZSTD_decompress(back.data(), n * 4, z.data(), zsize); });
  if (std::memcmp(back.data(), delta.data(), n * 4) != 0)
    throw error(errc::corrupt, "bench: zstd round trip differs");
  return {8.0 * double(zsize) / double(n), double(d.cur.size()) / double(zsize),
          double(d.cur.size()) / enc / 1e9, double(d.cur.size()) / dec / 1e9};
}

std::vector<mode> modes(bool per_tensor_available) {
  std::vector<mode> m;
  m.push_back({"paper", 2, 1, entropy_policy::huffman_only});
  m.push_back({"paper", 3, 1, entropy_policy::huffman_only});
  m.push_back({"grouped", 2, 4, entropy_policy::best});
  m.push_back({"grouped", 3, 2, entropy_policy::best});
  if (per_tensor_available) {
    m.push_back({"grouped-tensor", 2, 4, entropy_policy::best, bucket_scope::tensor});
    m.push_back({"grouped-tensor", 3, 2, entropy_policy::best, bucket_scope::tensor});
    m.push_back({"grouped-tensor", 4, 2, entropy_policy::best, bucket_scope::tensor});
    // The mount's defaults: ratios for nonnegative tensors (Adam's v).
    for (int bits : {3, 4}) {
      mode r{"grouped-tensor-rel", bits, 2, entropy_policy::best, bucket_scope::tensor};
      r.relative = true;
      m.push_back(r);
    }
    // ... on a chain of 12-bit keyframes (the mount's default keyframe_bits): rounded deltas.
    mode r{"grouped-tensor-rel-round12", 3, 2, entropy_policy::best, bucket_scope::tensor};
    r.relative = true;
    r.round_bits = 12;
    m.push_back(r);
    // ... and differences on a grid where it is estimated to save bits (grid=auto).
    r.name = "grouped-tensor-rel-round12-grid";
    r.grid = true;
    m.push_back(r);
    // Adam's v as the mount codes it: 1-bit ratios (ratio_bits=1), rounded to 2 mantissa bits
    // (moment_bits=2), eight symbols a group.
    mode v{"v-ratio1-round2", 1, 8, entropy_policy::best, bucket_scope::tensor};
    v.relative = true;
    v.round_bits = 2;
    v.v_only = true;
    m.push_back(v);
  }
  mode l;
  l.name = "lossless";
  l.kind = mode::lossless;
  m.push_back(l);
  l.name = "lossless-round12";  // the mount's keyframes (keyframe_bits=12)
  l.round_bits = 12;
  m.push_back(l);
  mode z;
  z.name = "zstd-1-delta";
  z.kind = mode::zstd_delta;
  m.push_back(z);
  return m;
}

void run(const options& o) {
  const auto t = parse_dtype(o.dtype_name);
  if (!t || *t == dtype::bytes) throw invalid_argument("--dtype must be f32, f16 or bf16");
  std::vector<dataset> sets;
  sets.push_back(synthetic("gauss", o.elements, *t));
  sets.push_back(synthetic("laplace", o.elements, *t));
  sets.push_back(adam_v(o.elements, *t));
  if (!o.data_dir.empty()) {
    std::vector<fs::path> metas;
    for (const auto& e : fs::directory_iterator(o.data_dir))
      if (e.path().extension() == ".json") metas.push_back(e.path());
    std::sort(metas.begin(), metas.end());
    if (metas.empty()) throw invalid_argument("no *.json bench data in " + o.data_dir);
    for (const auto& p : metas) sets.push_back(real(p));
  }
  if (!o.json)
    std::printf("%-10s %-15s %4s %5s %7s %8s %8s %9s %9s %7s\n", "data", "mode", "bits", "group",
                "threads", "bits/par", "ratio", "enc GB/s", "dec GB/s", "zero%");
  for (int threads : o.threads) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, std::size_t(threads));
    tbb::task_arena arena(threads);
    for (const auto& d : sets) {
      for (const auto& m : modes(d.tensor_elements.size() > 1)) {
        if (m.v_only && d.name.rfind("adam-v", 0) != 0) continue;
        result r;
        arena.execute([&] {
          r = m.kind == mode::lossy      ? run_lossy(d, m, o)
              : m.kind == mode::lossless ? run_lossless(d, m, o)
                                         : run_zstd_delta(d, o);
        });
        if (o.json) {
          nlohmann::json j{{"mode", m.name},
                           {"bits", m.bits},
                           {"group", m.group},
                           {"scope", std::string(name(m.scope))},
                           {"data", d.name},
                           {"dtype", std::string(name(d.type))},
                           {"threads", threads},
                           {"elements", d.elements()},
                           {"bits_per_param", r.bits_per_param},
                           {"ratio", r.ratio},
                           {"encode_gbps", r.encode_gbps},
                           {"decode_gbps", r.decode_gbps}};
          if (r.zero_fraction >= 0) j["zero_fraction"] = r.zero_fraction;
          std::cout << j.dump() << "\n" << std::flush;
        } else {
          char zero[16] = "-";
          if (r.zero_fraction >= 0) std::snprintf(zero, sizeof zero, "%.1f", 100 * r.zero_fraction);
          std::printf("%-10s %-15s %4d %5d %7d %8.3f %8.2f %9.2f %9.2f %7s\n", d.name.c_str(),
                      m.name.c_str(), m.bits, m.group, threads, r.bits_per_param, r.ratio,
                      r.encode_gbps, r.decode_gbps, zero);
          std::fflush(stdout);
        }
      }
    }
  }
  // Every thread that coded keeps the codec's scratch (codec/scratch.hpp): what the runs above
  // left, for the daemon's thread limits (fs/content/thread_limits.hpp).
  if (!o.json)
    std::printf("codec scratch held: %.1f MiB in %s\n", double(scratch_bytes()) / double(1 << 20),
                plural(scratch_threads(), "thread").c_str());
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto o = std::make_shared<options>();
  auto* codec = bench->add_subcommand(
      "codec",
      "Bits/param, ratio and GB/s of every codec mode (paper, grouped, lossless, zstd -1)");
  codec->add_option("--threads", o->threads, "Thread counts to run, e.g. 1,2")
      ->delimiter(',')
      ->check(CLI::Range(1, 256));
  codec->add_flag("--json", o->json, "One JSON object per line");
  codec
      ->add_option("--data", o->data_dir,
                   "Directory of real deltas from tests/bench/make_real_deltas.py")
      ->check(CLI::ExistingDirectory);
  codec->add_option("--elements", o->elements, "Elements of the synthetic tensors")
      ->check(CLI::Range(std::size_t(1), std::size_t(1) << 31));
  codec->add_option("--dtype", o->dtype_name, "Synthetic tensor dtype: f32, f16, bf16");
  codec->add_option("--repeats", o->repeats, "Timed runs per measurement (median)")
      ->check(CLI::Range(1, 1000));
  codec->add_option("--block-bytes", o->block_bytes, "Input bytes per block")
      ->check(CLI::Range(std::size_t(4096), max_block_bytes));
  codec->callback([o] { run(*o); });
}

}  // namespace ckpt::tools
