/*
 * A fake libnvidia-ml.so.1 for jaxmon's tests: the NVML functions jaxmon calls, with the C ABI and struct layouts
 * that nvidia-ml-py (pynvml.py) declares, answering from a JSON scenario file the test writes and rewrites.
 *
 * The scenario's path is $FAKENVML_SCENARIO. It is re-read whenever its inode, size or mtime changes, so a test can
 * change readings, lose a GPU or queue Xid events while the daemon runs. Schema (every field optional; a reading
 * whose key is absent is NOT_SUPPORTED unless said otherwise):
 *
 *   {"init_error": 9,                              NVML error code nvmlInitWithFlags returns
 *    "count_error": 999,                           NVML error code nvmlDeviceGetCount_v2 returns
 *    "driver_version": "550.54.15",
 *    "cuda_driver_version": 12040,                 what nvmlSystemGetCudaDriverVersion{,_v2} answer (absent: 12040)
 *    "devices": [{
 *      "name": "NVIDIA H200", "uuid": "GPU-...", "pci_bus_id": "00000000:18:00.0",
 *      "minor_number": 0,                          N of /dev/nvidiaN (default: the device's index)
 *      "error": 15,                                every call on this device (and its MIG devices) returns it
 *      "handle_error": 15,                         nvmlDeviceGetHandleByIndex_v2 returns it
 *      "delay_ms": 0,                              every call on this device sleeps this long first (a hung call)
 *      "hang_until": 0,                            a wedged GPU: every call on this device blocks until this Unix
 *                                                  time (or until the field goes from the scenario), then answers
 *      "memory": {"total": 1, "reserved": 0, "used": 0},            (absent: zeros)
 *      "utilization": {"gpu": 0, "memory": 0},     percent (absent: zeros)
 *      "encoder_util": 0, "decoder_util": 0,       percent
 *      "power_mw": 0, "power_limit_mw": 0,         (absent: 0)
 *      "power_management_limit_mw": 0, "energy_mj": 0, "temperature_c": 0 (absent: 0),
 *      "fans": [40, 45],                           percent per fan (absent: a board without fans)
 *      "clocks_mhz": {"graphics": 0, "sm": 0, "memory": 0, "video": 0},       current; a clock left out: unsupported
 *      "max_clocks_mhz": {"graphics": 0, "sm": 0, "memory": 0, "video": 0},   maxima
 *      "clocks_event_reasons": 0,                  the bitmask (absent: 0)
 *      "ecc": {"enabled": true, "corrected": 0, "uncorrected": 0},            absent: ECC not supported
 *      "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false},
 *      "pcie": {"tx_kbps": 0, "rx_kbps": 0, "replays": 0, "sample_ms": 0},    sample_ms: each throughput call
 *                                                  sleeps this long, as the driver samples for 20 ms
 *      "nvlink": [{"active": true, "tx_kib": 0, "rx_kib": 0,                  one entry per link; past the last:
 *                  "replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0,  INVALID_ARGUMENT; "remote": the PCI
 *                  "remote": "00000000:3B:00.0"}],              bus id at the link's far end (absent: NOT_SUPPORTED)
 *      "topology": {"1": 10, "2": 40},             the common ancestor with each other GPU by its index
 *                                                  (nvmlGpuTopologyLevel_t; a GPU left out: NOT_SUPPORTED)
 *      "p2p_nvlink": {"1": true},                  GPUs whose NVLink P2P status is OK (the others NOT_SUPPORTED)
 *      "mig": {"current": 1, "pending": 1, "max_devices": 7,                  absent: no MIG on this GPU
 *              "devices": [{"index": 0, "uuid": "MIG-...", "name": "NVIDIA H200 MIG 1g.18gb",
 *                           "gpu_instance": 9, "compute_instance": 0, "memory": {...},
 *                           "utilization": {...},  absent: NOT_SUPPORTED, as current drivers answer for MIG
 *                           "error": 0, "not_supported": [...]}]},
 *      "gpm": {"supported": true,                 GPM (absent: isSupportedDevice = 0); per metric id, the percent
 *              "metrics": {"2": 80.5, ...},        nvmlGpmMetricsGet gives over an interval ending at a sample taken
 *              "errors": {"12": 999}},             while the scenario said so; "errors": that metric's nvmlReturn.
 *                                                  A MIG device entry's "gpm" {"metrics", "errors"} is its GPU
 *                                                  instance's (nvmlGpmMigSampleGet; absent: NOT_SUPPORTED).
 *                                                  "not_supported": ["gpm"] / "fail": {"gpm": N} apply to every GPM
 *                                                  call on the device, "fail": {"gpm_metrics": N} to
 *                                                  nvmlGpmMetricsGet on its samples. Samples under 100 ms apart give
 *                                                  INVALID_ARGUMENT, as NVML's floor does. $FAKENVML_STATE names a
 *                                                  JSON file the fake keeps up to date with its GPM sample counts
 *                                                  (live, and since this scenario file was first read: allocated,
 *                                                  freed, short intervals, bad pointers), and with the device calls
 *                                                  blocked now in a "delay_ms" or "hang_until" (blocked_calls).
 *      "processes": [{"pid": 1, "used": 0,        compute processes; "used": null is NVML_VALUE_NOT_AVAILABLE
 *                     "utilization": {"sm": 0, "memory": 0, "encoder": 0, "decoder": 0}}],
 *                                                  a process with "utilization" has that sample, timestamped at the
 *                                                  call, or a list of samples, each with "at_us" (its timestamp)
 *                                                  or stamped at the call; both per-process utilization calls
 *                                                  return those after their lastSeenTimeStamp (NOT_FOUND: none;
 *                                                  NOT_SUPPORTED in MIG mode)
 *      "graphics_processes": [{"pid": 1, "used": 0}],  graphics processes (absent: none)
 *      "fail": {"nvlink_errors": 999},             calls (named as in not_supported) that return that error
 *      "not_supported": ["power", ...]}],          calls that return NOT_SUPPORTED: memory, utilization,
 *                                                  encoder, decoder, power, power_limit, power_management_limit,
 *                                                  energy, temperature, fans, clock, max_clock,
 *                                                  clocks_event_reasons, remapped_rows, pcie_throughput,
 *                                                  pcie_replay, nvlink, nvlink_errors, nvlink_throughput, topology (the
 *                                                  fields' own return codes), field_values (the whole call),
 *                                                  mig, processes, process_utilization, events
 *    "events": [{"device": 0, "type": 8, "data": 79}]}   delivered once each, in order, by nvmlEventSetWait_v2
 *                                                  (which blocks, as the driver's does, until the scenario's
 *                                                  directory changes or the timeout: inotify, not a polling loop)
 *
 * Compiled with -DFAKENVML_LEGACY it lacks the newer symbols (nvmlDeviceGetMemoryInfo_v2,
 * nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetCurrentClocksEventReasons, nvmlDeviceGetNumFans,
 * nvmlDeviceGetFanSpeed_v2, nvmlDeviceGetRemappedRows, the MIG calls and GPM; nvmlDeviceGetTemperatureV,
 * nvmlSystemGetCudaDriverVersion_v2, nvmlDeviceGetGraphicsRunningProcesses_v3 and
 * nvmlDeviceGetProcessesUtilizationInfo), as an old driver does. With -DFAKENVML_NO_PROCESS_UTILIZATION it lacks
 * both per-process utilization calls, as a driver without them (a call is then FUNCTION_NOT_FOUND in pynvml).
 *
 * Besides jaxmon's calls it answers those nvitop (nvitop-exporter, bench/node_weight.py) makes: the CUDA driver
 * version, the versioned temperature, graphics processes, per-process utilization samples and the NVLink link
 * count field.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <poll.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

/* ---- the layouts pynvml.py declares ------------------------------------------------------------------------ */

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;                     /* c_nvmlMemory_t */
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))              /* nvmlMemory_v2 */
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;                            /* c_nvmlUtilization_t */
typedef struct {                                                                           /* c_nvmlProcessInfo_v2_t */
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct {                                                         /* c_nvmlProcessUtilizationSample_t */
    unsigned int pid;
    unsigned long long timeStamp;                                                          /* CPU time, in us */
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
typedef struct {                                                       /* c_nvmlProcessUtilizationInfo_v1_t */
    unsigned long long timeStamp;                                                          /* CPU time, in us */
    unsigned int pid, smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil;
} nvmlProcessUtilizationInfo_v1_t;
typedef struct {                                                     /* c_nvmlProcessesUtilizationInfo_v1_t */
    unsigned int version, processSamplesCount;
    unsigned long long lastSeenTimeStamp;
    nvmlProcessUtilizationInfo_v1_t *procUtilArray;
} nvmlProcessesUtilizationInfo_t;
#define NVML_PROCESSES_UTILIZATION_INFO_V1                                      /* ProcessesUtilizationInfo_v1 */ \
    ((unsigned int)(sizeof(nvmlProcessesUtilizationInfo_t) | (1u << 24)))
typedef struct {                                                                   /* c_nvmlTemperature_v1_t */
    unsigned int version;
    int sensorType;                                                                /* _nvmlTemperatureSensors_t */
    int temperature;
} nvmlTemperature_v1_t;
#define NVML_TEMPERATURE_V1 ((unsigned int)(sizeof(nvmlTemperature_v1_t) | (1u << 24)))   /* nvmlTemperature_v1 */
typedef struct {                                                                           /* nvmlPciInfo_t */
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef union {                                                                            /* c_nvmlValue_t */
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;
typedef struct {                                                                           /* c_nvmlFieldValue_t */
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType;                                                                /* _nvmlValueType_t */
    unsigned int nvmlReturn;                                                               /* _nvmlReturn_t */
    nvmlValue_t value;
} nvmlFieldValue_t;
#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3
#define NVML_FI_DEV_NVLINK_LINK_COUNT 91
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX 138
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX 139
struct fake_device;
typedef struct fake_device *nvmlDevice_t;
typedef struct {                                                                           /* c_nvmlEventData_t */
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
struct fake_event_set;
typedef struct fake_event_set *nvmlEventSet_t;

#define NVML_VALUE_NOT_AVAILABLE_ULL (~0ULL)

/* ---- a small JSON reader: a tree of nodes ------------------------------------------------------------------- */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;
typedef struct jnode {
    jtype type;
    double num;
    char *str;            /* J_STR value */
    char *key;            /* member name inside an object */
    struct jnode *child;  /* first element / member */
    struct jnode *next;   /* next sibling */
} jnode;

static const char *jp;

static void jfree(jnode *n) {
    while (n) {
        jnode *next = n->next;
        jfree(n->child);
        free(n->str);
        free(n->key);
        free(n);
        n = next;
    }
}

static void jskip(void) { while (*jp && isspace((unsigned char)*jp)) jp++; }

static char *jstring(void) {
    if (*jp != '"') return NULL;
    jp++;
    size_t cap = 16, len = 0;
    char *out = malloc(cap);
    while (*jp && *jp != '"') {
        char c = *jp++;
        if (c == '\\') {
            c = *jp++;
            if (c == 'n') c = '\n';
            else if (c == 't') c = '\t';
            else if (c == 'u') { jp += 4; c = '?'; }  /* the tests write ASCII */
        }
        if (len + 2 > cap) out = realloc(out, cap *= 2);
        out[len++] = c;
    }
    if (*jp != '"') { free(out); return NULL; }
    jp++;
    out[len] = 0;
    return out;
}

static jnode *jvalue(void) {
    jskip();
    jnode *n = calloc(1, sizeof *n);
    if (*jp == '{' || *jp == '[') {
        char close = *jp == '{' ? '}' : ']';
        n->type = *jp == '{' ? J_OBJ : J_ARR;
        jp++;
        jnode **tail = &n->child;
        jskip();
        if (*jp == close) { jp++; return n; }
        for (;;) {
            char *key = NULL;
            jskip();
            if (n->type == J_OBJ) {
                key = jstring();
                jskip();
                if (!key || *jp != ':') { free(key); jfree(n); return NULL; }
                jp++;
            }
            jnode *item = jvalue();
            if (!item) { free(key); jfree(n); return NULL; }
            item->key = key;
            *tail = item;
            tail = &item->next;
            jskip();
            if (*jp == ',') { jp++; continue; }
            if (*jp == close) { jp++; return n; }
            jfree(n);
            return NULL;
        }
    }
    if (*jp == '"') {
        n->type = J_STR;
        n->str = jstring();
        if (!n->str) { jfree(n); return NULL; }
        return n;
    }
    if (!strncmp(jp, "true", 4)) { n->type = J_BOOL; n->num = 1; jp += 4; return n; }
    if (!strncmp(jp, "false", 5)) { n->type = J_BOOL; jp += 5; return n; }
    if (!strncmp(jp, "null", 4)) { n->type = J_NULL; jp += 4; return n; }
    char *end;
    n->num = strtod(jp, &end);
    if (end == jp) { jfree(n); return NULL; }
    n->type = J_NUM;
    jp = end;
    return n;
}

static jnode *jget(const jnode *obj, const char *key) {
    if (!obj || obj->type != J_OBJ) return NULL;
    for (jnode *c = obj->child; c; c = c->next)
        if (!strcmp(c->key, key)) return c;
    return NULL;
}

static double jnum(const jnode *obj, const char *key, double dflt) {
    const jnode *n = jget(obj, key);
    return n && (n->type == J_NUM || n->type == J_BOOL) ? n->num : dflt;
}

static const char *jstr(const jnode *obj, const char *key, const char *dflt) {
    const jnode *n = jget(obj, key);
    return n && n->type == J_STR ? n->str : dflt;
}

/* ---- the scenario ------------------------------------------------------------------------------------------- */

#define MAX_DEVICES 64
#define MAX_MIG 8
/* A GPU's handle (mig = -1) or one of its MIG devices' (mig = the MIG device index on the GPU). */
struct fake_device { int index, mig; };
static struct fake_device handles[MAX_DEVICES];
static struct fake_device mig_handles[MAX_DEVICES][MAX_MIG];

static int is_gpu_handle(const struct fake_device *h) {
    return (uintptr_t)h >= (uintptr_t)handles && (uintptr_t)h < (uintptr_t)(handles + MAX_DEVICES);
}

static int is_mig_handle(const struct fake_device *h) {
    uintptr_t first = (uintptr_t)&mig_handles[0][0];
    return (uintptr_t)h >= first && (uintptr_t)h < first + sizeof mig_handles;
}

struct fake_event_set { unsigned long long registered[MAX_DEVICES]; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static jnode *scenario;
static struct stat seen;
static char seen_path[4096];
static int initialized;
static size_t events_delivered;
static void gpm_new_scenario_locked(void);
/* GPM sample counts (the GPM section keeps them), and the device calls blocked now in a delay or a hang. */
static long gpm_live_count, gpm_allocated, gpm_freed, gpm_short_intervals, gpm_bad_samples, gpm_metrics_calls;
static long blocked_calls;

/* $FAKENVML_STATE, when set: what the fake saw, rewritten (atomically) whenever a count other than the metrics
 * calls changes, so a test reads the live samples after polls, a lost GPU and shutdown, and the calls blocked now
 * in a device's "delay_ms" or "hang_until" (so a test knows a poll is inside a hung call before it relies on it). */
static void write_state_locked(void) {
    const char *path = getenv("FAKENVML_STATE");
    if (!path) return;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f,
            "{\"gpm_live_samples\": %ld, \"gpm_allocated\": %ld, \"gpm_freed\": %ld, \"gpm_short_intervals\": %ld, "
            "\"gpm_bad_samples\": %ld, \"gpm_metrics_calls\": %ld, \"blocked_calls\": %ld}\n",
            gpm_live_count, gpm_allocated, gpm_freed, gpm_short_intervals, gpm_bad_samples, gpm_metrics_calls,
            blocked_calls);
    fclose(f);
    rename(tmp, path);
}

/* Re-read the scenario when the file changed; keep the last good one when it is half-written or unreadable. */
static void reload_locked(void) {
    const char *path = getenv("FAKENVML_SCENARIO");
    struct stat st;
    if (!path || stat(path, &st) != 0) return;
    if (scenario && !strcmp(path, seen_path) && st.st_ino == seen.st_ino && st.st_size == seen.st_size &&
        st.st_mtim.tv_sec == seen.st_mtim.tv_sec && st.st_mtim.tv_nsec == seen.st_mtim.tv_nsec)
        return;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    char *text = malloc((size_t)st.st_size + 1);
    size_t got = fread(text, 1, (size_t)st.st_size, f);
    fclose(f);
    text[got] = 0;
    jp = text;
    jnode *parsed = jvalue();
    free(text);
    if (!parsed || parsed->type != J_OBJ) { jfree(parsed); return; }
    jfree(scenario);
    scenario = parsed;
    seen = st;
    /* Events are delivered once per scenario file: a test appends to the list and rewrites the same file. */
    if (strcmp(path, seen_path)) {
        events_delivered = 0;
        gpm_new_scenario_locked();
    }
    snprintf(seen_path, sizeof seen_path, "%s", path);
}

static jnode *device_node(int index) {
    jnode *devs = jget(scenario, "devices");
    if (!devs || devs->type != J_ARR) return NULL;
    int i = 0;
    for (jnode *d = devs->child; d; d = d->next, i++)
        if (i == index) return d;
    return NULL;
}

static int device_count(void) {
    jnode *devs = jget(scenario, "devices");
    int n = 0;
    if (devs && devs->type == J_ARR)
        for (jnode *d = devs->child; d; d = d->next) n++;
    return n;
}

static int unsupported(const jnode *dev, const char *what) {
    const jnode *list = jget(dev, "not_supported");
    if (!list || list->type != J_ARR) return 0;
    for (const jnode *c = list->child; c; c = c->next)
        if (c->type == J_STR && !strcmp(c->str, what)) return 1;
    return 0;
}

/* The MIG device at `index` of a GPU in the scenario ("index" of the entry, else its place in the list). */
static jnode *mig_node(const jnode *dev, int index) {
    jnode *list = jget(jget(dev, "mig"), "devices");
    if (!list || list->type != J_ARR) return NULL;
    int i = 0;
    for (jnode *m = list->child; m; m = m->next, i++)
        if ((int)jnum(m, "index", i) == index) return m;
    return NULL;
}

static void sleep_ms(double ms) {
    if (ms <= 0) return;
    struct timespec ts = {(time_t)(ms / 1000), (long)((ms - 1000.0 * (long)(ms / 1000)) * 1e6)};
    nanosleep(&ts, NULL);
}

/*
 * Every device call starts here: reload, find the device (and the MIG device, for a MIG handle), apply its delay
 * (outside the lock, as a hung driver call would not hold up the other GPUs), its error, and the "not_supported"
 * list (a MIG device's own). Returns with the lock held on success; *mig is NULL for a GPU's handle.
 */
static nvmlReturn_t enter_handle(nvmlDevice_t handle, const char *what, jnode **dev, jnode **mig) {
    int is_mig = is_mig_handle(handle);
    if (!handle || (!is_mig && !is_gpu_handle(handle))) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    if (!initialized) { pthread_mutex_unlock(&lock); return NVML_ERROR_UNINITIALIZED; }
    reload_locked();
    *dev = device_node(handle->index);
    if (!*dev) { pthread_mutex_unlock(&lock); return NVML_ERROR_INVALID_ARGUMENT; }
    double delay = jnum(*dev, "delay_ms", 0);
    if (delay > 0) {
        blocked_calls++;
        write_state_locked();
        pthread_mutex_unlock(&lock);
        sleep_ms(delay);
        pthread_mutex_lock(&lock);
        blocked_calls--;
        write_state_locked();
        reload_locked();
        *dev = device_node(handle->index);
        if (!*dev) { pthread_mutex_unlock(&lock); return NVML_ERROR_INVALID_ARGUMENT; }
    }
    /* A wedged GPU: block, re-reading the scenario every 50 ms (the test may end the hang early), never holding the
     * lock that the other GPUs' calls need. */
    int hung = 0;
    for (;;) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        double left = jnum(*dev, "hang_until", 0) - ((double)now.tv_sec + now.tv_nsec / 1e9);
        if (left <= 0) break;
        if (!hung) {
            hung = 1;
            blocked_calls++;
            write_state_locked();
        }
        pthread_mutex_unlock(&lock);
        sleep_ms(left * 1000 < 50 ? left * 1000 : 50);
        pthread_mutex_lock(&lock);
        reload_locked();
        *dev = device_node(handle->index);
        if (!*dev) break;
    }
    if (hung) {
        blocked_calls--;
        write_state_locked();
    }
    if (!*dev) { pthread_mutex_unlock(&lock); return NVML_ERROR_INVALID_ARGUMENT; }
    int err = (int)jnum(*dev, "error", 0);
    *mig = NULL;
    if (!err && is_mig) {
        *mig = mig_node(*dev, handle->mig);
        if (!*mig) err = NVML_ERROR_INVALID_ARGUMENT; /* the MIG device was destroyed */
        else err = (int)jnum(*mig, "error", 0);
    }
    if (!err && what && unsupported(*mig ? *mig : *dev, what)) err = NVML_ERROR_NOT_SUPPORTED;
    if (!err && what) err = (int)jnum(jget(*mig ? *mig : *dev, "fail"), what, 0);
    if (err) { pthread_mutex_unlock(&lock); return err; }
    return NVML_SUCCESS;
}

/* A call MIG device handles do not take (NOT_SUPPORTED for them, as NVML answers for most GPU-wide readings). */
static nvmlReturn_t enter_device(nvmlDevice_t handle, const char *what, jnode **dev) {
    jnode *mig;
    nvmlReturn_t r = enter_handle(handle, what, dev, &mig);
    if (r) return r;
    if (mig) { pthread_mutex_unlock(&lock); return NVML_ERROR_NOT_SUPPORTED; }
    return NVML_SUCCESS;
}

static nvmlReturn_t leave(nvmlReturn_t ret) {
    pthread_mutex_unlock(&lock);
    return ret;
}

static nvmlReturn_t copy_string(const char *value, char *out, unsigned int length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return NVML_SUCCESS;
}

/* ---- the API ------------------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    reload_locked();
    int err = scenario ? (int)jnum(scenario, "init_error", 0) : NVML_ERROR_DRIVER_NOT_LOADED;
    if (!err) initialized++;
    return leave(err);
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    if (!initialized) return leave(NVML_ERROR_UNINITIALIZED);
    initialized--;
    return leave(NVML_SUCCESS);
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
        case NVML_SUCCESS: return "Success";
        case 15: return "GPU is lost";
        case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
        case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
        case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
        case NVML_ERROR_NOT_FOUND: return "Not Found";
        case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
        case NVML_ERROR_TIMEOUT: return "Timeout";
        case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
        default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    pthread_mutex_lock(&lock);
    if (!initialized) return leave(NVML_ERROR_UNINITIALIZED);
    reload_locked();
    return leave(copy_string(jstr(scenario, "driver_version", "550.54.15"), version, length));
}

/* CUDA's version as an integer, 1000 * major + 10 * minor (12040 is CUDA 12.4, as a 550 driver reports). */
static nvmlReturn_t cuda_driver_version(int *version) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    reload_locked();
    *version = (int)jnum(scenario, "cuda_driver_version", 12040);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) { return cuda_driver_version(version); }

#ifndef FAKENVML_LEGACY
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { return cuda_driver_version(version); }
#endif

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    pthread_mutex_lock(&lock);
    if (!initialized) return leave(NVML_ERROR_UNINITIALIZED);
    reload_locked();
    int err = (int)jnum(scenario, "count_error", 0);
    if (err) return leave(err);
    *count = (unsigned int)device_count();
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    pthread_mutex_lock(&lock);
    if (!initialized) return leave(NVML_ERROR_UNINITIALIZED);
    reload_locked();
    jnode *dev = device_node((int)index);
    if (!dev || index >= MAX_DEVICES) return leave(NVML_ERROR_INVALID_ARGUMENT);
    int err = (int)jnum(dev, "handle_error", 0);
    if (err) return leave(err);
    handles[index].index = (int)index;
    handles[index].mig = -1;
    *device = &handles[index];
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    jnode *dev;
    nvmlReturn_t r = enter_device(device, NULL, &dev);
    if (r) return r;
    *index = (unsigned int)device->index;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    jnode *dev, *mig;
    nvmlReturn_t r = enter_handle(device, NULL, &dev, &mig);
    if (r) return r;
    const char *value = mig ? jstr(mig, "name", "NVIDIA Fake GPU MIG 1g.18gb") : jstr(dev, "name", "NVIDIA Fake GPU");
    return leave(copy_string(value, name, length));
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    jnode *dev, *mig;
    nvmlReturn_t r = enter_handle(device, NULL, &dev, &mig);
    if (r) return r;
    const char *dflt = mig ? "MIG-00000000-0000-0000-0000-000000000000" : "GPU-00000000-0000-0000-0000-000000000000";
    return leave(copy_string(jstr(mig ? mig : dev, "uuid", dflt), uuid, length));
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    jnode *dev;
    nvmlReturn_t r = enter_device(device, NULL, &dev);
    if (r) return r;
    *minor = (unsigned int)jnum(dev, "minor_number", device->index);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    jnode *dev;
    nvmlReturn_t r = enter_device(device, NULL, &dev);
    if (r) return r;
    memset(pci, 0, sizeof *pci);
    const char *bus_id = jstr(dev, "pci_bus_id", "00000000:00:00.0");
    snprintf(pci->busId, sizeof pci->busId, "%s", bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", bus_id + (strlen(bus_id) > 12 ? 4 : 0));
    unsigned int domain = 0, bus = 0, dev_no = 0;
    sscanf(bus_id, "%x:%x:%x", &domain, &bus, &dev_no);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev_no;
    return leave(NVML_SUCCESS);
}

static void memory_of(const jnode *dev, unsigned long long *total, unsigned long long *reserved,
                      unsigned long long *used) {
    const jnode *m = jget(dev, "memory");
    *total = (unsigned long long)jnum(m, "total", 0);
    *reserved = (unsigned long long)jnum(m, "reserved", 0);
    *used = (unsigned long long)jnum(m, "used", 0);
}

#ifndef FAKENVML_LEGACY
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    jnode *dev, *mig;
    nvmlReturn_t r = enter_handle(device, "memory", &dev, &mig);
    if (r) return r;
    if (memory->version != NVML_MEMORY_V2) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    memory_of(mig ? mig : dev, &memory->total, &memory->reserved, &memory->used);
    memory->free = memory->total - memory->reserved - memory->used;
    return leave(NVML_SUCCESS);
}
#endif

/* v1 counts the driver's reservation as used, as the real library does. */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    jnode *dev, *mig;
    nvmlReturn_t r = enter_handle(device, "memory", &dev, &mig);
    if (r) return r;
    unsigned long long reserved;
    memory_of(mig ? mig : dev, &memory->total, &reserved, &memory->used);
    memory->used += reserved;
    memory->free = memory->total - memory->used;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    jnode *dev, *mig;
    nvmlReturn_t r = enter_handle(device, "utilization", &dev, &mig);
    if (r) return r;
    const jnode *u = jget(mig ? mig : dev, "utilization");
    if (mig && !u) return leave(NVML_ERROR_NOT_SUPPORTED); /* as current drivers answer for MIG devices */
    util->gpu = (unsigned int)jnum(u, "gpu", 0);
    util->memory = (unsigned int)jnum(u, "memory", 0);
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t read_uint(nvmlDevice_t device, const char *what, const char *key, unsigned int *out) {
    jnode *dev;
    nvmlReturn_t r = enter_device(device, what, &dev);
    if (r) return r;
    *out = (unsigned int)jnum(dev, key, 0);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    return read_uint(device, "power", "power_mw", power);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    return read_uint(device, "power_limit", "power_limit_mw", limit);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT; /* NVML_TEMPERATURE_GPU */
    return read_uint(device, "temperature", "temperature_c", temp);
}

#ifndef FAKENVML_LEGACY
/* The versioned call: the struct's version must be nvmlTemperature_v1; the sensor NVML_TEMPERATURE_GPU (0). */
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_v1_t *temp) {
    jnode *dev;
    if (!temp) return NVML_ERROR_INVALID_ARGUMENT;
    if (temp->version != NVML_TEMPERATURE_V1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temp->sensorType != 0) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, "temperature", &dev);
    if (r) return r;
    temp->temperature = (int)jnum(dev, "temperature_c", 0);
    return leave(NVML_SUCCESS);
}
#endif

