/* mapguard.c — the SIGBUS handler behind mapguard.h and its table of guarded mappings.
 * Must do only async-signal-safe work in the handler: atomics, mmap, sigaction; no locks, no malloc. */
#include "mapguard.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAPGUARD_SLOTS 64

typedef struct {
    _Atomic uintptr_t base; /* 0: free slot */
    _Atomic size_t size;
    atomic_bool faulted;
} guard_slot;

static guard_slot slots[MAPGUARD_SLOTS];
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER; /* add/remove only, never the handler */
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static struct sigaction previous;
static uintptr_t page_size = 4096; /* read once at install: sysconf is not async-signal-safe */

static void chain(int sig, siginfo_t *info, void *uctx) {
    if (previous.sa_flags & SA_SIGINFO) {
        if (previous.sa_sigaction) previous.sa_sigaction(sig, info, uctx);
        return;
    }
    if (previous.sa_handler == SIG_IGN) return;
    if (previous.sa_handler == SIG_DFL || previous.sa_handler == NULL) {
        /* back to the default action: the faulting read repeats and ends the process as it would
         * have without the guard */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(sig, &dfl, NULL);
        return;
    }
    previous.sa_handler(sig);
}

static void on_sigbus(int sig, siginfo_t *info, void *uctx) {
    uintptr_t addr = (uintptr_t)info->si_addr;
    for (int i = 0; i < MAPGUARD_SLOTS; i++) {
        uintptr_t base = atomic_load(&slots[i].base);
        size_t size = atomic_load(&slots[i].size);
        if (!base || addr < base || addr - base >= size) continue;
        uintptr_t from = addr / page_size * page_size;
        /* zeros from the faulting page to the end: one call covers the whole truncated tail */
        void *p = mmap((void *)from, base + size - from, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (p == MAP_FAILED) break; /* cannot repair: let the previous action decide */
        atomic_store(&slots[i].faulted, true);
        return;
    }
    chain(sig, info, uctx);
}

static void install(void) {
    long page = sysconf(_SC_PAGESIZE);
    if (page > 0) page_size = (uintptr_t)page;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &previous);
}

int ember_mapguard_add(const void *base, size_t size) {
    if (!base || !size) return -1;
    pthread_once(&install_once, install);
    int slot = -1;
    pthread_mutex_lock(&slots_lock);
    for (int i = 0; i < MAPGUARD_SLOTS; i++)
        if (!atomic_load(&slots[i].base)) {
            atomic_store(&slots[i].faulted, false);
            atomic_store(&slots[i].size, size);
            atomic_store(&slots[i].base, (uintptr_t)base); /* published last: the handler reads base first */
            slot = i;
            break;
        }
    pthread_mutex_unlock(&slots_lock);
    return slot;
}

void ember_mapguard_remove(int slot) {
    if (slot < 0 || slot >= MAPGUARD_SLOTS) return;
    pthread_mutex_lock(&slots_lock);
    atomic_store(&slots[slot].base, 0);
    atomic_store(&slots[slot].size, 0);
    pthread_mutex_unlock(&slots_lock);
}

bool ember_mapguard_faulted(int slot) {
    return slot >= 0 && slot < MAPGUARD_SLOTS && atomic_load(&slots[slot].faulted);
}
