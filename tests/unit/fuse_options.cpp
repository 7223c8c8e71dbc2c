// fs/fuse/options: the daemon's command line. The codec knobs (bits, coding, rep, scope,
// optimizer, keyframe_interval, lossless) reach content_options; bad values are refused with
// usage_error before anything is mounted; everything else goes to libfuse or is dropped.
#include <catch2/catch.hpp>
#include <initializer_list>
#include <string>
#include <vector>

#include "fs/fuse/options.hpp"

using ckpt::fs::content_options;
using ckpt::fs::fuse::daemon_options;
using ckpt::fs::fuse::kDefaultRefreshInterval;
using ckpt::fs::fuse::parse_command_line;
using ckpt::fs::fuse::usage_error;
using ckpt::fs::fuse::usage_text;
namespace codec = ckpt::codec;

namespace {

daemon_options parse(std::initializer_list<const char*> args) {
  std::vector<const char*> argv{"ckptfs"};
  argv.insert(argv.end(), args);
  return parse_command_line(int(argv.size()), argv.data());
}

daemon_options parse_o(const std::string& opts) {
  return parse({"store", "mnt", "-o", opts.c_str()});
}

}  // namespace

TEST_CASE("fuse options: no -o gives content_options' defaults", "[fuse]") {
  const auto d = parse({"store", "mnt"});
  const content_options def;
  CHECK(d.store == "store");
  CHECK(d.mountpoint == "mnt");
  CHECK(d.content.bits == def.bits);
  CHECK(d.content.lossless == def.lossless);
  // The mount's own: the interval by the checkpoint's size, and refreshes (the library keeps a
  // fixed 20 and none).
  CHECK(d.content.keyframe_interval == 0);
  CHECK(d.content.refresh_interval == kDefaultRefreshInterval);
  CHECK(def.keyframe_interval == 20);
  CHECK(def.refresh_interval == 0);
  // The weights' error allowance: none unless asked for (matrix factorisation's accuracy limit).
  CHECK(d.content.weight_error == 0);
  CHECK(d.content.grid_error == def.grid_error);
  CHECK(def.weight_error == 0);
  CHECK(d.content.paper_coding == def.paper_coding);
  CHECK(d.content.rep == def.rep);
  CHECK(d.content.scope == def.scope);
  CHECK(d.content.exact_optimizer == def.exact_optimizer);
  CHECK(d.content.relative == def.relative);
  CHECK(d.fuse_options.empty());
}

TEST_CASE("fuse options: the help names the defaults content_options has", "[fuse]") {
  const content_options def;
  const std::string help = usage_text("ckptfs");
  CHECK_THAT(help, Catch::Contains("1..4 (default " + std::to_string(def.bits) + ")"));
  CHECK_THAT(help, Catch::Contains("auto (default): N = 1 GiB / its size, within " +
                                   std::to_string(def.kAutoKeyframeMin) + ".." +
                                   std::to_string(def.kAutoKeyframeMax)));
  CHECK_THAT(help, Catch::Contains("with 4 bits (default " +
                                   std::to_string(kDefaultRefreshInterval) + ")"));
  CHECK_THAT(help, Catch::Contains(def.paper_coding ? "paper (default)" : "grouped (default)"));
  CHECK_THAT(help,
             Catch::Contains(def.rep == codec::representative::mean ? "mean (default)"
                                                                    : "(max+min)/2) (default)"));
  CHECK_THAT(
      help, Catch::Contains(def.scope == codec::bucket_scope::tensor ? "per tensor (default)"
                                                                     : "per checkpoint (default)"));
  CHECK_THAT(help, Catch::Contains(def.exact_optimizer ? "exact (default)" : "lossy (default)"));
  CHECK_THAT(help, Catch::Contains(def.relative ? "on (default)" : "off (default)"));
}

TEST_CASE("fuse options: coding, rep, scope and optimizer take each of their values", "[fuse]") {
  CHECK_FALSE(parse_o("coding=grouped").content.paper_coding);
  CHECK(parse_o("coding=paper").content.paper_coding);
  CHECK(parse_o("rep=mean").content.rep == codec::representative::mean);
  CHECK(parse_o("rep=midrange").content.rep == codec::representative::midrange);
  CHECK(parse_o("scope=tensor").content.scope == codec::bucket_scope::tensor);
  CHECK(parse_o("scope=checkpoint").content.scope == codec::bucket_scope::checkpoint);
  CHECK_FALSE(parse_o("optimizer=lossy").content.exact_optimizer);
  CHECK(parse_o("optimizer=exact").content.exact_optimizer);
  CHECK(parse_o("relative=on").content.relative);
  CHECK_FALSE(parse_o("relative=off").content.relative);

  // All at once, in one list, in -oOPTS form and across several -o; the last value wins.
  const auto d = parse({"store", "mnt", "-ocoding=paper,rep=midrange", "-o",
                        "scope=checkpoint,optimizer=exact,bits=2,keyframe_interval=7", "-o",
                        "bits=4,lossless"});
  CHECK(d.content.paper_coding);
  CHECK(d.content.rep == codec::representative::midrange);
  CHECK(d.content.scope == codec::bucket_scope::checkpoint);
  CHECK(d.content.exact_optimizer);
  CHECK(d.content.bits == 4);
  CHECK(d.content.keyframe_interval == 7);
  CHECK(d.content.lossless);
  CHECK(d.fuse_options.empty());
}