/* NVML_CLOCK_GRAPHICS, _SM, _MEM, _VIDEO; a clock the scenario leaves out is NOT_SUPPORTED. */
static nvmlReturn_t clock_of(nvmlDevice_t device, const char *what, const char *key, unsigned int type,
                             unsigned int *clock) {
    static const char *names[] = {"graphics", "sm", "memory", "video"};
    jnode *dev;
    if (!clock) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, what, &dev);
    if (r) return r;
    if (type > 3) return leave(NVML_ERROR_INVALID_ARGUMENT);
    const jnode *value = jget(jget(dev, key), names[type]);
    if (!value || value->type != J_NUM) return leave(NVML_ERROR_NOT_SUPPORTED);
    *clock = (unsigned int)value->num;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock) {
    return clock_of(device, "clock", "clocks_mhz", type, clock);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock) {
    return clock_of(device, "max_clock", "max_clocks_mhz", type, clock);
}

static nvmlReturn_t reasons(nvmlDevice_t device, unsigned long long *out) {
    jnode *dev;
    nvmlReturn_t r = enter_device(device, "clocks_event_reasons", &dev);
    if (r) return r;
    *out = (unsigned long long)jnum(dev, "clocks_event_reasons", 0);
    return leave(NVML_SUCCESS);
}

