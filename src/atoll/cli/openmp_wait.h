// How long an idle OpenMP thread spins before it sleeps, chosen before GNU libgomp starts.
//
// atoll's loops, oneDNN and OpenBLAS share one GNU OpenMP (libgomp) pool. By default a libgomp
// thread that finds no work spins GOMP_SPINCOUNT = 300,000 times before it sleeps on a futex:
// ~8 ms on the 2-core development machine (26 ns per spin). Alone on the machine that costs
// nothing. Beside another busy process it is ruinous: the spinning threads hold cores that the
// other process's threads, and this process's own late thread at a barrier, are waiting for, so
// a parallel region can wait a whole time slice. A tiny-config training beside a second one ran
// 3.9x slower than alone, beside compile jobs up to ~25x (docs/benchmarks.md, "Sharing the
// machine").
//
// Sleeping at once (OMP_WAIT_POLICY=passive) shares best but pays a futex wake-up at nearly
// every region (~30 us on that machine): 25% slower alone on tiny. 3,000 spins (~80 us there)
// still catch the short gaps between regions: the small config runs level with the old
// default, and a training beside a second one or beside a busy loop runs ~1.7x slower
// instead of 3.9x and 2.6x.
//
// libgomp reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, in its constructor, before main()
// runs, and has no call to change them later. So when the user has set neither, main() sets
// GOMP_SPINCOUNT = kAtollSpinCount and replaces the process with itself (execv of
// /proc/self/exe: same pid, same arguments), and libgomp starts again with it. The restarted
// image then removes the variable again, so the processes it starts (`atoll launch`'s workers,
// which get OMP_WAIT_POLICY=passive, and redis-server) see the user's environment. A user's
// own setting of either variable is kept as it is.
#pragma once

namespace atl::cli {

// GOMP_SPINCOUNT when the user set neither variable: short waits spin, long ones sleep.
inline constexpr const char* kAtollSpinCount = "3000";

// Called first thing in main(). Returns only when nothing needs changing (a variable is set)
// or when the re-execution failed (then libgomp's default stays; atoll runs as before).
void apply_openmp_wait_default(char** argv);

}  // namespace atl::cli
