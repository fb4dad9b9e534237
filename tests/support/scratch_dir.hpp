// Test support: the one scratch folder every test uses (a fresh directory per instance, removed with its
// contents at the end), and small file helpers (read a whole file, write one, snapshot a folder).
#pragma once
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace attn::test {

namespace fs = std::filesystem;

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

// A fresh folder per instance, <temp>/attnbench-<tag>-XXXXXX (mkdtemp: unique even across processes and
// leftovers of earlier runs), removed with its contents at the end.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    std::string templ = (fs::temp_directory_path() / ("attnbench-" + tag + "-XXXXXX")).string();
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    path_ = templ;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const fs::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // Writes `text` to the file `name` in this folder and returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    write_text(path_ / name, text);
    return file(name);
  }

 private:
  fs::path path_;
};

// Names and contents of every regular file under `dir` (empty if it does not exist): equal snapshots before
// and after a refused command show it touched nothing.
inline std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  if (!fs::exists(dir)) return files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    files[fs::relative(e.path(), dir).string() + (e.is_directory() ? "/" : "")] =
        e.is_regular_file() ? slurp(e.path()) : "";
  return files;
}

}  // namespace attn::test
