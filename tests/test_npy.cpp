// .npy reading and writing: round trips of every rank, float64 conversion, masks of several dtypes, and the
// rejection (with a message naming the problem) of every malformed or foreign file we can build by hand.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/io/npy.hpp"
#include "common/support/error.hpp"
#include "tests/support/scratch_dir.hpp"

using namespace attn;
using attn::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

// The dict NumPy writes, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }.
std::string header_dict(const std::string& descr, bool fortran, const std::string& shape) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

// A whole .npy image: magic, version, little-endian header length (2 bytes for 1.0, 4 for 2.0/3.0), the dict
// padded with spaces and a newline to a multiple of 64 bytes as NumPy does, then the raw data.
std::string npy_image(const std::string& dict, const std::string& data, int major = 1) {
  const std::size_t prefix = major == 1 ? 10 : 12;
  std::string padded = dict;
  padded.append((64 - (prefix + dict.size() + 1) % 64) % 64, ' ');
  padded.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  const uint32_t len = static_cast<uint32_t>(padded.size());
  out.append(reinterpret_cast<const char*>(&len), major == 1 ? 2 : 4);  // x86-64 is little-endian
  return out + padded + data;
}

template <class T>
std::string raw_bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// Expects parse_npy_float to throw a UsageError whose message holds every one of `parts`.
void expect_float_rejected(const std::string& bytes, const std::vector<std::string>& parts) {
  try {
    parse_npy_float(bytes, "x.npy");
    FAIL_CHECK("accepted a file that should be rejected; expected a message with '" << parts.front() << "'");
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("x.npy") != std::string::npos);  // the file is named
    for (const auto& part : parts) CHECK(msg.find(part) != std::string::npos);
  }
}

FloatArray counting_array(std::vector<int64_t> shape) {
  FloatArray a(std::move(shape));
  // Distinct, non-integer values so a transposed or shifted read shows up.
  for (std::size_t i = 0; i < a.numel(); ++i) a.data[i] = 0.25f * static_cast<float>(i) - 3.125f;
  return a;
}

}  // namespace

TEST_CASE("float32 arrays of rank 0 to 4 round-trip through .npy", "[npy]") {
  ScratchDir dir("npy");
  const std::vector<std::vector<int64_t>> shapes = {{}, {5}, {2, 3}, {2, 0, 3}, {2, 3, 4, 5}, {1, 1, 1, 7}};
  for (const auto& shape : shapes) {
    const FloatArray a = counting_array(shape);
    INFO("shape " << a.shape_str());
    const std::string bytes = npy_bytes(a);
    // NumPy aligns the data to 64 bytes; readers that mmap rely on it.
    const NpyHeader h = parse_npy_header(bytes, "mem");
    CHECK(h.data_offset % 64 == 0);
    CHECK(h.descr == "<f4");
    CHECK_FALSE(h.fortran_order);
    CHECK(h.shape == shape);

    const std::string path = dir.file("a.npy");
    write_npy(path, a);
    const FloatArray b = read_npy_float(path);
    CHECK(b.shape == a.shape);
    REQUIRE(b.numel() == a.numel());
    // memcmp on the null data pointers of an empty array is undefined behaviour, even for 0 bytes.
    if (a.numel() > 0) CHECK(std::memcmp(a.ptr(), b.ptr(), a.numel() * sizeof(float)) == 0);
    CHECK(read_file_bytes(path) == bytes);
  }
}

TEST_CASE("float64 .npy is converted to float32, and read_npy_double keeps full precision", "[npy]") {
  const std::vector<double> values = {1.5, -2.25, 1e-3, 0.1, 3e38};
  const std::string image = npy_image(header_dict("<f8", false, "(5,)"), raw_bytes(values));
  const FloatArray a = parse_npy_float(image, "mem");
  REQUIRE(a.shape == std::vector<int64_t>{5});
  for (std::size_t i = 0; i < values.size(); ++i) CHECK(a.data[i] == static_cast<float>(values[i]));

  ScratchDir dir("npy");
  const std::string path = dir.file("d.npy");
  write_file_atomic(path, image);
  const DoubleArray d = read_npy_double(path);
  REQUIRE(d.numel() == values.size());
  for (std::size_t i = 0; i < values.size(); ++i) CHECK(d.data[i] == values[i]);  // 0.1 stays exact

  // A float64 beyond the float range is an error, not a silent infinity.
  expect_float_rejected(
      npy_image(header_dict("<f8", false, "(2,)"), raw_bytes(std::vector<double>{1.0, 1e300})),
      {"element 1", "overflows float32"});
}