TEST_CASE("fuse options: keyframe_interval takes auto or 1.. and refresh_interval off or 0..",
          "[fuse]") {
  CHECK(parse_o("keyframe_interval=auto").content.keyframe_interval == 0);
  CHECK(parse_o("keyframe_interval=1").content.keyframe_interval == 1);
  CHECK(parse_o("keyframe_interval=20").content.keyframe_interval == 20);
  CHECK(parse_o("refresh_interval=off").content.refresh_interval == 0);
  CHECK(parse_o("refresh_interval=0").content.refresh_interval == 0);
  CHECK(parse_o("refresh_interval=10").content.refresh_interval == 10);
  CHECK_THROWS_WITH(parse_o("keyframe_interval=0"),
                    Catch::Contains("keyframe_interval (expected auto or an integer from 1"));
  CHECK_THROWS_WITH(parse_o("refresh_interval=-1"),
                    Catch::Contains("refresh_interval (expected off or an integer from 0"));
}

TEST_CASE("fuse options: weight_error takes off or a percentage, grid_error a factor 1..64",
          "[fuse]") {
  CHECK(parse_o("weight_error=off").content.weight_error == 0);
  CHECK(parse_o("weight_error=0").content.weight_error == 0);
  CHECK(parse_o("weight_error=2.5%").content.weight_error == Approx(0.025));
  CHECK(parse_o("weight_error=5%").content.weight_error == Approx(0.05));
  CHECK(parse_o("grid_error=1").content.grid_error == 1);
  CHECK(parse_o("grid_error=16").content.grid_error == 16);
  for (const char* bad : {"weight_error=30%", "weight_error=-1%", "weight_error=x%",
                          "weight_error=%", "weight_error=2.5%%", "weight_error", "grid_error=0.5",
                          "grid_error=100", "grid_error=", "grid_error"})
    CHECK_THROWS_AS(parse_o(bad), usage_error);
  // A number without its sign is refused, not taken as a percentage of a percent.
  CHECK_THROWS_WITH(parse_o("weight_error=0.025"),
                    Catch::Contains("invalid value '0.025' for -o weight_error (off, or a "
                                    "percentage from 0.01% to 20%"));
  CHECK_THROWS_WITH(parse_o("weight_error=2.5%%"),
                    Catch::Contains("invalid value '2.5%%' for -o weight_error"));
  CHECK_THROWS_WITH(parse_o("weight_error=30%"),
                    Catch::Contains("invalid value '30%' for -o weight_error"));
}

TEST_CASE("fuse options: ratio_bits 1..4 are taken, default 1, others refused", "[fuse]") {
  CHECK(parse_o("bits=3").content.ratio_bits == 1);
  CHECK(parse_o("bits=4").content.ratio_bits == 1);
  for (int b = 1; b <= 4; ++b)
    CHECK(parse_o("ratio_bits=" + std::to_string(b)).content.ratio_bits == b);
  for (const char* bad : {"ratio_bits=0", "ratio_bits=5", "ratio_bits=", "ratio_bits"})
    CHECK_THROWS_AS(parse_o(bad), usage_error);
}

TEST_CASE("fuse options: intra on by default, intra_buckets within what bits has", "[fuse]") {
  CHECK(parse_o("bits=3").content.intra);
  CHECK_FALSE(parse_o("intra=off").content.intra);
  CHECK(parse_o("bits=3").content.intra_buckets == 0);
  CHECK(parse_o("bits=3").content.intra_buckets_for(3) == 5);
  CHECK(parse_o("bits=3").content.intra_buckets_for(1) == 1);
  // Adam's m one fewer by default, as many as asked for when set.
  CHECK(parse_o("bits=3").content.intra_buckets_for(3, true) == 4);
  CHECK(parse_o("bits=3").content.intra_buckets_for(2, true) == 1);
  CHECK(parse_o("bits=3").content.intra_buckets_for(1, true) == 1);
  CHECK(parse_o("intra_buckets=6").content.intra_buckets_for(3, true) == 6);
  CHECK(parse_o("intra_buckets=7").content.intra_buckets == 7);
  CHECK(parse_o("bits=4,intra_buckets=15").content.intra_buckets_for(4) == 15);
  CHECK_THROWS_WITH(parse_o("intra_buckets=8"),
                    Catch::Contains("intra_buckets=8") && Catch::Contains("bits=3"));
  for (const char* bad : {"intra_buckets=0", "intra_buckets=16", "intra_buckets=", "intra_buckets",
                          "intra=yes", "intra"})
    CHECK_THROWS_AS(parse_o(bad), usage_error);
}

