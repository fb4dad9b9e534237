// Stage 4 of a sweep (config -> plan -> runner -> store): the results folder. It owns the folder's layout
// (configs/README.md, "The results folder"): meta.json (config, its hash, machine, calibration, start/end),
// results.jsonl (one flushed, fsynced ResultRow per line, so a crash loses at most the point being
// measured), results.csv (written atomically at the end), and --resume / --force. Everything else in a
// results folder is derived from these by other tools (plots, REPORT.md, summary.json, peer rows, patterns)
// and is removed when the results it was derived from are replaced.
#pragma once
#include <fstream>
#include <string>
#include <vector>

#include "bench/lib/config.hpp"
#include "bench/lib/result_row.hpp"

namespace attn {

class ResultStore {
 public:
  enum class Mode { fresh, resume, force };
  struct Identity {  // what --resume requires to be unchanged
    std::string config_hash;
    std::string isa_option;  // `run --isa`
  };

  // Checks the folder before anything is written (UsageError: results there without --resume/--force, a
  // --resume whose config or --isa changed); fresh/force: creates it, removes earlier results and what was
  // derived from them, writes meta.json; resume: loads meta.json and the rows (cutting a torn last line).
  ResultStore(std::string dir, Mode mode, const SweepConfig& config, const Identity& id, Json machine_meta);
  ~ResultStore();
  ResultStore(const ResultStore&) = delete;
  ResultStore& operator=(const ResultStore&) = delete;

  const std::vector<ResultRow>& existing() const { return existing_; }  // rows of the run being resumed
  Json& meta() { return meta_; }
  void save_meta();  // atomically
  // Sets its timestamp; one line, flushed and fsynced. `extra` (an object) adds fields beside the row's
  // (attnbench_mpi's ranks and ring report); readers of the row ignore them.
  void append(ResultRow& row, const Json& extra = Json::object());
  // Closes results.jsonl, writes results.csv from every row and meta.json's end_time/interrupted/rows.
  void finish(bool interrupted);

  std::string dir() const { return dir_; }
  std::string jsonl_path() const;
  std::string meta_path() const;
  std::string csv_path() const;

 private:
  std::string dir_;
  Json meta_;
  std::vector<ResultRow> existing_;
  std::ofstream jsonl_;
  int jsonl_fd_ = -1;
};

// Removes what other tools derived from a results folder's rows (plots/, REPORT.md, summary.json,
// results.peers.jsonl, patterns/): they describe the results being replaced (a fresh run, `attnbench merge`).
void remove_derived_files(const std::string& dir);

// Reads results.jsonl. A torn last line (a crash mid-write) is dropped and, if `repair`, cut from the file;
// a bad line anywhere else is an error naming the file and line. The last row per id wins.
std::vector<ResultRow> read_results_jsonl(const std::string& path, bool repair);

// The CSV view of the rows (one column per field, nested fields flattened with '.').
std::string results_csv(const std::vector<ResultRow>& rows);

}  // namespace attn
