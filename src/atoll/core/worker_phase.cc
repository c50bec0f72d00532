#include "atoll/core/worker_phase.h"

#include <atomic>

namespace atl {

namespace {

std::atomic<int> g_phase{-1};
std::function<void(const char*)> g_sink;

}  // namespace

const char* phase_name(WorkerPhase phase) {
  switch (phase) {
    case WorkerPhase::kTraining: return "training";
    case WorkerPhase::kExchanging: return "exchanging";
    case WorkerPhase::kRecovering: return "recovering";
    case WorkerPhase::kJoining: return "joining";
  }
  return "training";
}

void set_phase_sink(std::function<void(const char*)> sink) {
  g_sink = std::move(sink);
  g_phase = -1;
}

void enter_phase(WorkerPhase phase) {
  if (g_phase.exchange(int(phase)) != int(phase) && g_sink) g_sink(phase_name(phase));
}

}  // namespace atl
