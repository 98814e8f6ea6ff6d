/*
 * A fake libnvidia-ml.so.1 for tests: the NVML C functions Sentinel's agent calls through
 * pynvml, serving values (and error codes) from a text file named by $FAKE_NVML_CONFIG.
 *
 * The file is re-read whenever it changes (inode, size or mtime), so a test can change values
 * between sweeps. Write it atomically (temp file + rename) so a reader never sees half a file.
 *
 *   # comment
 *   init_error = 9            top level: nvmlInit returns this code (0 = success)
 *   driver_version = 570.124.06   top level: nvmlSystemGetDriverVersion
 *   cuda_driver_version = 12080   top level: nvmlSystemGetCudaDriverVersion_v2 (12.8)
 *   error.driver_version = 3  top level: that system call returns this code (keys:
 *                             SYSTEM_ERROR_KEYS below)
 *   xid = 1 79                top level, repeatable: an XID event queue, "GPU XID" in order;
 *                             each entry is delivered once to each event set (append only);
 *                             a GPU's ecc_dbe_volatile growing is a double-bit ECC event
 *                             (no_dbe_events = 1: a GPU that raises none)
 *   [gpu 0]                   one section per GPU, indices 0..N-1 in order
 *   uuid = GPU-...            strings: uuid, name, pci_bus_id, vbios, inforom
 *   fabric_cluster = 3c5b...  the NVLink fabric's cluster UUID (32 hex digits, dashes allowed),
 *   fabric_clique = 7         its clique, and fabric_state (nvmlGpuFabricState_t; 0, the
 *   fabric_state = 3          default: a GPU on no NVLink fabric, NOT_SUPPORTED)
 *   persistence_mode = 1      nvmlEnableState_t numbers: persistence_mode, ecc_mode (current),
 *                             ecc_mode_pending (after the next reset)
 *   temp_gpu = 41             numbers (decimal or 0x hex): see NUMBER_KEYS below
 *   nvlink_state = 1,1,0,1    per-link lists: one entry per link (count = number of links)
 *   nvlink_replay = 0,2,0,5
 *   processes = 4242:1048576,4343:2097152     pid:used_bytes pairs
 *   tensor_util = 37.5        GPM ANY_TENSOR_UTIL in percent
 *   error.temp_gpu = 3        the call behind a field returns this NVML error code (keys:
 *                             ERROR_KEYS below; nvlink_fields fails the NVLink field values)
 *   lost = 1                  every call on this GPU returns NVML_ERROR_GPU_IS_LOST (15)
 *   recovery_action = 1       NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (error.recovery_action fails it)
 *   missing_fields = 83,94    field ids this "driver" does not know (NOT_SUPPORTED in the field
 *                             values) while it still has their per-call functions
 *
 * Field values serve the same state as the per-call functions, and fail with the same
 * error.<key>: ECC totals, retired pages, remapped rows, energy and PCIe replay as well.
 *
 *   hang = nvmlDeviceGetPowerUsage   top level: that function (or every function: `hang = *`)
 *                             blocks, re-reading the file every 20 ms, until the file no longer
 *                             names it: a call wedged in the driver, released by the test
 *
 * Build: gcc -O2 -shared -fPIC -o libnvidia-ml.so.1 fake_nvml.c
 * With -DFAKE_NVML_OLD_DRIVER it lacks what older drivers lack (GPM, ClocksEventReasons).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ---- NVML types, laid out as pynvml's ctypes structures ---------------------------------- */

typedef int nvmlReturn_t;
typedef enum { NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1 } nvmlEnableState_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15, NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct nvml_gpu *nvmlDevice_t;
typedef struct nvml_event_set *nvmlEventSet_t;
typedef struct nvml_gpm_sample *nvmlGpmSample_t;

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef union {
    double dVal; unsigned int uiVal; unsigned long ulVal; unsigned long long ullVal;
    long long sllVal; int siVal; unsigned short usVal;
} nvmlValue_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;
typedef struct {
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId, state;
} nvmlGpuFabricInfo_t;
typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId, state, healthMask;
} nvmlGpuFabricInfoV_t;
#define NVML_GPU_FABRIC_INFO_V2 0x02000024u
typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct { char *shortName, *longName, *unit; } metricInfo;
} nvmlGpmMetric_t;
typedef struct {
    unsigned int version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[];
} nvmlGpmMetricsGet_t;

#define NVML_FI_DEV_ECC_SBE_VOL_TOTAL 3
#define NVML_FI_DEV_ECC_DBE_VOL_TOTAL 4
#define NVML_FI_DEV_ECC_SBE_AGG_TOTAL 5
#define NVML_FI_DEV_ECC_DBE_AGG_TOTAL 6
#define NVML_FI_DEV_RETIRED_SBE 29
#define NVML_FI_DEV_RETIRED_DBE 30
#define NVML_FI_DEV_RETIRED_PENDING 31
#define NVML_FI_DEV_MEMORY_TEMP 82
#define NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION 83
#define NVML_FI_DEV_PCIE_REPLAY_COUNTER 94
#define NVML_FI_DEV_REMAPPED_COR 142
#define NVML_FI_DEV_REMAPPED_UNC 143
#define NVML_FI_DEV_REMAPPED_PENDING 144
#define NVML_FI_DEV_REMAPPED_FAILURE 145
#define NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY 161
#define NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY 162
#define NVML_FI_DEV_NVLINK_ERROR_DL_CRC 163
#define NVML_FI_DEV_NVLINK_GET_STATE 165
#define NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230
#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3
#define NVML_GPM_METRIC_ANY_TENSOR_UTIL 5
#define NVML_EVENT_TYPE_DBE 0x2ULL
#define NVML_EVENT_TYPE_XID 0x8ULL

