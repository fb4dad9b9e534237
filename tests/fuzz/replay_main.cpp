// Replays inputs through a fuzz target's LLVMFuzzerTestOneInput without libFuzzer, so every build (gcc
// included) runs the committed corpus under ctest (fuzz.<target>):
//   fuzz_<target>_replay DIR_OR_FILE...
// Each directory contributes its regular files (sorted by name, not recursive). Prints one line per input;
// an exception escaping the target is reported with the input's path and fails the run (exit 1); a crash or
// sanitizer report aborts with the input's path as the last line printed. Exit 2: no inputs or a bad path.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size);

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " CORPUS_DIR_OR_FILE...\n";
    return 2;
  }
  std::vector<fs::path> inputs;
  for (int a = 1; a < argc; ++a) {
    const fs::path arg = argv[a];
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      std::vector<fs::path> files;
      for (const auto& entry : fs::directory_iterator(arg))
        if (entry.is_regular_file()) files.push_back(entry.path());
      std::sort(files.begin(), files.end());
      inputs.insert(inputs.end(), files.begin(), files.end());
    } else if (fs::is_regular_file(arg, ec)) {
      inputs.push_back(arg);
    } else {
      std::cerr << "replay: '" << arg.string() << "' is neither a file nor a directory\n";
      return 2;
    }
  }
  if (inputs.empty()) {
    std::cerr << "replay: no input files in the given paths\n";
    return 2;
  }
  int failed = 0;
  for (const fs::path& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::cerr << "replay: cannot read '" << path.string() << "'\n";
      return 2;
    }
    std::cout << path.string() << " (" << bytes.size() << " bytes) ... " << std::flush;
    // An exactly sized heap copy, as libFuzzer passes it: a read past the end is a sanitizer report.
    std::unique_ptr<uint8_t[]> copy(new uint8_t[std::max<std::size_t>(bytes.size(), 1)]);
    if (!bytes.empty()) std::memcpy(copy.get(), bytes.data(), bytes.size());
    try {
      LLVMFuzzerTestOneInput(copy.get(), bytes.size());
      std::cout << "ok\n";
    } catch (const std::exception& e) {
      std::cout << "FAILED\n";
      std::cerr << "replay: '" << path.string() << "': uncaught exception: " << e.what() << "\n";
      ++failed;
    } catch (...) {
      std::cout << "FAILED\n";
      std::cerr << "replay: '" << path.string() << "': uncaught exception of unknown type\n";
      ++failed;
    }
  }
  std::cout << inputs.size() << " inputs replayed, " << failed << " failed\n";
  return failed ? 1 : 0;
}
