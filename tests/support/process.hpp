// Test support: the built `attnbench` (or another built executable) run as a child process (argv, no shell),
// with its exit status, stdout and stderr captured and an optional address-space limit (RLIMIT_AS) to prove
// that a command refuses a huge problem instead of allocating for it. Header-only; every test that runs a
// built executable uses it (scratch folders are in tests/support/scratch_dir.hpp).
#pragma once
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/support/sanitizer.hpp"
#include "tests/support/scratch_dir.hpp"

namespace attn::test {

namespace fs = std::filesystem;

struct ProcResult {
  int code = -1;  // exit code, or 128 + signal
  bool signaled = false;
  std::string out, err;
};

struct ProcOptions {
  fs::path cwd;                           // working directory (required: stdout/stderr are captured there)
  std::optional<uint64_t> address_space;  // RLIMIT_AS in bytes for the child
};

// Starts `exe args...` in opt.cwd with stdout/stderr in cwd/<log>.out|.err; returns the child's pid (for
// tests that signal it mid-run). wait_process collects it.
inline pid_t spawn_process(const fs::path& exe, const std::vector<std::string>& args, const ProcOptions& opt,
                           const std::string& log) {
  std::vector<std::string> argv_s{exe.string()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string dir = opt.cwd.string(), out = (opt.cwd / (log + ".out")).string(),
                    err = (opt.cwd / (log + ".err")).string();
  // ASan and TSan reserve terabytes of address space at start-up: an RLIMIT_AS would stop the child before
  // main(), so a sanitizer build applies no limit.
  const bool limit = opt.address_space.has_value() && !kSanitizerBuild;
  rlimit rl{};
  if (limit) rl.rlim_cur = rl.rlim_max = static_cast<rlim_t>(*opt.address_space);
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec (the test process has threads).
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0 || ::chdir(dir.c_str()) != 0) ::_exit(126);
    ::dup2(o, 1);
    ::dup2(e, 2);
    if (limit && ::setrlimit(RLIMIT_AS, &rl) != 0) ::_exit(125);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  REQUIRE(pid > 0);
  return pid;
}

inline ProcResult wait_process(pid_t pid, const fs::path& cwd, const std::string& log) {
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  ProcResult r;
  r.signaled = WIFSIGNALED(status);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(cwd / (log + ".out"));
  r.err = slurp(cwd / (log + ".err"));
  fs::remove(cwd / (log + ".out"));
  fs::remove(cwd / (log + ".err"));
  return r;
}

// Runs `exe args...` and waits for it; its exit code and output go with the next assertion's report.
inline ProcResult run_process(const fs::path& exe, const std::vector<std::string>& args,
                              const ProcOptions& opt) {
  static int counter = 0;
  const std::string tag = "proc-" + std::to_string(counter++);
  ProcResult r = wait_process(spawn_process(exe, args, opt, tag), opt.cwd, tag);
  UNSCOPED_INFO(exe.filename().string() << " exit " << r.code << "\nstdout:\n"
                                        << r.out << "\nstderr:\n"
                                        << r.err);
  return r;
}

// The same for the built `attnbench` (ATTNBENCH_EXE).
inline pid_t spawn_attnbench(const std::vector<std::string>& args, const ProcOptions& opt,
                             const std::string& log) {
  return spawn_process(ATTNBENCH_EXE, args, opt, log);
}

inline ProcResult wait_attnbench(pid_t pid, const fs::path& cwd, const std::string& log) {
  return wait_process(pid, cwd, log);
}

inline ProcResult run_attnbench(const std::vector<std::string>& args, const ProcOptions& opt) {
  return run_process(ATTNBENCH_EXE, args, opt);
}

inline ProcResult run_attnbench(const std::vector<std::string>& args, const fs::path& cwd) {
  return run_attnbench(args, ProcOptions{cwd, std::nullopt});
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace attn::test
