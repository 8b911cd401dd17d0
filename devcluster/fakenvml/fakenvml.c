/*
 * A fake libnvidia-ml.so.1 for TauGrid tests and the dev cluster.
 *
 * It exports the subset of the NVML C API that the agent calls through the
 * real, unmodified pynvml, with the exact (versioned) symbol names and struct
 * layouts that pynvml (nvidia-ml-py 13.x) uses.  All state lives in this
 * process: per-GPU readings, return-code overrides, fault flags and per-event-
 * set queues.  State is changed through one line-oriented command language,
 * used by the scenario file (env FAKE_NVML_SCENARIO), by the in-process export
 * fake_nvml_control() and by the optional Unix socket (env FAKE_NVML_SOCKET).
 * README.md beside this file documents the language.
 *
 * Build: gcc -shared -fPIC -fvisibility=hidden -Wl,-soname,libnvidia-ml.so.1 -pthread
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------ NVML ABI */

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_UNKNOWN = 999,
};

enum {
    NVML_VALUE_TYPE_UNSIGNED_INT = 1,
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3,
};

#define EVT_SINGLE_BIT_ECC 0x1ULL
#define EVT_DOUBLE_BIT_ECC 0x2ULL
#define EVT_XID 0x8ULL
#define EVT_RECOVERY_ACTION 0x8000ULL

#define REASON_HW_SLOWDOWN 0x8ULL
#define REASON_HW_THERMAL 0x40ULL

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned long long referenceTime;
    unsigned long long violationTime;
} nvmlViolationTime_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    uint32_t fieldId;
    uint32_t scopeId;
    int64_t timestamp;
    int64_t latencyUsec;
    unsigned int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct {
    unsigned int version;
    unsigned int sensorType;
    int temperature;
} nvmlTemperature_v1_t;

struct gpu_s;
typedef struct gpu_s *nvmlDevice_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

/* ------------------------------------------------------------------ state */

#define MAX_GPUS 64
#define MAX_LINKS 36
#define NVLINK_COUNTERS 5
#define MAX_RC 256
#define MAX_SETS 64
#define QUEUE_CAP 1024
#define LINE_MAX_LEN 1024

typedef struct {
    char uuid[96];
    char name[96];
    char bus_id[32];
    char serial[32];
    unsigned int minor;
    unsigned int pci_device_id;
    unsigned int pci_subsystem_id;
    unsigned int temperature;
    unsigned int memory_temperature;
    unsigned int temp_shutdown;
    unsigned int temp_slowdown;
    unsigned int temp_gpu_max;
    unsigned int temp_mem_max;
    unsigned int power_mw;
    unsigned int power_limit_mw;
    unsigned long long energy_mj;
    unsigned int util_gpu;
    unsigned int util_memory;
    unsigned int util_encoder;
    unsigned int util_decoder;
    unsigned long long memory_total;
    unsigned long long memory_used;
    unsigned long long memory_reserved;
    unsigned int ecc_mode;
    unsigned long long ecc_corrected_volatile;
    unsigned long long ecc_corrected_aggregate;
    unsigned long long ecc_uncorrected_volatile;
    unsigned long long ecc_uncorrected_aggregate;
    unsigned int retired_sbe;
    unsigned int retired_dbe;
    unsigned int retired_pending;
    unsigned int remapped_correctable;
    unsigned int remapped_uncorrectable;
    unsigned int remap_pending;
    unsigned int remap_failure;
    unsigned long long clock_event_reasons;
    unsigned int sm_clock;
    unsigned int mem_clock;
    unsigned int video_clock;
    unsigned long long violation_power_ns;
    unsigned long long violation_thermal_ns;
    unsigned int pcie_replay;
    unsigned int pcie_gen;
    unsigned int pcie_width;
    unsigned int pcie_max_gen;
    unsigned int pcie_max_width;
    unsigned int nvlink_count;
    unsigned int nvlink_state[MAX_LINKS];
    unsigned long long nvlink_errors[MAX_LINKS][NVLINK_COUNTERS];
    unsigned int recovery_action;
    unsigned long long supported_events;
    unsigned int lost;
    unsigned int reset_required;
    unsigned int reset_count;
} gpu_values_t;

struct gpu_s {
    unsigned int index;
    gpu_values_t v;
};

typedef struct {
    char function[64];
    int gpu; /* -1: every GPU (and the system-level calls) */
    nvmlReturn_t rc;
    unsigned long long after;
    unsigned long long calls;
} rc_override_t;

struct event_set_s {
    int in_use;
    unsigned long long mask[MAX_GPUS];
    nvmlEventData_t queue[QUEUE_CAP];
    unsigned int head;
    unsigned int count;
    pthread_cond_t cond;
};
typedef struct event_set_s *nvmlEventSet_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_loaded;
static int g_load_failed;
static char g_load_error[512];
static unsigned int g_refcount;
static unsigned int g_count = 8;
static char g_seed[128];
static char g_driver_version[80] = "570.148.08";
static char g_nvml_version[80] = "12.570.148.08";
static int g_cuda_version = 12080;
/* The driver branch the library pretends to be (`driver_branch N`): older branches lack the
 * newer event types, the recovery-action field and some functions, as real drivers do. */
static unsigned int g_branch = 570;
static struct gpu_s g_gpus[MAX_GPUS];
static gpu_values_t g_defaults[MAX_GPUS];
static rc_override_t g_rc[MAX_RC];
static unsigned int g_rc_len;
static rc_override_t g_rc_defaults[MAX_RC];
static unsigned int g_rc_defaults_len;
static struct event_set_s g_sets[MAX_SETS];
static unsigned int g_waiters;
static char g_scenario_path[4096];
static int g_socket_started;

/* ------------------------------------------------------------------ helpers */

static uint64_t fnv1a(const char *s, uint64_t h) {
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

static const unsigned int k_h100_buses[8] = {0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB};

/* The event types a branch supports: SBE, DBE, PState, Xid and Clock on every branch; the
 * ECC-storm, DRAM retirement and poison types from R560; GpuUnavailableError (0x4000) and
 * GpuRecoveryAction (0x8000) from R565 (NVML change log, "Changes between v560 and v565"). */
static unsigned long long branch_events(unsigned int branch) {
    unsigned long long mask = 0x1FULL;
    if (branch >= 560) mask |= 0x3E00ULL;
    if (branch >= 565) mask |= 0xC000ULL;
    return mask;
}

static const struct {
    unsigned int branch;
    const char *version;
    int cuda;
} k_branches[] = {
    {470, "470.256.02", 11040}, {510, "510.108.03", 11060}, {525, "525.147.05", 12000},
    {535, "535.183.06", 12020}, {550, "550.54.15", 12040},  {555, "555.42.06", 12050},
    {560, "560.35.03", 12060},  {565, "565.57.01", 12070},  {570, "570.148.08", 12080},
    {575, "575.51.03", 12090},  {580, "580.65.06", 13000},
};

static void default_values(gpu_values_t *v, unsigned int i) {
    memset(v, 0, sizeof(*v));
    char idx[16];
    snprintf(idx, sizeof(idx), "%u", i);
    uint64_t h = fnv1a(idx, fnv1a(g_seed, 14695981039346656037ULL));
    uint64_t h2 = fnv1a("taugrid", h);
    snprintf(v->uuid, sizeof(v->uuid), "GPU-%08x-%04x-4%03x-8%03x-%012llx", (unsigned)(h >> 32),
             (unsigned)(h >> 16) & 0xFFFFu, (unsigned)h & 0xFFFu, (unsigned)(h2 >> 52) & 0xFFFu,
             (unsigned long long)(h2 & 0xFFFFFFFFFFFFULL));
    snprintf(v->name, sizeof(v->name), "NVIDIA H100 80GB HBM3");
    /* An HGX H100 board's buses; GPUs past the eighth go to the next PCI domain. */
    snprintf(v->bus_id, sizeof(v->bus_id), "%08X:%02X:00.0", i / 8, k_h100_buses[i % 8]);
    snprintf(v->serial, sizeof(v->serial), "1654923%06u", (unsigned)((h2 % 900000ULL) + i));
    v->minor = i;
    v->pci_device_id = 0x233010DEu;
    v->pci_subsystem_id = 0x16C110DEu;
    v->temperature = 35;
    v->memory_temperature = 40;
    v->temp_shutdown = 92;
    v->temp_slowdown = 89;
    v->temp_gpu_max = 87;
    v->temp_mem_max = 95;
    v->power_mw = 72000;
    v->power_limit_mw = 700000;
    v->energy_mj = 123456789ULL;
    v->memory_total = 85520809984ULL;
    v->memory_used = 0;
    v->memory_reserved = 569769984ULL;
    v->ecc_mode = 1;
    v->sm_clock = 1980;
    v->mem_clock = 2619;
    v->video_clock = 1755;
    v->pcie_gen = 5;
    v->pcie_width = 16;
    v->pcie_max_gen = 5;
    v->pcie_max_width = 16;
    v->nvlink_count = 18;
    for (unsigned int l = 0; l < MAX_LINKS; l++) v->nvlink_state[l] = l < 18 ? 1 : 0;
    v->supported_events = branch_events(g_branch);
}

static int64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void copy_str(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src);
}