TEST_CASE("fuse options: grid auto, off or a step, and only with bits >= 2", "[fuse]") {
  using ckpt::fs::content_options;
  CHECK(parse_o("bits=3").content.grid_step == content_options::kAutoGrid);
  CHECK(parse_o("grid=auto").content.grid_step == content_options::kAutoGrid);
  CHECK(parse_o("grid=off").content.grid_step == 0);
  CHECK(parse_o("grid=0").content.grid_step == 0);
  CHECK(parse_o("grid=1.25").content.grid_step == 1.25);
  CHECK(parse_o("bits=2,grid=0.05").content.grid_step == 0.05);
  CHECK(parse_o("bits=1").content.bits == 1);  // the default needs no refusal
  CHECK(parse_o("bits=1,grid=off").content.grid_step == 0);
  CHECK_THROWS_WITH(parse_o("bits=1,grid=auto"), Catch::Contains("bits=2"));
  CHECK_THROWS_WITH(parse_o("bits=1,grid=1"), Catch::Contains("bits=2"));
  for (const char* bad :
       {"grid=", "grid", "grid=on", "grid=-1", "grid=0.01", "grid=17", "grid=1x", "grid=nan"})
    CHECK_THROWS_AS(parse_o(bad), usage_error);
}

TEST_CASE("fuse options: moment_bits 0..23, default 2", "[fuse]") {
  CHECK(parse_o("bits=3").content.moment_bits == 2);
  CHECK(ckpt::fs::content_options{}.moment_bits == 0);  // the library's own: keyframe_bits
  CHECK(parse_o("moment_bits=0").content.moment_bits == 0);
  CHECK(parse_o("moment_bits=12").content.moment_bits == 12);
  for (const char* bad :
       {"moment_bits=24", "moment_bits=-1", "moment_bits=", "moment_bits", "moment_bits=6x"})
    CHECK_THROWS_AS(parse_o(bad), usage_error);
}

TEST_CASE("fuse options: heads auto (default), on or off", "[fuse]") {
  const auto d = parse_o("bits=3");
  CHECK(d.heads);
  CHECK_FALSE(d.content.heads_always);  // auto: none where the head is the only live file
  CHECK_FALSE(content_options{}.heads_always);
  CHECK(parse_o("heads=auto").heads);
  CHECK_FALSE(parse_o("heads=auto").content.heads_always);
  CHECK(parse_o("heads=on").heads);
  CHECK(parse_o("heads=on").content.heads_always);
  CHECK_FALSE(parse_o("heads=off").heads);
  for (const char* bad : {"heads=yes", "heads=", "heads", "heads=ON"})
    CHECK_THROWS_AS(parse_o(bad), usage_error);
}

TEST_CASE("fuse options: min_tensor is a size of at least one byte", "[fuse]") {
  CHECK(parse_o("bits=3").content.min_tensor_bytes == 256);
  CHECK(ckpt::fs::content_options{}.min_tensor_bytes == 4096);  // the library's own
  CHECK(parse_o("min_tensor=256").content.min_tensor_bytes == 256);
  CHECK(parse_o("min_tensor=1K").content.min_tensor_bytes == 1024);
  CHECK(parse_o("min_tensor=1").content.recognise().min_compress_bytes == 1);
  for (const char* bad :
       {"min_tensor=0", "min_tensor=", "min_tensor", "min_tensor=-1", "min_tensor=1Q"})
    CHECK_THROWS_AS(parse_o(bad), usage_error);
}

