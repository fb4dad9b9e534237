// Piecewise .npy reading and writing for attnbench_mpi's rank 0 (npy_stream.hpp).
#include "bench/mpi/npy_stream.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "common/support/error.hpp"
#include "common/support/tensor.hpp"

namespace attn::ring {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& msg) {
  throw UsageError("file '" + what + "': " + msg);
}

// pread/pwrite of exactly `bytes` bytes (they may return less).
void read_exact(int fd, char* buf, std::size_t bytes, int64_t at, const std::string& what) {
  while (bytes > 0) {
    const ssize_t got = ::pread(fd, buf, bytes, static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      fail(what, got == 0 ? "unexpected end of file" : std::string("read failed: ") + std::strerror(errno));
    buf += got;
    bytes -= static_cast<std::size_t>(got);
    at += got;
  }
}
void write_exact(int fd, const char* buf, std::size_t bytes, int64_t at, const std::string& what) {
  while (bytes > 0) {
    const ssize_t put = ::pwrite(fd, buf, bytes, static_cast<off_t>(at));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) fail(what, std::string("write failed: ") + std::strerror(errno));
    buf += put;
    bytes -= static_cast<std::size_t>(put);
    at += put;
  }
}

}  // namespace

NpyReader::NpyReader(const std::string& path, const std::string& what) : what_(what) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail(what, std::string("cannot open (") + std::strerror(errno) + ")");
  struct stat sb {};
  if (::fstat(fd_, &sb) != 0) fail(what, std::string("cannot stat (") + std::strerror(errno) + ")");
  const int64_t size = sb.st_size;
  // The header: magic, version, length (2 bytes in version 1, 4 in 2 and 3), then the dict.
  std::string head(static_cast<std::size_t>(std::min<int64_t>(size, 12)), '\0');
  read_exact(fd_, head.data(), head.size(), 0, what);
  if (head.size() >= 12 && static_cast<unsigned char>(head[0]) == 0x93) {
    const int major = static_cast<unsigned char>(head[6]);
    uint64_t len = 0, start = 10;
    if (major == 1) {
      len = static_cast<unsigned char>(head[8]) | static_cast<unsigned>(static_cast<unsigned char>(head[9]))
                                                      << 8;
    } else {
      for (int b = 3; b >= 0; --b) len = len << 8 | static_cast<unsigned char>(head[8 + b]);
      start = 12;
    }
    head.resize(static_cast<std::size_t>(std::min<uint64_t>(static_cast<uint64_t>(size), start + len)));
    read_exact(fd_, head.data(), head.size(), 0, what);
  }
  header_ = parse_npy_header(head, what);  // the project's checks and messages
  if (header_.descr == "<f2")
    fail(what,
         "dtype '<f2' (float16) is fp16 storage, which attnbench_mpi does not run (fp32 only): save it as "
         "float32");
  if (header_.descr != "<f4" && header_.descr != "<f8")
    fail(what, "dtype '" + header_.descr + "' is not allowed here (float32 '<f4' or float64 '<f8')");
  if (header_.fortran_order)
    fail(what,
         "array is in Fortran order; only C order is supported (use np.ascontiguousarray before saving)");
  itemsize_ = header_.descr == "<f4" ? 4 : 8;
  const int64_t need = static_cast<int64_t>(NdArray<float>::count(header_.shape)) * itemsize_;
  const int64_t have = size - static_cast<int64_t>(header_.data_offset);
  if (have != need)
    fail(what, "shape " + NdArray<float>::shape_to_string(header_.shape) + " of " + header_.descr +
                   " needs " + std::to_string(need) + " data bytes, the file has " + std::to_string(have));
}

NpyReader::~NpyReader() {
  if (fd_ >= 0) ::close(fd_);
}

void NpyReader::read(int64_t first, int64_t count, float* out) {
  const int64_t at = static_cast<int64_t>(header_.data_offset) + first * itemsize_;
  if (itemsize_ == 4) {
    read_exact(fd_, reinterpret_cast<char*>(out), static_cast<std::size_t>(count) * 4, at, what_);
    return;
  }
  wide_.resize(static_cast<std::size_t>(count));
  read_exact(fd_, reinterpret_cast<char*>(wide_.data()), static_cast<std::size_t>(count) * 8, at, what_);
  for (int64_t i = 0; i < count; ++i) {
    const double v = wide_[static_cast<std::size_t>(i)];
    if (std::isfinite(v) && std::fabs(v) > std::numeric_limits<float>::max())
      fail(what_, "element " + std::to_string(first + i) + " = " + std::to_string(v) + " overflows float32");
    out[i] = static_cast<float>(v);
  }
}

NpyWriter::NpyWriter(const std::string& path, const std::vector<int64_t>& shape) : path_(path) {
  // Version 1.0 header as NumPy writes it: the dict padded with spaces and a newline to a multiple of 64.
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i)
    dict += std::to_string(shape[i]) + (shape.size() == 1 ? "," : i + 1 < shape.size() ? ", " : "");
  dict += "), }";
  const std::size_t total = (10 + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - 10 - dict.size() - 1, ' ');
  dict += '\n';
  std::string head = "\x93NUMPY";
  head += '\x01';
  head += '\x00';
  head += static_cast<char>(dict.size() & 0xff);
  head += static_cast<char>(dict.size() >> 8);
  head += dict;
  data_offset_ = static_cast<int64_t>(head.size());
  const std::string tmp = path_ + ".tmp";
  fd_ = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path_, std::string("cannot create '") + tmp + "' (" + std::strerror(errno) + ")");
  write_exact(fd_, head.data(), head.size(), 0, path_);
  const int64_t bytes = data_offset_ + static_cast<int64_t>(NdArray<float>::count(shape)) * 4;
  if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0)
    fail(path_, std::string("cannot size the file (") + std::strerror(errno) + ")");
}

NpyWriter::~NpyWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink((path_ + ".tmp").c_str());
}

void NpyWriter::write(int64_t first, int64_t count, const float* values) {
  write_exact(fd_, reinterpret_cast<const char*>(values), static_cast<std::size_t>(count) * 4,
              data_offset_ + first * 4, path_);
}

void NpyWriter::commit() {
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail(path_, std::string("close failed (") + std::strerror(errno) + ")");
  }
  fd_ = -1;
  if (std::rename((path_ + ".tmp").c_str(), path_.c_str()) != 0)
    fail(path_, std::string("cannot rename the temporary file (") + std::strerror(errno) + ")");
  committed_ = true;
}

}  // namespace attn::ring