static nvmlReturn_t copy_out(char *dst, unsigned int length, const char *src) {
    if (dst == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ events */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_conds(void) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    for (unsigned int i = 0; i < MAX_SETS; i++) pthread_cond_init(&g_sets[i].cond, &attr);
    pthread_condattr_destroy(&attr);
}

/* Queue one event on every set that registered its type for this GPU. */
static void push_event_locked(unsigned int gpu, unsigned long long type, unsigned long long data) {
    for (unsigned int s = 0; s < MAX_SETS; s++) {
        struct event_set_s *set = &g_sets[s];
        if (!set->in_use || (set->mask[gpu] & type) == 0) continue;
        if (set->count == QUEUE_CAP) { /* full: drop the oldest, keep the newest */
            set->head = (set->head + 1) % QUEUE_CAP;
            set->count--;
        }
        nvmlEventData_t *e = &set->queue[(set->head + set->count) % QUEUE_CAP];
        memset(e, 0, sizeof(*e));
        e->device = &g_gpus[gpu];
        e->eventType = type;
        e->eventData = data;
        e->gpuInstanceId = 0xFFFFFFFFu;
        e->computeInstanceId = 0xFFFFFFFFu;
        set->count++;
        pthread_cond_broadcast(&set->cond);
    }
}

/* Wake every waiter, so one whose set holds a GPU that was just lost returns GPU_IS_LOST. */
static void wake_sets_locked(void) {
    for (unsigned int s = 0; s < MAX_SETS; s++)
        if (g_sets[s].in_use) pthread_cond_broadcast(&g_sets[s].cond);
}

/* Whether a GPU registered on this set has fallen off the bus. */
static int set_has_lost_locked(const struct event_set_s *set) {
    for (unsigned int i = 0; i < g_count; i++)
        if (set->mask[i] != 0 && g_gpus[i].v.lost) return 1;
    return 0;
}

static void clear_queues_locked(void) {
    for (unsigned int s = 0; s < MAX_SETS; s++) {
        g_sets[s].head = 0;
        g_sets[s].count = 0;
    }
}

/* ------------------------------------------------------------------ keys */

typedef enum { K_U32, K_U64, K_STR } ktype_t;

typedef struct {
    const char *name;
    ktype_t type;
    size_t offset;
    size_t size;
} fkey_t;

#define KEY(n, t, f) {n, t, offsetof(gpu_values_t, f), sizeof(((gpu_values_t *)0)->f)}

static const fkey_t k_keys[] = {
    KEY("uuid", K_STR, uuid),
    KEY("name", K_STR, name),
    KEY("pci_bus_id", K_STR, bus_id),
    KEY("serial", K_STR, serial),
    KEY("minor", K_U32, minor),
    KEY("pci_device_id", K_U32, pci_device_id),
    KEY("pci_subsystem_id", K_U32, pci_subsystem_id),
    KEY("temperature", K_U32, temperature),
    KEY("memory_temperature", K_U32, memory_temperature),
    KEY("temperature_shutdown", K_U32, temp_shutdown),
    KEY("temperature_slowdown", K_U32, temp_slowdown),
    KEY("temperature_gpu_max", K_U32, temp_gpu_max),
    KEY("temperature_mem_max", K_U32, temp_mem_max),
    KEY("power_mw", K_U32, power_mw),
    KEY("power_limit_mw", K_U32, power_limit_mw),
    KEY("energy_mj", K_U64, energy_mj),
    KEY("util_gpu", K_U32, util_gpu),
    KEY("util_memory", K_U32, util_memory),
    KEY("util_encoder", K_U32, util_encoder),
    KEY("util_decoder", K_U32, util_decoder),
    KEY("memory_total", K_U64, memory_total),
    KEY("memory_used", K_U64, memory_used),
    KEY("memory_reserved", K_U64, memory_reserved),
    KEY("ecc_mode", K_U32, ecc_mode),
    KEY("ecc_corrected_volatile", K_U64, ecc_corrected_volatile),
    KEY("ecc_corrected_aggregate", K_U64, ecc_corrected_aggregate),
    KEY("ecc_uncorrected_volatile", K_U64, ecc_uncorrected_volatile),
    KEY("ecc_uncorrected_aggregate", K_U64, ecc_uncorrected_aggregate),
    KEY("retired_sbe", K_U32, retired_sbe),
    KEY("retired_dbe", K_U32, retired_dbe),
    KEY("retired_pending", K_U32, retired_pending),
    KEY("remapped_correctable", K_U32, remapped_correctable),
    KEY("remapped_uncorrectable", K_U32, remapped_uncorrectable),
    KEY("remap_pending", K_U32, remap_pending),
    KEY("remap_failure", K_U32, remap_failure),
    KEY("clock_event_reasons", K_U64, clock_event_reasons),
    KEY("sm_clock", K_U32, sm_clock),
    KEY("mem_clock", K_U32, mem_clock),
    KEY("video_clock", K_U32, video_clock),
    KEY("violation_power_ns", K_U64, violation_power_ns),
    KEY("violation_thermal_ns", K_U64, violation_thermal_ns),
    KEY("pcie_replay", K_U32, pcie_replay),
    KEY("pcie_gen", K_U32, pcie_gen),
    KEY("pcie_width", K_U32, pcie_width),
    KEY("pcie_max_gen", K_U32, pcie_max_gen),
    KEY("pcie_max_width", K_U32, pcie_max_width),
    KEY("nvlink_count", K_U32, nvlink_count),
    KEY("recovery_action", K_U32, recovery_action),
    KEY("supported_events", K_U64, supported_events),
    KEY("lost", K_U32, lost),
    KEY("reset_required", K_U32, reset_required),
    KEY("reset_count", K_U32, reset_count),
};

static const char *const k_link_counters[NVLINK_COUNTERS] = {
    "nvlink_replay", "nvlink_recovery", "nvlink_crc_flit", "nvlink_crc_data", "nvlink_ecc_data",
};

static int parse_u64(const char *s, unsigned long long *out) {
    if (s == NULL || *s == '\0' || *s == '-') return -1;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0') return -1;
    *out = v;
    return 0;
}

/* Resolve "KEY" or "nvlink_state.L" / "nvlink_<counter>.L" to a pointer and type. */
static int resolve_key(gpu_values_t *v, const char *key, void **ptr, ktype_t *type, size_t *size,
                       char *err, size_t errlen) {
    for (size_t i = 0; i < sizeof(k_keys) / sizeof(k_keys[0]); i++) {
        if (strcmp(k_keys[i].name, key) == 0) {
            *ptr = (char *)v + k_keys[i].offset;
            *type = k_keys[i].type;
            *size = k_keys[i].size;
            return 0;
        }
    }
    const char *dot = strchr(key, '.');
    if (dot != NULL) {
        size_t plen = (size_t)(dot - key);
        unsigned long long link;
        if (parse_u64(dot + 1, &link) != 0 || link >= MAX_LINKS) {
            snprintf(err, errlen, "bad link number in key '%s' (0..%d)", key, MAX_LINKS - 1);
            return -1;
        }
        if (plen == strlen("nvlink_state") && strncmp(key, "nvlink_state", plen) == 0) {
            *ptr = &v->nvlink_state[link];
            *type = K_U32;
            *size = sizeof(unsigned int);
            return 0;
        }
        for (unsigned int c = 0; c < NVLINK_COUNTERS; c++) {
            if (plen == strlen(k_link_counters[c]) && strncmp(key, k_link_counters[c], plen) == 0) {
                *ptr = &v->nvlink_errors[link][c];
                *type = K_U64;
                *size = sizeof(unsigned long long);
                return 0;
            }
        }
    }
    snprintf(err, errlen, "unknown key '%s'", key);
    return -1;
}

/* ------------------------------------------------------------------ return-code overrides */

static rc_override_t *rc_find_exact(const char *function, int gpu) {
    for (unsigned int i = 0; i < g_rc_len; i++) {
        if (g_rc[i].gpu == gpu && strcmp(g_rc[i].function, function) == 0) return &g_rc[i];
    }
    return NULL;
}

static void rc_remove_at(unsigned int i) {
    memmove(&g_rc[i], &g_rc[i + 1], (g_rc_len - i - 1) * sizeof(g_rc[0]));
    g_rc_len--;
}

/* Count this call against matching overrides; return the forced code or SUCCESS. */
static nvmlReturn_t rc_check(const char *function, int gpu) {
    nvmlReturn_t forced = NVML_SUCCESS;
    for (unsigned int i = 0; i < g_rc_len; i++) {
        rc_override_t *o = &g_rc[i];
        if (strcmp(o->function, function) != 0) continue;
        if (o->gpu != -1 && o->gpu != gpu) continue;
        o->calls++;
        if (o->calls > o->after && forced == NVML_SUCCESS) forced = o->rc;
    }
    return forced;
}

/* ------------------------------------------------------------------ commands */

typedef struct {
    char buf[LINE_MAX_LEN];
    char *tok[8];
    const char *rest[8]; /* rest of the original line from token i */
    int n;
} tokens_t;

static void tokenize(const char *line, tokens_t *t) {
    copy_str(t->buf, sizeof(t->buf), line);
    t->n = 0;
    char *p = t->buf;
    while (*p && t->n < 8) {
        while (*p && isspace((unsigned char)*p)) p++;
        if (!*p) break;
        t->rest[t->n] = line + (p - t->buf);
        t->tok[t->n++] = p;
        while (*p && !isspace((unsigned char)*p)) p++;
        if (*p) *p++ = '\0';
    }
}

/* Parse a GPU argument: an index below the GPU count, or '*' for all (-1). */
static int parse_gpu(const char *s, int allow_all, int *gpu, char *err, size_t errlen) {
    unsigned long long v;
    if (allow_all && strcmp(s, "*") == 0) {
        *gpu = -1;
        return 0;
    }
    if (parse_u64(s, &v) != 0) {
        snprintf(err, errlen, "bad gpu '%s': expected an index%s", s, allow_all ? " or '*'" : "");
        return -1;
    }
    if (v >= g_count) {
        snprintf(err, errlen, "gpu %s out of range: %u GPUs", s, g_count);
        return -1;
    }
    *gpu = (int)v;
    return 0;
}

static int need_args(const tokens_t *t, int n, const char *usage, char *err, size_t errlen) {
    if (t->n != n) {
        snprintf(err, errlen, "usage: %s", usage);
        return -1;
    }
    return 0;
}

static void reset_gpu_locked(gpu_values_t *v) {
    v->lost = 0;
    v->reset_required = 0;
    v->ecc_corrected_volatile = 0;
    v->ecc_uncorrected_volatile = 0;
    v->remap_pending = 0;
    v->retired_pending = 0;
    v->recovery_action = 0;
    for (unsigned int l = 0; l < MAX_LINKS; l++) v->nvlink_state[l] = l < v->nvlink_count ? 1 : 0;
    v->reset_count++;
}

static void clear_gpu_locked(int gpu) {
    g_gpus[gpu].v = g_defaults[gpu];
    for (unsigned int i = g_rc_len; i > 0; i--) {
        if (g_rc[i - 1].gpu == gpu) rc_remove_at(i - 1);
    }
    for (unsigned int i = 0; i < g_rc_defaults_len && g_rc_len < MAX_RC; i++) {
        if (g_rc_defaults[i].gpu == gpu) {
            g_rc[g_rc_len] = g_rc_defaults[i];
            g_rc[g_rc_len++].calls = 0;
        }
    }
}

static int load_locked(const char *path);

/* Per-GPU commands applied to one GPU (the caller loops for '*'). */
static int exec_gpu_cmd(const tokens_t *t, int gpu, char *reply, size_t rlen) {
    const char *cmd = t->tok[0];
    gpu_values_t *v = &g_gpus[gpu].v;
    unsigned long long n = 0;

    if (strcmp(cmd, "set") == 0) {
        void *ptr;
        ktype_t type;
        size_t size;
        if (t->n < 4) {
            snprintf(reply, rlen, "usage: set GPU KEY VALUE");
            return -1;
        }
        if (resolve_key(v, t->tok[2], &ptr, &type, &size, reply, rlen) != 0) return -1;
        if (type == K_STR) {
            char value[LINE_MAX_LEN];
            copy_str(value, sizeof(value), t->rest[3]);
            size_t len = strlen(value);
            while (len > 0 && isspace((unsigned char)value[len - 1])) value[--len] = '\0';
            if (len + 1 > size) {
                snprintf(reply, rlen, "value for '%s' too long (at most %zu characters)", t->tok[2],
                         size - 1);
                return -1;
            }
            copy_str((char *)ptr, size, value);
            return 0;
        }
        if (t->n != 4 || parse_u64(t->tok[3], &n) != 0) {
            snprintf(reply, rlen, "bad value '%s' for '%s': expected a non-negative integer",
                     t->rest[3], t->tok[2]);
            return -1;
        }
        if (strcmp(t->tok[2], "nvlink_count") == 0) {
            if (n > MAX_LINKS) {
                snprintf(reply, rlen, "bad nvlink_count %llu: at most %d", n, MAX_LINKS);
                return -1;
            }
            /* A new link count brings exactly the links 0..count-1 up. */
            for (unsigned int l = 0; l < MAX_LINKS; l++) v->nvlink_state[l] = l < n ? 1 : 0;
        }
        if (type == K_U32) {
            if (n > 0xFFFFFFFFULL) {
                snprintf(reply, rlen, "value %llu for '%s' does not fit 32 bits", n, t->tok[2]);
                return -1;
            }
            *(unsigned int *)ptr = (unsigned int)n;
        } else {
            *(unsigned long long *)ptr = n;
        }
        return 0;
    }
    if (strcmp(cmd, "get") == 0) {
        void *ptr;
        ktype_t type;
        size_t size;
        if (need_args(t, 3, "get GPU KEY", reply, rlen) != 0) return -1;
        if (resolve_key(v, t->tok[2], &ptr, &type, &size, reply, rlen) != 0) return -1;
        if (type == K_STR) snprintf(reply, rlen, "%s", (char *)ptr);
        else if (type == K_U32) snprintf(reply, rlen, "%u", *(unsigned int *)ptr);
        else snprintf(reply, rlen, "%llu", *(unsigned long long *)ptr);
        return 1; /* reply carries a value */
    }
    if (strcmp(cmd, "xid") == 0) {
        if (need_args(t, 3, "xid GPU CODE", reply, rlen) != 0) return -1;
        if (parse_u64(t->tok[2], &n) != 0) {
            snprintf(reply, rlen, "bad xid code '%s'", t->tok[2]);
            return -1;
        }
        push_event_locked((unsigned)gpu, EVT_XID, n);
        return 0;
    }
    if (strcmp(cmd, "event") == 0) {
        unsigned long long type, data;
        if (need_args(t, 4, "event GPU TYPE DATA", reply, rlen) != 0) return -1;
        if (parse_u64(t->tok[2], &type) != 0 || type == 0 || parse_u64(t->tok[3], &data) != 0) {
            snprintf(reply, rlen, "bad event type or data: '%s' '%s'", t->tok[2], t->tok[3]);
            return -1;
        }
        push_event_locked((unsigned)gpu, type, data);
        return 0;
    }
    if (strcmp(cmd, "lost") == 0) {
        if (need_args(t, 2, "lost GPU", reply, rlen) != 0) return -1;
        v->lost = 1;
        push_event_locked((unsigned)gpu, EVT_XID, 79);
        wake_sets_locked();
        return 0;
    }
    if (strcmp(cmd, "reset_required") == 0) {
        if (need_args(t, 2, "reset_required GPU", reply, rlen) != 0) return -1;
        v->reset_required = 1;
        if (v->recovery_action == 0) push_event_locked((unsigned)gpu, EVT_RECOVERY_ACTION, 1);
        return 0;
    }
    if (strcmp(cmd, "reset") == 0) {
        if (need_args(t, 2, "reset GPU", reply, rlen) != 0) return -1;
        reset_gpu_locked(v);
        return 0;
    }
    if (strcmp(cmd, "clear") == 0) {
        if (need_args(t, 2, "clear GPU", reply, rlen) != 0) return -1;
        clear_gpu_locked(gpu);
        return 0;
    }
    if (strcmp(cmd, "ecc_uncorrected") == 0 || strcmp(cmd, "ecc_corrected") == 0) {
        int unc = cmd[4] == 'u';
        if (need_args(t, 3, unc ? "ecc_uncorrected GPU COUNT" : "ecc_corrected GPU COUNT", reply,
                      rlen) != 0)
            return -1;
        if (parse_u64(t->tok[2], &n) != 0 || n == 0) {
            snprintf(reply, rlen, "bad error count '%s': expected a positive integer", t->tok[2]);
            return -1;
        }
        if (unc) {
            v->ecc_uncorrected_volatile += n;
            v->ecc_uncorrected_aggregate += n;
            push_event_locked((unsigned)gpu, EVT_DOUBLE_BIT_ECC, 0);
        } else {
            v->ecc_corrected_volatile += n;
            v->ecc_corrected_aggregate += n;
            push_event_locked((unsigned)gpu, EVT_SINGLE_BIT_ECC, 0);
        }
        return 0;
    }
    if (strcmp(cmd, "thermal") == 0) {
        if (need_args(t, 3, "thermal GPU on|off", reply, rlen) != 0) return -1;
        if (strcmp(t->tok[2], "on") == 0) {
            v->clock_event_reasons |= REASON_HW_THERMAL | REASON_HW_SLOWDOWN;
            v->temperature = v->temp_slowdown + 1; /* past slowdown, short of shutdown */
        } else if (strcmp(t->tok[2], "off") == 0) {
            v->clock_event_reasons &= ~(REASON_HW_THERMAL | REASON_HW_SLOWDOWN);
            v->temperature = g_defaults[gpu].temperature;
        } else {
            snprintf(reply, rlen, "bad thermal state '%s': expected on or off", t->tok[2]);
            return -1;
        }
        return 0;
    }
    if (strcmp(cmd, "nvlink_down") == 0 || strcmp(cmd, "nvlink_up") == 0) {
        int up = strcmp(cmd, "nvlink_up") == 0;
        if (need_args(t, 3, up ? "nvlink_up GPU LINK" : "nvlink_down GPU LINK", reply, rlen) != 0)
            return -1;
        if (parse_u64(t->tok[2], &n) != 0 || n >= v->nvlink_count) {
            snprintf(reply, rlen, "bad link '%s': gpu %d has links 0..%d", t->tok[2], gpu,
                     (int)v->nvlink_count - 1);
            return -1;
        }
        v->nvlink_state[n] = up ? 1 : 0;
        return 0;
    }
    if (strcmp(cmd, "remap") == 0) {
        if (need_args(t, 3, "remap GPU pending|failure|clear", reply, rlen) != 0) return -1;
        if (strcmp(t->tok[2], "pending") == 0) {
            v->remap_pending = 1;
            v->remapped_uncorrectable++;
        } else if (strcmp(t->tok[2], "failure") == 0) {
            v->remap_failure = 1;
        } else if (strcmp(t->tok[2], "clear") == 0) {
            v->remap_pending = 0;
            v->remap_failure = 0;
        } else {
            snprintf(reply, rlen, "bad remap state '%s': expected pending, failure or clear",
                     t->tok[2]);
            return -1;
        }
        return 0;
    }
    if (strcmp(cmd, "recovery_action") == 0) {
        if (need_args(t, 3, "recovery_action GPU VALUE", reply, rlen) != 0) return -1;
        if (parse_u64(t->tok[2], &n) != 0 || n > 7) {
            snprintf(reply, rlen, "bad recovery action '%s': expected 0..7", t->tok[2]);
            return -1;
        }
        v->recovery_action = (unsigned int)n;
        push_event_locked((unsigned)gpu, EVT_RECOVERY_ACTION, n);
        return 0;
    }
    snprintf(reply, rlen, "unknown command '%s'", cmd);
    return -1;
}

static int is_gpu_cmd(const char *cmd) {
    static const char *const names[] = {
        "set", "get", "xid", "event", "lost", "reset_required", "reset", "clear",
        "ecc_uncorrected", "ecc_corrected", "thermal", "nvlink_down", "nvlink_up", "remap",
        "recovery_action",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(cmd, names[i]) == 0) return 1;
    }
    return 0;
}

