/* nonfinite.h — locating the first non-finite value of an evaluation: hooks that check every view
 * (after the experiment's own hook, so a hook that writes NaN is found where it wrote it) and the
 * sentence that names where it was. The session (session.c) and the batch (batch.c) rerun the
 * evaluation with them when its logits came out non-finite. */
#ifndef EMBER_NONFINITE_H
#define EMBER_NONFINITE_H

#include "model.h"

typedef struct {
    const ember_hooks *user; /* called first at every stage */
    int64_t row0, rows;      /* the token rows checked (a batch's sequence); rows < 0: every row */
    int64_t logits_row;      /* the row of the logits stages' views checked (one row a sequence); < 0: their
                              * token rows as above (logits of every row) */
    bool found;
    ember_stage stage;
    int64_t layer, row, col; /* row: 0-based within the rows checked */
    int64_t head;            /* the attention head holding it on a per-head stage, else -1 */
    float value;
} ember_nonfinite_locator;

/* The hooks of a locating pass over lc (lc->user's SAE splices kept): every stage but
 * attention_pattern, which only where lc->user hooks it (its buffer exists only then). */
ember_hooks ember_nonfinite_hooks(ember_nonfinite_locator *lc);
/* "first non-finite value at STAGE of layer L (0-based token row R, column C = V)" and the like,
 * or "a second pass did not reproduce it" when nothing was found. head_col >= 0: the LM head's own
 * product was non-finite at that column (head_value) from a finite final hidden state, which is
 * named when no view before after_logits was found. */
void ember_nonfinite_where(const ember_nonfinite_locator *lc, int64_t head_col, float head_value, char *out,
                           size_t cap);

#endif