TEST_CASE("format versions 2.0 and 3.0 headers are read", "[npy]") {
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  for (int major : {2, 3}) {
    const FloatArray a =
        parse_npy_float(npy_image(header_dict("<f4", false, "(3, 2)"), raw_bytes(values), major), "mem");
    CHECK(a.shape == std::vector<int64_t>{3, 2});
    CHECK(std::vector<float>(a.data.begin(), a.data.end()) == values);
  }
  expect_float_rejected(npy_image(header_dict("<f4", false, "(1,)"), raw_bytes(std::vector<float>{1}), 4),
                        {"version 4"});
}

TEST_CASE("malformed and foreign .npy files are rejected with a message saying why", "[npy]") {
  const std::string six_floats = raw_bytes(std::vector<float>(6, 1.0f));

  SECTION("wrong dtype") {
    expect_float_rejected(npy_image(header_dict("<i2", false, "(6,)"), std::string(12, '\0')),
                          {"'<i2'", "float32"});
    expect_float_rejected(npy_image(header_dict("<c8", false, "(6,)"), std::string(48, '\0')), {"'<c8'"});
    // A structured dtype is a list, not a string.
    expect_float_rejected(
        npy_image("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }", six_floats),
        {"structured"});
  }
  SECTION("big-endian") {
    expect_float_rejected(npy_image(header_dict(">f4", false, "(6,)"), six_floats), {"'>f4'", "big-endian"});
  }
  SECTION("Fortran order") {
    expect_float_rejected(npy_image(header_dict("<f4", true, "(2, 3)"), six_floats), {"Fortran order"});
  }
  SECTION("truncated data") {
    expect_float_rejected(npy_image(header_dict("<f4", false, "(2, 3)"), six_floats.substr(0, 20)),
                          {"truncated", "[2, 3]", "24", "20"});
  }
  SECTION("truncated header") {
    const std::string whole = npy_image(header_dict("<f4", false, "(2, 3)"), six_floats);
    expect_float_rejected(whole.substr(0, 40), {"truncated .npy header"});
    // Shorter than the fixed prefix: caught as a non-.npy file rather than read out of bounds.
    expect_float_rejected(whole.substr(0, 7), {"not a .npy file"});
    // Version 2 needs a 4-byte length: 11 bytes cannot hold it.
    std::string v2 = whole.substr(0, 11);
    v2[6] = '\x02';
    expect_float_rejected(v2, {"truncated .npy header"});
  }
  SECTION("trailing bytes") {
    expect_float_rejected(npy_image(header_dict("<f4", false, "(2, 3)"), six_floats + "xyz"),
                          {"3 trailing bytes"});
  }
  SECTION("bad magic") {
    std::string image = npy_image(header_dict("<f4", false, "(2, 3)"), six_floats);
    image[1] = 'M';
    expect_float_rejected(image, {"not a .npy file"});
    expect_float_rejected("", {"not a .npy file"});
  }
  SECTION("absurd shape") {
    // 2^80 elements; also 2^41 in one dimension. Refused from the header, before any allocation.
    expect_float_rejected(npy_image(header_dict("<f4", false, "(1099511627776, 1099511627776)"), ""),
                          {"absurdly large"});
    expect_float_rejected(npy_image(header_dict("<f4", false, "(2199023255552,)"), ""), {"absurdly large"});
    expect_float_rejected(npy_image(header_dict("<f4", false, "(12345678901234567890,)"), ""),
                          {"malformed shape"});
  }
  SECTION("malformed header dict") {
    expect_float_rejected(npy_image("{'descr': '<f4', 'fortran_order': False, }", six_floats),
                          {"no 'shape' key"});
    expect_float_rejected(npy_image("{'fortran_order': False, 'shape': (6,), }", six_floats),
                          {"no 'descr' key"});
    expect_float_rejected(npy_image("{'descr': '<f4', 'shape': (6,), }", six_floats),
                          {"no 'fortran_order' key"});
    expect_float_rejected(npy_image("{'descr' '<f4', 'fortran_order': False, 'shape': (6,), }", six_floats),
                          {"no ':'"});
    expect_float_rejected(npy_image(header_dict("<f4", false, "[2, 3]"), six_floats), {"malformed shape"});
    expect_float_rejected(npy_image(header_dict("<f4", false, "(2, -3)"), six_floats),
                          {"malformed shape entry"});
    expect_float_rejected(npy_image(header_dict("<f4", false, "(2, x)"), six_floats),
                          {"malformed shape entry"});
    expect_float_rejected(npy_image("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (6,), }", six_floats),
                          {"fortran_order", "Maybe"});
  }
}