/* ---- the served state --------------------------------------------------------------------- */

#define MAX_GPUS 64
#define MAX_LINKS 36
#define MAX_PROCS 64
#define MAX_XIDS 4096

/* Numeric values, and the fields whose calls can be told to fail with error.<field>. */
enum value_key {
    V_TEMP_GPU, V_TEMP_MEM, V_POWER_MW, V_POWER_LIMIT_MW, V_ENERGY_MJ, V_CLOCK_SM, V_CLOCK_MEM,
    V_UTIL_GPU, V_UTIL_MEM, V_FB_TOTAL, V_FB_USED, V_FB_FREE,
    V_ECC_SBE_VOLATILE, V_ECC_DBE_VOLATILE, V_ECC_SBE_AGGREGATE, V_ECC_DBE_AGGREGATE,
    V_RETIRED_SBE, V_RETIRED_DBE, V_RETIRED_PENDING,
    V_REMAP_CORRECTABLE, V_REMAP_UNCORRECTABLE, V_REMAP_PENDING, V_REMAP_FAILURE,
    V_CLOCKS_EVENT_REASONS, V_PCIE_REPLAY, V_GPM_SUPPORTED, V_RECOVERY_ACTION, V_NO_DBE_EVENTS,
    V_PERSISTENCE_MODE, V_ECC_MODE, V_ECC_MODE_PENDING, V_FABRIC_CLIQUE, V_FABRIC_STATE, V_COUNT
};
static const char *const NUMBER_KEYS[V_COUNT] = {
    "temp_gpu", "temp_mem", "power_mw", "power_limit_mw", "energy_mj", "clock_sm", "clock_mem",
    "util_gpu", "util_mem", "fb_total", "fb_used", "fb_free",
    "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate",
    "retired_sbe", "retired_dbe", "retired_pending",
    "remap_correctable", "remap_uncorrectable", "remap_pending", "remap_failure",
    "clocks_event_reasons", "pcie_replay", "gpm_supported", "recovery_action", "no_dbe_events",
    "persistence_mode", "ecc_mode", "ecc_mode_pending", "fabric_clique", "fabric_state",
};

enum error_key {
    E_HANDLE, E_UUID, E_NAME, E_PCI, E_TEMP_GPU, E_TEMP_MEM, E_POWER, E_POWER_LIMIT, E_ENERGY, E_CLOCK_SM,
    E_CLOCK_MEM, E_UTIL, E_MEMORY, E_ECC_SBE_VOLATILE, E_ECC_DBE_VOLATILE, E_ECC_SBE_AGGREGATE,
    E_ECC_DBE_AGGREGATE, E_RETIRED_PAGES, E_RETIRED_PENDING, E_REMAPPED_ROWS, E_CLOCKS_EVENT,
    E_PCIE_REPLAY, E_NVLINK_STATE, E_NVLINK_CRC_FLIT, E_NVLINK_CRC_DATA, E_NVLINK_REPLAY,
    E_NVLINK_RECOVERY, E_NVLINK_FIELDS, E_GPM, E_PROCESSES, E_EVENTS, E_RECOVERY_ACTION,
    E_VBIOS, E_INFOROM, E_PERSISTENCE, E_ECC_MODE, E_FABRIC, E_COUNT
};
static const char *const ERROR_KEYS[E_COUNT] = {
    "handle", "uuid", "name", "pci", "temp_gpu", "temp_mem", "power", "power_limit", "energy", "clock_sm",
    "clock_mem", "util", "memory", "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate",
    "ecc_dbe_aggregate", "retired_pages", "retired_pending", "remapped_rows", "clocks_event",
    "pcie_replay", "nvlink_state", "nvlink_crc_flit", "nvlink_crc_data", "nvlink_replay",
    "nvlink_recovery", "nvlink_fields", "gpm", "processes", "events", "recovery_action",
    "vbios", "inforom", "persistence", "ecc_mode", "fabric",
};

/* The system-wide calls that can be told to fail with a top-level error.<key>. */
enum system_error_key { SE_DRIVER_VERSION, SE_CUDA_DRIVER_VERSION, SE_COUNT };
static const char *const SYSTEM_ERROR_KEYS[SE_COUNT] = {"driver_version", "cuda_driver_version"};

