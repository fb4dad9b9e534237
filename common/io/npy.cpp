// .npy reader/writer. The header is a Python dict literal; we parse exactly the three keys NumPy writes.
#include "common/io/npy.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/support/error.hpp"

namespace attn {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;
// Anything larger than this is refused before allocating: 2^40 elements is far beyond this machine.
constexpr int64_t kMaxElements = int64_t{1} << 40;

[[noreturn]] void bad(const std::string& what, const std::string& msg) {
  throw UsageError("file '" + what + "': " + msg);
}

std::size_t skip_ws(const std::string& s, std::size_t i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i;
  return i;
}

// Returns the text of the value following key `key` in the header dict, up to the next top-level comma.
std::string dict_value(const std::string& dict, const std::string& key, const std::string& what) {
  for (const char quote : {'\'', '"'}) {
    std::string needle = std::string(1, quote) + key + quote;
    std::size_t pos = dict.find(needle);
    if (pos == std::string::npos) continue;
    pos = skip_ws(dict, pos + needle.size());
    if (pos >= dict.size() || dict[pos] != ':')
      bad(what, "malformed .npy header (no ':' after '" + key + "')");
    pos = skip_ws(dict, pos + 1);
    std::size_t end = pos;
    int depth = 0;
    while (end < dict.size()) {
      char c = dict[end];
      if (c == '(') ++depth;
      if (c == ')') --depth;
      if ((c == ',' && depth == 0) || (c == '}' && depth == 0)) break;
      ++end;
    }
    std::string v = dict.substr(pos, end - pos);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\n')) v.pop_back();
    return v;
  }
  bad(what, "malformed .npy header (no '" + key + "' key)");
}

std::size_t item_size(const std::string& descr) {
  if (descr.size() < 3) return 0;
  return static_cast<std::size_t>(std::atoi(descr.c_str() + 2));
}

template <class T>
T load_le(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // x86-64 is little-endian; '>' descrs are rejected earlier
  return v;
}

}  // namespace

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("file '" + path + "': cannot open for reading (" + std::strerror(errno) + ")");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw UsageError("file '" + path + "': cannot open for writing (" + std::strerror(errno) + ")");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw UsageError("file '" + path + "': write failed (" + std::strerror(errno) + ")");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw UsageError("file '" + path + "': cannot rename temporary file (" + ec.message() + ")");
  }
}

NpyHeader parse_npy_header(const std::string& bytes, const std::string& what) {
  if (bytes.size() < kMagicLen + 4 || std::memcmp(bytes.data(), kMagic, kMagicLen) != 0)
    bad(what, "not a .npy file (missing the \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  std::size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = load_le<uint16_t>(bytes.data() + 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) bad(what, "truncated .npy header");
    header_len = load_le<uint32_t>(bytes.data() + 8);
    header_start = 12;
  } else {
    bad(what, ".npy format version " + std::to_string(major) + " is not supported (1, 2 or 3 allowed)");
  }
  if (header_start + header_len > bytes.size()) bad(what, "truncated .npy header");
  std::string dict = bytes.substr(header_start, header_len);

  NpyHeader h;
  h.data_offset = header_start + header_len;
  std::string descr = dict_value(dict, "descr", what);
  if (descr.size() < 2 || (descr.front() != '\'' && descr.front() != '"'))
    bad(what, "unsupported dtype " + descr + " (structured dtypes are not allowed)");
  h.descr = descr.substr(1, descr.size() - 2);
  if (!h.descr.empty() && h.descr[0] == '>' && h.descr != ">i1" && h.descr != ">u1")
    bad(what, "dtype '" + h.descr + "' is big-endian; only little-endian ('<') data is supported");
  std::string fortran = dict_value(dict, "fortran_order", what);
  if (fortran == "True") {
    h.fortran_order = true;
  } else if (fortran != "False") {
    bad(what, "malformed fortran_order value '" + fortran + "'");
  }
  std::string shape = dict_value(dict, "shape", what);
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')')
    bad(what, "malformed shape '" + shape + "'");
  std::string inner = shape.substr(1, shape.size() - 2);
  std::stringstream ss(inner);
  std::string item;
  int64_t total = 1;
  double elements = 1;  // the exact product may not fit in 64 bits: for the message
  bool too_large = false;
  while (std::getline(ss, item, ',')) {
    std::size_t a = item.find_first_not_of(" \n\tL");
    if (a == std::string::npos) continue;  // trailing comma of a 1-tuple
    std::size_t b = item.find_last_not_of(" \n\tL");
    std::string num = item.substr(a, b - a + 1);
    if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos || num.size() > 15)
      bad(what, "malformed shape entry '" + num + "' in " + shape);
    int64_t dim = std::stoll(num);
    elements *= static_cast<double>(dim);
    too_large = too_large || (dim != 0 && total > kMaxElements / dim);
    if (!too_large) total *= dim;
    h.shape.push_back(dim);
  }
  if (too_large) {  // refused from the header, before anything is allocated
    std::ostringstream s;
    s.precision(17);
    s << "shape " << shape << " is absurdly large: " << elements << " elements ("
      << elements * static_cast<double>(item_size(h.descr)) << " bytes of " << h.descr
      << "); every extent and their product must be at most 2^40 = " << kMaxElements << " elements";
    bad(what, s.str());
  }
  return h;
}