/*
 * Execute one command line with g_lock held.  Returns 0 (ok, reply empty),
 * 1 (ok, reply holds a value) or -1 (error, reply holds the message).
 * `scenario` allows the load-time-only commands gpus/seed (pass 1 handles them).
 */
static int exec_locked(const char *line, int scenario, char *reply, size_t rlen) {
    tokens_t t;
    unsigned long long n = 0;
    reply[0] = '\0';
    if (strlen(line) >= LINE_MAX_LEN) {
        snprintf(reply, rlen, "line longer than %d characters", LINE_MAX_LEN - 1);
        return -1;
    }
    tokenize(line, &t);
    if (t.n == 0 || t.tok[0][0] == '#') return 0;
    const char *cmd = t.tok[0];

    if (strcmp(cmd, "gpus") == 0 || strcmp(cmd, "seed") == 0) {
        if (!scenario) {
            snprintf(reply, rlen, "'%s' is only allowed in a scenario file", cmd);
            return -1;
        }
        return 0; /* applied in pass 1 of load_locked */
    }
    if (strcmp(cmd, "ping") == 0) return need_args(&t, 1, "ping", reply, rlen);
    if (strcmp(cmd, "driver_version") == 0 || strcmp(cmd, "nvml_version") == 0) {
        if (need_args(&t, 2, cmd[0] == 'd' ? "driver_version VERSION" : "nvml_version VERSION",
                      reply, rlen) != 0)
            return -1;
        copy_str(cmd[0] == 'd' ? g_driver_version : g_nvml_version, sizeof(g_driver_version),
                 t.tok[1]);
        return 0;
    }
    if (strcmp(cmd, "driver_branch") == 0) {
        if (need_args(&t, 2, "driver_branch BRANCH", reply, rlen) != 0) return -1;
        if (parse_u64(t.tok[1], &n) != 0 || n < 100 || n > 999) {
            snprintf(reply, rlen, "bad driver branch '%s': expected a number like 550", t.tok[1]);
            return -1;
        }
        g_branch = (unsigned int)n;
        snprintf(g_driver_version, sizeof(g_driver_version), "%u.00.00", g_branch);
        g_cuda_version = 12000;
        for (size_t i = 0; i < sizeof(k_branches) / sizeof(k_branches[0]); i++) {
            if (k_branches[i].branch == g_branch) {
                copy_str(g_driver_version, sizeof(g_driver_version), k_branches[i].version);
                g_cuda_version = k_branches[i].cuda;
            }
        }
        snprintf(g_nvml_version, sizeof(g_nvml_version), "%d.%s", g_cuda_version / 1000,
                 g_driver_version);
        for (unsigned int i = 0; i < MAX_GPUS; i++) g_gpus[i].v.supported_events = branch_events(g_branch);
        return 0;
    }
    if (strcmp(cmd, "cuda_version") == 0) {
        if (need_args(&t, 2, "cuda_version NUMBER", reply, rlen) != 0) return -1;
        if (parse_u64(t.tok[1], &n) != 0 || n > 0x7FFFFFFF) {
            snprintf(reply, rlen, "bad cuda version '%s': expected an integer like 12040", t.tok[1]);
            return -1;
        }
        g_cuda_version = (int)n;
        return 0;
    }
    if (strcmp(cmd, "rc") == 0) {
        int gpu;
        unsigned long long rc, after = 0;
        if (t.n != 4 && !(t.n == 6 && strcmp(t.tok[4], "after") == 0)) {
            snprintf(reply, rlen, "usage: rc FUNCTION GPU|* CODE [after N]");
            return -1;
        }
        if (strlen(t.tok[1]) >= sizeof(g_rc[0].function)) {
            snprintf(reply, rlen, "function name '%s' too long", t.tok[1]);
            return -1;
        }
        if (parse_gpu(t.tok[2], 1, &gpu, reply, rlen) != 0) return -1;
        if (parse_u64(t.tok[3], &rc) != 0 || rc > 0x7FFFFFFF) {
            snprintf(reply, rlen, "bad return code '%s': expected an NVML error number", t.tok[3]);
            return -1;
        }
        if (t.n == 6 && parse_u64(t.tok[5], &after) != 0) {
            snprintf(reply, rlen, "bad call count '%s' after 'after'", t.tok[5]);
            return -1;
        }
        rc_override_t *o = rc_find_exact(t.tok[1], gpu);
        if (rc == 0) {
            if (o != NULL) rc_remove_at((unsigned)(o - g_rc));
            return 0;
        }
        if (o == NULL) {
            if (g_rc_len == MAX_RC) {
                snprintf(reply, rlen, "too many return-code overrides (at most %d)", MAX_RC);
                return -1;
            }
            o = &g_rc[g_rc_len++];
            copy_str(o->function, sizeof(o->function), t.tok[1]);
            o->gpu = gpu;
        }
        o->rc = (nvmlReturn_t)rc;
        o->after = after;
        o->calls = 0;
        return 0;
    }
    if (strcmp(cmd, "rc_clear") == 0) {
        if (need_args(&t, 1, "rc_clear", reply, rlen) != 0) return -1;
        g_rc_len = 0;
        return 0;
    }
    if (strcmp(cmd, "reset_all") == 0) {
        if (scenario) {
            snprintf(reply, rlen, "'reset_all' is not allowed in a scenario file");
            return -1;
        }
        if (need_args(&t, 1, "reset_all", reply, rlen) != 0) return -1;
        if (load_locked(g_scenario_path[0] ? g_scenario_path : NULL) != 0) {
            snprintf(reply, rlen, "%s", g_load_error);
            return -1;
        }
        return 0;
    }
    if (is_gpu_cmd(cmd)) {
        int gpu;
        if (t.n < 2) {
            snprintf(reply, rlen, "usage: %s GPU ...", cmd);
            return -1;
        }
        if (parse_gpu(t.tok[1], strcmp(cmd, "get") != 0, &gpu, reply, rlen) != 0) return -1;
        if (gpu >= 0) return exec_gpu_cmd(&t, gpu, reply, rlen);
        for (unsigned int i = 0; i < g_count; i++) {
            int r = exec_gpu_cmd(&t, (int)i, reply, rlen);
            if (r < 0) return r;
        }
        return 0;
    }
    snprintf(reply, rlen, "unknown command '%s'", cmd);
    return -1;
}

