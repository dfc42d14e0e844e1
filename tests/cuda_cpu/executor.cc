// Runs a CUDA kernel compiled for the host (cuda_cpu.h) over its grid: the blocks one after
// another, each block's threads as fibers on their own stacks, switched by hand (x86-64:
// six callee-saved registers and the stack pointer; elsewhere ucontext). A fiber runs until
// it reaches __syncthreads or a warp shuffle, where it yields until every thread of its block
// (or lane of its warp) has arrived: the meaning CUDA gives them, with no assumption that a
// warp's lanes run in lockstep anywhere else (Volta's independent thread scheduling).
//
// Why fibers rather than a thread per CUDA thread: a block is up to 1024 threads and a tiny
// model's step launches thousands of blocks; a fiber switch is a few nanoseconds where an OS
// thread handoff is microseconds, and one OS thread keeps `__shared__` a plain static.
//
// What CUDA leaves undefined is an error here, reported to the caller (ek_cpu_error), not a
// hang: __syncthreads reached by some threads of a block after others returned, a shuffle
// whose warp has lanes that returned or do not exist, a mask other than the whole warp,
// threads that can never meet. Memory errors are AddressSanitizer's (built with it when the
// process has its runtime: tests/cuda_cpu.py).
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include <string>
#include <vector>

#ifndef __x86_64__
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EK_ASAN 1
#else
#define EK_ASAN 0
#endif

struct ek_cpu_dim3 {
    unsigned x, y, z;
};

extern "C" {
ek_cpu_dim3 ek_cpu_block_idx, ek_cpu_block_dim, ek_cpu_grid_dim;
const ek_cpu_dim3* ek_cpu_thread_idx;
}

