#pragma once
// Note [Keeping freed memory]
// A GPU's caching allocator keeps the blocks a program frees and hands them out again: a
// training step never gives memory back to the driver, so the next step's allocations
// cost nothing. glibc's malloc on this CPU does give it back:
//  * a block above the mmap threshold (128 KiB, rising with the blocks freed up to 32 MiB)
//    is a mapping of its own, unmapped when it is freed;
//  * a worker thread allocates from its own arena (heaps of at most 64 MiB; larger
//    blocks are mappings), and arenas are trimmed when their top is free.
// Every step of a pipeline frees and allocates again the same parameter-sized tensors
// (weight gradients, Adam's temporaries, weight snapshots), and the first touch of each
// fresh page is a page fault. On VGG16/4 (fc6 = 25.7 MB of weights) under PipeDream that
// was 1.57 M minor faults in 8 iterations and 2x the step and backward times of the
// profile (experiments/README.md, planner_fidelity): the times then depend on glibc's
// heuristics, not on the model, and the planner cannot predict them.
//
// keepFreedMemory() makes the process behave like a caching allocator: every thread
// allocates from the main arena (M_ARENA_MAX 1), no block is a mapping of its own
// (M_MMAP_MAX 0), and the heap is never trimmed (M_TRIM_THRESHOLD at its maximum). Freed
// memory stays in the process and is reused; the resident size stays at the process's
// peak, as a GPU's reserved memory does. The tracking allocator's accounting (live bytes
// per domain and category) does not change. It must run before the process starts its
// worker threads (threads that already have an arena keep it).
//
// Switch: devices.keep_freed_memory (default true). pipefb_train applies it before any
// device thread exists; the profiler (pipefb_profile, and pipefb_plan/pipefb_sweep when
// they measure) applies the same setting, so that profiled and trained times see the same
// allocator, and a profile measured with it off says so in its key ("malloc=system").
namespace pipefb::memory {

/// Applies the malloc settings of Note [Keeping freed memory]. Returns false (and changes
/// nothing) where they are not available (not glibc). Idempotent.
bool keepFreedMemory();

/// Whether keepFreedMemory() has been applied in this process.
bool keepingFreedMemory();

}  // namespace pipefb::memory
