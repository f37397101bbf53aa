// glibc's malloc serves blocks above its mmap threshold (128 KiB at first, raised at run time as
// such blocks are freed) straight from the kernel and unmaps them on free. A conv net's step
// allocates and frees activations of megabytes each, so each step faulted its memory in afresh:
// one fastcnn epoch on 20,480 Fashion-MNIST images took 1.35 million page faults and 4.9 s instead
// of 0.1 million and 3.3 s (2-core AMD EPYC Zen 5), depending on where the adaptive threshold had
// got to. Whether it had got there depended on the command line. The CLI calls this first thing.
#pragma once

#include <cstdint>

namespace spritetorch {

// Keeps freed blocks of up to 256 MiB in the process for reuse (fixed mmap threshold 256 MiB, trim
// threshold 512 MiB). Does nothing off glibc's malloc (AddressSanitizer builds have their own), or
// when the user set MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ (their choice wins). Returns
// whether it changed anything.
bool keep_freed_memory_for_reuse();

// Bytes of the C heap in use (glibc's mallinfo2: the arenas and the chunks mmapped for large
// blocks), or -1 where it cannot tell (before glibc 2.33, off glibc, AddressSanitizer's heap).
// What a step holds between two readings on one thread, whose tensors come from the main arena:
// bench/unet_step_bench's and fastcnn_step_bench's `held`.
int64_t heap_in_use_bytes();

}  // namespace spritetorch