/* ------------------------------------------------------------------ scenario loading */

static int load_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_load_error, sizeof(g_load_error), fmt, ap);
    va_end(ap);
    return -1;
}

/* Reset every piece of state, then apply the scenario file (NULL: built-in defaults). */
static int load_locked(const char *path) {
    char *text = NULL;
    const char *seed = getenv("FAKE_NVML_SEED");
    g_count = 8;
    copy_str(g_seed, sizeof(g_seed), seed != NULL ? seed : "");
    copy_str(g_driver_version, sizeof(g_driver_version), "570.148.08");
    copy_str(g_nvml_version, sizeof(g_nvml_version), "12.570.148.08");
    g_cuda_version = 12080;
    g_branch = 570;
    g_rc_len = 0;
    g_load_error[0] = '\0';
    clear_queues_locked();

    if (path != NULL) {
        FILE *f = fopen(path, "r");
        if (f == NULL) return load_fail("scenario %s: cannot open: %s", path, strerror(errno));
        size_t cap = 4096, len = 0;
        text = malloc(cap);
        if (text == NULL) {
            fclose(f);
            return load_fail("scenario %s: out of memory", path);
        }
        size_t got;
        while ((got = fread(text + len, 1, cap - len - 1, f)) > 0) {
            len += got;
            if (cap - len - 1 == 0) {
                char *bigger = realloc(text, cap * 2);
                if (bigger == NULL) {
                    free(text);
                    fclose(f);
                    return load_fail("scenario %s: out of memory", path);
                }
                text = bigger;
                cap *= 2;
            }
        }
        text[len] = '\0';
        fclose(f);
    }
    /* Pass 1: gpus and seed shape the defaults every other line builds on. */
    for (int pass = 1; pass <= 2; pass++) {
        if (pass == 2) {
            for (unsigned int i = 0; i < MAX_GPUS; i++) {
                g_gpus[i].index = i;
                default_values(&g_gpus[i].v, i);
            }
        }
        if (text == NULL) continue;
        char *p = text;
        for (int lineno = 1; *p; lineno++) {
            char *nl = strchr(p, '\n');
            size_t linelen = nl ? (size_t)(nl - p) : strlen(p);
            char line[LINE_MAX_LEN];
            char reply[512];
            if (linelen >= sizeof(line)) {
                free(text);
                return load_fail("scenario %s line %d: longer than %d characters", path, lineno,
                                 LINE_MAX_LEN - 1);
            }
            memcpy(line, p, linelen);
            line[linelen] = '\0';
            if (linelen > 0 && line[linelen - 1] == '\r') line[linelen - 1] = '\0';
            p = nl ? nl + 1 : p + linelen;
            tokens_t t;
            tokenize(line, &t);
            if (t.n == 0 || t.tok[0][0] == '#') continue;
            int shape = strcmp(t.tok[0], "gpus") == 0 || strcmp(t.tok[0], "seed") == 0;
            if (pass == 1 && shape) {
                unsigned long long n;
                if (t.n != 2) {
                    free(text);
                    return load_fail("scenario %s line %d: usage: %s %s", path, lineno, t.tok[0],
                                     t.tok[0][0] == 'g' ? "COUNT" : "TEXT");
                }
                if (t.tok[0][0] == 's') {
                    copy_str(g_seed, sizeof(g_seed), t.tok[1]);
                } else if (parse_u64(t.tok[1], &n) != 0 || n > MAX_GPUS) {
                    free(text);
                    return load_fail("scenario %s line %d: bad gpus '%s': expected 0..%d", path,
                                     lineno, t.tok[1], MAX_GPUS);
                } else {
                    g_count = (unsigned int)n;
                }
            } else if (pass == 2 && !shape) {
                if (exec_locked(line, 1, reply, sizeof(reply)) < 0) {
                    free(text);
                    return load_fail("scenario %s line %d: %s", path, lineno, reply);
                }
            }
        }
    }
    free(text);
    for (unsigned int i = 0; i < MAX_GPUS; i++) {
        g_gpus[i].v.reset_count = 0;
        g_defaults[i] = g_gpus[i].v;
    }
    memcpy(g_rc_defaults, g_rc, sizeof(g_rc));
    g_rc_defaults_len = g_rc_len;
    for (unsigned int i = 0; i < g_rc_len; i++) g_rc[i].calls = 0;
    return 0;
}