/* NVML's nvmlNvLinkErrorCounter_t order: DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT, DL_CRC_DATA. */
#define LINK_COUNTERS 4
static const char *const LINK_KEYS[LINK_COUNTERS] = {
    "nvlink_replay", "nvlink_recovery", "nvlink_crc_flit", "nvlink_crc_data",
};
static const int LINK_ERRORS[LINK_COUNTERS] = {
    E_NVLINK_REPLAY, E_NVLINK_RECOVERY, E_NVLINK_CRC_FLIT, E_NVLINK_CRC_DATA,
};

struct nvml_gpu {
    char uuid[96], name[96], pci_bus_id[32], vbios[96], inforom[96];
    unsigned char fabric_cluster[16];
    unsigned long long v[V_COUNT];
    int err[E_COUNT];
    int lost;
    int links;
    unsigned long long link_state[MAX_LINKS], link_counter[LINK_COUNTERS][MAX_LINKS];
    int procs;
    unsigned int proc_pid[MAX_PROCS];
    unsigned long long proc_mem[MAX_PROCS];
    double tensor_util;
    int missing_fields;
    unsigned long long missing_field[MAX_LINKS];
};

struct state {
    int init_error, gpus, xids;
    char hang[96], driver_version[96];
    int cuda_driver_version;
    int sys_err[SE_COUNT];
    struct nvml_gpu gpu[MAX_GPUS];
    int xid_gpu[MAX_XIDS];
    unsigned long long xid_code[MAX_XIDS];
};

/* Per GPU: the event types registered, and the volatile DBE count last delivered as an event. */
struct nvml_event_set {
    int next_xid;
    unsigned long long mask[MAX_GPUS], dbe_seen[MAX_GPUS];
};
struct nvml_gpm_sample { int gpu; double tensor_util; };

/* Two buffers: a reload parses into the spare one and swaps only if the whole file parsed. */
static struct state buffers[2];
static struct state *S = &buffers[0];
static int initialized;
static const char *config_path;
static struct stat loaded;

/* ---- config parsing ----------------------------------------------------------------------- */

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r'))
        *--end = '\0';
    return s;
}

static int index_of(const char *const *names, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], key) == 0) return i;
    return -1;
}

static int parse_list(const char *value, unsigned long long *out) {
    int n = 0;
    char *end;
    while (*value && n < MAX_LINKS) {
        out[n++] = strtoull(value, &end, 0);
        value = (*end == ',') ? end + 1 : end;
        if (end == value && *end) return -1;
    }
    return n;
}

static int parse_processes(struct nvml_gpu *g, const char *value) {
    char *end;
    g->procs = 0;
    while (*value && g->procs < MAX_PROCS) {
        g->proc_pid[g->procs] = (unsigned int)strtoul(value, &end, 10);
        if (*end != ':') return -1;
        g->proc_mem[g->procs++] = strtoull(end + 1, &end, 0);
        while (*end == ',' || *end == ' ') end++;
        value = end;
    }
    return 0;
}

/* 32 hex digits (dashes skipped) into 16 bytes. */
static int parse_uuid(const char *value, unsigned char out[16]) {
    int n = 0;
    unsigned int byte;
    for (; *value && n < 16; value++) {
        if (*value == '-') continue;
        if (sscanf(value, "%2x", &byte) != 1) return -1;
        out[n++] = (unsigned char)byte;
        value++;
        if (!*value) break;
    }
    return n == 16 ? 0 : -1;
}

static int parse_gpu_key(struct nvml_gpu *g, const char *key, const char *value) {
    int i;
    if (strcmp(key, "uuid") == 0) snprintf(g->uuid, sizeof g->uuid, "%s", value);
    else if (strcmp(key, "name") == 0) snprintf(g->name, sizeof g->name, "%s", value);
    else if (strcmp(key, "pci_bus_id") == 0)
        snprintf(g->pci_bus_id, sizeof g->pci_bus_id, "%s", value);
    else if (strcmp(key, "vbios") == 0) snprintf(g->vbios, sizeof g->vbios, "%s", value);
    else if (strcmp(key, "inforom") == 0) snprintf(g->inforom, sizeof g->inforom, "%s", value);
    else if (strcmp(key, "fabric_cluster") == 0) return parse_uuid(value, g->fabric_cluster);
    else if (strcmp(key, "lost") == 0) g->lost = atoi(value);
    else if (strcmp(key, "tensor_util") == 0) g->tensor_util = strtod(value, NULL);
    else if (strcmp(key, "processes") == 0) return parse_processes(g, value);
    else if (strcmp(key, "nvlink_state") == 0) {
        g->links = parse_list(value, g->link_state);
        return g->links < 0 ? -1 : 0;
    } else if (strcmp(key, "missing_fields") == 0) {
        g->missing_fields = parse_list(value, g->missing_field);
        return g->missing_fields < 0 ? -1 : 0;
    } else if ((i = index_of(LINK_KEYS, LINK_COUNTERS, key)) >= 0)
        return parse_list(value, g->link_counter[i]) < 0 ? -1 : 0;
    else if (strncmp(key, "error.", 6) == 0 && (i = index_of(ERROR_KEYS, E_COUNT, key + 6)) >= 0)
        g->err[i] = atoi(value);
    else if ((i = index_of(NUMBER_KEYS, V_COUNT, key)) >= 0) g->v[i] = strtoull(value, NULL, 0);
    else return -1;
    return 0;
}