#ifndef FAKENVML_LEGACY
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *out) {
    return reasons(device, out);
}
#endif

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *out) {
    return reasons(device, out);
}

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, int *current, int *pending) {
    jnode *dev;
    nvmlReturn_t r = enter_device(device, NULL, &dev);
    if (r) return r;
    const jnode *ecc = jget(dev, "ecc");
    if (!ecc) return leave(NVML_ERROR_NOT_SUPPORTED);
    *current = *pending = (int)jnum(ecc, "enabled", 1);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type, int counter_type,
                                         unsigned long long *count) {
    jnode *dev;
    nvmlReturn_t r = enter_device(device, NULL, &dev);
    if (r) return r;
    const jnode *ecc = jget(dev, "ecc");
    if (!ecc || !jnum(ecc, "enabled", 1)) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (counter_type != 0) return leave(NVML_ERROR_NOT_SUPPORTED); /* only NVML_VOLATILE_ECC */
    if (error_type == 0) *count = (unsigned long long)jnum(ecc, "corrected", 0);
    else if (error_type == 1) *count = (unsigned long long)jnum(ecc, "uncorrected", 0);
    else return leave(NVML_ERROR_INVALID_ARGUMENT);
    return leave(NVML_SUCCESS);
}

/* The two-call protocol pynvml uses: count with a NULL array (INSUFFICIENT_SIZE when there are any), then fill.
 * `key` is the scenario's list: "processes" (compute) or "graphics_processes". */
