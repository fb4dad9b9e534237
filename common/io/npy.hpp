// Reading and writing NumPy .npy files (format versions 1.0-3.0, C order, little-endian).
// Readers check everything a corrupt or foreign file can get wrong and throw UsageError naming the file.
// Each read_npy_* reads the file and calls its parse_npy_* twin on the bytes (tests/fuzz/fuzz_npy.cpp fuzzes
// the parse_* functions).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/support/tensor.hpp"

namespace attn {

struct NpyHeader {
  std::string descr;  // e.g. "<f4"
  bool fortran_order = false;
  std::vector<int64_t> shape;
  std::size_t data_offset = 0;  // bytes from the start of the file to the data
};

// Parses the header of an in-memory .npy image; `what` names the file in error messages.
NpyHeader parse_npy_header(const std::string& bytes, const std::string& what);

// float32 or float64 (converted to float32; values outside the float range are an error, not inf).
FloatArray read_npy_float(const std::string& path);
FloatArray parse_npy_float(const std::string& bytes, const std::string& what);
// float64 kept in double (for references and weights read at full precision).
DoubleArray read_npy_double(const std::string& path);
DoubleArray parse_npy_double(const std::string& bytes, const std::string& what);
// float16 ('<f2' only) kept as IEEE binary16 bit patterns, unconverted: fp16 storage read as is (eval
// --dtype fp16; common/interface/half.hpp widens them exactly).
NdArray<uint16_t> read_npy_fp16(const std::string& path);
NdArray<uint16_t> parse_npy_fp16(const std::string& bytes, const std::string& what);
// A boolean/integer mask: bool, u1, i1, i4, i8 (and float32/64 holding 0/1); nonzero becomes 1.
ByteArray read_npy_mask(const std::string& path);
ByteArray parse_npy_mask(const std::string& bytes, const std::string& what);

// Written to `path.tmp` and renamed, so a reader never sees a half-written file.
void write_npy(const std::string& path, const FloatArray& array);
void write_npy(const std::string& path, const DoubleArray& array);
void write_npy(const std::string& path, const ByteArray& array);         // uint8 ('|u1'), e.g. masks
void write_npy(const std::string& path, const NdArray<int64_t>& array);  // int64 ('<i8'), e.g. row indices
std::string npy_bytes(const FloatArray& array);

// Whole-file helpers shared by every loader.
std::string read_file_bytes(const std::string& path);
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace attn
