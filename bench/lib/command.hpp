// Subcommands of the `attnbench` CLI register themselves here (one file per subcommand, like variants).
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/interface/attention.hpp"

namespace attn::cli {

// Adds the subcommand's options to `sub` and returns the action to run after parsing (its exit code).
using CommandSetup = std::function<std::function<int()>(CLI::App& sub)>;

struct Command {
  std::string name;
  std::string help;
  CommandSetup setup;
};

std::vector<Command>& commands();
bool register_command(std::string name, std::string help, CommandSetup setup);

// `--isa NAME` (default "best") for a subcommand that runs kernels; the action passes the value to
// simd::select_isa(name, "--isa") before any work, which refuses (exit 2) a name this CPU cannot run.
CLI::Option* add_isa_option(CLI::App& sub, std::string& name);

// Runs the CLI: returns 0 on success, 1 on a failed check or run, 2 on a usage error (bad option/file).
int run_cli(int argc, const char* const* argv);

// Resolves `--param k=v` strings against a variant's specs (typed, validated, defaults filled in).
Json parse_cli_params(const Attention& variant, const std::vector<std::string>& kvs);

}  // namespace attn::cli

#define ATTN_REGISTER_COMMAND(name, help, setup)                                                        \
  namespace {                                                                                           \
  [[maybe_unused]] const bool ATTN_CONCAT(attn_command_,                                                \
                                          __LINE__) = ::attn::cli::register_command(name, help, setup); \
  }
