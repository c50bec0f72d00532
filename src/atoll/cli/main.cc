// atoll: train Mixture-of-Experts language models on one machine or across islands.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "atoll/atoll_config.h"
#include "atoll/cli/commands.h"
#include "atoll/cli/openmp_wait.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"

int main(int argc, char** argv) {
  atl::cli::apply_openmp_wait_default(argv);  // may restart the process once, before any thread exists
  CLI::App app{"atoll: train Mixture-of-Experts language models on CPUs, one machine or many islands"};
  app.set_version_flag("--version", ATOLL_VERSION);
  app.require_subcommand(1);
  std::vector<atl::cli::Runner> runners = {atl::cli::add_train(app),    atl::cli::add_bench(app),
                                           atl::cli::add_eval(app),     atl::cli::add_generate(app),
                                           atl::cli::add_export(app),   atl::cli::add_data(app),
                                           atl::cli::add_launch(app),   atl::cli::add_worker(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& run : runners) {
      const int rc = run();
      if (rc >= 0) return rc;
    }
  } catch (const atl::Error& e) {
    std::fprintf(stderr, "atoll: error: %s\n", e.what());
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