static int parse_line(struct state *st, struct nvml_gpu **gpu, char *line) {
    int index;
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    line = trim(line);
    if (!*line) return 0;
    if (sscanf(line, "[gpu %d]", &index) == 1) {
        if (index != st->gpus || index >= MAX_GPUS) return -1;
        *gpu = &st->gpu[st->gpus++];
        return 0;
    }
    char *eq = strchr(line, '=');
    if (!eq) return -1;
    *eq = '\0';
    char *key = trim(line), *value = trim(eq + 1);
    if (*gpu) return parse_gpu_key(*gpu, key, value);
    int i;
    if (strcmp(key, "init_error") == 0) st->init_error = atoi(value);
    else if (strcmp(key, "hang") == 0) snprintf(st->hang, sizeof st->hang, "%s", value);
    else if (strcmp(key, "driver_version") == 0)
        snprintf(st->driver_version, sizeof st->driver_version, "%s", value);
    else if (strcmp(key, "cuda_driver_version") == 0) st->cuda_driver_version = atoi(value);
    else if (strncmp(key, "error.", 6) == 0 &&
             (i = index_of(SYSTEM_ERROR_KEYS, SE_COUNT, key + 6)) >= 0)
        st->sys_err[i] = atoi(value);
    else if (strcmp(key, "xid") == 0 && st->xids < MAX_XIDS) {
        if (sscanf(value, "%d %llu", &st->xid_gpu[st->xids], &st->xid_code[st->xids]) != 2)
            return -1;
        st->xids++;
    } else return -1;
    return 0;
}

/* Parse into the spare buffer and swap only when the whole file is good. */
static int load_config(const char *path) {
    struct state *next = (S == &buffers[0]) ? &buffers[1] : &buffers[0];
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "fake_nvml: cannot open FAKE_NVML_CONFIG=%s\n", path);
        return -1;
    }
    memset(next, 0, sizeof *next);
    struct nvml_gpu *gpu = NULL;
    char line[4096];
    int lineno = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (parse_line(next, &gpu, line) != 0) {
            fprintf(stderr, "fake_nvml: %s:%d: cannot parse line\n", path, lineno);
            bad = 1;
        }
    }
    fclose(f);
    if (bad) return -1;
    S = next;
    return 0;
}

/* Re-read the file when it changed. Called at the top of every call: tests rely on it. */
static void refresh(void) {
    struct stat now;
    if (!config_path || stat(config_path, &now) != 0) return;
    if (now.st_ino == loaded.st_ino && now.st_size == loaded.st_size &&
        now.st_mtim.tv_sec == loaded.st_mtim.tv_sec &&
        now.st_mtim.tv_nsec == loaded.st_mtim.tv_nsec)
        return;
    if (load_config(config_path) == 0) loaded = now;
}

/* ---- hang mode: a call that does not return until the test releases it ------------------- */

static int hangs(const char *fn) {
    return S->hang[0] && (strcmp(S->hang, "*") == 0 || strcmp(S->hang, fn) == 0);
}

/* No refresh of its own on the way in (every call already refreshes once): the file is at
   most one call old here, so a hang written by a test starts at the next call of `fn`. */
static void hang_point(const char *fn) {
    struct timespec pause = {0, 20 * 1000000L};
    while (hangs(fn)) {
        nanosleep(&pause, NULL);
        refresh();
    }
}

#define ENTER() hang_point(__func__)

/* ---- helpers shared by the device calls --------------------------------------------------- */

/* Handles always point into buffers[0]; the index selects the slot in the active buffer. */
static int gpu_index(nvmlDevice_t d) {
    ptrdiff_t k = d - buffers[0].gpu;
    return (k >= 0 && k < MAX_GPUS) ? (int)k : -1;
}

/* Resolve a handle to the current values; NULL with *ret set when the call must fail. */
static struct nvml_gpu *gpu_for(nvmlDevice_t d, int error_key, nvmlReturn_t *ret) {
    refresh();
    int i = gpu_index(d);
    *ret = NVML_SUCCESS;
    if (!initialized) *ret = NVML_ERROR_UNINITIALIZED;
    else if (i < 0 || i >= S->gpus) *ret = NVML_ERROR_INVALID_ARGUMENT;
    else if (S->gpu[i].lost) *ret = NVML_ERROR_GPU_IS_LOST;
    else if (error_key >= 0 && S->gpu[i].err[error_key]) *ret = S->gpu[i].err[error_key];
    return *ret == NVML_SUCCESS ? &S->gpu[i] : NULL;
}

#define GPU_OR_RETURN(g, d, key)                    \
    nvmlReturn_t ret_;                              \
    struct nvml_gpu *g = gpu_for((d), (key), &ret_); \
    if (!g) return ret_

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *value) {
    if (!out || length <= strlen(value)) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return NVML_SUCCESS;
}

