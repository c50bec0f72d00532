// What a worker of a launched run is doing, for the launcher's live view
// (supervise/status_model.h): a phase that changes at a few points of a run, entered where the
// change happens (train/ and dist/), reported once per change:
//   joining     a restarted worker from its start until its first step (train/island_trainer.cc)
//   training    as each step begins (train/progress_mark.h ProgressHook)
//   exchanging  a step's outer-step work: an exchange, or finishing an overlapped one
//               (train/island_hooks.cc DilocoHook)
//   recovering  an aborted outer step being re-formed and retried (dist/elastic_group.cc reform)
// A worker under `atoll launch` sends each change as one line {"phase": NAME} on its metrics pipe
// (train/island_trainer.cc); the launcher takes such lines for the view and writes them nowhere.
// Without a sink (atoll train, a worker started by hand) a report costs one atomic exchange.
#pragma once

#include <functional>

namespace atl {

enum class WorkerPhase : int { kTraining, kExchanging, kRecovering, kJoining };

const char* phase_name(WorkerPhase phase);

// Where changes go: set once before the threads that report start (an empty function: nowhere).
// The sink is called from whichever thread enters a phase, so it must be thread-safe.
void set_phase_sink(std::function<void(const char* name)> sink);
// Reports `phase` when it differs from the phase entered last. Thread-safe.
void enter_phase(WorkerPhase phase);

}  // namespace atl
