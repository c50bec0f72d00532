// `atoll report RUN_DIR [--compare RUN_DIR...] [--out FILE.html]`: the run's page (train/report.h;
// docs/report.md), by default RUN_DIR/report.html. Damaged run files become notes on the page;
// a folder that is no run is an error.
#include <cstdio>
#include <memory>

#include "atoll/cli/commands.h"
#include "atoll/core/file_writer.h"
#include "atoll/train/report.h"

namespace atl::cli {

Runner add_report(CLI::App& app) {
  auto* cmd = app.add_subcommand("report", "one self-contained HTML page of a run (charts, incidents, summary); "
                                           "opens offline");
  struct Flags {
    std::string run, out;
    std::vector<std::string> compare;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("run_dir", f->run, "the run directory")->required();
  cmd->add_option("--compare", f->compare, "other run directories, overlaid on the same charts");
  cmd->add_option("--out", f->out, "the page to write (default: RUN_DIR/report.html)");
  return [cmd, f]() -> int {
    if (!cmd->parsed()) return -1;
    std::vector<nlohmann::json> runs = {load_report_run(f->run)};
    for (const std::string& other : f->compare) runs.push_back(load_report_run(other));
    const std::string out = f->out.empty() ? f->run + "/report.html" : f->out;
    write_file_atomic(out, report_html(runs));
    size_t notes = 0;
    for (const auto& r : runs) notes += r["notes"].size();
    std::printf("wrote %s (%zu run%s%s)\n", out.c_str(), runs.size(), runs.size() > 1 ? "s" : "",
                notes ? (", " + std::to_string(notes) + " note(s) on the page").c_str() : "");
    return 0;
  };
}

}  // namespace atl::cli