static nvmlReturn_t get_uint(nvmlDevice_t d, int error_key, int value_key, unsigned int *out) {
    GPU_OR_RETURN(g, d, error_key);
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    *out = (unsigned int)g->v[value_key];
    return NVML_SUCCESS;
}

static nvmlReturn_t get_ull(nvmlDevice_t d, int error_key, int value_key,
                            unsigned long long *out) {
    GPU_OR_RETURN(g, d, error_key);
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    *out = g->v[value_key];
    return NVML_SUCCESS;
}

/* ---- library lifecycle -------------------------------------------------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    ENTER();
    (void)flags;
    config_path = getenv("FAKE_NVML_CONFIG");
    if (!config_path) {
        fprintf(stderr, "fake_nvml: FAKE_NVML_CONFIG is not set\n");
        return NVML_ERROR_UNKNOWN;
    }
    memset(&loaded, 0, sizeof loaded);
    refresh();
    if (loaded.st_ino == 0) return NVML_ERROR_UNKNOWN;
    if (S->init_error) return S->init_error;
    initialized = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    ENTER();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    initialized = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    ENTER();
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    default: return "Fake NVML error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ENTER();
    refresh();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (S->sys_err[SE_DRIVER_VERSION]) return S->sys_err[SE_DRIVER_VERSION];
    return copy_string(version, length, S->driver_version);
}

/* The CUDA version the driver supports, as 1000 * major + 10 * minor (12080 is 12.8). */
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    ENTER();
    refresh();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    if (S->sys_err[SE_CUDA_DRIVER_VERSION]) return S->sys_err[SE_CUDA_DRIVER_VERSION];
    *version = S->cuda_driver_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    ENTER();
    refresh();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *count = (unsigned int)S->gpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    ENTER();
    refresh();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (index >= (unsigned int)S->gpus) return NVML_ERROR_INVALID_ARGUMENT;
    if (S->gpu[index].lost) return NVML_ERROR_GPU_IS_LOST;
    if (S->gpu[index].err[E_HANDLE]) return S->gpu[index].err[E_HANDLE];
    *device = &buffers[0].gpu[index];
    return NVML_SUCCESS;
}

/* ---- identity ----------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    ENTER();
    GPU_OR_RETURN(g, d, E_UUID);
    return copy_string(uuid, length, g->uuid);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    ENTER();
    GPU_OR_RETURN(g, d, E_NAME);
    return copy_string(name, length, g->name);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    ENTER();
    GPU_OR_RETURN(g, d, E_PCI);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->pci_bus_id);
    /* the legacy field is 16 bytes: NVML truncates the bus id there too */
    memcpy(pci->busIdLegacy, g->pci_bus_id, sizeof pci->busIdLegacy - 1);
    return NVML_SUCCESS;
}

/* The NVLink fabric (NVL72 and the like): the cluster and clique the fabric manager put the GPU
 * in. A GPU on no fabric answers NOT_SUPPORTED, as NVML does. */
static nvmlReturn_t fabric(nvmlDevice_t d, unsigned char cluster[16], nvmlReturn_t *status,
                           unsigned int *clique, unsigned int *state) {
    GPU_OR_RETURN(g, d, E_FABRIC);
    if (!g->v[V_FABRIC_STATE]) return NVML_ERROR_NOT_SUPPORTED;
    memcpy(cluster, g->fabric_cluster, 16);
    *status = NVML_SUCCESS;
    *clique = (unsigned int)g->v[V_FABRIC_CLIQUE];
    *state = (unsigned int)g->v[V_FABRIC_STATE];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t d, nvmlGpuFabricInfo_t *info) {
    ENTER();
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    return fabric(d, info->clusterUuid, &info->status, &info->cliqueId, &info->state);
}

#ifndef FAKE_NVML_OLD_DRIVER /* the versioned call came with R550 */
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t d, nvmlGpuFabricInfoV_t *info) {
    ENTER();
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != NVML_GPU_FABRIC_INFO_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    info->healthMask = 0;
    return fabric(d, info->clusterUuid, &info->status, &info->cliqueId, &info->state);
}
#endif

/* ---- configuration: firmware and modes ---------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t d, char *version, unsigned int length) {
    ENTER();
    GPU_OR_RETURN(g, d, E_VBIOS);
    return copy_string(version, length, g->vbios);
}

nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t d, char *version, unsigned int length) {
    ENTER();
    GPU_OR_RETURN(g, d, E_INFOROM);
    return copy_string(version, length, g->inforom);
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, nvmlEnableState_t *mode) {
    ENTER();
    GPU_OR_RETURN(g, d, E_PERSISTENCE);
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    *mode = g->v[V_PERSISTENCE_MODE] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

/* ECC mode now, and the mode after the next reset (a change waits for one). */
nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t d, nvmlEnableState_t *current,
                                  nvmlEnableState_t *pending) {
    ENTER();
    GPU_OR_RETURN(g, d, E_ECC_MODE);
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    *current = g->v[V_ECC_MODE] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    *pending = g->v[V_ECC_MODE_PENDING] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

/* ---- temperature, power, clocks, utilization, memory --------------------------------------- */

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *temp) {
    ENTER();
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    return get_uint(d, E_TEMP_GPU, V_TEMP_GPU, temp);
}

