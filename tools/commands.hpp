#pragma once
// Each ckptctl subcommand lives in its own file and registers itself here. A command's callback
// returns the process exit status: 0 success, 1 a problem found, 2 usage error.
#include <CLI/CLI.hpp>

namespace ckpt::tools {

// Set by a subcommand's callback: the process exit status.
inline int exit_status = 0;

void add_bench_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_stat_command(CLI::App& app);
// Store management (docs/management.md): live through a mount's daemon, or offline on a store.
void add_ls_command(CLI::App& app);
void add_rm_command(CLI::App& app);
void add_prune_command(CLI::App& app);
void add_verify_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_gc_command(CLI::App& app);
// What a running daemon holds (memory, buffers, commits, encodes, heads, scratch): live only.
void add_status_command(CLI::App& app);

}  // namespace ckpt::tools