static nvmlReturn_t processes_of(nvmlDevice_t device, const char *key, unsigned int *count, nvmlProcessInfo_t *infos) {
    jnode *dev;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, "processes", &dev);
    if (r) return r;
    const jnode *list = jget(dev, key);
    unsigned int n = 0;
    if (list && list->type == J_ARR)
        for (const jnode *p = list->child; p; p = p->next) n++;
    if (n > *count || (!infos && n > 0)) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    *count = n;
    unsigned int i = 0;
    if (n)
        for (const jnode *p = list->child; p; p = p->next, i++) {
            const jnode *used = jget(p, "used");
            infos[i].pid = (unsigned int)jnum(p, "pid", 0);
            infos[i].usedGpuMemory = used && used->type == J_NUM ? (unsigned long long)used->num
                                                                 : NVML_VALUE_NOT_AVAILABLE_ULL;
            infos[i].gpuInstanceId = infos[i].computeInstanceId = 0xFFFFFFFFu;
        }
    return leave(NVML_SUCCESS);
}

#ifndef FAKENVML_LEGACY
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    return processes_of(device, "processes", count, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                      nvmlProcessInfo_t *infos) {
    return processes_of(device, "graphics_processes", count, infos);
}
#endif

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    return processes_of(device, "processes", count, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                      nvmlProcessInfo_t *infos) {
    return processes_of(device, "graphics_processes", count, infos);
}

