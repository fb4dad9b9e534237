// attnbench CLI entry point; the subcommands live in bench/lib/cli_*.cpp and register themselves.
#include "bench/lib/command.hpp"

int main(int argc, char** argv) {
  return attn::cli::run_cli(argc, argv);
}
