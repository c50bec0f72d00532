// `atoll doctor` (docs/cluster.md "atoll doctor"): before a multi-host run, checks from this host
// what breaks such runs in practice, each as one line PASS / WARN / FAIL with what was found and
// the fix: the store reachable within a bound and the password right; the interface a worker
// would listen on (the same choice, cli/worker_flags.h) and a port bound on it the way Gloo binds
// its pairs; the links to the other hosts (doctor_peers.h); this host's clock against the
// store's; the run token against what the store holds; free disk in the run directory for the
// checkpoints the config implies. The command line adds the placement and the config checks.
//
// It writes nothing a run reads: no file anywhere (the run directory is only looked at), no key
// under the run's prefix "atoll/<run>/"; doctors meet under "atoll-doctor/<run>/", with keys that
// expire (doctor_peers.h).
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "atoll/config/config.h"
#include "atoll/dist/listen_address.h"

namespace atl {

enum class Verdict { kPass, kWarn, kFail, kSkip };  // kSkip: not checked, as an earlier check failed

struct DoctorLine {
  Verdict verdict = Verdict::kPass;
  std::string check = {};  // "store", "interface", ...
  std::string found = {};  // what was found
  std::string fix = {};    // "" where there is nothing to fix
};

// "PASS store: redis://10.0.0.1:6379 answers ...", "FAIL ...; fix: ...".
std::string doctor_line_text(const DoctorLine& line);

struct DoctorOptions {
  std::string store_url = {};       // "" = none was given (a FAIL)
  std::string store_password = {};  // "" = the URL's, or none
  std::string password_from = {};   // where the password came from ("ATOLL_STORE_PASSWORD"; "" = none given)
  std::string run_id = {}, run_dir = {};
  std::string run_token = {}, token_from = {};  // the token and where it came from ("ATOLL_RUN_TOKEN"); "" = none
  bool token_unreadable = false;      // its file could not be read (a FAIL reported already)
  // The worker's choice of address (cli/worker_flags.h choose_interface); throws ConfigError.
  std::function<ListenAddress()> choose_interface = {};
  const Config* config = nullptr;     // null: the config failed (reported already; no disk check)
  int islands = 1, workers_per_island = 1;
  std::string who = {};               // "island 0 rank 1" ("" = no placement), for the other doctors
  int peers = 1;                      // doctors to meet, this one included (1: no meeting)
  std::chrono::milliseconds peers_wait{60000}, timeout{5000};
  std::function<void(const DoctorLine&)> report = {};  // each line as soon as it is known
};

// The checks after the placement and the config, in order: store, interface, port, clock, run
// token, disk, peers. Each finding goes to opts.report; nothing is thrown for what is found.
void run_doctor_checks(const DoctorOptions& opts);

}  // namespace atl
