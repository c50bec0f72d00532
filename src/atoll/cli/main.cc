// atoll: train Mixture-of-Experts language models on one machine or across islands.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "atoll/atoll_config.h"
#include "atoll/cli/commands.h"
#include "atoll/cli/openmp_wait.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/user_path.h"
#include "atoll/train/island_trainer.h"

namespace {

// A command-line mistake as one line: the command, CLI11's words (the flag and what is wrong with
// it, from the flag's check: cli/number_flags.h) and where to look for the fix.
std::string parse_error_line(const CLI::App& app, const CLI::ParseError& e) {
  std::string command = "atoll";
  for (const CLI::App* at = &app;;) {
    const auto subs = at->get_subcommands();
    if (subs.empty()) break;
    at = subs.front();
    command += " " + at->get_name();
  }
  std::string what = e.what();
  for (char& c : what)
    if (c == '\n') c = ' ';
  return command + ": " + what + "; fix: correct the command line (`" + command + " --help` lists every flag)";
}

}  // namespace

int main(int argc, char** argv) {
  atl::cli::apply_openmp_wait_default(argv);  // may restart the process once, before any thread exists
  CLI::App app{"atoll: train Mixture-of-Experts language models on CPUs, one machine or many islands"};
  app.set_version_flag("--version", ATOLL_VERSION);
  app.require_subcommand(1);
  std::vector<atl::cli::Runner> runners = {atl::cli::add_train(app),    atl::cli::add_bench(app),
                                           atl::cli::add_eval(app),     atl::cli::add_generate(app),
                                           atl::cli::add_export(app),   atl::cli::add_data(app),
                                           atl::cli::add_launch(app),   atl::cli::add_worker(app),
                                           atl::cli::add_report(app),   atl::cli::add_doctor(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "atoll: error: %s\n", parse_error_line(app, e).c_str());
    // A scheduler's retry policy reads `atoll worker`'s status: a mistake on its command line
    // is a config error, like a bad config (train/island_trainer.h); `atoll doctor` takes the
    // same command line and says so the same way.
    const auto subs = app.get_subcommands();
    if (!subs.empty() && (subs.front()->get_name() == "worker" || subs.front()->get_name() == "doctor"))
      return atl::kWorkerConfigExit;
    return e.get_exit_code();
  }
  try {
    for (auto& run : runners) {
      const int rc = run();
      if (rc >= 0) return rc;
    }
  } catch (const atl::Error& e) {
    std::fprintf(stderr, "atoll: error: %s\n", e.what());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {  // never the library's raw text
    std::fprintf(stderr, "atoll: error: %s\n", atl::filesystem_error_line(e).c_str());
    return 1;
  } catch (const atl::CheckError& e) {
    std::fprintf(stderr, "atoll: internal error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "atoll: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
