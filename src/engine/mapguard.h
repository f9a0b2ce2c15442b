/* mapguard.h — keeps a file mapping from killing the process when the file shrinks under it.
 *
 * A read of a mapped page past the end of a truncated file raises SIGBUS. For registered mappings a
 * SIGBUS handler replaces the pages from the faulting one to the end of the mapping with
 * zero-filled anonymous memory and marks the mapping faulted; the faulting read then resumes and
 * sees zeros. Nothing jumps: the evaluation runs to its end on the zeros, and the session reports
 * the fault as an error naming the file (see docs/robustness.md). Signals in addresses outside
 * every registered mapping go to the handler that was installed before, or kill as before. */
#ifndef EMBER_MAPGUARD_H
#define EMBER_MAPGUARD_H

#include <stdbool.h>
#include <stddef.h>

/* Registers [base, base+size); returns a slot (>= 0), or -1 when the table is full (the mapping
 * is then unguarded: a fault kills as without the guard). Installs the handler on first use. */
int ember_mapguard_add(const void *base, size_t size);
void ember_mapguard_remove(int slot);
/* Whether a read of the mapping has faulted since it was registered. */
bool ember_mapguard_faulted(int slot);

#endif
