/* main.c — ember-lua: the Lua 5.4 interpreter with ember built in, its Lua library included
 * (lib_embed.h). Takes the standard `lua` options plus `-m mod`, runs scripts under lua_pcall with
 * a traceback, and with no script opens the REPL (lib/ember/cli/repl.lua) over GNU readline. Only the
 * terminal glue is C; the REPL logic is Lua. */
#include "lbind.h"
#include "lib_embed.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>

#include <lualib.h>
#include <readline/history.h>
#include <readline/readline.h>

int luaopen_lpeg(lua_State *L);
int luaopen_cjson(lua_State *L);

static const char *progname = "ember-lua";
static lua_State *globalL = NULL;

/* ---- Ctrl-C ------------------------------------------------------------------------------------ */

/* While readline waits for a line, Ctrl-C only abandons that line; otherwise it arms a count hook
 * that raises "interrupted" at the next Lua instruction (on the main thread and on the thread
 * running engine work, which may be a coroutine), and sets the flag that generate() polls between
 * tokens. The handler stays armed: once an interrupt has been delivered (the error raised, or
 * generate stopped), the next Ctrl-C interrupts again. Only a second Ctrl-C while the first is
 * still undelivered (C code that runs no Lua) falls back to the default (kill). */
static volatile sig_atomic_t in_readline = 0, readline_sigint = 0;

#define STOP_MASK (LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT)

/* Raises the plain string "interrupted" (no position), which generate recognises: it then
 * returns what it has generated so far with stop = "interrupted" instead of losing it. */
static void lstop(lua_State *L, lua_Debug *ar) {
    (void)ar;
    /* delivered: the flag and every hook armed for it go, so the next generate runs normally */
    ember_lua_interrupted = 0;
    lua_sethook(L, NULL, 0, 0);
    lua_sethook(globalL, NULL, 0, 0);
    lua_State *running = ember_lua_running;
    if (running) lua_sethook(running, NULL, 0, 0);
    lua_pushliteral(L, "interrupted");
    lua_error(L);
}