/* A per-GPU scalar field: the value its per-call function serves, failing as that call does. */
static nvmlReturn_t scalar_field(struct nvml_gpu *g, nvmlFieldValue_t *fv, int value_key,
                                 int error_key, int value_type) {
    fv->valueType = value_type;
    if (value_type == NVML_VALUE_TYPE_UNSIGNED_INT) fv->value.uiVal = (unsigned int)g->v[value_key];
    else fv->value.ullVal = g->v[value_key];
    return g->err[error_key];
}

/* Field values: per-GPU scalars, and the per-link NVLink DL counters (scopeId = link). */
static nvmlReturn_t field_value(struct nvml_gpu *g, nvmlFieldValue_t *fv) {
    unsigned int link = fv->scopeId;
    const int UINT = NVML_VALUE_TYPE_UNSIGNED_INT, ULL = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    for (int i = 0; i < g->missing_fields; i++)
        if (g->missing_field[i] == fv->fieldId) return NVML_ERROR_NOT_SUPPORTED;
    fv->valueType = ULL;
    switch (fv->fieldId) {
    case NVML_FI_DEV_ECC_SBE_VOL_TOTAL:
        return scalar_field(g, fv, V_ECC_SBE_VOLATILE, E_ECC_SBE_VOLATILE, ULL);
    case NVML_FI_DEV_ECC_DBE_VOL_TOTAL:
        return scalar_field(g, fv, V_ECC_DBE_VOLATILE, E_ECC_DBE_VOLATILE, ULL);
    case NVML_FI_DEV_ECC_SBE_AGG_TOTAL:
        return scalar_field(g, fv, V_ECC_SBE_AGGREGATE, E_ECC_SBE_AGGREGATE, ULL);
    case NVML_FI_DEV_ECC_DBE_AGG_TOTAL:
        return scalar_field(g, fv, V_ECC_DBE_AGGREGATE, E_ECC_DBE_AGGREGATE, ULL);
    case NVML_FI_DEV_RETIRED_SBE:
        return scalar_field(g, fv, V_RETIRED_SBE, E_RETIRED_PAGES, ULL);
    case NVML_FI_DEV_RETIRED_DBE:
        return scalar_field(g, fv, V_RETIRED_DBE, E_RETIRED_PAGES, ULL);
    case NVML_FI_DEV_RETIRED_PENDING:
        return scalar_field(g, fv, V_RETIRED_PENDING, E_RETIRED_PENDING, UINT);
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
        return scalar_field(g, fv, V_ENERGY_MJ, E_ENERGY, ULL);
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER:
        return scalar_field(g, fv, V_PCIE_REPLAY, E_PCIE_REPLAY, UINT);
    case NVML_FI_DEV_REMAPPED_COR:
        return scalar_field(g, fv, V_REMAP_CORRECTABLE, E_REMAPPED_ROWS, UINT);
    case NVML_FI_DEV_REMAPPED_UNC:
        return scalar_field(g, fv, V_REMAP_UNCORRECTABLE, E_REMAPPED_ROWS, UINT);
    case NVML_FI_DEV_REMAPPED_PENDING:
        return scalar_field(g, fv, V_REMAP_PENDING, E_REMAPPED_ROWS, UINT);
    case NVML_FI_DEV_REMAPPED_FAILURE:
        return scalar_field(g, fv, V_REMAP_FAILURE, E_REMAPPED_ROWS, UINT);
    case NVML_FI_DEV_MEMORY_TEMP:
        return scalar_field(g, fv, V_TEMP_MEM, E_TEMP_MEM, UINT);
    case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
        return scalar_field(g, fv, V_RECOVERY_ACTION, E_RECOVERY_ACTION, UINT);
    case NVML_FI_DEV_NVLINK_GET_STATE:
    case NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY:
    case NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY:
    case NVML_FI_DEV_NVLINK_ERROR_DL_CRC:
        if (g->err[E_NVLINK_FIELDS] || g->links == 0)
            return g->err[E_NVLINK_FIELDS] ? g->err[E_NVLINK_FIELDS] : NVML_ERROR_NOT_SUPPORTED;
        if (link >= (unsigned int)g->links) return NVML_ERROR_INVALID_ARGUMENT;
        if (fv->fieldId == NVML_FI_DEV_NVLINK_GET_STATE) {
            fv->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            fv->value.uiVal = (unsigned int)g->link_state[link];
        } else if (fv->fieldId == NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY)
            fv->value.ullVal = g->link_counter[0][link];
        else if (fv->fieldId == NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY)
            fv->value.ullVal = g->link_counter[1][link];
        else /* the DL CRC counter covers flit and data CRC errors */
            fv->value.ullVal = g->link_counter[2][link] + g->link_counter[3][link];
        return NVML_SUCCESS;
    default:
        return NVML_ERROR_NOT_SUPPORTED;
    }
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values) {
    ENTER();
    GPU_OR_RETURN(g, d, -1);
    for (int i = 0; i < count; i++) {
        values[i].timestamp = (long long)time(NULL) * 1000000;
        values[i].latencyUsec = 0;
        values[i].nvmlReturn = field_value(g, &values[i]);
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    ENTER();
    return get_uint(d, E_POWER, V_POWER_MW, mw);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
    ENTER();
    return get_uint(d, E_POWER_LIMIT, V_POWER_LIMIT_MW, mw);
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
    ENTER();
    return get_ull(d, E_ENERGY, V_ENERGY_MJ, mj);
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    ENTER();
    if (type == 1) return get_uint(d, E_CLOCK_SM, V_CLOCK_SM, mhz);
    if (type == 2) return get_uint(d, E_CLOCK_MEM, V_CLOCK_MEM, mhz);
    return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *util) {
    ENTER();
    GPU_OR_RETURN(g, d, E_UTIL);
    util->gpu = (unsigned int)g->v[V_UTIL_GPU];
    util->memory = (unsigned int)g->v[V_UTIL_MEM];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *memory) {
    ENTER();
    GPU_OR_RETURN(g, d, E_MEMORY);
    memory->total = g->v[V_FB_TOTAL];
    memory->free = g->v[V_FB_FREE];
    memory->used = g->v[V_FB_USED];
    return NVML_SUCCESS;
}

/* ---- memory errors: ECC, retired pages, remapped rows -------------------------------------- */

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int error_type, int counter_type,
                                         unsigned long long *count) {
    ENTER();
    /* error_type: 0 corrected (SBE), 1 uncorrected (DBE); counter_type: 0 volatile, 1 aggr. */
    static const int values[2][2] = {{V_ECC_SBE_VOLATILE, V_ECC_SBE_AGGREGATE},
                                     {V_ECC_DBE_VOLATILE, V_ECC_DBE_AGGREGATE}};
    static const int errors[2][2] = {{E_ECC_SBE_VOLATILE, E_ECC_SBE_AGGREGATE},
                                     {E_ECC_DBE_VOLATILE, E_ECC_DBE_AGGREGATE}};
    if (error_type < 0 || error_type > 1 || counter_type < 0 || counter_type > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    return get_ull(d, errors[error_type][counter_type], values[error_type][counter_type], count);
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t d, int cause, unsigned int *page_count,
                                       unsigned long long *addresses) {
    ENTER();
    GPU_OR_RETURN(g, d, E_RETIRED_PAGES);
    if (cause < 0 || cause > 1 || !page_count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int pages = (unsigned int)g->v[cause == 0 ? V_RETIRED_SBE : V_RETIRED_DBE];
    unsigned int room = *page_count;
    *page_count = pages;
    if (room < pages || (!addresses && pages)) return NVML_ERROR_INSUFFICIENT_SIZE;
    for (unsigned int i = 0; i < pages; i++)
        addresses[i] = 0x100000ULL * (i + 1) + (unsigned long long)cause;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, int *pending) {
    ENTER();
    return get_uint(d, E_RETIRED_PENDING, V_RETIRED_PENDING, (unsigned int *)pending);
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failure) {
    ENTER();
    GPU_OR_RETURN(g, d, E_REMAPPED_ROWS);
    *corr = (unsigned int)g->v[V_REMAP_CORRECTABLE];
    *unc = (unsigned int)g->v[V_REMAP_UNCORRECTABLE];
    *pending = (unsigned int)g->v[V_REMAP_PENDING];
    *failure = (unsigned int)g->v[V_REMAP_FAILURE];
    return NVML_SUCCESS;
}

/* ---- throttling, PCIe, NVLink ------------------------------------------------------------- */

#ifndef FAKE_NVML_OLD_DRIVER /* before R535 this was only "ClocksThrottleReasons" */
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *r) {
    ENTER();
    return get_ull(d, E_CLOCKS_EVENT, V_CLOCKS_EVENT_REASONS, r);
}
#endif

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *r) {
    ENTER();
    return get_ull(d, E_CLOCKS_EVENT, V_CLOCKS_EVENT_REASONS, r);
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t d, unsigned int *count) {
    ENTER();
    return get_uint(d, E_PCIE_REPLAY, V_PCIE_REPLAY, count);
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, unsigned int *active) {
    ENTER();
    GPU_OR_RETURN(g, d, E_NVLINK_STATE);
    if (g->links == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned int)g->links) return NVML_ERROR_INVALID_ARGUMENT;
    *active = (unsigned int)g->link_state[link];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t d, unsigned int link, int counter,
                                             unsigned long long *value) {
    ENTER();
    if (counter < 0 || counter >= LINK_COUNTERS) return NVML_ERROR_INVALID_ARGUMENT;
    GPU_OR_RETURN(g, d, LINK_ERRORS[counter]);
    if (g->links == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned int)g->links) return NVML_ERROR_INVALID_ARGUMENT;
    *value = g->link_counter[counter][link];
    return NVML_SUCCESS;
}