TEST_CASE("masks are read from bool, uint8 and int64 .npy files, nonzero becoming 1", "[npy]") {
  const std::vector<uint8_t> want = {1, 0, 1, 1, 0, 1};
  SECTION("bool") {
    const ByteArray m =
        parse_npy_mask(npy_image(header_dict("|b1", false, "(2, 3)"), raw_bytes(want)), "m.npy");
    CHECK(m.shape == std::vector<int64_t>{2, 3});
    CHECK(std::vector<uint8_t>(m.data.begin(), m.data.end()) == want);
  }
  SECTION("uint8 with values other than 1") {
    const std::vector<uint8_t> values = {7, 0, 255, 1, 0, 2};
    const ByteArray m =
        parse_npy_mask(npy_image(header_dict("|u1", false, "(2, 3)"), raw_bytes(values)), "m.npy");
    CHECK(std::vector<uint8_t>(m.data.begin(), m.data.end()) == want);
  }
  SECTION("int64, including values whose low byte is zero") {
    const std::vector<int64_t> values = {256, 0, -1, int64_t{1} << 40, 0, 1};
    const ByteArray m =
        parse_npy_mask(npy_image(header_dict("<i8", false, "(2, 3)"), raw_bytes(values)), "m.npy");
    CHECK(std::vector<uint8_t>(m.data.begin(), m.data.end()) == want);
  }
  SECTION("float32 of 0/1; NaN rejected") {
    const std::vector<float> values = {1, 0, 0.5f, 1, -0.0f, 1};
    const ByteArray m =
        parse_npy_mask(npy_image(header_dict("<f4", false, "(2, 3)"), raw_bytes(values)), "m.npy");
    CHECK(std::vector<uint8_t>(m.data.begin(), m.data.end()) == want);
    const std::vector<float> with_nan = {1, std::nanf("")};
    CHECK_THROWS_WITH(
        parse_npy_mask(npy_image(header_dict("<f4", false, "(2,)"), raw_bytes(with_nan)), "m.npy"),
        Catch::Contains("element 1 is NaN"));
  }
  SECTION("rejections") {
    CHECK_THROWS_WITH(
        parse_npy_mask(npy_image(header_dict("<i2", false, "(2,)"), std::string(4, '\0')), "m.npy"),
        Catch::Contains("'<i2' is not allowed for a mask"));
    CHECK_THROWS_WITH(parse_npy_mask(npy_image(header_dict("|b1", true, "(2, 3)"), raw_bytes(want)), "m.npy"),
                      Catch::Contains("Fortran order"));
    CHECK_THROWS_WITH(
        parse_npy_mask(npy_image(header_dict("|b1", false, "(2, 3)"), raw_bytes(want) + "x"), "m.npy"),
        Catch::Contains("trailing bytes"));
    CHECK_THROWS_WITH(
        parse_npy_mask(npy_image(header_dict("<i8", false, "(2, 3)"), raw_bytes(want)), "m.npy"),
        Catch::Contains("truncated"));
  }
}

TEST_CASE("writing .npy is atomic: no temporary remains and an existing file is replaced whole", "[npy]") {
  ScratchDir dir("npy");
  const std::string path = dir.file("o.npy");
  {
    std::ofstream big(path, std::ios::binary);
    big << std::string(100000, 'z');  // longer than what replaces it: a truncating write must not keep a tail
  }
  const FloatArray a = counting_array({3, 4});
  write_npy(path, a);
  CHECK_FALSE(fs::exists(path + ".tmp"));
  CHECK(fs::file_size(path) == npy_bytes(a).size());
  CHECK(read_npy_float(path).data == a.data);

  DoubleArray d({2});
  d.data = {0.1, 0.2};
  write_npy(path, d);
  CHECK_FALSE(fs::exists(path + ".tmp"));
  CHECK(read_npy_double(path).data == d.data);

  // A directory that does not exist: a UsageError naming the file, and nothing left behind.
  const std::string missing = dir.file("no_such_dir/o.npy");
  CHECK_THROWS_WITH(write_npy(missing, a), Catch::Contains("no_such_dir/o.npy"));
  CHECK_FALSE(fs::exists(missing + ".tmp"));
  CHECK_THROWS_WITH(read_npy_float(dir.file("absent.npy")),
                    Catch::Contains("absent.npy") && Catch::Contains("cannot open"));
}