static void on_sigint(int sig) {
    if (in_readline) {
        readline_sigint = 1;
        return;
    }
    if (ember_lua_interrupted) { /* the last one was never delivered: let this one kill */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    ember_lua_interrupted = 1;
    lua_sethook(globalL, lstop, STOP_MASK, 1); /* async-signal-safe */
    lua_State *running = ember_lua_running;
    if (running && running != globalL) lua_sethook(running, lstop, STOP_MASK, 1);
}

static void arm_sigint(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

/* ---- running chunks ---------------------------------------------------------------------------- */

static void l_message(const char *pname, const char *msg) {
    if (pname) fprintf(stderr, "%s: ", pname);
    fprintf(stderr, "%s\n", msg);
    fflush(stderr);
}

static int report(lua_State *L, int status) {
    if (status != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        l_message(progname, msg ? msg : "(error object is not a string)");
        lua_pop(L, 1);
    }
    return status;
}

/* Message handler: a string message plus a traceback. */
static int msghandler(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (!msg) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
        msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* Calls the function below narg arguments under the traceback handler, with Ctrl-C armed. */
static int docall(lua_State *L, int narg, int nres) {
    int base = lua_gettop(L) - narg;
    lua_pushcfunction(L, msghandler);
    lua_insert(L, base);
    arm_sigint();
    int status = lua_pcall(L, narg, nres, base);
    signal(SIGINT, SIG_DFL);
    lua_remove(L, base);
    return status;
}

static int dochunk(lua_State *L, int status) {
    if (status == LUA_OK) status = docall(L, 0, 0);
    return report(L, status);
}

static int dostring(lua_State *L, const char *s, const char *name) {
    return dochunk(L, luaL_loadbuffer(L, s, strlen(s), name));
}

/* -l mod or -l g=mod: require(mod) into global g (default: mod). */
static int dolibrary(lua_State *L, char *spec) {
    char *eq = strchr(spec, '=');
    char *glb = spec, *mod = spec;
    if (eq) {
        *eq = '\0';
        mod = eq + 1;
    }
    lua_getglobal(L, "require");
    lua_pushstring(L, mod);
    int status = docall(L, 1, 1);
    if (status == LUA_OK) lua_setglobal(L, glb);
    return report(L, status);
}

/* ---- arguments, like lua.c ---------------------------------------------------------------------- */

enum { HAS_ERROR = 1, HAS_I = 2, HAS_V = 4, HAS_E = 8, HAS_BIG_E = 16, HAS_M = 32 };

/* Scans options; returns flags and sets *first to the index of the script (or argc). With -m mod,
 * *first is the index of mod, which then stands where a script would. */
static int collectargs(char **argv, int *first) {
    int args = 0, i;
    for (i = 1; argv[i] != NULL; i++) {
        *first = i;
        if (argv[i][0] != '-') return args; /* the script */
        switch (argv[i][1]) {
        case '-':
            if (argv[i][2] != '\0') return HAS_ERROR;
            *first = i + 1;
            return args;
        case '\0': return args; /* '-' is stdin as the script */
        case 'E':
            if (argv[i][2] != '\0') return HAS_ERROR;
            args |= HAS_BIG_E;
            break;
        case 'W':
            if (argv[i][2] != '\0') return HAS_ERROR;
            break;
        case 'm': /* -m mod: like python -m, the module's main(arg) is the script */
            if (argv[i][2] != '\0' || argv[i + 1] == NULL || argv[i + 1][0] == '-') return HAS_ERROR;
            *first = i + 1;
            return args | HAS_M;
        case 'i':
            args |= HAS_I; /* fall through: -i implies -v */
        /* fall through */
        case 'v':
            if (argv[i][2] != '\0') return HAS_ERROR;
            args |= HAS_V;
            break;
        case 'e':
            args |= HAS_E; /* fall through */
        /* fall through */
        case 'l':
            if (argv[i][2] == '\0') {
                i++;
                if (argv[i] == NULL || argv[i][0] == '-') return HAS_ERROR;
            }
            break;
        default: return HAS_ERROR;
        }
    }
    *first = i;
    return args;
}

static int runargs(lua_State *L, char **argv, int n) {
    for (int i = 1; i < n; i++) {
        int opt = argv[i][1];
        if (opt == 'W') lua_warning(L, "@on", 0);
        if (opt != 'e' && opt != 'l') continue;
        char *extra = argv[i] + 2;
        if (*extra == '\0') extra = argv[++i];
        int status = opt == 'e' ? dostring(L, extra, "=(command line)") : dolibrary(L, extra);
        if (status != LUA_OK) return 0;
    }
    return 1;
}

/* The global `arg`: arg[0] the script, arg[1..] its arguments, negatives the interpreter + options. */
static void createargtable(lua_State *L, char **argv, int argc, int script) {
    if (script == argc) script = 0; /* no script: arg[0] is the interpreter */
    lua_createtable(L, argc - script - 1 > 0 ? argc - script - 1 : 0, script + 1);
    for (int i = 0; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i - script);
    }
    lua_setglobal(L, "arg");
}

/* Exit status of `-m mod`: what mod.main(arg) returned. */
static int module_status = EXIT_SUCCESS;

/* -m mod: require(mod).main(arg) -> exit status (an integer; anything else counts as 0). */
static int handle_module(lua_State *L, const char *mod) {
    lua_getglobal(L, "require");
    lua_pushstring(L, mod);
    int status = docall(L, 1, 1); /* [module] */
    if (status != LUA_OK) return report(L, status);
    if (lua_getfield(L, -1, "main") != LUA_TFUNCTION) { /* [module, main] */
        lua_pop(L, 2);
        l_message(progname, lua_pushfstring(L, "module '%s' has no main function", mod));
        lua_pop(L, 1);
        return LUA_ERRRUN;
    }
    lua_remove(L, -2);
    lua_getglobal(L, "arg"); /* [main, arg] */
    status = docall(L, 1, 1);
    if (status != LUA_OK) return report(L, status);
    module_status = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
    return LUA_OK;
}

/* A script's own directory goes at the end of package.path (DIR/?.lua, DIR/?/init.lua) and
 * package.cpath (DIR/?.so), so a multi-file experiment can require its siblings from any working
 * directory. Last, so it never shadows ember's own modules (which preload serves first anyway).
 * The directory is the real one (links resolved), as an absolute path. */
static void add_script_dir(lua_State *L, const char *fname) {
    char *real = realpath(fname, NULL);
    if (!real) return; /* luaL_loadfile reports the missing file */
    char *slash = strrchr(real, '/');
    if (slash == real) slash[1] = '\0'; /* a script in "/" */
    else if (slash) *slash = '\0';
    const char *sep = strcmp(real, "/") == 0 ? "" : "/";
    lua_getglobal(L, "package"); /* [package] */
    lua_getfield(L, -1, "path"); /* [package, path] */
    lua_pushfstring(L, "%s;%s%s?.lua;%s%s?/init.lua", lua_tostring(L, -1), real, sep, real, sep);
    lua_setfield(L, -3, "path");  /* [package, path] */
    lua_getfield(L, -2, "cpath"); /* [package, path, cpath] */
    lua_pushfstring(L, "%s;%s%s?.so", lua_tostring(L, -1), real, sep);
    lua_setfield(L, -4, "cpath");
    lua_pop(L, 3);
    free(real);
}

static int handle_script(lua_State *L, char **argv) {
    const char *fname = argv[0];
    if (strcmp(fname, "-") == 0 && strcmp(argv[-1], "--") != 0) fname = NULL; /* stdin */
    if (fname) add_script_dir(L, fname);
    int status = luaL_loadfile(L, fname);
    if (status == LUA_OK) {
        int n = 0;
        for (char **a = argv + 1; *a; a++) {
            luaL_checkstack(L, 1, "too many script arguments");
            lua_pushstring(L, *a);
            n++;
        }
        status = docall(L, n, LUA_MULTRET);
    }
    return report(L, status);
}

/* ---- package set-up ----------------------------------------------------------------------------- */

/* package.path: $EMBER_LIB first when set (a development tree's lib/ overrides the embedded
 * copy); no "./"-relative entries, so a script's directory cannot shadow ember's modules.
 * Returns whether EMBER_LIB is in use. */
static bool setup_paths(lua_State *L, bool ignore_env) {
    const char *lib = ignore_env ? NULL : getenv("EMBER_LIB");
    if (lib && !*lib) lib = NULL;
    lua_getglobal(L, "package"); /* [package] */
    const char *fields[] = {"path", "cpath"};
    for (int f = 0; f < 2; f++) {
        lua_getfield(L, -1, fields[f]); /* [package, old] */
        const char *old = lua_tostring(L, -1);
        luaL_Buffer b;
        luaL_buffinit(L, &b);
        if (f == 0 && lib) {
            luaL_addstring(&b, lib);
            luaL_addstring(&b, "/?.lua;");
            luaL_addstring(&b, lib);
            luaL_addstring(&b, "/?/init.lua");
        }
        const char *p = old ? old : "";
        while (*p) {
            const char *end = strchr(p, ';');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            bool relative = len >= 2 && p[0] == '.' && p[1] == '/';
            if (len > 0 && !relative) {
                if (luaL_bufflen(&b) > 0) luaL_addchar(&b, ';');
                luaL_addlstring(&b, p, len);
            }
            p += len + (end ? 1 : 0);
        }
        luaL_pushresult(&b);            /* [package, old, new] */
        lua_setfield(L, -3, fields[f]); /* [package, old] */
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return lib != NULL;
}

/* package.preload loader of one embedded module; upvalue 1: its index in ember_lib_modules.
 * Called by require as loader(name, ":preload:"); the chunk gets (name, chunk name) as a file
 * loaded by the standard searcher gets (name, path). [name, extra] */
static int load_embedded(lua_State *L) {
    const ember_lib_module *m = &ember_lib_modules[lua_tointeger(L, lua_upvalueindex(1))];
    if (luaL_loadbuffer(L, (const char *)m->src, m->len, m->chunk) != LUA_OK) return lua_error(L);
    lua_pushstring(L, m->name);
    lua_pushstring(L, m->chunk + 1); /* without the '@' */
    lua_call(L, 2, 1);
    return 1;
}

/* The C modules always; the Lua library unless EMBER_LIB points at a tree of it. */
static void preload(lua_State *L, bool with_library) {
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE); /* [preload] */
    lua_pushcfunction(L, luaopen_ember_core);
    lua_setfield(L, -2, "ember.core");
    lua_pushcfunction(L, luaopen_lpeg);
    lua_setfield(L, -2, "lpeg");
    lua_pushcfunction(L, luaopen_cjson);
    lua_setfield(L, -2, "cjson");
    for (lua_Integer i = 0; with_library && ember_lib_modules[i].name; i++) {
        lua_pushinteger(L, i);
        lua_pushcclosure(L, load_embedded, 1);
        lua_setfield(L, -2, ember_lib_modules[i].name);
    }
    lua_pop(L, 1);
}

/* ---- readline glue for lib/ember/cli/repl.lua ------------------------------------------------ */

static char *line_result;
static bool line_done;

static void on_line(char *line) {
    line_result = line;
    line_done = true;
    rl_callback_handler_remove();
}

static void free_line(void *p) { free(p); }

/* rl.readline(prompt) -> line | nil (end of input) | false (Ctrl-C abandoned the line).
 * The callback interface plus select() lets Ctrl-C cancel a line without killing the REPL. */
static int l_readline(lua_State *L) {
    const char *prompt = luaL_optstring(L, 1, "> ");
    void **box = ember_lua_box(L, free_line); /* the line is freed even if pushing it raises */
    line_done = false;
    line_result = NULL;
    readline_sigint = 0;
    ember_lua_interrupted = 0;
    in_readline = 1;
    arm_sigint();
    rl_callback_handler_install(prompt, on_line);
    bool interrupted = false;
    int fd = fileno(rl_instream ? rl_instream : stdin);
    while (!line_done) {
        fd_set fds;
        FD_ZERO(&fds);
        FD_SET(fd, &fds);
        if (select(fd + 1, &fds, NULL, NULL, NULL) < 0) {
            if (errno == EINTR && readline_sigint) {
                readline_sigint = 0;
                interrupted = true;
                rl_echo_signal_char(SIGINT); /* "^C" after the abandoned text, as a shell shows it */
                rl_crlf();
                rl_free_line_state();
                rl_callback_sigcleanup();
                rl_callback_handler_remove();
                break;
            }
            if (errno == EINTR) continue;
            rl_callback_handler_remove();
            break; /* treat a failing terminal as end of input */
        }
        rl_callback_read_char();
    }
    in_readline = 0;
    arm_sigint(); /* the line is evaluated next: Ctrl-C interrupts it */
    *box = line_result;
    if (interrupted) lua_pushboolean(L, 0);
    else if (!line_result) lua_pushnil(L);
    else lua_pushstring(L, line_result);
    return 1;
}

static const char *history_path = NULL;

static int l_add_history(lua_State *L) {
    const char *line = luaL_checkstring(L, 1);
    add_history(line);
    if (history_path) append_history(1, history_path);
    return 0;
}

/* rl.load_history(path): reads it (creating it if missing) and appends each new entry there. */
static int l_load_history(lua_State *L) {
    luaL_checkstring(L, 1);
    lua_pushvalue(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, "ember.repl.history"); /* keeps the string alive */
    lua_getfield(L, LUA_REGISTRYINDEX, "ember.repl.history");
    history_path = lua_tostring(L, -1);
    if (read_history(history_path) != 0) write_history(history_path);
    return 0;
}

/* Completion: readline asks for matches of the word before the cursor; the Lua completer
 * (registry "ember.repl.completer") returns them as a table of full replacement strings. */
static char **matches = NULL;
static size_t n_matches = 0, next_match = 0;

static char *match_generator(const char *text, int state) {
    (void)text;
    if (state == 0) next_match = 0;
    return next_match < n_matches ? strdup(matches[next_match++]) : NULL;
}

static void clear_matches(void) {
    for (size_t i = 0; i < n_matches; i++) free(matches[i]);
    free(matches);
    matches = NULL;
    n_matches = 0;
}

/* [text, line] -> completer(text, line) -> table; runs under lua_pcall. */
static int call_completer(lua_State *L) {
    lua_getfield(L, LUA_REGISTRYINDEX, "ember.repl.completer");
    lua_insert(L, 1);
    lua_call(L, 2, 1);
    return 1;
}

static char **complete(const char *text, int start, int end) {
    (void)start;
    (void)end;
    rl_attempted_completion_over = 1; /* never fall back to file names */
    rl_completion_append_character = '\0';
    clear_matches();
    lua_State *L = globalL;
    if (!lua_checkstack(L, 4)) return NULL;
    int top = lua_gettop(L);
    lua_pushcfunction(L, call_completer);
    lua_pushstring(L, text);
    lua_pushstring(L, rl_line_buffer);
    if (lua_pcall(L, 2, 1, 0) == LUA_OK && lua_istable(L, -1)) {
        size_t n = lua_rawlen(L, -1);
        matches = calloc(n ? n : 1, sizeof *matches);
        for (size_t i = 1; matches && i <= n; i++) {
            lua_rawgeti(L, -1, (lua_Integer)i);
            const char *s = lua_tostring(L, -1);
            if (s && (matches[n_matches] = strdup(s))) n_matches++;
            lua_pop(L, 1);
        }
    }
    lua_settop(L, top);
    if (n_matches == 0) return NULL;
    return rl_completion_matches(text, match_generator);
}

static int l_set_completer(lua_State *L) {
    luaL_checktype(L, 1, LUA_TFUNCTION);
    lua_setfield(L, LUA_REGISTRYINDEX, "ember.repl.completer");
    rl_attempted_completion_function = complete;
    return 0;
}

static void setup_readline(void) {
    rl_readline_name = "ember";
    rl_catch_signals = 0; /* Ctrl-C is ours (see l_readline) */
    /* '.', ':', '[' and ']' are not word breaks, so completion sees whole paths like "ember.tens",
     * "m:ge" or "c.after_layer[3]:l2" (the completer takes an unclosed '[' apart itself). */
    rl_basic_word_break_characters = " \t\n\"\\'><=;+-*/%^~#{}(),&|";
}

static const luaL_Reg rl_funcs[] = {{"readline", l_readline},
                                    {"add_history", l_add_history},
                                    {"load_history", l_load_history},
                                    {"set_completer", l_set_completer},
                                    {NULL, NULL}};

/* require("ember.readline") -> the same rl table the REPL gets, for Lua commands that read lines
 * from a terminal themselves (`ember interactive`); only ember-lua has it, so stock Lua (the
 * specs) falls back to plain reads. */
static int open_readline(lua_State *L) {
    setup_readline();
    luaL_newlib(L, rl_funcs);
    return 1;
}

static void preload_readline(lua_State *L) {
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE); /* [preload] */
    lua_pushcfunction(L, open_readline);
    lua_setfield(L, -2, "ember.readline");
    lua_pop(L, 1);
}

static int run_repl(lua_State *L) {
    setup_readline();
    lua_getglobal(L, "require");
    lua_pushliteral(L, "ember.cli.repl");
    int status = docall(L, 1, 1); /* [repl] */
    if (status != LUA_OK) return report(L, status);
    lua_getfield(L, -1, "run"); /* [repl, run] */
    lua_remove(L, -2);
    luaL_newlib(L, rl_funcs);
    status = report(L, docall(L, 1, 0));
    if (history_path) history_truncate_file(history_path, 1000);
    clear_matches();
    return status;
}

/* ---- main ---------------------------------------------------------------------------------------- */

static void print_usage(const char *badoption) {
    if (badoption[1] == 'e' || badoption[1] == 'l' || badoption[1] == 'm')
        fprintf(stderr, "%s: '%s' needs argument\n", progname, badoption);
    else fprintf(stderr, "%s: unrecognized option '%s'\n", progname, badoption);
    fprintf(stderr,
            "usage: %s [options] [script [args]]\n"
            "Available options are:\n"
            "  -e stat   execute string 'stat'\n"
            "  -i        enter interactive mode after executing 'script'\n"
            "  -l mod    require library 'mod' into global 'mod'\n"
            "  -l g=mod  require library 'mod' into global 'g'\n"
            "  -m mod    run require('mod').main(arg) with the remaining arguments; its result is the exit status\n"
            "  -v        show version information\n"
            "  -E        ignore environment variables (EMBER_LIB: a lib/ used instead of the built-in one)\n"
            "  -W        turn warnings on\n"
            "  --        stop handling options\n"
            "  -         stop handling options and execute stdin\n"
            "With no script, ember-lua starts the REPL (history in $EMBER_HISTORY or ~/.ember_history).\n",
            progname);
}

/* One rule for every mode (script, -e, -l, -m, stdin, the REPL): the library is the global
 * `ember`, as `local ember = require("ember")` gives it, and `help` is the REPL's help(). Each is
 * required on first use (an __index on _G), so a run that never names it pays nothing and a
 * library that cannot load fails where it is used. [_G, key] */
static int global_index(lua_State *L) {
    if (lua_type(L, 2) != LUA_TSTRING) return 0;
    const char *key = lua_tostring(L, 2);
    bool is_help = strcmp(key, "help") == 0;
    if (!is_help && strcmp(key, "ember") != 0) return 0;
    lua_getglobal(L, "require");
    if (is_help) lua_pushliteral(L, "ember.cli.repl");
    else lua_pushliteral(L, "ember");
    lua_call(L, 1, 1);                        /* [_G, key, module] */
    if (is_help) lua_getfield(L, -1, "help"); /* [_G, key, repl, help] */
    lua_pushvalue(L, -1);
    lua_setfield(L, 1, key); /* rawset: _G has no __newindex */
    return 1;
}

static void set_global_ember(lua_State *L) {
    lua_pushglobaltable(L);   /* [_G] */
    lua_createtable(L, 0, 1); /* [_G, mt] */
    lua_pushcfunction(L, global_index);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, -2);
    lua_pop(L, 1);
}

