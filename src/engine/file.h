/* file.h — opening input files safely: only regular files, never blocking on a FIFO, reads bounded.
 * Every model, tokenizer and config file the engine reads comes through here. */
#ifndef EMBER_FILE_H
#define EMBER_FILE_H

#include "ember.h"

#include <sys/stat.h>

/* Opens path read-only without blocking (O_NONBLOCK, so a FIFO cannot hang the open), then
 * requires a regular file: a directory, FIFO, socket or device is an EMBER_ERR_IO naming the path
 * and what it is. On success *fd is a blocking descriptor and *st its fstat. */
ember_status ember_file_open_regular(const char *path, int *fd, struct stat *st, ember_error *err);

/* The whole regular file into a malloc'd, NUL-terminated buffer; files larger than max_bytes are
 * refused before anything is read (EMBER_ERR_IO naming the size and the limit). */
ember_status ember_file_read_all(const char *path, size_t max_bytes, char **data, size_t *len, ember_error *err);

#endif