namespace {

// Checks fortran order and the data length, returns the number of elements.
std::size_t checked_count(const NpyHeader& h, const std::string& bytes, const std::string& what) {
  if (h.fortran_order)
    bad(what,
        "array is in Fortran order; only C order is supported (use np.ascontiguousarray before saving)");
  std::size_t n = NdArray<float>::count(h.shape);
  std::size_t need = n * item_size(h.descr);
  std::size_t have = bytes.size() - h.data_offset;
  if (have < need)
    bad(what, "truncated: shape " + NdArray<float>::shape_to_string(h.shape) + " of " + h.descr + " needs " +
                  std::to_string(need) + " data bytes, the file has " + std::to_string(have));
  if (have > need)
    bad(what, "has " + std::to_string(have - need) + " trailing bytes after the data of shape " +
                  NdArray<float>::shape_to_string(h.shape));
  return n;
}

}  // namespace

FloatArray parse_npy_float(const std::string& bytes, const std::string& what) {
  NpyHeader h = parse_npy_header(bytes, what);
  if (h.descr != "<f4" && h.descr != "<f8")
    bad(what, "dtype '" + h.descr + "' is not allowed here (float32 '<f4' or float64 '<f8')");
  std::size_t n = checked_count(h, bytes, what);
  FloatArray out(h.shape);
  const char* p = bytes.data() + h.data_offset;
  if (h.descr == "<f4") {
    if (n) std::memcpy(out.ptr(), p, n * 4);
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      double v = load_le<double>(p + 8 * i);
      if (std::isfinite(v) && std::fabs(v) > std::numeric_limits<float>::max())
        bad(what, "element " + std::to_string(i) + " = " + std::to_string(v) + " overflows float32");
      out.data[i] = static_cast<float>(v);
    }
  }
  return out;
}

FloatArray read_npy_float(const std::string& path) {
  return parse_npy_float(read_file_bytes(path), path);
}

DoubleArray read_npy_double(const std::string& path) {
  return parse_npy_double(read_file_bytes(path), path);
}

DoubleArray parse_npy_double(const std::string& bytes, const std::string& what) {
  NpyHeader h = parse_npy_header(bytes, what);
  if (h.descr != "<f4" && h.descr != "<f8")
    bad(what, "dtype '" + h.descr + "' is not allowed here (float32 '<f4' or float64 '<f8')");
  std::size_t n = checked_count(h, bytes, what);
  DoubleArray out(h.shape);
  const char* p = bytes.data() + h.data_offset;
  for (std::size_t i = 0; i < n; ++i)
    out.data[i] = h.descr == "<f4" ? load_le<float>(p + 4 * i) : load_le<double>(p + 8 * i);
  return out;
}