/*
 * Per-process utilization samples. A compute process's "utilization" is one sample ({"sm", "memory", "encoder",
 * "decoder"} in percent), or a list of them; a sample with "at_us" carries that CPU timestamp (microseconds of
 * CLOCK_REALTIME, as the driver's), one without it is stamped at the call. A call returns the samples stamped after
 * its `last_seen`, in the two-call protocol of the process lists (a NULL array or a short one: INSUFFICIENT_SIZE and
 * the count); none at all is NOT_FOUND, as a driver answers when no process ran since `last_seen`. A GPU in MIG
 * mode ("mig": {"current": 1}) is NOT_SUPPORTED (nvml.h: "On MIG-enabled GPUs, querying process utilization is not
 * currently supported"). Both calls (nvmlDeviceGetProcessUtilization, and nvmlDeviceGetProcessesUtilizationInfo
 * with its versioned struct) answer from this one function; `fill` writes sample `i`.
 */
#ifndef FAKENVML_NO_PROCESS_UTILIZATION
struct util_sample { unsigned int pid; unsigned long long stamp; unsigned int sm, mem, enc, dec; };

static unsigned long long now_us(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (unsigned long long)now.tv_sec * 1000000ULL + (unsigned long long)now.tv_nsec / 1000;
}

/* Visit the samples after `last_seen` (with the lock held); returns how many there are. */
static unsigned int util_samples(const jnode *dev, unsigned long long last_seen, struct util_sample *out,
                                 unsigned int room) {
    const jnode *list = jget(dev, "processes");
    unsigned long long stamp = now_us();
    unsigned int n = 0;
    if (!list || list->type != J_ARR) return 0;
    for (const jnode *p = list->child; p; p = p->next) {
        const jnode *u = jget(p, "utilization");
        if (!u) continue;
        const jnode *one = u->type == J_ARR ? u->child : u;
        for (; one; one = u->type == J_ARR ? one->next : NULL) {
            const jnode *at = jget(one, "at_us");
            unsigned long long when = at && at->type == J_NUM ? (unsigned long long)at->num : stamp;
            if (when <= last_seen) continue;
            if (out && n < room) {
                out[n].pid = (unsigned int)jnum(p, "pid", 0);
                out[n].stamp = when;
                out[n].sm = (unsigned int)jnum(one, "sm", 0);
                out[n].mem = (unsigned int)jnum(one, "memory", 0);
                out[n].enc = (unsigned int)jnum(one, "encoder", 0);
                out[n].dec = (unsigned int)jnum(one, "decoder", 0);
            }
            n++;
        }
    }
    return n;
}

#define MAX_UTIL_SAMPLES 256

/* The common part of both calls: enter, refuse MIG mode, count; fills `found` (up to MAX_UTIL_SAMPLES) and returns
 * with the lock held on success. */
static nvmlReturn_t enter_util(nvmlDevice_t device, unsigned long long last_seen, struct util_sample *found,
                               unsigned int *n) {
    jnode *dev;
    nvmlReturn_t r = enter_device(device, "process_utilization", &dev);
    if (r) return r;
    if (jnum(jget(dev, "mig"), "current", 0) == 1) return leave(NVML_ERROR_NOT_SUPPORTED);
    *n = util_samples(dev, last_seen, found, MAX_UTIL_SAMPLES);
    if (*n > MAX_UTIL_SAMPLES) *n = MAX_UTIL_SAMPLES;
    if (*n == 0) return leave(NVML_ERROR_NOT_FOUND);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *samples,
                                             unsigned int *count, unsigned long long last_seen) {
    struct util_sample found[MAX_UTIL_SAMPLES];
    unsigned int n;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_util(device, last_seen, found, &n);
    if (r) return r;
    if (!samples || *count < n) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int i = 0; i < n; i++) {
        samples[i].pid = found[i].pid;
        samples[i].timeStamp = found[i].stamp;
        samples[i].smUtil = found[i].sm;
        samples[i].memUtil = found[i].mem;
        samples[i].encUtil = found[i].enc;
        samples[i].decUtil = found[i].dec;
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

#ifndef FAKENVML_LEGACY
nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device, nvmlProcessesUtilizationInfo_t *info) {
    struct util_sample found[MAX_UTIL_SAMPLES];
    unsigned int n;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != NVML_PROCESSES_UTILIZATION_INFO_V1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t r = enter_util(device, info->lastSeenTimeStamp, found, &n);
    if (r) return r;
    if (!info->procUtilArray || info->processSamplesCount < n) {
        info->processSamplesCount = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int i = 0; i < n; i++) {
        nvmlProcessUtilizationInfo_v1_t *s = &info->procUtilArray[i];
        s->timeStamp = found[i].stamp;
        s->pid = found[i].pid;
        s->smUtil = found[i].sm;
        s->memUtil = found[i].mem;
        s->encUtil = found[i].enc;
        s->decUtil = found[i].dec;
        s->jpgUtil = s->ofaUtil = 0;
    }
    info->processSamplesCount = n;
    return leave(NVML_SUCCESS);
}
#endif
#endif

/* ---- the readings of issue 22: fans, encoder/decoder, energy, PCIe, row remapper ----------------------------- */

/* A number the scenario must name: absent is NOT_SUPPORTED (unlike read_uint's older readings, absent = 0). */
static nvmlReturn_t read_present(nvmlDevice_t device, const char *what, const char *key, double *out) {
    jnode *dev;
    nvmlReturn_t r = enter_device(device, what, &dev);
    if (r) return r;
    const jnode *value = jget(dev, key);
    if (!value || value->type != J_NUM) return leave(NVML_ERROR_NOT_SUPPORTED);
    *out = value->num;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t utilization_of(nvmlDevice_t device, const char *what, const char *key, unsigned int *util,
                                   unsigned int *period_us) {
    double value;
    if (!util || !period_us) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = read_present(device, what, key, &value);
    if (r) return r;
    *util = (unsigned int)value;
    *period_us = 167000; /* a sample period of 1/6 s */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *util, unsigned int *period_us) {
    return utilization_of(device, "encoder", "encoder_util", util, period_us);
}

nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *util, unsigned int *period_us) {
    return utilization_of(device, "decoder", "decoder_util", util, period_us);
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit) {
    double value;
    if (!limit) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = read_present(device, "power_management_limit", "power_management_limit_mw", &value);
    if (!r) *limit = (unsigned int)value;
    return r;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    double value;
    if (!energy) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = read_present(device, "energy", "energy_mj", &value);
    if (!r) *energy = (unsigned long long)value;
    return r;
}

