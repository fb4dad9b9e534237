// .npy files read and written piece by piece, so that rank 0 of attnbench_mpi never holds a whole tensor:
// it reads each rank's rows straight from the file (pread) and writes the gathered output rows in place
// (pwrite into a file sized up front, renamed into place when complete, as write_npy does).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/io/npy.hpp"

namespace attn::ring {

// A float32 ('<f4') or float64 ('<f8', converted) C-order .npy file opened for reading pieces. `what` names
// it in errors (the path, as the project's readers: "file 'q.npy': ..."). The constructor checks the header
// and the file size (UsageError).
class NpyReader {
 public:
  NpyReader(const std::string& path, const std::string& what);
  ~NpyReader();
  NpyReader(const NpyReader&) = delete;
  NpyReader& operator=(const NpyReader&) = delete;
  const std::vector<int64_t>& shape() const { return header_.shape; }
  // Elements [first, first + count) in C order, as float32 (UsageError for a float64 value outside the
  // float range, as read_npy_float).
  void read(int64_t first, int64_t count, float* out);

 private:
  std::string what_;
  NpyHeader header_;
  int fd_ = -1;
  int64_t itemsize_ = 4;
  std::vector<double> wide_;
};

// A float32 .npy of `shape` written piece by piece to PATH.tmp, renamed to PATH by commit().
class NpyWriter {
 public:
  NpyWriter(const std::string& path, const std::vector<int64_t>& shape);
  ~NpyWriter();  // removes PATH.tmp unless committed
  NpyWriter(const NpyWriter&) = delete;
  NpyWriter& operator=(const NpyWriter&) = delete;
  void write(int64_t first, int64_t count, const float* values);
  void commit();

 private:
  std::string path_;
  int fd_ = -1;
  int64_t data_offset_ = 0;
  bool committed_ = false;
};

}  // namespace attn::ring
