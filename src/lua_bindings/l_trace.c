/* l_trace.c — ember.Trace: a JSONL trace file the engine writes its events into while the
 * trace is attached to a session (core.internal.set_trace); lib/ember/model/trace.lua adds the header and
 * the summary line. Hooks get no handle on it: only the library attaches or detaches a trace. */
#include "l_trace.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "l_session.h"

typedef struct {
    ember_trace *t; /* NULL once closed */
    FILE *f;
    char *path;   /* the file's path (owned), to remove it when a write failed */
    int attached; /* sessions tracing into it right now: it cannot close under them */
} lua_trace;

static lua_trace *check_trace(lua_State *L, int i) {
    lua_trace *lt = luaL_checkudata(L, i, EMBER_LUA_TRACE);
    if (!lt->t) luaL_error(L, "attempt to use a closed trace");
    return lt;
}

/* Closes the file; true when every write reached it. A trace that lost a write (a full disk) is
 * partial: the file is removed rather than left to pass for a whole trace (only a regular file:
 * a trace written to a device or a pipe is not ours to remove). */
static bool trace_close(lua_trace *lt) {
    if (!lt->t) return true;
    bool ok = ember_trace_status(lt->t, NULL) == EMBER_OK && !ferror(lt->f);
    ember_trace_free(lt->t);
    lt->t = NULL;
    if (fclose(lt->f) != 0) ok = false;
    lt->f = NULL;
    struct stat st;
    if (!ok && lt->path && lstat(lt->path, &st) == 0 && S_ISREG(st.st_mode)) remove(lt->path);
    free(lt->path);
    lt->path = NULL;
    return ok;
}

/* core.internal.trace_open(path) -> Trace, or raises "trace: cannot create 'path': reason". */
static int l_trace_open(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    lua_trace *lt = lua_newuserdatauv(L, sizeof *lt, 0); /* [path, trace] */
    lt->t = NULL;
    lt->f = NULL;
    lt->path = NULL;
    lt->attached = 0;
    luaL_setmetatable(L, EMBER_LUA_TRACE);
    FILE *f = fopen(path, "w");
    if (!f) { /* no position: the message names the file, which is what the caller needs */
        lua_pushfstring(L, "trace: cannot create '%s': %s", path, strerror(errno));
        return lua_error(L);
    }
    ember_error err = {0};
    char *copy = strdup(path);
    if (!copy) {
        fclose(f);
        return luaL_error(L, "trace: out of memory");
    }
    if (ember_trace_new(f, &lt->t, &err) != EMBER_OK) {
        free(copy);
        fclose(f);
        return luaL_error(L, "%s", err.msg);
    }
    lt->f = f;
    lt->path = copy;
    return 1;
}

/* core.internal.trace_write(trace, line): a line the library writes itself (the header and the
 * summary); not an engine event, so it is not part of the normalized fingerprint. */
static int l_trace_write(lua_State *L) {
    lua_trace *lt = check_trace(L, 1);
    size_t n;
    const char *s = luaL_checklstring(L, 2, &n);
    if (fwrite(s, 1, n, lt->f) != n || fputc('\n', lt->f) == EOF) {
        lua_pushfstring(L, "trace: writing '%s' failed (disk full?)", lt->path ? lt->path : "?");
        return lua_error(L);
    }
    return 0;
}

/* core.internal.trace_filter(trace, layers | nil, ops | nil): layers a sequence of 0-based layer
 * indices, ops a sequence of op names (lib/ember/model/trace.lua validates them against the model). */
static int l_trace_filter(lua_State *L) {
    lua_trace *lt = check_trace(L, 1);
    bool *mask = NULL;
    int64_t n_mask = 0;
    const char **ops = NULL;
    int n_ops = 0;
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        const lua_Integer n = (lua_Integer)lua_rawlen(L, 2);
        for (lua_Integer i = 1; i <= n; i++) {
            lua_Integer l = (lua_rawgeti(L, 2, i), luaL_checkinteger(L, -1));
            lua_pop(L, 1);
            if (l < 0 || l >= ((lua_Integer)1 << 20)) return luaL_error(L, "trace: layer %I is out of range", l);
            if (l + 1 > n_mask) n_mask = (int64_t)l + 1;
        }
        mask = lua_newuserdatauv(L, (size_t)(n_mask > 0 ? n_mask : 1) * sizeof *mask, 0); /* freed by the GC */
        memset(mask, 0, (size_t)(n_mask > 0 ? n_mask : 1) * sizeof *mask);
        for (lua_Integer i = 1; i <= n; i++) {
            lua_rawgeti(L, 2, i);
            mask[lua_tointeger(L, -1)] = true;
            lua_pop(L, 1);
        }
    }
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        n_ops = (int)lua_rawlen(L, 3);
        ops = lua_newuserdatauv(L, (size_t)(n_ops > 0 ? n_ops : 1) * sizeof *ops, 0);
        for (int i = 0; i < n_ops; i++) {
            lua_rawgeti(L, 3, i + 1);
            ops[i] = luaL_checkstring(L, -1); /* the table keeps the string alive meanwhile */
            lua_pop(L, 1);
        }
    }
    ember_error err = {0};
    if (ember_trace_set_filter(lt->t, mask, n_mask, ops, n_ops, &err) != EMBER_OK) return luaL_error(L, "%s", err.msg);
    return 0;
}