/* ------------------------------------------------------------------ control socket */

static void send_all(int fd, const char *s) {
    size_t len = strlen(s);
    while (len > 0) {
        ssize_t w = send(fd, s, len, MSG_NOSIGNAL);
        if (w <= 0) {
            if (w < 0 && errno == EINTR) continue;
            return;
        }
        s += w;
        len -= (size_t)w;
    }
}

static int run_command(const char *line, char *reply, size_t rlen);

static void *serve_connection(void *arg) {
    int fd = (int)(intptr_t)arg;
    char buf[LINE_MAX_LEN * 4];
    size_t len = 0;
    int discarding = 0; /* inside an over-long line: drop bytes up to its newline */
    for (;;) {
        ssize_t r = recv(fd, buf + len, sizeof(buf) - len - 1, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
        buf[len] = '\0';
        char *start = buf;
        char *nl;
        while ((nl = strchr(start, '\n')) != NULL) {
            *nl = '\0';
            if (nl > start && nl[-1] == '\r') nl[-1] = '\0';
            if (discarding) {
                discarding = 0;
                start = nl + 1;
                continue;
            }
            char reply[600];
            char out[700];
            int rc = run_command(start, reply, sizeof(reply));
            if (rc < 0) snprintf(out, sizeof(out), "error %s\n", reply);
            else if (rc == 1) snprintf(out, sizeof(out), "ok %s\n", reply);
            else snprintf(out, sizeof(out), "ok\n");
            send_all(fd, out);
            start = nl + 1;
        }
        len = strlen(start);
        memmove(buf, start, len + 1);
        if (len == sizeof(buf) - 1) {
            if (!discarding) send_all(fd, "error line too long\n");
            discarding = 1;
            len = 0;
        }
    }
    close(fd);
    return NULL;
}

static void *serve(void *arg) {
    int lfd = (int)(intptr_t)arg;
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return NULL;
        }
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&th, &attr, serve_connection, (void *)(intptr_t)fd) != 0) close(fd);
        pthread_attr_destroy(&attr);
    }
}

static int start_socket_locked(const char *path) {
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(addr.sun_path))
        return load_fail("FAKE_NVML_SOCKET %s: path longer than %zu bytes", path,
                         sizeof(addr.sun_path) - 1);
    copy_str(addr.sun_path, sizeof(addr.sun_path), path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return load_fail("FAKE_NVML_SOCKET %s: socket: %s", path, strerror(errno));
    unlink(path);
    if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 || listen(fd, 16) != 0) {
        int e = errno;
        close(fd);
        return load_fail("FAKE_NVML_SOCKET %s: bind/listen: %s", path, strerror(e));
    }
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int e = pthread_create(&th, &attr, serve, (void *)(intptr_t)fd);
    pthread_attr_destroy(&attr);
    if (e != 0) {
        close(fd);
        return load_fail("FAKE_NVML_SOCKET %s: thread: %s", path, strerror(e));
    }
    return 0;
}

/* First use in the process: read the env, load the scenario, start the socket. */
static void ensure_loaded_locked(void) {
    if (g_loaded) return;
    g_loaded = 1;
    pthread_once(&g_once, init_conds);
    const char *scenario = getenv("FAKE_NVML_SCENARIO");
    if (scenario != NULL && scenario[0] != '\0') copy_str(g_scenario_path, sizeof(g_scenario_path), scenario);
    if (load_locked(g_scenario_path[0] ? g_scenario_path : NULL) != 0) {
        g_load_failed = 1;
        fprintf(stderr, "fakenvml: %s\n", g_load_error);
        return;
    }
    const char *sock = getenv("FAKE_NVML_SOCKET");
    if (sock != NULL && sock[0] != '\0' && !g_socket_started) {
        if (start_socket_locked(sock) != 0) {
            g_load_failed = 1;
            fprintf(stderr, "fakenvml: %s\n", g_load_error);
            return;
        }
        g_socket_started = 1;
    }
}

