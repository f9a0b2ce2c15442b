/* test_view_heads.c — v:head(h) on views that carry a head layout (what the hook adapter gives the
 * per-head stages): rows give a sub-view of one head's rows, columns a strided sub-view of one
 * head's columns; both write through and expire with the view; clone() keeps the layout; a wrong
 * n_heads or layout is refused. Views are made here over a C buffer, as the adapter makes them over engine
 * memory, and driven from Lua on the ember core. */
#include "l_tensor.h"
#include "test_support.h"

#include <lualib.h>
#include <string.h>

/* [H*P, cols] with H = 2 heads, P = 3 rows per head, 4 columns (rows layout), and the same buffer
 * read as [P', H*D] = [6, 2 heads * 2] (columns layout). Value = 10 * row + column (0-based). */
#define ROWS 6
#define COLS 4

static const char *const script = "local v_rows, v_cols = ...\n"
                                  "local out = {}\n"
                                  "-- rows: head 1 is rows 4..6, as a sub-view\n"
                                  "local h1 = v_rows:head(1)\n"
                                  "out[#out + 1] = table.concat(h1:shape(), 'x')\n"
                                  "out[#out + 1] = h1:get(1, 1)\n"
                                  "h1:set(1, 2, -1)\n"
                                  "out[#out + 1] = v_rows:get(4, 2)\n"
                                  "out[#out + 1] = getmetatable(h1).__name\n"
                                  "-- columns: head 1 is columns 3..4, a strided sub-view\n"
                                  "local c1 = v_cols:head(1)\n"
                                  "out[#out + 1] = table.concat(c1:shape(), 'x')\n"
                                  "out[#out + 1] = table.concat(c1:row(2):values(), ',')\n"
                                  "out[#out + 1] = getmetatable(c1).__name\n"
                                  "c1:set(6, 1, -2)\n"
                                  "-- a clone keeps the layout\n"
                                  "out[#out + 1] = table.concat(v_cols:clone():head(0):values(), ',')\n"
                                  "out[#out + 1] = table.concat(v_rows:clone():head(0):shape(), 'x')\n"
                                  "-- refusals\n"
                                  "out[#out + 1] = select(2, pcall(v_rows.head, v_rows, 0, 3))\n"
                                  "out[#out + 1] = select(2, pcall(v_rows.head, v_rows, 0, nil, 'columns'))\n"
                                  "out[#out + 1] = select(2, pcall(v_rows.head, v_rows, 2))\n"
                                  "-- explicit arguments that agree are accepted\n"
                                  "out[#out + 1] = v_cols:head(1, 2, 'columns'):get(1, 1)\n"
                                  "return out, h1\n";

static const char *const after_expiry = "local h1 = ...\nreturn pcall(h1.values, h1)\n";

int main(void) {
    float buf[ROWS * COLS];
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++) buf[r * COLS + c] = (float)(10 * r + c);
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    luaL_requiref(L, "ember.core", luaopen_ember_core, 0);
    lua_pop(L, 1);

    bool modified = false;
    CHECK(luaL_loadstring(L, script) == LUA_OK);
    ember_lua_view *vr = ember_lua_push_view(L, buf, ROWS, COLS, &modified);
    vr->n_heads = 2;
    vr->heads_by = EMBER_LUA_HEADS_ROWS;
    ember_lua_view *vc = ember_lua_push_view(L, buf, ROWS, COLS, &modified);
    vc->n_heads = 2;
    vc->heads_by = EMBER_LUA_HEADS_COLUMNS;
    if (lua_pcall(L, 2, 2, 0) != LUA_OK) {
        CHECK_MSG(false, "script: %s", lua_tostring(L, -1));
        lua_close(L);
        return ember_test_finish();
    }
    static const char *const want[] = {
        "3x4",
        "30.0",
        "-1.0",
        "ember.TensorView",
        "6x2",
        "12.0,13.0",
        "ember.TensorView",
        "0.0,1.0,10.0,11.0,20.0,21.0,30.0,-1.0,40.0,41.0,50.0,51.0",
        "3x4",
        "head: this view holds 2 heads, not 3",
        "head: this view lays its heads out by rows",
        "head: head 2 out of range 0..1 (heads are 0-based, like layers)",
        "2.0",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        lua_rawgeti(L, 1, (lua_Integer)i + 1);
        const char *got = luaL_tolstring(L, -1, NULL);
        CHECK_MSG(got && strstr(got, want[i]) != NULL, "result %zu: '%s', expected '%s'", i + 1, got, want[i]);
        lua_pop(L, 2);
    }
    CHECK_MSG(buf[3 * COLS + 1] == -1.0f, "the write through head(1) of the rows view did not reach the buffer");
    CHECK_MSG(buf[5 * COLS + 2] == -2.0f, "the write through head(1) of the columns view did not reach the buffer");
    CHECK(modified);

    /* expire the view the sub-view came from: the sub-view must refuse to read */
    ember_lua_expire_view(vr);
    CHECK(luaL_loadstring(L, after_expiry) == LUA_OK);
    lua_pushvalue(L, 2); /* h1 */
    CHECK(lua_pcall(L, 1, 2, 0) == LUA_OK);
    CHECK_MSG(!lua_toboolean(L, -2) && strstr(lua_tostring(L, -1), "expired view"), "after expiry: %s",
              lua_tostring(L, -1));
    lua_close(L);
    return ember_test_finish();
}