void ember_lua_trace_detach(lua_State *L, int idx) {
    idx = lua_absindex(L, idx);
    ember_lua_session *ls = luaL_checkudata(L, idx, EMBER_LUA_SESSION);
    if (lua_getiuservalue(L, idx, 3) == LUA_TUSERDATA) {
        lua_trace *old = luaL_testudata(L, -1, EMBER_LUA_TRACE);
        if (old) old->attached--;
    }
    lua_pop(L, 1);
    if (ls->s) ember_session_set_trace(ls->s, NULL);
    lua_pushnil(L);
    lua_setiuservalue(L, idx, 3);
}

/* core.internal.set_trace(session, trace | nil): the session's later evaluations write into trace
 * (nil detaches whatever it had). The session's user value 3 keeps the trace alive meanwhile. */
static int l_set_trace(lua_State *L) {
    ember_lua_session *ls = luaL_checkudata(L, 1, EMBER_LUA_SESSION);
    if (!ls->s) return luaL_error(L, "attempt to use a closed session");
    if (ls->busy) return luaL_error(L, "set_trace: the session is busy (a hook cannot change its trace)");
    lua_trace *lt = lua_isnoneornil(L, 2) ? NULL : check_trace(L, 2);
    ember_lua_trace_detach(L, 1);
    ember_session_set_trace(ls->s, lt ? lt->t : NULL);
    if (lt) lt->attached++;
    lua_pushvalue(L, 2);
    lua_setiuservalue(L, 1, 3);
    return 0;
}

/* t:close() -> true; raises when a write failed or a session is still tracing into it. */
static int t_close(lua_State *L) {
    lua_trace *lt = luaL_checkudata(L, 1, EMBER_LUA_TRACE);
    if (lt->attached > 0) return luaL_error(L, "trace: cannot close a trace a running session writes into");
    const char *path = lua_pushstring(L, lt->path ? lt->path : "?"); /* [trace, path]: kept past the close */
    if (!trace_close(lt)) { /* no position: the message names the file, which is what the caller needs */
        lua_pushfstring(L, "trace: writing '%s' failed (disk full?); the partial trace was removed", path);
        return lua_error(L);
    }
    lua_pushboolean(L, 1);
    return 1;
}

static int t_gc(lua_State *L) {
    lua_trace *lt = luaL_checkudata(L, 1, EMBER_LUA_TRACE);
    /* a session holding it keeps it alive, so at collection nothing writes into it any more */
    trace_close(lt);
    return 0;
}

/* t:fingerprint() -> the normalized trace fingerprint so far, 16 lowercase hex digits. */
static int t_fingerprint(lua_State *L) {
    lua_trace *lt = check_trace(L, 1);
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, ember_trace_fingerprint(lt->t));
    lua_pushstring(L, hex);
    return 1;
}

static int t_get_events(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)ember_trace_event_count(check_trace(L, 1)->t));
    return 1;
}

static int t_get_evaluations(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)ember_trace_eval_count(check_trace(L, 1)->t));
    return 1;
}

static int t_get_closed(lua_State *L) {
    lua_pushboolean(L, ((lua_trace *)luaL_checkudata(L, 1, EMBER_LUA_TRACE))->t == NULL);
    return 1;
}

static int t_tostring(lua_State *L) {
    lua_trace *lt = luaL_checkudata(L, 1, EMBER_LUA_TRACE);
    if (!lt->t) lua_pushstring(L, "ember.Trace (closed)");
    else lua_pushfstring(L, "ember.Trace (%I events)", (lua_Integer)ember_trace_event_count(lt->t));
    return 1;
}

void ember_lua_open_trace(lua_State *L, int module) {
    static const luaL_Reg methods[] = {{"close", t_close}, {"fingerprint", t_fingerprint}, {NULL, NULL}};
    /* __close is close (it refuses while a session writes into the trace); __gc runs only once no
     * session holds it */
    static const luaL_Reg meta[] = {{"__gc", t_gc}, {"__close", t_close}, {"__tostring", t_tostring}, {NULL, NULL}};
    static const luaL_Reg getters[] = {
        {"events", t_get_events}, {"evaluations", t_get_evaluations}, {"closed", t_get_closed}, {NULL, NULL}};
    static const luaL_Reg internal[] = {{"trace_open", l_trace_open},
                                        {"trace_write", l_trace_write},
                                        {"trace_filter", l_trace_filter},
                                        {"set_trace", l_set_trace},
                                        {NULL, NULL}};
    ember_lua_new_class(L, EMBER_LUA_TRACE, methods, meta, getters);
    lua_pop(L, 1);
    ember_lua_set_internal(L, module, internal);
}