static int run_command(const char *line, char *reply, size_t rlen) {
    pthread_mutex_lock(&g_lock);
    ensure_loaded_locked();
    int rc = exec_locked(line, 0, reply, rlen);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* ------------------------------------------------------------------ control exports */

/* Run one command; 0 ok, 1 ok with a value in reply, -1 error with the message in reply. */
EXPORT int fake_nvml_command(const char *line, char *reply, unsigned int reply_size) {
    char local[600];
    if (line == NULL) return -1;
    int rc = run_command(line, local, sizeof(local));
    if (reply != NULL && reply_size > 0) snprintf(reply, reply_size, "%s", local);
    return rc;
}

/* Run newline-separated commands; stop at the first error. 0 or an errno-like code. */
EXPORT int fake_nvml_control(const char *text) {
    if (text == NULL) return EINVAL;
    const char *p = text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char line[LINE_MAX_LEN];
        char reply[600];
        if (len >= sizeof(line)) return E2BIG;
        memcpy(line, p, len);
        line[len] = '\0';
        if (run_command(line, reply, sizeof(reply)) < 0) {
            fprintf(stderr, "fakenvml: %s: %s\n", line, reply);
            return EINVAL;
        }
        p = nl ? nl + 1 : p + len;
    }
    return 0;
}

/* Replace all state from a scenario file (NULL or "": built-in defaults); -1 on error. */
EXPORT int fake_nvml_load(const char *path, char *error, unsigned int error_size) {
    pthread_mutex_lock(&g_lock);
    ensure_loaded_locked();
    copy_str(g_scenario_path, sizeof(g_scenario_path), path ? path : "");
    int rc = load_locked(g_scenario_path[0] ? g_scenario_path : NULL);
    g_load_failed = rc != 0;
    if (error != NULL && error_size > 0) snprintf(error, error_size, "%s", g_load_error);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* Threads currently blocked in nvmlEventSetWait*: lets tests inject only once one waits. */
EXPORT unsigned int fake_nvml_waiters(void) {
    pthread_mutex_lock(&g_lock);
    unsigned int n = g_waiters;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* sizeof a struct ("nvmlFieldValue_t") or offsetof a member ("nvmlFieldValue_t.value"); -1 if unknown. */
EXPORT long fake_nvml_layout(const char *name) {
#define L_SIZE(T) {#T, (long)sizeof(T)}
#define L_OFF(T, m) {#T "." #m, (long)offsetof(T, m)}
    static const struct {
        const char *name;
        long value;
    } table[] = {
        L_SIZE(nvmlPciInfo_t), L_OFF(nvmlPciInfo_t, busIdLegacy), L_OFF(nvmlPciInfo_t, domain),
        L_OFF(nvmlPciInfo_t, bus), L_OFF(nvmlPciInfo_t, device), L_OFF(nvmlPciInfo_t, pciDeviceId),
        L_OFF(nvmlPciInfo_t, pciSubSystemId), L_OFF(nvmlPciInfo_t, busId),
        L_SIZE(nvmlMemory_t), L_OFF(nvmlMemory_t, total), L_OFF(nvmlMemory_t, free),
        L_OFF(nvmlMemory_t, used),
        L_SIZE(nvmlMemory_v2_t), L_OFF(nvmlMemory_v2_t, version), L_OFF(nvmlMemory_v2_t, total),
        L_OFF(nvmlMemory_v2_t, reserved), L_OFF(nvmlMemory_v2_t, free), L_OFF(nvmlMemory_v2_t, used),
        L_SIZE(nvmlUtilization_t), L_OFF(nvmlUtilization_t, gpu), L_OFF(nvmlUtilization_t, memory),
        L_SIZE(nvmlViolationTime_t), L_OFF(nvmlViolationTime_t, referenceTime),
        L_OFF(nvmlViolationTime_t, violationTime),
        L_SIZE(nvmlValue_t),
        L_SIZE(nvmlFieldValue_t), L_OFF(nvmlFieldValue_t, fieldId), L_OFF(nvmlFieldValue_t, scopeId),
        L_OFF(nvmlFieldValue_t, timestamp), L_OFF(nvmlFieldValue_t, latencyUsec),
        L_OFF(nvmlFieldValue_t, valueType), L_OFF(nvmlFieldValue_t, nvmlReturn),
        L_OFF(nvmlFieldValue_t, value),
        L_SIZE(nvmlEventData_t), L_OFF(nvmlEventData_t, device), L_OFF(nvmlEventData_t, eventType),
        L_OFF(nvmlEventData_t, eventData), L_OFF(nvmlEventData_t, gpuInstanceId),
        L_OFF(nvmlEventData_t, computeInstanceId),
        L_SIZE(nvmlTemperature_v1_t), L_OFF(nvmlTemperature_v1_t, version),
        L_OFF(nvmlTemperature_v1_t, sensorType), L_OFF(nvmlTemperature_v1_t, temperature),
    };
#undef L_SIZE
#undef L_OFF
    if (name == NULL) return -1;
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        if (strcmp(table[i].name, name) == 0) return table[i].value;
    }
    return -1;
}

/* ------------------------------------------------------------------ NVML: system */

#define UNLOCK_RETURN(x)                \
    do {                                \
        nvmlReturn_t r_ = (x);          \
        pthread_mutex_unlock(&g_lock);  \
        return r_;                      \
    } while (0)

/* Lock, check init, resolve the handle and apply overrides and lost.
 *
 * A GPU that needs a reset keeps answering: nvml.h documents NVML_ERROR_RESET_REQUIRED only for
 * a few setters (persistence/scheduler state, :11401, :11631; none of which the fake exports),
 * never for a reading. It says so through NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (field 230, R565+)
 * and a GpuRecoveryAction event, as a real R565+ driver does. */
static nvmlReturn_t device_check(const char *function, nvmlDevice_t dev, int health, gpu_values_t **v) {
    (void)health;
    if (g_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    if (dev == NULL || dev < &g_gpus[0] || dev >= &g_gpus[g_count] ||
        (size_t)((char *)dev - (char *)&g_gpus[0]) % sizeof(g_gpus[0]) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t forced = rc_check(function, (int)dev->index);
    if (forced != NVML_SUCCESS) return forced;
    if (dev->v.lost) return NVML_ERROR_GPU_IS_LOST;
    *v = &dev->v;
    return NVML_SUCCESS;
}

/* `health` marks readings apart from identity calls; both answer for a reset-required GPU. */
#define BEGIN_DEVICE(dev, health)                                             \
    gpu_values_t *v = NULL;                                                   \
    pthread_mutex_lock(&g_lock);                                              \
    {                                                                         \
        nvmlReturn_t rc_ = device_check(__func__, (dev), (health), &v);       \
        if (rc_ != NVML_SUCCESS) UNLOCK_RETURN(rc_);                          \
    }

#define BEGIN_SYSTEM()                                                        \
    pthread_mutex_lock(&g_lock);                                              \
    {                                                                         \
        if (g_refcount == 0) UNLOCK_RETURN(NVML_ERROR_UNINITIALIZED);         \
        nvmlReturn_t rc_ = rc_check(__func__, -1);                            \
        if (rc_ != NVML_SUCCESS) UNLOCK_RETURN(rc_);                          \
    }

#define REQUIRE(p) \
    if ((p) == NULL) UNLOCK_RETURN(NVML_ERROR_INVALID_ARGUMENT)

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&g_lock);
    ensure_loaded_locked();
    if (g_load_failed) UNLOCK_RETURN(NVML_ERROR_UNKNOWN);
    nvmlReturn_t forced = rc_check(__func__, -1);
    if (forced != NVML_SUCCESS) UNLOCK_RETURN(forced);
    g_refcount++;
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) UNLOCK_RETURN(NVML_ERROR_UNINITIALIZED);
    g_refcount--;
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt Request Issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 22: return "The requested vgpu operation is not available on target device, because ECC is enabled";
    case 23: return "Insufficient Resources";
    case 24: return "Insufficient Frequency";
    case 25: return "Argument Version Mismatch";
    case 26: return "Deprecated";
    case 27: return "Not Ready";
    case 28: return "GPU Not Found";
    case 29: return "Invalid State";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t system_string(const char *function, const char *value, char *buf, unsigned int len) {
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) UNLOCK_RETURN(NVML_ERROR_UNINITIALIZED);
    nvmlReturn_t forced = rc_check(function, -1);
    if (forced != NVML_SUCCESS) UNLOCK_RETURN(forced);
    UNLOCK_RETURN(copy_out(buf, len, value));
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return system_string(__func__, g_driver_version, version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return system_string(__func__, g_nvml_version, version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    BEGIN_SYSTEM();
    REQUIRE(version);
    *version = g_cuda_version;
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    BEGIN_SYSTEM();
    REQUIRE(version);
    *version = g_cuda_version;
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    BEGIN_SYSTEM();
    REQUIRE(count);
    *count = g_count;
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

/* ------------------------------------------------------------------ NVML: handles */

static nvmlReturn_t handle_for(const char *function, unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t forced = rc_check(function, (int)index);
    if (forced != NVML_SUCCESS) return forced;
    if (g_gpus[index].v.lost) return NVML_ERROR_GPU_IS_LOST;
    *device = &g_gpus[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) UNLOCK_RETURN(NVML_ERROR_UNINITIALIZED);
    if (device == NULL || index >= g_count) UNLOCK_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    UNLOCK_RETURN(handle_for(__func__, index, device));
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) UNLOCK_RETURN(NVML_ERROR_UNINITIALIZED);
    if (uuid == NULL || device == NULL) UNLOCK_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < g_count; i++) {
        if (strcmp(g_gpus[i].v.uuid, uuid) == 0) UNLOCK_RETURN(handle_for(__func__, i, device));
    }
    UNLOCK_RETURN(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) UNLOCK_RETURN(NVML_ERROR_UNINITIALIZED);
    if (bus_id == NULL || device == NULL) UNLOCK_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < g_count; i++) {
        const char *full = g_gpus[i].v.bus_id;
        /* Accept the 8-digit domain form and the legacy 4-digit one. */
        if (strcasecmp(full, bus_id) == 0 || (strlen(full) > 4 && strcasecmp(full + 4, bus_id) == 0))
            UNLOCK_RETURN(handle_for(__func__, i, device));
    }
    UNLOCK_RETURN(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

/* ------------------------------------------------------------------ NVML: identity */

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    BEGIN_DEVICE(dev, 0);
    UNLOCK_RETURN(copy_out(uuid, length, v->uuid));
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    BEGIN_DEVICE(dev, 0);
    UNLOCK_RETURN(copy_out(name, length, v->name));
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t dev, char *serial, unsigned int length) {
    BEGIN_DEVICE(dev, 0);
    UNLOCK_RETURN(copy_out(serial, length, v->serial));
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index) {
    BEGIN_DEVICE(dev, 0);
    REQUIRE(index);
    *index = dev->index;
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned int *minor) {
    BEGIN_DEVICE(dev, 0);
    REQUIRE(minor);
    *minor = v->minor;
    UNLOCK_RETURN(NVML_SUCCESS);
}

static void fill_pci(const gpu_values_t *v, nvmlPciInfo_t *pci) {
    unsigned int domain = 0, bus = 0, device = 0, function = 0;
    memset(pci, 0, sizeof(*pci));
    copy_str(pci->busId, sizeof(pci->busId), v->bus_id);
    if (sscanf(v->bus_id, "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4) {
        domain = bus = device = function = 0;
    }
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.%X", domain & 0xFFFFu,
             bus & 0xFFu, device & 0xFFu, function & 0xFu);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = device;
    pci->pciDeviceId = v->pci_device_id;
    pci->pciSubSystemId = v->pci_subsystem_id;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    BEGIN_DEVICE(dev, 0);
    REQUIRE(pci);
    fill_pci(v, pci);
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(dev, pci);
}

/* ------------------------------------------------------------------ NVML: readings */

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, unsigned int sensor, unsigned int *temp) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(temp);
    if (sensor != 0) UNLOCK_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *temp = v->temperature;
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t dev, nvmlTemperature_v1_t *temp) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(temp);
    if (temp->version != 0x100000Cu) UNLOCK_RETURN(25); /* ARGUMENT_VERSION_MISMATCH */
    if (temp->sensorType != 0) UNLOCK_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    temp->temperature = (int)v->temperature;
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t dev, unsigned int threshold,
                                                      unsigned int *temp) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(temp);
    switch (threshold) {
    case 0: *temp = v->temp_shutdown; break;
    case 1: *temp = v->temp_slowdown; break;
    case 2: *temp = v->temp_mem_max; break;
    case 3: *temp = v->temp_gpu_max; break;
    default: UNLOCK_RETURN(NVML_ERROR_NOT_SUPPORTED);
    }
    UNLOCK_RETURN(NVML_SUCCESS);
}