namespace {

constexpr size_t kStack = 256 << 10;  // per fiber; ASan's frames are several times the plain ones
constexpr size_t kGuard = 4096;
constexpr size_t kTopFrames = 16 << 10;
constexpr int kMaxThreads = 1024;
constexpr unsigned kWarp = 32;

#ifdef __x86_64__
// ek_cpu_switch(&save, to): push the callee-saved registers, save rsp, load `to`, pop, return
// into the other fiber
extern "C" void ek_cpu_switch(void** save, void* to);
__asm__(
    ".text\n"
    ".globl ek_cpu_switch\n"
    ".type ek_cpu_switch,@function\n"
    "ek_cpu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size ek_cpu_switch, .-ek_cpu_switch\n");
#endif

struct Fiber {
    char* stack = nullptr;  // lowest usable byte (above the guard page)
#ifdef __x86_64__
    void* sp = nullptr;
#else
    ucontext_t ctx;
#endif
    ek_cpu_dim3 idx{};
    unsigned warp = 0, lane = 0;
    bool done = false;
};

struct Warp {
    unsigned bits[2][kWarp];  // a shuffle's values, double-buffered by generation
    unsigned lanes = 0, arrived = 0, gen = 0, returned = 0;
};

struct State {
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    char* stacks = nullptr;
    Fiber* current = nullptr;
#ifdef __x86_64__
    void* scheduler_sp = nullptr;
#else
    ucontext_t scheduler;
#endif
    const void* scheduler_bottom = nullptr;
    size_t scheduler_size = 0;
    void (*entry)(void**) = nullptr;
    void** params = nullptr;
    unsigned n_threads = 0, arrived = 0, gen = 0, returned = 0;
    unsigned long long progress = 0;
    std::string error;
};

State S;

void fail(const std::string& what) {
    if (S.error.empty()) {
        char where[160];
        snprintf(where, sizeof where, "block (%u,%u,%u) of grid (%u,%u,%u), block dims (%u,%u,%u): ",
                 ek_cpu_block_idx.x, ek_cpu_block_idx.y, ek_cpu_block_idx.z, ek_cpu_grid_dim.x, ek_cpu_grid_dim.y,
                 ek_cpu_grid_dim.z, ek_cpu_block_dim.x, ek_cpu_block_dim.y, ek_cpu_block_dim.z);
        S.error = where + what;
    }
}

// -- switching --------------------------------------------------------------------------------

void switch_to_scheduler(bool finished) {
    Fiber* f = S.current;
#if EK_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(finished ? nullptr : &fake, S.scheduler_bottom, S.scheduler_size);
#else
    (void)finished;
#endif
#ifdef __x86_64__
    ek_cpu_switch(&f->sp, S.scheduler_sp);
#else
    swapcontext(&f->ctx, &S.scheduler);
#endif
#if EK_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

void switch_to(Fiber* f) {
    S.current = f;
    ek_cpu_thread_idx = &f->idx;
#if EK_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, kStack);
#endif
#ifdef __x86_64__
    ek_cpu_switch(&S.scheduler_sp, f->sp);
#else
    swapcontext(&S.scheduler, &f->ctx);
#endif
#if EK_ASAN
    __sanitizer_finish_switch_fiber(fake, &S.scheduler_bottom, &S.scheduler_size);
#endif
}

void yield() { switch_to_scheduler(false); }

void thread_returned();

void fiber_main() {
#if EK_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &S.scheduler_bottom, &S.scheduler_size);
#endif
    S.entry(S.params);
    thread_returned();
    switch_to_scheduler(true);
    __builtin_trap();  // a finished fiber is never resumed
}

void start(Fiber* f) {
    f->done = false;
#if EK_ASAN
    // the frames a returned fiber never left (fiber_main's, its last switch's) lie at the top
    // of its stack; every other frame unpoisoned itself on the way out
    ASAN_UNPOISON_MEMORY_REGION(f->stack + kStack - kTopFrames, kTopFrames);
#endif
#ifdef __x86_64__
    // ret pops fiber_main's address with rsp = top - 8, as after a call (rsp % 16 == 8)
    void** top = (void**)(f->stack + kStack);
    *--top = nullptr;
    *--top = (void*)&fiber_main;
    for (int i = 0; i < 6; ++i) *--top = nullptr;
    f->sp = top;
#else
    getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = f->stack;
    f->ctx.uc_stack.ss_size = kStack;
    f->ctx.uc_link = nullptr;
    makecontext(&f->ctx, fiber_main, 0);
#endif
}

// -- what the kernels call --------------------------------------------------------------------

void thread_returned() {
    Fiber* f = S.current;
    f->done = true;
    ++S.returned;
    ++S.progress;
    Warp& w = S.warps[f->warp];
    ++w.returned;
    if (S.arrived > 0)
        fail("a thread returned while others of its block wait at __syncthreads (a barrier in divergent code)");
    if (w.arrived > 0)
        fail("a lane returned while others of its warp wait at a full-warp shuffle (divergent __shfl_xor_sync)");
}

}  // namespace

extern "C" void ek_cpu_syncthreads(void) {
    const unsigned gen = S.gen;
    ++S.progress;
    if (S.returned > 0) {
        fail("__syncthreads reached after a thread of the block returned (a barrier in divergent code)");
        yield();
    }
    if (++S.arrived == S.n_threads) {
        S.arrived = 0;
        ++S.gen;
        return;
    }
    while (S.gen == gen) yield();
}

extern "C" unsigned ek_cpu_shfl_xor(unsigned mask, unsigned bits, int lane_mask, int width) {
    Fiber* f = S.current;
    Warp& w = S.warps[f->warp];
    if (mask != 0xffffffffu) fail("a shuffle mask other than the whole warp (native/ uses 0xffffffff)");
    if (w.lanes != kWarp) fail("a full-warp shuffle in a warp with fewer than 32 threads (blockDim not whole warps)");
    if (w.returned > 0) fail("a full-warp shuffle after a lane of the warp returned");
    if (width <= 0 || width > (int)kWarp || (width & (width - 1))) fail("a shuffle width that is not a power of two <= 32");
    if (!S.error.empty()) yield();
    const unsigned gen = w.gen, buf = gen & 1u;
    w.bits[buf][f->lane] = bits;
    ++S.progress;
    if (++w.arrived == w.lanes) {
        w.arrived = 0;
        ++w.gen;
    } else {
        while (w.gen == gen) yield();
    }
    const unsigned segment = f->lane & ~(unsigned)(width - 1), src = f->lane ^ (unsigned)lane_mask;
    return (src & ~(unsigned)(width - 1)) == segment ? w.bits[buf][src] : bits;  // outside the segment: own value
}

extern "C" const char* ek_cpu_error(void) { return S.error.c_str(); }

namespace {

bool ensure_stacks() {
    if (S.stacks) return true;
    const size_t each = kGuard + kStack, total = each * kMaxThreads;
    void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    S.stacks = (char*)p;
    S.fibers.resize(kMaxThreads);
    for (int i = 0; i < kMaxThreads; ++i) {
        char* base = S.stacks + i * each;
        mprotect(base, kGuard, PROT_NONE);  // an overflowing fiber faults instead of writing its neighbour
        S.fibers[i].stack = base + kGuard;
    }
    return true;
}

bool run_block() {
    const ek_cpu_dim3 d = ek_cpu_block_dim;
    S.arrived = S.returned = 0;
    S.warps.assign((S.n_threads + kWarp - 1) / kWarp, Warp{});
    for (unsigned t = 0; t < S.n_threads; ++t) {
        Fiber& f = S.fibers[t];
        f.idx = {t % d.x, (t / d.x) % d.y, t / (d.x * d.y)};
        f.warp = t / kWarp;
        f.lane = t % kWarp;
        ++S.warps[f.warp].lanes;
        start(&f);
    }
    unsigned remaining = S.n_threads;
    while (remaining > 0) {
        const unsigned long long before = S.progress;
        for (unsigned t = 0; t < S.n_threads; ++t) {
            Fiber& f = S.fibers[t];
            if (f.done) continue;
            switch_to(&f);
            if (!S.error.empty()) return false;
            if (f.done) --remaining;
        }
        if (remaining > 0 && S.progress == before) {
            fail("threads wait at points the others never reach (a deadlock: barriers or shuffles in divergent code)");
            return false;
        }
    }
    return true;
}

}  // namespace

// 0: the kernel ran over the whole grid; -1: it did not (ek_cpu_error says why)
extern "C" int ek_cpu_launch(void (*entry)(void**), void** params, unsigned gx, unsigned gy, unsigned gz,
                             unsigned bx, unsigned by, unsigned bz) {
#if EK_ASAN
    // the fibers a failed launch abandoned left poisoned frames anywhere on their stacks
    if (!S.error.empty() && S.stacks)
        for (Fiber& f : S.fibers) ASAN_UNPOISON_MEMORY_REGION(f.stack, kStack);
#endif
    S.error.clear();
    ek_cpu_grid_dim = {gx, gy, gz};
    ek_cpu_block_dim = {bx, by, bz};
    ek_cpu_block_idx = {0, 0, 0};
    const unsigned long long n = (unsigned long long)bx * by * bz;
    if (n == 0 || n > (unsigned long long)kMaxThreads || gx == 0 || gy == 0 || gz == 0) {
        fail("a block of 1..1024 threads over a non-empty grid is required (CUDA_ERROR_INVALID_VALUE)");
        return -1;
    }
    if (!ensure_stacks()) {
        fail("no memory for the fibers' stacks");
        return -1;
    }
    S.entry = entry;
    S.params = params;
    S.n_threads = (unsigned)n;
    for (unsigned z = 0; z < gz; ++z)
        for (unsigned y = 0; y < gy; ++y)
            for (unsigned x = 0; x < gx; ++x) {
                ek_cpu_block_idx = {x, y, z};
                if (!run_block()) return -1;
            }
    return 0;
}