TEST_CASE("fuse options: keyframe_bits 0..23, default 12, not with lossless", "[fuse]") {
  CHECK(parse_o("bits=3").content.keyframe_bits == 12);
  CHECK(parse_o("keyframe_bits=8").content.keyframe_bits == 8);
  CHECK(parse_o("keyframe_bits=0").content.keyframe_bits == 0);
  CHECK(parse_o("keyframe_bits=23").content.keyframe_bits == 23);
  // lossless alone is fine (it ignores the default); with an explicit keyframe_bits it is not.
  CHECK(parse_o("lossless").content.lossless);
  CHECK_NOTHROW(parse_o("lossless,keyframe_bits=0"));
  for (const char* bad :
       {"keyframe_bits=-1", "keyframe_bits=24", "keyframe_bits=", "keyframe_bits"})
    CHECK_THROWS_AS(parse_o(bad), usage_error);
  CHECK_THROWS_WITH(parse_o("lossless,keyframe_bits=8"), Catch::Contains("contradict"));
}

TEST_CASE("fuse options: bits 1..4 are taken, anything else is refused", "[fuse]") {
  for (int b = 1; b <= 4; ++b) CHECK(parse_o("bits=" + std::to_string(b)).content.bits == b);
  for (const char* bad : {"bits=0", "bits=5", "bits=-1", "bits=3x", "bits=", "bits=2.5", "bits"})
    CHECK_THROWS_AS(parse_o(bad), usage_error);
  CHECK_THROWS_WITH(parse_o("bits=9"), Catch::Contains("bits") && Catch::Contains("1 to 4"));
}

TEST_CASE("fuse options: invalid codec values are refused with the choices", "[fuse]") {
  CHECK_THROWS_WITH(parse_o("coding=huffman"),
                    Catch::Contains("coding") && Catch::Contains("grouped, paper"));
  CHECK_THROWS_WITH(parse_o("rep=median"),
                    Catch::Contains("rep") && Catch::Contains("mean, midrange"));
  CHECK_THROWS_WITH(parse_o("scope=block"),
                    Catch::Contains("scope") && Catch::Contains("tensor, checkpoint"));
  CHECK_THROWS_WITH(parse_o("optimizer=drop"),
                    Catch::Contains("optimizer") && Catch::Contains("lossy, exact"));
  CHECK_THROWS_WITH(parse_o("relative=yes"),
                    Catch::Contains("relative") && Catch::Contains("on, off"));
  // Case matters, a value is required, and an empty value is not a choice.
  for (const char* bad :
       {"coding=Paper", "coding", "rep=", "scope", "optimizer=", "keyframe_interval=0",
        "keyframe_interval=x", "keyframe_interval=Auto", "refresh_interval=x",
        "refresh_interval=-1", "refresh_interval", "lossless=1", "relative", "relative="})
    CHECK_THROWS_AS(parse_o(bad), usage_error);
}

TEST_CASE("fuse options: other options go to libfuse, mount(8)'s generic ones are dropped",
          "[fuse]") {
  const auto d = parse_o("allow_other,defaults,noauto,x-systemd.automount,ro,coding=paper");
  CHECK(d.fuse_options == std::vector<std::string>{"allow_other", "ro"});
  CHECK(d.content.paper_coding);
  CHECK_THROWS_AS(parse({"store"}), usage_error);
  CHECK_THROWS_AS(parse({"store", "mnt", "extra"}), usage_error);
  CHECK_THROWS_AS(parse({"store", "mnt", "-o"}), usage_error);
  CHECK(parse({"ckptfs#/data/store", "mnt"}).store == "/data/store");
}

TEST_CASE("fuse options: reads=direct (default) or cached", "[fuse]") {
  CHECK(parse({"store", "mnt"}).direct_checkpoint_reads);
  CHECK(parse_o("reads=direct").direct_checkpoint_reads);
  CHECK_FALSE(parse_o("reads=cached").direct_checkpoint_reads);
  CHECK_THAT(usage_text("ckptfs"), Catch::Contains("direct (default)"));
  CHECK_THROWS_WITH(parse_o("reads=mmap"),
                    Catch::Contains("reads") && Catch::Contains("direct, cached"));
  CHECK_THROWS_AS(parse_o("reads"), usage_error);
  CHECK(parse_o("reads=cached").fuse_options.empty());  // ours, not libfuse's
}

TEST_CASE("fuse options: reclaim takes 0 or a factor from 1 to 100", "[fuse]") {
  CHECK(parse({"store", "mnt"}).reclaim == 1.25);
  CHECK_THAT(usage_text("ckptfs"), Catch::Contains("(default 1.25"));
  CHECK(parse_o("reclaim=0").reclaim == 0);
  CHECK(parse_o("reclaim=2.5").reclaim == 2.5);
  CHECK(parse_o("reclaim=1").reclaim == 1);
  for (const char* bad : {"reclaim=0.5", "reclaim=101", "reclaim=", "reclaim=x", "reclaim=1.2x",
                          "reclaim=-1", "reclaim=nan", "reclaim"})
    CHECK_THROWS_WITH(parse_o(bad), Catch::Contains("reclaim"));
}