/* The fans of the scenario ("fans": a list of percents); NOT_SUPPORTED for a board without. */
static nvmlReturn_t fan_speed(nvmlDevice_t device, unsigned int fan, unsigned int *speed) {
    jnode *dev;
    if (!speed) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, "fans", &dev);
    if (r) return r;
    const jnode *fans = jget(dev, "fans");
    if (!fans || fans->type != J_ARR || !fans->child) return leave(NVML_ERROR_NOT_SUPPORTED);
    unsigned int i = 0;
    for (const jnode *f = fans->child; f; f = f->next, i++)
        if (i == fan) {
            *speed = (unsigned int)f->num;
            return leave(NVML_SUCCESS);
        }
    return leave(NVML_ERROR_INVALID_ARGUMENT);
}

nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed) { return fan_speed(device, 0, speed); }

#ifndef FAKENVML_LEGACY
nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan, unsigned int *speed) {
    return fan_speed(device, fan, speed);
}

nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t device, unsigned int *count) {
    jnode *dev;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, "fans", &dev);
    if (r) return r;
    const jnode *fans = jget(dev, "fans");
    if (!fans || fans->type != J_ARR) return leave(NVML_ERROR_NOT_SUPPORTED);
    unsigned int n = 0;
    for (const jnode *f = fans->child; f; f = f->next) n++;
    *count = n;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *correctable, unsigned int *uncorrectable,
                                       unsigned int *pending, unsigned int *failure) {
    jnode *dev;
    if (!correctable || !uncorrectable || !pending || !failure) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, "remapped_rows", &dev);
    if (r) return r;
    const jnode *rows = jget(dev, "remapped_rows");
    if (!rows) return leave(NVML_ERROR_NOT_SUPPORTED);
    *correctable = (unsigned int)jnum(rows, "correctable", 0);
    *uncorrectable = (unsigned int)jnum(rows, "uncorrectable", 0);
    *pending = jnum(rows, "pending", 0) ? 1 : 0;
    *failure = jnum(rows, "failure", 0) ? 1 : 0;
    return leave(NVML_SUCCESS);
}
#endif

/* NVML_PCIE_UTIL_TX_BYTES (0) and RX_BYTES (1), in KB/s; "sample_ms" stands for the driver's 20 ms sample. */
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, unsigned int counter, unsigned int *value) {
    jnode *dev;
    if (!value) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, "pcie_throughput", &dev);
    if (r) return r;
    const jnode *pcie = jget(dev, "pcie");
    if (!pcie) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (counter > 1) return leave(NVML_ERROR_INVALID_ARGUMENT);
    double sample = jnum(pcie, "sample_ms", 0);
    *value = (unsigned int)jnum(pcie, counter == 0 ? "tx_kbps" : "rx_kbps", 0);
    pthread_mutex_unlock(&lock);
    sleep_ms(sample);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value) {
    jnode *dev;
    if (!value) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, "pcie_replay", &dev);
    if (r) return r;
    const jnode *pcie = jget(dev, "pcie");
    if (!pcie) return leave(NVML_ERROR_NOT_SUPPORTED);
    *value = (unsigned int)jnum(pcie, "replays", 0);
    return leave(NVML_SUCCESS);
}

/* ---- NVLink ------------------------------------------------------------------------------------------------ */

/* The scenario's entry of `link`: NOT_SUPPORTED without "nvlink", INVALID_ARGUMENT past the GPU's last link. */
static nvmlReturn_t link_node(const jnode *dev, unsigned int link, const jnode **out) {
    const jnode *links = jget(dev, "nvlink");
    if (!links || links->type != J_ARR) return NVML_ERROR_NOT_SUPPORTED;
    unsigned int i = 0;
    for (const jnode *l = links->child; l; l = l->next, i++)
        if (i == link) {
            *out = l;
            return NVML_SUCCESS;
        }
    return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, unsigned int *active) {
    jnode *dev;
    const jnode *l;
    if (!active) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, "nvlink", &dev);
    if (r) return r;
    if ((r = link_node(dev, link, &l))) return leave(r);
    *active = jnum(l, "active", 1) ? 1 : 0; /* NVML_FEATURE_ENABLED / DISABLED */
    return leave(NVML_SUCCESS);
}

/* NVML_NVLINK_ERROR_DL_REPLAY (0), _RECOVERY (1), _CRC_FLIT (2), _CRC_DATA (3); _ECC_DATA (4) is not offered. */
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link, unsigned int counter,
                                             unsigned long long *value) {
    static const char *names[] = {"replay", "recovery", "crc_flit", "crc_data"};
    jnode *dev;
    const jnode *l;
    if (!value) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, "nvlink_errors", &dev);
    if (r) return r;
    if ((r = link_node(dev, link, &l))) return leave(r);
    if (counter == 4) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (counter > 4) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *value = (unsigned long long)jnum(l, names[counter], 0);
    return leave(NVML_SUCCESS);
}

/* ---- Topology between two GPUs -------------------------------------------------------------------------------- */

/* The pair's entry of the scenario's "topology" on `dev` (keyed by the other GPU's index), or NULL. */
static const jnode *pair_node(const jnode *dev, const char *field, nvmlDevice_t other) {
    char key[16];
    snprintf(key, sizeof key, "%d", other->index);
    return jget(jget(dev, field), key);
}

/* nvmlGpuTopologyLevel_t from "topology": {"<index>": level} (0 internal, 10 single switch, 20 multiple switches,
 * 30 host bridge, 40 NUMA node, 50 system); a pair the scenario leaves out: NOT_SUPPORTED. */
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2, int *pathInfo) {
    jnode *dev;
    if (!pathInfo || !is_gpu_handle(device2)) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device1, "topology", &dev);
    if (r) return r;
    const jnode *level = pair_node(dev, "topology", device2);
    if (!level || level->type != J_NUM) return leave(NVML_ERROR_NOT_SUPPORTED);
    *pathInfo = (int)level->num;
    return leave(NVML_SUCCESS);
}

/* nvmlGpuP2PStatus_t for NVML_P2P_CAPS_INDEX_NVLINK (2) from "p2p_nvlink": {"<index>": true}: OK (0) or
 * NOT_SUPPORTED (5); the other capabilities (read, write, atomics, prop) answer OK between any two GPUs. */
nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2, int p2pIndex, int *p2pStatus) {
    jnode *dev;
    if (!p2pStatus || !is_gpu_handle(device2) || p2pIndex < 0 || p2pIndex > 4) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device1, "topology", &dev);
    if (r) return r;
    if (p2pIndex != 2) {
        *p2pStatus = 0;
        return leave(NVML_SUCCESS);
    }
    const jnode *ok = pair_node(dev, "p2p_nvlink", device2);
    *p2pStatus = ok && ok->type == J_BOOL && ok->num ? 0 : 5;
    return leave(NVML_SUCCESS);
}

/* The PCI bus id at the far end of `link`: the link's "remote" in the scenario (absent: NOT_SUPPORTED). */
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    jnode *dev;
    const jnode *l;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, "nvlink", &dev);
    if (r) return r;
    if ((r = link_node(dev, link, &l))) return leave(r);
    const char *remote = jstr(l, "remote", NULL);
    if (!remote) return leave(NVML_ERROR_NOT_SUPPORTED);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", remote);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", remote + (strlen(remote) > 12 ? 4 : 0));
    unsigned int domain = 0, bus = 0, dev_no = 0;
    sscanf(remote, "%x:%x:%x", &domain, &bus, &dev_no);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev_no;
    return leave(NVML_SUCCESS);
}

