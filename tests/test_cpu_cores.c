/* test_cpu_cores.c — the default thread count: physical cores counted from a made-up sysfs tree and
 * cpuinfo file (hyper-thread siblings, two packages, an offline CPU, an affinity mask), the real
 * machine's answer within its allowed CPUs, and a model loaded without a thread count using it. */
#include "ember.h"
#include "cpu.h"
#include "tiny_model.h"
#include "test_support.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void put(const char *dir, const char *rel, const char *text) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    /* make the parent directories */
    for (char *p = path + strlen(dir) + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(path, 0777);
        *p = '/';
    }
    ember_write_file(path, text, strlen(text));
}

/* cpuN with (package, core); online: "" for no online file (cpu0), "0"/"1" otherwise. */
static void cpu(const char *dir, int n, int pkg, int core, const char *online) {
    char rel[128], v[32];
    snprintf(rel, sizeof rel, "cpu%d/topology/core_id", n);
    snprintf(v, sizeof v, "%d\n", core);
    put(dir, rel, v);
    snprintf(rel, sizeof rel, "cpu%d/topology/physical_package_id", n);
    snprintf(v, sizeof v, "%d\n", pkg);
    put(dir, rel, v);
    if (*online) {
        snprintf(rel, sizeof rel, "cpu%d/online", n);
        put(dir, rel, online);
    }
}

int main(void) {
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/cpu-cores-%d", ember_test_tmpdir(), (int)getpid());
    mkdir(dir, 0777);
    /* 2 packages x 2 cores x 2 hyper-threads = 8 CPUs, 4 physical cores; cpu7 offline */
    int n = 0;
    for (int pkg = 0; pkg < 2; pkg++)
        for (int core = 0; core < 2; core++)
            for (int ht = 0; ht < 2; ht++, n++) cpu(dir, n, pkg, core, n == 0 ? "" : "1\n");
    CHECK(ember_cpu_cores_from(dir, NULL, NULL) == 4);
    put(dir, "cpu7/online", "0\n"); /* cpu7 is the sibling of cpu6: still 4 */
    put(dir, "cpu6/online", "0\n"); /* package 1 core 1 gone entirely: 3 */
    CHECK_MSG(ember_cpu_cores_from(dir, NULL, NULL) == 3, "%d", ember_cpu_cores_from(dir, NULL, NULL));
    bool allowed[4096] = {false};
    allowed[0] = allowed[1] = allowed[2] = true; /* cpu0, cpu1: one core; cpu2: another */
    CHECK(ember_cpu_cores_from(dir, NULL, allowed) == 2);

    /* no sysfs: /proc/cpuinfo's blocks (4 processors, 2 cores) */
    char info[1200];
    snprintf(info, sizeof info, "%s/cpuinfo", dir);
    const char *text = "processor\t: 0\nphysical id\t: 0\ncore id\t\t: 0\n\n"
                       "processor\t: 1\nphysical id\t: 0\ncore id\t\t: 1\n\n"
                       "processor\t: 2\nphysical id\t: 0\ncore id\t\t: 0\n\n"
                       "processor\t: 3\nphysical id\t: 0\ncore id\t\t: 1\n";
    ember_write_file(info, text, strlen(text));
    char nosys[1200];
    snprintf(nosys, sizeof nosys, "%s/no-such-dir", dir);
    CHECK(ember_cpu_cores_from(nosys, info, NULL) == 2);
    bool only3[4096] = {false};
    only3[3] = true;
    CHECK(ember_cpu_cores_from(nosys, info, only3) == 1);
    CHECK(ember_cpu_cores_from(nosys, NULL, NULL) == 0);

    /* this machine: between 1 and the CPUs this process may use */
    int phys = ember_cpu_physical_cores(), logical = ember_cpu_logical_cores();
    CHECK_MSG(phys >= 1 && phys <= logical, "physical %d, logical %d", phys, logical);

    /* a model loaded without a thread count runs on that many */
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.n_layer = 1;
    char model[1200];
    snprintf(model, sizeof model, "%s/m.gguf", dir);
    ember_error err = {0};
    CHECK_MSG(ember_tiny_model_write(&p, model, &err) == EMBER_OK, "%.900s", err.msg);
    ember_model *m = NULL;
    ember_model_params mp = {.path = model};
    CHECK_MSG(ember_model_load(&mp, &m, &err) == EMBER_OK, "%.900s", err.msg);
    if (m) CHECK_MSG(ember_model_get_info(m)->n_threads == phys, "%d threads", ember_model_get_info(m)->n_threads);
    ember_model_free(m);
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return ember_test_finish();
}
