// attnbench CLI entry point; the subcommands live in bench/lib/cli_*.cpp and register themselves.
#include "bench/lib/command.hpp"
#include "common/support/runtime.hpp"

int main(int argc, char** argv) {
  attn::reexec_with_blas_core(argv);  // OpenBLAS's kernels for this CPU when it fell back to narrower ones
  return attn::cli::run_cli(argc, argv);
}