/* The field-values API: NVLink data throughput (KiB, cumulative) per link and the number of links (an unsigned
 * int: the length of the scenario's "nvlink"); every other field is NOT_SUPPORTED in its own return code, as a
 * driver answers for a field this GPU does not have. */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values) {
    jnode *dev;
    if (count < 0 || (count > 0 && !values)) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, "field_values", &dev);
    if (r) return r;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        const jnode *l;
        v->timestamp = (long long)now.tv_sec * 1000000 + now.tv_nsec / 1000;
        v->latencyUsec = 0;
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        v->value.ullVal = 0;
        if (v->fieldId == NVML_FI_DEV_NVLINK_LINK_COUNT) {
            const jnode *links = jget(dev, "nvlink");
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            if (links && links->type == J_ARR && !unsupported(dev, "nvlink")) {
                unsigned int n = 0;
                for (const jnode *c = links->child; c; c = c->next) n++;
                v->value.uiVal = n;
                v->nvmlReturn = NVML_SUCCESS;
            }
        } else if (v->fieldId != NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX &&
                   v->fieldId != NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        else if (unsupported(dev, "nvlink_throughput"))
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        else if ((v->nvmlReturn = link_node(dev, v->scopeId, &l)) == NVML_SUCCESS) {
            const char *key = v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX ? "tx_kib" : "rx_kib";
            v->value.ullVal = (unsigned long long)jnum(l, key, 0);
        }
    }
    return leave(NVML_SUCCESS);
}

/* ---- MIG ---------------------------------------------------------------------------------------------------- */

#ifndef FAKENVML_LEGACY
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    jnode *dev;
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, "mig", &dev);
    if (r) return r;
    const jnode *mig = jget(dev, "mig");
    if (!mig) return leave(NVML_ERROR_NOT_SUPPORTED);
    *current = (unsigned int)jnum(mig, "current", 0);
    *pending = (unsigned int)jnum(mig, "pending", *current);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    jnode *dev;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, "mig", &dev);
    if (r) return r;
    const jnode *mig = jget(dev, "mig");
    if (!mig) return leave(NVML_ERROR_NOT_SUPPORTED);
    *count = (unsigned int)jnum(mig, "max_devices", 7);
    return leave(NVML_SUCCESS);
}

/* NOT_FOUND where no MIG device holds `index` (the indexes of a GPU's MIG devices need not be contiguous). */
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig) {
    jnode *dev;
    if (!mig) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, "mig", &dev);
    if (r) return r;
    const jnode *m = jget(dev, "mig");
    if (!m) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!jnum(m, "current", 0)) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (index >= (unsigned int)jnum(m, "max_devices", 7) || index >= MAX_MIG) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!mig_node(dev, (int)index)) return leave(NVML_ERROR_NOT_FOUND);
    mig_handles[device->index][index].index = device->index;
    mig_handles[device->index][index].mig = (int)index;
    *mig = &mig_handles[device->index][index];
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t instance_id(nvmlDevice_t device, const char *key, unsigned int *id) {
    jnode *dev, *mig;
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_handle(device, NULL, &dev, &mig);
    if (r) return r;
    if (!mig) return leave(NVML_ERROR_INVALID_ARGUMENT); /* not a MIG device handle */
    *id = (unsigned int)jnum(mig, key, 0);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    return instance_id(device, "gpu_instance", id);
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    return instance_id(device, "compute_instance", id);
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig) {
    jnode *dev, *mig;
    if (!is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_handle(device, NULL, &dev, &mig);
    if (r) return r;
    *is_mig = mig ? 1 : 0;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t device, nvmlDevice_t *parent) {
    jnode *dev, *mig;
    if (!parent) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_handle(device, NULL, &dev, &mig);
    if (r) return r;
    if (!mig) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *parent = &handles[device->index];
    return leave(NVML_SUCCESS);
}
#endif

/* ---- events ------------------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    pthread_mutex_lock(&lock);
    if (!initialized) return leave(NVML_ERROR_UNINITIALIZED);
    *set = calloc(1, sizeof **set);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    free(set);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    jnode *dev;
    nvmlReturn_t r = enter_device(device, "events", &dev);
    if (r) return r;
    *types = 0x8 | 0x1 | 0x2; /* Xid, single- and double-bit ECC */
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    jnode *dev;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, "events", &dev);
    if (r) return r;
    set->registered[device->index] |= types;
    return leave(NVML_SUCCESS);
}

/* The next queued event for a device registered in `set`, or 0; events for unregistered devices are dropped. */
static int next_event_locked(nvmlEventSet_t set, nvmlEventData_t *data) {
    jnode *events = jget(scenario, "events");
    if (!events || events->type != J_ARR) return 0;
    size_t i = 0;
    for (jnode *e = events->child; e; e = e->next, i++) {
        if (i < events_delivered) continue;
        events_delivered = i + 1;
        int index = (int)jnum(e, "device", 0);
        unsigned long long type = (unsigned long long)jnum(e, "type", 8);
        if (index < 0 || index >= MAX_DEVICES || !(set->registered[index] & type)) continue;
        memset(data, 0, sizeof *data);
        handles[index].index = index;
        handles[index].mig = -1;
        data->device = &handles[index];
        data->eventType = type;
        data->eventData = (unsigned long long)jnum(e, "data", 0);
        data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
        return 1;
    }
    return 0;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
}

/* An inotify descriptor watching the scenario's directory (the test replaces the file there), or -1. */
static int watch_scenario(void) {
    const char *path = getenv("FAKENVML_SCENARIO");
    if (!path) return -1;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) dir[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (fd < 0) return -1;
    if (inotify_add_watch(fd, dir, IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Blocks like the driver's wait (a thread in it costs no CPU): the scenario is re-read whenever its directory
 * changes, and the call returns the next event or TIMEOUT after `timeoutms`. The watch is set before the first
 * look, so a change made meanwhile wakes it; without inotify it looks every 10 ms instead. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    int fd = watch_scenario();
    double deadline = now_ms() + timeoutms;
    nvmlReturn_t result;
    for (;;) {
        pthread_mutex_lock(&lock);
        if (!initialized) { result = leave(NVML_ERROR_UNINITIALIZED); break; }
        reload_locked();
        if (next_event_locked(set, data)) { result = leave(NVML_SUCCESS); break; }
        pthread_mutex_unlock(&lock);
        double left = deadline - now_ms();
        if (left <= 0) { result = NVML_ERROR_TIMEOUT; break; }
        if (fd < 0) {
            sleep_ms(left < 10 ? left : 10);
            continue;
        }
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, (int)left + 1) > 0) {
            char drain[4096];
            while (read(fd, drain, sizeof drain) > 0) {}
        }
    }
    if (fd >= 0) close(fd);
    return result;
}

/* ---- GPM ---------------------------------------------------------------------------------------------------- */

#ifndef FAKENVML_LEGACY
#include <stddef.h>

#define NVML_GPM_SUPPORT_VERSION 1
#define NVML_GPM_METRICS_GET_VERSION 1
/* The smallest NVML_GPM_METRIC_MAX a header had (98): a caller's array may be that short, so more metrics than
 * this in one call are refused, as a driver with that header refuses more than its own maximum. */
#define GPM_METRICS_LIMIT 98
/* NVML's floor: two samples closer than this give no values. */
#define GPM_FLOOR_SECONDS 0.1
#define GPM_SLOTS 64

typedef struct {                                                                           /* c_nvmlGpmMetric_t */
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct { const char *shortName, *longName, *unit; } metricInfo;                       /* c_metricInfo_t */
} nvmlGpmMetric_t;
struct fake_gpm_sample;
typedef struct fake_gpm_sample *nvmlGpmSample_t;                                           /* c_nvmlGpmSample_t */
typedef struct {                                                                           /* c_nvmlGpmMetricsGet_t */
    unsigned int version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[GPM_METRICS_LIMIT];   /* NVML_GPM_METRIC_MAX entries in the caller's header */
} nvmlGpmMetricsGet_t;
typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;             /* c_nvmlGpmSupport_t */
_Static_assert(sizeof(nvmlGpmMetric_t) == 40, "nvmlGpmMetric_t is 40 bytes");
_Static_assert(offsetof(nvmlGpmMetricsGet_t, metrics) == 24, "the metrics array is at offset 24");

/* A sample: what the scenario said of the GPU (gpu_instance -1) or GPU instance when it was taken, and when. */
struct fake_gpm_sample {
    struct fake_gpm_sample *next;                  /* the live samples */
    int device, gpu_instance, taken;
    double at;                                     /* CLOCK_MONOTONIC, seconds */
    int count;
    unsigned int ids[GPM_SLOTS];
    double values[GPM_SLOTS];
    int errors[GPM_SLOTS];
};