#define GETTER_U32(fn, member)                                        \
    EXPORT nvmlReturn_t fn(nvmlDevice_t dev, unsigned int *out) {     \
        BEGIN_DEVICE(dev, 1);                                         \
        REQUIRE(out);                                                 \
        *out = v->member;                                             \
        UNLOCK_RETURN(NVML_SUCCESS);                                  \
    }

#define GETTER_U64(fn, member)                                           \
    EXPORT nvmlReturn_t fn(nvmlDevice_t dev, unsigned long long *out) {  \
        BEGIN_DEVICE(dev, 1);                                            \
        REQUIRE(out);                                                    \
        *out = v->member;                                                \
        UNLOCK_RETURN(NVML_SUCCESS);                                     \
    }

GETTER_U32(nvmlDeviceGetPowerUsage, power_mw)
GETTER_U32(nvmlDeviceGetEnforcedPowerLimit, power_limit_mw)
GETTER_U64(nvmlDeviceGetTotalEnergyConsumption, energy_mj)
GETTER_U32(nvmlDeviceGetPcieReplayCounter, pcie_replay)
GETTER_U32(nvmlDeviceGetCurrPcieLinkGeneration, pcie_gen)
GETTER_U32(nvmlDeviceGetCurrPcieLinkWidth, pcie_width)
GETTER_U32(nvmlDeviceGetMaxPcieLinkGeneration, pcie_max_gen)
GETTER_U32(nvmlDeviceGetMaxPcieLinkWidth, pcie_max_width)
GETTER_U64(nvmlDeviceGetCurrentClocksThrottleReasons, clock_event_reasons)

/* The "event reasons" name arrived in R535; older drivers only answer the throttle one. */
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t dev, unsigned long long *out) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(out);
    if (g_branch < 535) UNLOCK_RETURN(NVML_ERROR_FUNCTION_NOT_FOUND);
    *out = v->clock_event_reasons;
    UNLOCK_RETURN(NVML_SUCCESS);
}
GETTER_U32(nvmlDeviceGetRetiredPagesPendingStatus, retired_pending)

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *util) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(util);
    util->gpu = v->util_gpu;
    util->memory = v->util_memory;
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t dev, unsigned int *util,
                                                    unsigned int *period_us) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(util);
    REQUIRE(period_us);
    *util = v->util_encoder;
    *period_us = 167000;
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t dev, unsigned int *util,
                                                    unsigned int *period_us) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(util);
    REQUIRE(period_us);
    *util = v->util_decoder;
    *period_us = 167000;
    UNLOCK_RETURN(NVML_SUCCESS);
}

static unsigned long long mem_free(const gpu_values_t *v) {
    unsigned long long taken = v->memory_used + v->memory_reserved;
    return taken >= v->memory_total ? 0 : v->memory_total - taken;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(mem);
    /* v1 counts the driver-reserved memory as used, as the real driver does. */
    mem->total = v->memory_total;
    mem->used = v->memory_used + v->memory_reserved;
    mem->free = mem_free(v);
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(mem);
    /* nvmlMemory_v2 arrived in R510; an older driver has no such entry point. */
    if (g_branch < 510) UNLOCK_RETURN(NVML_ERROR_FUNCTION_NOT_FOUND);
    if (mem->version != 0x02000028u) UNLOCK_RETURN(25); /* ARGUMENT_VERSION_MISMATCH */
    mem->total = v->memory_total;
    mem->reserved = v->memory_reserved;
    mem->used = v->memory_used;
    mem->free = mem_free(v);
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t dev, unsigned int *current, unsigned int *pending) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(current);
    REQUIRE(pending);
    *current = v->ecc_mode;
    *pending = v->ecc_mode;
    UNLOCK_RETURN(NVML_SUCCESS);
}

static nvmlReturn_t ecc_count(const gpu_values_t *v, unsigned int error_type, unsigned int counter_type,
                              unsigned long long *count) {
    if (error_type > 1 || counter_type > 1) return NVML_ERROR_INVALID_ARGUMENT;
    if (error_type == 0)
        *count = counter_type == 0 ? v->ecc_corrected_volatile : v->ecc_corrected_aggregate;
    else
        *count = counter_type == 0 ? v->ecc_uncorrected_volatile : v->ecc_uncorrected_aggregate;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t dev, unsigned int error_type,
                                                unsigned int counter_type, unsigned long long *count) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(count);
    UNLOCK_RETURN(ecc_count(v, error_type, counter_type, count));
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t dev, unsigned int error_type,
                                                    unsigned int counter_type, unsigned int location,
                                                    unsigned long long *count) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(count);
    if (location == 2) UNLOCK_RETURN(ecc_count(v, error_type, counter_type, count)); /* DRAM */
    if (location == 7) { /* SRAM: every injected error is a DRAM error */
        if (error_type > 1 || counter_type > 1) UNLOCK_RETURN(NVML_ERROR_INVALID_ARGUMENT);
        *count = 0;
        UNLOCK_RETURN(NVML_SUCCESS);
    }
    UNLOCK_RETURN(NVML_ERROR_NOT_SUPPORTED);
}