/* ---- GPM: a sample snapshots tensor_util; a metric reads the later sample's snapshot ------ */
#ifndef FAKE_NVML_OLD_DRIVER /* GPM arrived with R520 */

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *support) {
    ENTER();
    GPU_OR_RETURN(g, d, -1);
    if (support->version != 1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    support->isSupportedDevice = (unsigned int)g->v[V_GPM_SUPPORTED];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    ENTER();
    *sample = calloc(1, sizeof **sample);
    if (!*sample) return NVML_ERROR_UNKNOWN;
    (*sample)->gpu = -1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    ENTER();
    free(sample);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t d, nvmlGpmSample_t sample) {
    ENTER();
    GPU_OR_RETURN(g, d, E_GPM);
    if (!g->v[V_GPM_SUPPORTED]) return NVML_ERROR_NOT_SUPPORTED;
    sample->gpu = gpu_index(d);
    sample->tensor_util = g->tensor_util;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *get) {
    ENTER();
    refresh();
    if (get->version != 1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!get->sample1 || !get->sample2 || get->sample1 == get->sample2 ||
        get->sample1->gpu < 0 || get->sample1->gpu != get->sample2->gpu)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < get->numMetrics; i++) {
        nvmlGpmMetric_t *m = &get->metrics[i];
        m->nvmlReturn = NVML_SUCCESS;
        m->value = get->sample2->tensor_util;
        if (m->metricId != NVML_GPM_METRIC_ANY_TENSOR_UTIL) m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    }
    return NVML_SUCCESS;
}