static struct fake_gpm_sample *gpm_live;

/* The counts are per scenario file (each test writes its own): all but the live samples start again at 0. */
static void gpm_new_scenario_locked(void) {
    gpm_allocated = gpm_freed = gpm_short_intervals = gpm_bad_samples = gpm_metrics_calls = 0;
}

static int gpm_is_live(nvmlGpmSample_t sample) {
    for (struct fake_gpm_sample *s = gpm_live; s; s = s->next)
        if (s == sample) return 1;
    return 0;
}

static double monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The scenario's GPM values now: {"metrics": {"2": 80.5, ...}, "errors": {"12": 999}}, percent per metric id. */
static void gpm_record(struct fake_gpm_sample *s, const jnode *gpm, int device, int gpu_instance) {
    s->device = device;
    s->gpu_instance = gpu_instance;
    s->taken = 1;
    s->count = 0;
    const jnode *lists[2] = {jget(gpm, "metrics"), jget(gpm, "errors")};
    for (int l = 0; l < 2; l++) {
        if (!lists[l] || lists[l]->type != J_OBJ) continue;
        for (const jnode *m = lists[l]->child; m && s->count < GPM_SLOTS; m = m->next) {
            s->ids[s->count] = (unsigned int)strtoul(m->key, NULL, 10);
            s->values[s->count] = l == 0 ? m->num : 0;
            s->errors[s->count] = l == 0 ? NVML_SUCCESS : (int)m->num;
            s->count++;
        }
    }
    s->at = monotonic_s();
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *out) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    if (!initialized) return leave(NVML_ERROR_UNINITIALIZED);
    reload_locked();
    struct fake_gpm_sample *s = calloc(1, sizeof *s);
    s->device = -1;
    s->next = gpm_live;
    gpm_live = s;
    gpm_live_count++;
    gpm_allocated++;
    write_state_locked();
    *out = s;
    return leave(NVML_SUCCESS);
}

/* A pointer that is not a live sample (freed twice, never allocated) is counted, and refused. */
nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    pthread_mutex_lock(&lock);
    for (struct fake_gpm_sample **p = &gpm_live; *p; p = &(*p)->next)
        if (*p == sample) {
            *p = sample->next;
            free(sample);
            gpm_live_count--;
            gpm_freed++;
            write_state_locked();
            return leave(NVML_SUCCESS);
        }
    gpm_bad_samples++;
    write_state_locked();
    return leave(NVML_ERROR_INVALID_ARGUMENT);
}

/* isSupportedDevice: the device has "gpm" and its "supported" is not false. "not_supported": ["gpm"] and
 * "fail": {"gpm": N} apply to every GPM call on the device (enter_device). */
nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *support) {
    jnode *dev;
    if (!support) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_device(device, "gpm", &dev);
    if (r) return r;
    if (support->version != NVML_GPM_SUPPORT_VERSION) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    const jnode *gpm = jget(dev, "gpm");
    support->isSupportedDevice = gpm && jnum(gpm, "supported", 1) ? 1 : 0;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample) {
    jnode *dev;
    nvmlReturn_t r = enter_device(device, "gpm", &dev);
    if (r) return r;
    if (!gpm_is_live(sample)) { gpm_bad_samples++; write_state_locked(); return leave(NVML_ERROR_INVALID_ARGUMENT); }
    const jnode *gpm = jget(dev, "gpm");
    if (!gpm || !jnum(gpm, "supported", 1)) return leave(NVML_ERROR_NOT_SUPPORTED);
    gpm_record(sample, gpm, device->index, -1);
    return leave(NVML_SUCCESS);
}

/* A GPU instance of a GPU in MIG mode: its MIG device entry's "gpm" (absent: NOT_SUPPORTED); NOT_FOUND where no
 * MIG device of the GPU has that "gpu_instance". */
nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId, nvmlGpmSample_t sample) {
    jnode *dev;
    nvmlReturn_t r = enter_device(device, "gpm", &dev);
    if (r) return r;
    if (!gpm_is_live(sample)) { gpm_bad_samples++; write_state_locked(); return leave(NVML_ERROR_INVALID_ARGUMENT); }
    const jnode *gpm = jget(dev, "gpm");
    if (!gpm || !jnum(gpm, "supported", 1)) return leave(NVML_ERROR_NOT_SUPPORTED);
    const jnode *mig = jget(dev, "mig");
    const jnode *list = jget(mig, "devices");
    if (!mig || !jnum(mig, "current", 0) || !list || list->type != J_ARR) return leave(NVML_ERROR_NOT_FOUND);
    for (const jnode *m = list->child; m; m = m->next) {
        if ((unsigned int)jnum(m, "gpu_instance", -1) != gpuInstanceId) continue;
        int err = (int)jnum(m, "error", 0);
        if (err) return leave(err);
        const jnode *own = jget(m, "gpm");
        if (!own) return leave(NVML_ERROR_NOT_SUPPORTED);
        gpm_record(sample, own, device->index, (int)gpuInstanceId);
        return leave(NVML_SUCCESS);
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

static const char *gpm_name(unsigned int id) {
    switch (id) {
        case 1: return "GRAPHICS_UTIL";
        case 2: return "SM_UTIL";
        case 3: return "SM_OCCUPANCY";
        case 4: return "INTEGER_UTIL";
        case 5: return "ANY_TENSOR_UTIL";
        case 6: return "DFMA_TENSOR_UTIL";
        case 7: return "HMMA_TENSOR_UTIL";
        case 9: return "IMMA_TENSOR_UTIL";
        case 10: return "DRAM_BW_UTIL";
        case 11: return "FP64_UTIL";
        case 12: return "FP32_UTIL";
        case 13: return "FP16_UTIL";
        default: return NULL;
    }
}

/* The value of each metric over sample1 -> sample2: the scenario's value when sample2 was taken (the scenario
 * gives the average directly). Refused: a version other than 1 (ARGUMENT_VERSION_MISMATCH), unknown or untaken
 * samples, samples of two different GPUs or instances, an interval under 100 ms (counted), more metrics than the
 * smallest header holds; "fail": {"gpm_metrics": N} on sample2's device returns N. A metric the scenario lacks is
 * NOT_SUPPORTED in its own nvmlReturn, one in "errors" has that error; both with value 0 (never to be used). */
nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *request) {
    if (!request) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    if (!initialized) return leave(NVML_ERROR_UNINITIALIZED);
    reload_locked();
    gpm_metrics_calls++;
    if (request->version != NVML_GPM_METRICS_GET_VERSION) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (request->numMetrics > GPM_METRICS_LIMIT) return leave(NVML_ERROR_INVALID_ARGUMENT);
    struct fake_gpm_sample *one = request->sample1, *two = request->sample2;
    if (!gpm_is_live(one) || !gpm_is_live(two)) {
        gpm_bad_samples++;
        write_state_locked();
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (!one->taken || !two->taken || one == two || one->device != two->device ||
        one->gpu_instance != two->gpu_instance)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    int err = (int)jnum(jget(device_node(two->device), "fail"), "gpm_metrics", 0);
    if (err) return leave(err);
    if (two->at - one->at < GPM_FLOOR_SECONDS) {
        gpm_short_intervals++;
        write_state_locked();
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    for (unsigned int i = 0; i < request->numMetrics; i++) {
        nvmlGpmMetric_t *m = &request->metrics[i];
        m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        m->value = 0;
        m->metricInfo.shortName = m->metricInfo.longName = gpm_name(m->metricId);
        m->metricInfo.unit = "%";
        for (int k = 0; k < two->count; k++)
            if (two->ids[k] == m->metricId) {
                m->nvmlReturn = two->errors[k];
                m->value = two->errors[k] ? 0 : two->values[k];
            }
    }
    return leave(NVML_SUCCESS);
}
#else
static void gpm_new_scenario_locked(void) {}
#endif