static nvmlReturn_t retired_pages(const gpu_values_t *v, unsigned int cause, unsigned int *count,
                                  unsigned long long *addresses, unsigned long long *timestamps) {
    if (count == NULL || cause > 1) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = cause == 0 ? v->retired_sbe : v->retired_dbe;
    if (addresses == NULL) { /* size query */
        *count = n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) {
        addresses[i] = 0x100000ULL * (cause + 1) + 0x1000ULL * i;
        if (timestamps != NULL) timestamps[i] = 1700000000ULL + i;
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t dev, unsigned int cause, unsigned int *count,
                                              unsigned long long *addresses) {
    BEGIN_DEVICE(dev, 1);
    UNLOCK_RETURN(retired_pages(v, cause, count, addresses, NULL));
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t dev, unsigned int cause, unsigned int *count,
                                                 unsigned long long *addresses,
                                                 unsigned long long *timestamps) {
    BEGIN_DEVICE(dev, 1);
    UNLOCK_RETURN(retired_pages(v, cause, count, addresses, timestamps));
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned int *corr, unsigned int *unc,
                                              unsigned int *pending, unsigned int *failure) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(corr);
    REQUIRE(unc);
    REQUIRE(pending);
    REQUIRE(failure);
    *corr = v->remapped_correctable;
    *unc = v->remapped_uncorrectable;
    *pending = v->remap_pending;
    *failure = v->remap_failure;
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t dev, unsigned int policy,
                                                 nvmlViolationTime_t *out) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(out);
    if (policy > 5) UNLOCK_RETURN(NVML_ERROR_NOT_SUPPORTED);
    out->referenceTime = (unsigned long long)now_us() * 1000ULL;
    out->violationTime = policy == 0 ? v->violation_power_ns : policy == 1 ? v->violation_thermal_ns : 0;
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t dev, unsigned int type, unsigned int *clock) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(clock);
    switch (type) {
    case 0: /* graphics runs at the SM clock on this part */
    case 1: *clock = v->sm_clock; break;
    case 2: *clock = v->mem_clock; break;
    case 3: *clock = v->video_clock; break;
    default: UNLOCK_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    }
    UNLOCK_RETURN(NVML_SUCCESS);
}

static nvmlReturn_t check_link(const gpu_values_t *v, unsigned int link) {
    if (v->nvlink_count == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= v->nvlink_count) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, unsigned int *active) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(active);
    nvmlReturn_t rc = check_link(v, link);
    if (rc != NVML_SUCCESS) UNLOCK_RETURN(rc);
    *active = v->nvlink_state[link];
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t dev, unsigned int link,
                                                    unsigned int counter, unsigned long long *value) {
    BEGIN_DEVICE(dev, 1);
    REQUIRE(value);
    nvmlReturn_t rc = check_link(v, link);
    if (rc != NVML_SUCCESS) UNLOCK_RETURN(rc);
    if (counter >= NVLINK_COUNTERS) UNLOCK_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *value = v->nvlink_errors[link][counter];
    UNLOCK_RETURN(NVML_SUCCESS);
}

static unsigned long long link_total(const gpu_values_t *v, unsigned int counter) {
    unsigned long long sum = 0;
    for (unsigned int l = 0; l < v->nvlink_count && l < MAX_LINKS; l++) sum += v->nvlink_errors[l][counter];
    return sum;
}

/* Fill one field value; returns the per-entry status. */
static nvmlReturn_t field_value(const gpu_values_t *v, nvmlFieldValue_t *f) {
    unsigned long long u64 = 0;
    unsigned int u32 = 0;
    int is64 = 1;
    switch (f->fieldId) {
    case 3: u64 = v->ecc_corrected_volatile; break;
    case 4: u64 = v->ecc_uncorrected_volatile; break;
    case 5: u64 = v->ecc_corrected_aggregate; break;
    case 6: u64 = v->ecc_uncorrected_aggregate; break;
    case 29: u64 = v->retired_sbe; break;
    case 30: u64 = v->retired_dbe; break;
    case 31: u64 = v->retired_pending; break;
    case 38: u64 = link_total(v, 2); break;
    case 45: u64 = link_total(v, 3); break;
    case 52: u64 = link_total(v, 0); break;
    case 59: u64 = link_total(v, 1); break;
    case 82: is64 = 0; u32 = v->memory_temperature; break;
    case 83: u64 = v->energy_mj; break;
    case 94: is64 = 0; u32 = v->pcie_replay; break;
    case 142: is64 = 0; u32 = v->remapped_correctable; break;
    case 143: is64 = 0; u32 = v->remapped_uncorrectable; break;
    case 144: is64 = 0; u32 = v->remap_pending; break;
    case 145: is64 = 0; u32 = v->remap_failure; break;
    case 165: {
        nvmlReturn_t rc = check_link(v, f->scopeId);
        if (rc != NVML_SUCCESS) return rc;
        is64 = 0;
        u32 = v->nvlink_state[f->scopeId];
        break;
    }
    case 186: is64 = 0; u32 = v->power_mw; break;
    case 230:
        /* NVML_FI_DEV_GET_GPU_RECOVERY_ACTION arrived with R565, with Xid 154. */
        if (g_branch < 565) return NVML_ERROR_NOT_SUPPORTED;
        is64 = 0;
        /* A GPU that needs a reset and has no other action set says GPU_RESET (1). */
        u32 = v->recovery_action ? v->recovery_action : (v->reset_required ? 1u : 0u);
        break;
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
    if (is64) {
        f->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        f->value.ullVal = u64;
    } else {
        f->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        f->value.ullVal = 0;
        f->value.uiVal = u32;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int count, nvmlFieldValue_t *values) {
    BEGIN_DEVICE(dev, 1);
    if (count < 0 || (count > 0 && values == NULL)) UNLOCK_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    int64_t ts = now_us();
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *f = &values[i];
        char name[32];
        f->timestamp = ts;
        f->latencyUsec = 0;
        snprintf(name, sizeof(name), "field.%u", f->fieldId);
        nvmlReturn_t forced = rc_check(name, (int)dev->index);
        f->nvmlReturn = forced != NVML_SUCCESS ? forced : field_value(v, f);
    }
    UNLOCK_RETURN(NVML_SUCCESS);
}

/* ------------------------------------------------------------------ NVML: events */

static int valid_set(nvmlEventSet_t set) {
    return set != NULL && set >= &g_sets[0] && set < &g_sets[MAX_SETS] &&
           (size_t)((char *)set - (char *)&g_sets[0]) % sizeof(g_sets[0]) == 0 && set->in_use;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    BEGIN_SYSTEM();
    REQUIRE(set);
    for (unsigned int i = 0; i < MAX_SETS; i++) {
        if (!g_sets[i].in_use) {
            g_sets[i].in_use = 1;
            memset(g_sets[i].mask, 0, sizeof(g_sets[i].mask));
            g_sets[i].head = 0;
            g_sets[i].count = 0;
            *set = &g_sets[i];
            UNLOCK_RETURN(NVML_SUCCESS);
        }
    }
    UNLOCK_RETURN(20); /* NVML_ERROR_MEMORY */
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t dev, unsigned long long *types) {
    BEGIN_DEVICE(dev, 0);
    REQUIRE(types);
    *types = v->supported_events;
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long types, nvmlEventSet_t set) {
    BEGIN_DEVICE(dev, 0);
    if (!valid_set(set)) UNLOCK_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if ((types & ~v->supported_events) != 0) UNLOCK_RETURN(NVML_ERROR_NOT_SUPPORTED);
    set->mask[dev->index] |= types;
    UNLOCK_RETURN(NVML_SUCCESS);
}

static nvmlReturn_t event_wait(const char *function, nvmlEventSet_t set, nvmlEventData_t *data,
                               unsigned int timeout_ms) {
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) UNLOCK_RETURN(NVML_ERROR_UNINITIALIZED);
    nvmlReturn_t forced = rc_check(function, -1);
    if (forced != NVML_SUCCESS) UNLOCK_RETURN(forced);
    if (!valid_set(set) || data == NULL) UNLOCK_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    g_waiters++;
    while (set->in_use && set->count == 0 && !set_has_lost_locked(set) && timeout_ms > 0) {
        if (pthread_cond_timedwait(&set->cond, &g_lock, &deadline) == ETIMEDOUT) break;
    }
    g_waiters--;
    if (!set->in_use) UNLOCK_RETURN(NVML_ERROR_UNINITIALIZED);
    /* nvml.h:9994: the wait returns GPU_IS_LOST "if a GPU has fallen off the bus": once the
     * events queued before (Xid 79) are taken, a set holding a lost GPU answers that, until
     * the GPU is reset or a new set is made without it. */
    if (set->count == 0 && set_has_lost_locked(set)) UNLOCK_RETURN(NVML_ERROR_GPU_IS_LOST);
    if (set->count == 0) UNLOCK_RETURN(NVML_ERROR_TIMEOUT);
    *data = set->queue[set->head];
    set->head = (set->head + 1) % QUEUE_CAP;
    set->count--;
    UNLOCK_RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    return event_wait(__func__, set, data, timeout_ms);
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    return event_wait(__func__, set, data, timeout_ms);
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    BEGIN_SYSTEM();
    if (!valid_set(set)) UNLOCK_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    set->in_use = 0;
    set->count = 0;
    pthread_cond_broadcast(&set->cond);
    UNLOCK_RETURN(NVML_SUCCESS);
}