NdArray<uint16_t> parse_npy_fp16(const std::string& bytes, const std::string& what) {
  NpyHeader h = parse_npy_header(bytes, what);
  if (h.descr != "<f2") bad(what, "dtype '" + h.descr + "' is not float16 ('<f2')");
  std::size_t n = checked_count(h, bytes, what);
  NdArray<uint16_t> out(h.shape);
  if (n) std::memcpy(out.ptr(), bytes.data() + h.data_offset, n * 2);
  return out;
}

NdArray<uint16_t> read_npy_fp16(const std::string& path) {
  return parse_npy_fp16(read_file_bytes(path), path);
}

ByteArray parse_npy_mask(const std::string& bytes, const std::string& what) {
  NpyHeader h = parse_npy_header(bytes, what);
  static const char* kAllowed[] = {"|b1", "|u1", "|i1", "<i1", "<u1", "<i4",
                                   "<i8", "<u4", "<u8", "<f4", "<f8"};
  bool ok = false;
  for (const char* a : kAllowed) ok = ok || h.descr == a;
  if (!ok)
    bad(what, "dtype '" + h.descr + "' is not allowed for a mask (bool, integer, or float32/64 of 0/1)");
  std::size_t n = checked_count(h, bytes, what);
  ByteArray out(h.shape);
  const char* p = bytes.data() + h.data_offset;
  const std::size_t sz = item_size(h.descr);
  for (std::size_t i = 0; i < n; ++i) {
    const char* e = p + sz * i;
    bool nz;
    if (h.descr == "<f4") {
      float f = load_le<float>(e);
      if (std::isnan(f)) bad(what, "mask element " + std::to_string(i) + " is NaN");
      nz = f != 0.0f;
    } else if (h.descr == "<f8") {
      double f = load_le<double>(e);
      if (std::isnan(f)) bad(what, "mask element " + std::to_string(i) + " is NaN");
      nz = f != 0.0;
    } else {
      nz = false;
      for (std::size_t b = 0; b < sz; ++b) nz = nz || e[b] != 0;
    }
    out.data[i] = nz ? 1 : 0;
  }
  return out;
}

ByteArray read_npy_mask(const std::string& path) {
  return parse_npy_mask(read_file_bytes(path), path);
}

namespace {

template <class T>
std::string to_npy_bytes(const NdArray<T>& a, const char* descr) {
  std::string shape = "(";
  for (std::size_t i = 0; i < a.shape.size(); ++i) shape += std::to_string(a.shape[i]) + ", ";
  if (a.shape.size() > 1) shape.resize(shape.size() - 2);
  if (a.shape.size() == 1) shape.resize(shape.size() - 1);
  shape += ")";
  std::string dict =
      std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Pad so that magic + version + length + dict + '\n' is a multiple of 64 bytes (NumPy's own alignment).
  std::size_t total = kMagicLen + 2 + 2 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict.push_back('\n');
  std::string out(kMagic, kMagicLen);
  out.push_back('\x01');
  out.push_back('\x00');
  uint16_t len = static_cast<uint16_t>(dict.size());
  out.append(reinterpret_cast<const char*>(&len), 2);
  out += dict;
  out.append(reinterpret_cast<const char*>(a.ptr()), a.numel() * sizeof(T));
  return out;
}

}  // namespace

std::string npy_bytes(const FloatArray& array) {
  return to_npy_bytes(array, "<f4");
}
void write_npy(const std::string& path, const FloatArray& array) {
  write_file_atomic(path, to_npy_bytes(array, "<f4"));
}
void write_npy(const std::string& path, const DoubleArray& array) {
  write_file_atomic(path, to_npy_bytes(array, "<f8"));
}
void write_npy(const std::string& path, const ByteArray& array) {
  write_file_atomic(path, to_npy_bytes(array, "|u1"));
}
void write_npy(const std::string& path, const NdArray<int64_t>& array) {
  write_file_atomic(path, to_npy_bytes(array, "<i8"));
}

}  // namespace attn