/* Everything that runs Lua happens in here, itself under lua_pcall. */
static int pmain(lua_State *L) {
    int argc = (int)lua_tointeger(L, 1);
    char **argv = lua_touserdata(L, 2);
    int script = 0;
    int args = collectargs(argv, &script);
    if (args == HAS_ERROR) {
        print_usage(argv[script]);
        return 0;
    }
    luaL_checkversion(L);
    luaL_openlibs(L);
    preload(L, !setup_paths(L, args & HAS_BIG_E));
    createargtable(L, argv, argc, script);
    lua_gc(L, LUA_GCRESTART);
    lua_gc(L, LUA_GCGEN, 0, 0);
    /* The REPL prints its own banner (with the version): -i, or no script on a terminal. */
    bool repl = (args & HAS_I) || (script == argc && !(args & (HAS_E | HAS_V)) && isatty(0));
    if ((args & HAS_V) && !repl) printf("ember-lua %s (%s)\n", EMBER_VERSION, LUA_RELEASE);
    set_global_ember(L);
    preload_readline(L);
    if (!runargs(L, argv, script)) return 0;
    if (args & HAS_M) {
        if (handle_module(L, argv[script]) != LUA_OK) return 0;
        lua_pushboolean(L, 1);
        return 1;
    }
    if (script < argc && handle_script(L, argv + script) != LUA_OK) return 0;
    if (args & HAS_I) {
        if (run_repl(L) != LUA_OK) return 0;
    } else if (script == argc && !(args & (HAS_E | HAS_V))) {
        if (isatty(0)) {
            if (run_repl(L) != LUA_OK) return 0;
        } else if (dochunk(L, luaL_loadfile(L, NULL)) != LUA_OK) {
            return 0;
        }
    }
    lua_pushboolean(L, 1);
    return 1;
}

int main(int argc, char **argv) {
    lua_State *L = luaL_newstate();
    if (!L) {
        l_message(argv[0], "cannot create state: not enough memory");
        return EXIT_FAILURE;
    }
    globalL = L;
    lua_gc(L, LUA_GCSTOP); /* no GC while building the state */
    lua_pushcfunction(L, pmain);
    lua_pushinteger(L, argc);
    lua_pushlightuserdata(L, argv);
    int status = lua_pcall(L, 2, 1, 0);
    int ok = lua_toboolean(L, -1);
    report(L, status);
    lua_close(L);
    return (ok && status == LUA_OK) ? module_status : EXIT_FAILURE;
}
