/* embedding.c — rows of the embedding tables (token, position, gemma4's per-layer tokens) for the
 * forward passes, read from the file with pread rather than through the mapping.
 * Why: a page fault on a mapped file maps the neighbouring pages too (fault-around: 64 KiB by
 * default, a whole large folio of the page cache on recent kernels, up to 2 MiB), so a long prompt
 * of scattered ids left tens of MiB of a table resident that nothing reads again; when the table is
 * the tied output head, a second copy of what the repacked head holds. Reading the row's bytes
 * copies them out of the page cache and maps nothing. The values are the same: the bytes go
 * through the kernels' get_row (the type's to_float) a few blocks at a time. */
#include "model.h"

#define EMBER_LOOKUP_PIECE 16384 /* bytes of a row converted at a time (a multiple of every block) */

void ember_embedding_row(const ember_model *m, const ember_matrix *table, int64_t r, float *out) {
    const ember_type_traits *tt = ember_type_traits_get(table->type);
    const uint8_t *row = (const uint8_t *)table->data + (size_t)r * table->row_bytes;
    const int64_t blocks = table->n_in / tt->block_size, per_piece = EMBER_LOOKUP_PIECE / (int64_t)tt->block_bytes;
    const ember_gguf *file = ember_model_gguf_holding(m, row); /* an overridden table is the other file's */
    _Alignas(64) uint8_t buf[EMBER_LOOKUP_PIECE];
    for (int64_t b0 = 0; b0 < blocks; b0 += per_piece) {
        const int64_t k = blocks - b0 < per_piece ? blocks - b0 : per_piece;
        const size_t bytes = (size_t)k * tt->block_bytes;
        ember_gguf_read(file, row + (size_t)b0 * tt->block_bytes, buf, bytes);
        const ember_matrix piece = {
            .type = table->type, .data = buf, .n_in = k * tt->block_size, .n_out = 1, .row_bytes = bytes};
        m->ops->get_row(&piece, 0, out + b0 * tt->block_size);
    }
}
