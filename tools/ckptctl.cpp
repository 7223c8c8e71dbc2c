// ckptctl: management and benchmarks for ckptfs. This is the CLI's one error boundary: library
// errors (and a failed operation on the store) become a one-line message and exit status 1;
// usage errors (CLI11 parse errors, tools::usage_error) exit 2.
#include <malloc.h>

#include <cstdio>
#include <exception>

#include "codec/error.hpp"
#include "tools/commands.hpp"
#include "tools/ctl_util.hpp"

int main(int argc, char** argv) {
  // Like the daemon: keep freed buffers in the process instead of returning them to the kernel
  // after every checkpoint; re-faulting fresh pages costs more than coding them
  // (docs/benchmarks.md).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  CLI::App app{"ckptctl: manage and benchmark ckptfs checkpoint stores"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ckptctl 0.1.0");
  ckpt::tools::add_bench_command(app);
  ckpt::tools::add_inspect_command(app);
  ckpt::tools::add_ls_command(app);
  ckpt::tools::add_stat_command(app);
  ckpt::tools::add_prune_command(app);
  ckpt::tools::add_rm_command(app);
  ckpt::tools::add_verify_command(app);
  ckpt::tools::add_export_command(app);
  ckpt::tools::add_gc_command(app);
  ckpt::tools::add_status_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  } catch (const ckpt::tools::usage_error& e) {
    std::fprintf(stderr, "ckptctl: %s\nRun with --help for more information.\n", e.what());
    return 2;
  } catch (const ckpt::error& e) {
    std::fprintf(stderr, "ckptctl: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckptctl: %s\n", e.what());
    return 1;
  }
  return ckpt::tools::exit_status;
}