#endif

/* ---- processes ---------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    ENTER();
    GPU_OR_RETURN(g, d, E_PROCESSES);
    unsigned int room = *count;
    *count = (unsigned int)g->procs;
    if (room < (unsigned int)g->procs || (!infos && g->procs)) return NVML_ERROR_INSUFFICIENT_SIZE;
    for (int i = 0; i < g->procs; i++) {
        infos[i].pid = g->proc_pid[i];
        infos[i].usedGpuMemory = g->proc_mem[i];
        infos[i].gpuInstanceId = infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    return NVML_SUCCESS;
}

/* ---- XID events: each set has its own cursor into the file's xid queue -------------------- */

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    ENTER();
    refresh();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *set = calloc(1, sizeof **set);
    if (!*set) return NVML_ERROR_UNKNOWN;
    (*set)->next_xid = S->xids; /* like NVML: only events after registration are delivered */
    return NVML_SUCCESS;
}

static unsigned long long supported_events(const struct nvml_gpu *g) {
    return NVML_EVENT_TYPE_XID | (g->v[V_NO_DBE_EVENTS] ? 0 : NVML_EVENT_TYPE_DBE);
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    ENTER();
    GPU_OR_RETURN(g, d, E_EVENTS);
    *types = supported_events(g);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types,
                                      nvmlEventSet_t set) {
    ENTER();
    GPU_OR_RETURN(g, d, E_EVENTS);
    if (types & ~supported_events(g)) return NVML_ERROR_NOT_SUPPORTED;
    int k = gpu_index(d);
    if ((types & NVML_EVENT_TYPE_DBE) && !(set->mask[k] & NVML_EVENT_TYPE_DBE))
        set->dbe_seen[k] = g->v[V_ECC_DBE_VOLATILE]; /* only errors after registration */
    set->mask[k] |= types;
    return NVML_SUCCESS;
}

static int next_event(nvmlEventSet_t set, nvmlEventData_t *data) {
    while (set->next_xid < S->xids) {
        int i = set->next_xid++, gpu = S->xid_gpu[i];
        if (gpu < 0 || gpu >= MAX_GPUS || !(set->mask[gpu] & NVML_EVENT_TYPE_XID)) continue;
        memset(data, 0, sizeof *data);
        data->device = &buffers[0].gpu[gpu];
        data->eventType = NVML_EVENT_TYPE_XID;
        data->eventData = S->xid_code[i];
        return 1;
    }
    /* A double-bit ECC error: one event each time a GPU's volatile DBE count grows. */
    for (int k = 0; k < S->gpus && k < MAX_GPUS; k++) {
        unsigned long long now = S->gpu[k].v[V_ECC_DBE_VOLATILE];
        if (!(set->mask[k] & NVML_EVENT_TYPE_DBE) || now == set->dbe_seen[k]) continue;
        int grew = now > set->dbe_seen[k];
        set->dbe_seen[k] = now; /* a smaller count: the GPU was reset, no error */
        if (!grew) continue;
        memset(data, 0, sizeof *data);
        data->device = &buffers[0].gpu[k];
        data->eventType = NVML_EVENT_TYPE_DBE;
        return 1;
    }
    return 0;
}

/* Honours the timeout like NVML does: a caller passing a long one really waits. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int ms) {
    ENTER();
    refresh();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (next_event(set, data)) return NVML_SUCCESS;
    if (ms == 0) return NVML_ERROR_TIMEOUT;
    struct timespec pause = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
    refresh();
    return next_event(set, data) ? NVML_SUCCESS : NVML_ERROR_TIMEOUT;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    ENTER();
    free(set);
    return NVML_SUCCESS;
}
