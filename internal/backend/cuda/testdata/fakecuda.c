/*
 * fakecuda: a stand-in for libcuda.so.1 that the weightcache tests build with
 * gcc and load through the same purego binding as the real driver. "Device"
 * memory is host memory: VMM allocations and legacy allocations are memfds,
 * so that exported descriptors and IPC handles work across processes, and
 * device pointers are host addresses that only the copy calls touch.
 *
 * It follows the driver where the tests depend on it: CUDA_VISIBLE_DEVICES in
 * index and UUID form, a current context required on the calling thread,
 * granularity-sized cuMemCreate, no access before cuMemSetAccess, writes
 * refused through read-only mappings, async copies that only happen at
 * cuStreamSynchronize (so a staging buffer reused too early corrupts data),
 * legacy IPC handles that need the exporting process alive.
 *
 * Failure injection, read from the environment at each call:
 *   FAKECUDA_DEVICES=N        physical devices (default 1)
 *   FAKECUDA_UUID_SALT=N      perturbs every UUID (a "wrong UUID" machine)
 *   FAKECUDA_TOTAL_BYTES=N    memory per device (default 80 GiB)
 *   FAKECUDA_FREE_BYTES=N     free memory reported by cuMemGetInfo
 *   FAKECUDA_OOM_BYTES=N      allocations beyond N bytes in all fail with OOM
 *   FAKECUDA_NO_FD=1          no POSIX file-descriptor handle support
 *   FAKECUDA_NO_READONLY=1    cuMemSetAccess refuses PROT_READ
 *   FAKECUDA_FAIL=cuName      that call fails with CUDA_ERROR_UNKNOWN
 *   FAKECUDA_TRACE=path       append every call's name to path
 * Building with -DFAKECUDA_OMIT_VMM leaves out cuMemCreate, to test a
 * missing symbol.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUhandle;
typedef void *CUcontext;
typedef void *CUstream;

enum {
  OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3,
  NO_DEVICE = 100, INVALID_DEVICE = 101, INVALID_CONTEXT = 201,
  INVALID_HANDLE = 400, ILLEGAL_ADDRESS = 700, NOT_SUPPORTED = 801, UNKNOWN = 999,
};

typedef struct { int type; int id; } loc_t;
typedef struct {
  int type; int handle_types; loc_t location; void *win32; unsigned char flags[8];
} prop_t;
typedef struct { loc_t location; int flags; } access_t;
typedef struct { char bytes[16]; } uuid_t_;
typedef struct { char reserved[64]; } ipc_t;

#define MAXDEV 16
#define MAXOBJ 4096
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int inited, nvisible, visible[MAXDEV];
static unsigned long long used;
static __thread CUcontext current;

/* alloc: a physical allocation (memfd). region: a mapped device range. */
struct alloc { int live, fd, fdok, counted; size_t size; };
struct region { int live, prot, legacy, fd; CUdeviceptr ptr; size_t size; };
struct reserve { int live; CUdeviceptr ptr; size_t size; };
struct copy { CUdeviceptr dst; const void *src; size_t n; struct copy *next; };
struct stream { struct copy *head, *tail; };
static struct alloc allocs[MAXOBJ];
static struct region regions[MAXOBJ];
static struct reserve reserves[MAXOBJ];

static long long envll(const char *k, long long def) {
  const char *v = getenv(k);
  return v && *v ? atoll(v) : def;
}

static void trace(const char *name) {
  const char *p = getenv("FAKECUDA_TRACE");
  if (!p || !*p) return;
  int fd = open(p, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return;
  char line[128];
  int n = snprintf(line, sizeof line, "%s\n", name);
  if (write(fd, line, n) < 0) { /* tracing is best effort */ }
  close(fd);
}

/* enter is every entry point's prologue: trace, injected failure, init. */
static CUresult enter(const char *name, int need_init, int need_ctx) {
  trace(name);
  const char *f = getenv("FAKECUDA_FAIL");
  if (f && strcmp(f, name) == 0) return UNKNOWN;
  if (need_init && !inited) return NOT_INITIALIZED;
  if (need_ctx && !current) return INVALID_CONTEXT;
  return OK;
}
#define ENTER(init, ctx) do { CUresult e_ = enter(__func__, init, ctx); if (e_) return e_; } while (0)

static void flush_null(void);
static CUresult check(CUdeviceptr p, size_t n, int prot);

static size_t granularity(void) { return (size_t)envll("FAKECUDA_GRANULARITY", 2 << 20); }

static void uuid_of(int phys, unsigned char out[16]) {
  long long salt = envll("FAKECUDA_UUID_SALT", 0);
  for (int i = 0; i < 16; i++) out[i] = (unsigned char)(0x10 * i + 7 + salt * 31);
  out[0] = 0xfa; out[1] = 0xce; out[3] = (unsigned char)(0x30 + phys + salt);
}

static void uuid_str(int phys, char *s) {
  unsigned char u[16];
  uuid_of(phys, u);
  sprintf(s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
          u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

/* parse_visible follows the driver: indices or GPU-UUID prefixes, stopping
 * at the first entry that names nothing. */
static void parse_visible(int ndev) {
  const char *v = getenv("CUDA_VISIBLE_DEVICES");
  nvisible = 0;
  if (!v) { for (int i = 0; i < ndev; i++) visible[nvisible++] = i; return; }
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", v);
  for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int found = -1;
    if (strncmp(tok, "GPU-", 4) == 0) {
      for (int i = 0; i < ndev; i++) {
        char s[64];
        uuid_str(i, s);
        if (strncmp(s, tok, strlen(tok)) == 0) found = i;
      }
    } else {
      char *end;
      long n = strtol(tok, &end, 10);
      if (*end == 0 && end != tok && n >= 0 && n < ndev) found = (int)n;
    }
    if (found < 0 || nvisible == MAXDEV) return;
    visible[nvisible++] = found;
  }
}

CUresult cuInit(unsigned int flags) {
  ENTER(0, 0);
  if (flags != 0) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  int ndev = (int)envll("FAKECUDA_DEVICES", 1);
  parse_visible(ndev > MAXDEV ? MAXDEV : ndev);
  inited = 1;
  pthread_mutex_unlock(&mu);
  return OK;
}

CUresult cuDriverGetVersion(int *v) { ENTER(0, 0); *v = 12040; return OK; }

CUresult cuGetErrorName(CUresult e, const char **s) {
  static const struct { int code; const char *name; } names[] = {
    {OK, "CUDA_SUCCESS"}, {INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
    {OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"}, {NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
    {NO_DEVICE, "CUDA_ERROR_NO_DEVICE"}, {INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"},
    {INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"}, {INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"},
    {ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS"}, {NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED"},
    {UNKNOWN, "CUDA_ERROR_UNKNOWN"},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].code == e) { *s = names[i].name; return OK; }
  *s = NULL;
  return INVALID_VALUE;
}

CUresult cuDeviceGetCount(int *n) { ENTER(1, 0); *n = nvisible; return OK; }

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  ENTER(1, 0);
  if (ordinal < 0 || ordinal >= nvisible) return INVALID_DEVICE;
  *d = ordinal;
  return OK;
}

static int phys(CUdevice d) { return d >= 0 && d < nvisible ? visible[d] : -1; }

CUresult cuDeviceGetUuid_v2(uuid_t_ *u, CUdevice d) {
  ENTER(1, 0);
  if (phys(d) < 0) return INVALID_DEVICE;
  uuid_of(phys(d), (unsigned char *)u->bytes);
  return OK;
}

CUresult cuDeviceGetUuid(uuid_t_ *u, CUdevice d) { return cuDeviceGetUuid_v2(u, d); }

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  ENTER(1, 0);
  if (phys(d) < 0) return INVALID_DEVICE;
  snprintf(name, len, "Fake H200 %d", phys(d));
  return OK;
}

CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
  ENTER(1, 0);
  if (phys(d) < 0) return INVALID_DEVICE;
  switch (attr) {
  case 102: *v = 1; break;
  case 103: *v = envll("FAKECUDA_NO_FD", 0) ? 0 : 1; break;
  case 75: *v = 9; break;
  case 76: *v = 0; break;
  default: *v = 0;
  }
  return OK;
}

static unsigned long long total_bytes(void) { return (unsigned long long)envll("FAKECUDA_TOTAL_BYTES", 80LL << 30); }

CUresult cuDeviceTotalMem_v2(size_t *n, CUdevice d) {
  ENTER(1, 0);
  if (phys(d) < 0) return INVALID_DEVICE;
  *n = total_bytes();
  return OK;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  ENTER(1, 0);
  if (phys(d) < 0) return INVALID_DEVICE;
  *c = (CUcontext)(uintptr_t)(0x1000 + d);
  return OK;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { ENTER(1, 0); return phys(d) < 0 ? INVALID_DEVICE : OK; }

CUresult cuCtxSetCurrent(CUcontext c) { ENTER(1, 0); current = c; return OK; }


CUresult cuMemGetInfo_v2(size_t *free_, size_t *total) {
  ENTER(1, 1);
  unsigned long long t = total_bytes(), f = t > used ? t - used : 0;
  long long cap = envll("FAKECUDA_FREE_BYTES", -1);
  if (cap >= 0 && (unsigned long long)cap < f) f = (unsigned long long)cap;
  *free_ = f;
  *total = t;
  return OK;
}

static int slot(int (*live)(int)) {
  for (int i = 0; i < MAXOBJ; i++) if (!live(i)) return i;
  return -1;
}
static int alloc_live(int i) { return allocs[i].live; }
static int region_live(int i) { return regions[i].live; }
static int reserve_live(int i) { return reserves[i].live; }

static CUresult take(size_t size) {
  long long cap = envll("FAKECUDA_OOM_BYTES", -1);
  if ((cap >= 0 && used + size > (unsigned long long)cap) || used + size > total_bytes()) return OUT_OF_MEMORY;
  used += size;
  return OK;
}

static int new_memfd(size_t size) {
  int fd = memfd_create("fakecuda", MFD_CLOEXEC);
  if (fd >= 0 && ftruncate(fd, (off_t)size) != 0) { close(fd); return -1; }
  return fd;
}

CUresult cuMemGetAllocationGranularity(size_t *g, const prop_t *p, int option) {
  ENTER(1, 0);
  if (p->type != 1 || p->location.type != 1 || phys(p->location.id) < 0 || option < 0 || option > 1) return INVALID_VALUE;
  *g = granularity();
  return OK;
}

#ifndef FAKECUDA_OMIT_VMM
CUresult cuMemCreate(CUhandle *h, size_t size, const prop_t *p, unsigned long long flags) {
  ENTER(1, 0);
  if (flags || p->type != 1 || p->location.type != 1 || phys(p->location.id) < 0) return INVALID_VALUE;
  if (size == 0 || size % granularity()) return INVALID_VALUE;
  if ((p->handle_types & 1) && envll("FAKECUDA_NO_FD", 0)) return NOT_SUPPORTED;
  if (p->handle_types & ~1) return NOT_SUPPORTED;
  pthread_mutex_lock(&mu);
  CUresult r = take(size);
  int i = r ? -1 : slot(alloc_live);
  if (!r && i < 0) r = OUT_OF_MEMORY;
  int fd = r ? -1 : new_memfd(size);
  if (!r && fd < 0) { used -= size; r = OUT_OF_MEMORY; }
  if (!r) { allocs[i] = (struct alloc){1, fd, p->handle_types & 1, 1, size}; *h = (CUhandle)i + 1; }
  pthread_mutex_unlock(&mu);
  return r;
}
#endif

static struct alloc *handle(CUhandle h) {
  return h >= 1 && h <= MAXOBJ && allocs[h - 1].live ? &allocs[h - 1] : NULL;
}

CUresult cuMemRelease(CUhandle h) {
  ENTER(1, 0);
  pthread_mutex_lock(&mu);
  struct alloc *a = handle(h);
  if (a) { close(a->fd); if (a->counted) used -= a->size; a->live = 0; }
  pthread_mutex_unlock(&mu);
  return a ? OK : INVALID_HANDLE;
}

CUresult cuMemExportToShareableHandle(void *out, CUhandle h, int type, unsigned long long flags) {
  ENTER(1, 0);
  pthread_mutex_lock(&mu);
  struct alloc *a = handle(h);
  CUresult r = !a ? INVALID_HANDLE : (type != 1 || flags) ? INVALID_VALUE : !a->fdok ? NOT_SUPPORTED : OK;
  if (!r) {
    int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) r = UNKNOWN; else *(int *)out = fd;
  }
  pthread_mutex_unlock(&mu);
  return r;
}

/* Like the driver, the descriptor travels as the pointer's value. */
CUresult cuMemImportFromShareableHandle(CUhandle *h, void *os, int type) {
  ENTER(1, 0);
  if (type != 1) return INVALID_VALUE;
  int fd = (int)(intptr_t)os;
  struct stat st;
  if (fstat(fd, &st) != 0) return INVALID_HANDLE;
  pthread_mutex_lock(&mu);
  int i = slot(alloc_live), dup = i < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup >= 0) { allocs[i] = (struct alloc){1, dup, 1, 0, (size_t)st.st_size}; *h = (CUhandle)i + 1; }
  pthread_mutex_unlock(&mu);
  return dup < 0 ? OUT_OF_MEMORY : OK;
}

CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
  ENTER(1, 0);
  size_t g = granularity();
  if (size == 0 || size % g || addr || flags) return INVALID_VALUE;
  if (align < g) align = g;
  char *m = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return OUT_OF_MEMORY;
  uintptr_t start = ((uintptr_t)m + align - 1) & ~(uintptr_t)(align - 1);
  if (start > (uintptr_t)m) munmap(m, start - (uintptr_t)m);
  munmap((char *)start + size, (uintptr_t)m + size + align - start - size);
  pthread_mutex_lock(&mu);
  int i = slot(reserve_live);
  if (i >= 0) reserves[i] = (struct reserve){1, start, size};
  pthread_mutex_unlock(&mu);
  *p = start;
  return OK;
}

static struct region *find_region(CUdeviceptr p, size_t n) {
  for (int i = 0; i < MAXOBJ; i++)
    if (regions[i].live && p >= regions[i].ptr && p + n <= regions[i].ptr + regions[i].size) return &regions[i];
  return NULL;
}

CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
  ENTER(1, 0);
  pthread_mutex_lock(&mu);
  CUresult r = INVALID_VALUE;
  for (int i = 0; i < MAXOBJ; i++)
    if (reserves[i].live && reserves[i].ptr == p && reserves[i].size == size) {
      /* Still mapped: the driver refuses to free the range. */
      r = find_region(p, 0) || find_region(p + size - 1, 1) ? INVALID_VALUE : OK;
      if (!r) { munmap((void *)(uintptr_t)p, size); reserves[i].live = 0; }
    }
  pthread_mutex_unlock(&mu);
  return r;
}

CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, CUhandle h, unsigned long long flags) {
  ENTER(1, 0);
  pthread_mutex_lock(&mu);
  struct alloc *a = handle(h);
  int inside = 0;
  for (int i = 0; i < MAXOBJ; i++)
    if (reserves[i].live && p >= reserves[i].ptr && p + size <= reserves[i].ptr + reserves[i].size) inside = 1;
  CUresult r = !a ? INVALID_HANDLE : (!inside || flags || off + size > a->size || find_region(p, size)) ? INVALID_VALUE : OK;
  int i = r ? -1 : slot(region_live);
  if (!r && (i < 0 || mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, (off_t)off) == MAP_FAILED)) r = OUT_OF_MEMORY;
  if (!r) regions[i] = (struct region){1, PROT_NONE, 0, -1, p, size};
  pthread_mutex_unlock(&mu);
  return r;
}

CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
  ENTER(1, 0);
  flush_null();
  pthread_mutex_lock(&mu);
  struct region *g = find_region(p, size);
  CUresult r = !g || g->legacy || g->ptr != p || g->size != size ? INVALID_VALUE : OK;
  if (!r) {
    mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    g->live = 0;
  }
  pthread_mutex_unlock(&mu);
  return r;
}

CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const access_t *d, size_t count) {
  ENTER(1, 0);
  if (count != 1 || d->location.type != 1 || phys(d->location.id) < 0) return INVALID_VALUE;
  if (d->flags != 1 && d->flags != 3) return INVALID_VALUE;
  if (d->flags == 1 && envll("FAKECUDA_NO_READONLY", 0)) return INVALID_VALUE;
  int prot = d->flags == 1 ? PROT_READ : PROT_READ | PROT_WRITE;
  pthread_mutex_lock(&mu);
  struct region *g = find_region(p, size);
  CUresult r = g && mprotect((void *)(uintptr_t)p, size, prot) == 0 ? OK : INVALID_VALUE;
  if (!r) g->prot = prot;
  pthread_mutex_unlock(&mu);
  return r;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
  ENTER(1, 1);
  if (size == 0) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  CUresult r = take(size);
  int i = r ? -1 : slot(region_live), fd = -1;
  void *m = MAP_FAILED;
  if (!r && i >= 0 && (fd = new_memfd(size)) >= 0) m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (!r && m == MAP_FAILED) { if (fd >= 0) close(fd); used -= size; r = OUT_OF_MEMORY; }
  if (!r) { regions[i] = (struct region){1, PROT_READ | PROT_WRITE, 1, fd, (CUdeviceptr)(uintptr_t)m, size}; *p = (CUdeviceptr)(uintptr_t)m; }
  pthread_mutex_unlock(&mu);
  return r;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
  ENTER(1, 1);
  flush_null();
  pthread_mutex_lock(&mu);
  struct region *g = find_region(p, 1);
  CUresult r = !g || !g->legacy || g->ptr != p ? INVALID_VALUE : OK;
  if (!r) {
    munmap((void *)(uintptr_t)p, g->size);
    if (g->fd >= 0) { close(g->fd); used -= g->size; }
    g->live = 0;
  }
  pthread_mutex_unlock(&mu);
  return r;
}

/* A legacy handle names the exporter's descriptor through /proc, so it can
 * only be opened while the exporting process lives, as with the driver. */
struct ipc { char magic[8]; int pid, fd; unsigned long long size; };

CUresult cuIpcGetMemHandle(ipc_t *h, CUdeviceptr p) {
  ENTER(1, 1);
  pthread_mutex_lock(&mu);
  struct region *g = find_region(p, 1);
  CUresult r = !g || !g->legacy || g->fd < 0 || g->ptr != p ? INVALID_VALUE : OK;
  if (!r) {
    struct ipc x = {"FAKEIPC", getpid(), g->fd, g->size};
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &x, sizeof x);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, ipc_t h, unsigned int flags) {
  ENTER(1, 1);
  struct ipc x;
  memcpy(&x, h.reserved, sizeof x);
  if (memcmp(x.magic, "FAKEIPC", 8) != 0 || flags != 1) return INVALID_VALUE;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", x.pid, x.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return INVALID_HANDLE;
  void *m = mmap(NULL, x.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return OUT_OF_MEMORY;
  pthread_mutex_lock(&mu);
  int i = slot(region_live);
  if (i >= 0) regions[i] = (struct region){1, PROT_READ | PROT_WRITE, 1, -1, (CUdeviceptr)(uintptr_t)m, x.size};
  pthread_mutex_unlock(&mu);
  *p = (CUdeviceptr)(uintptr_t)m;
  return OK;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  ENTER(1, 1);
  pthread_mutex_lock(&mu);
  struct region *g = find_region(p, 1);
  CUresult r = !g || g->fd >= 0 || g->ptr != p ? INVALID_VALUE : OK;
  if (!r) { munmap((void *)(uintptr_t)p, g->size); g->live = 0; }
  pthread_mutex_unlock(&mu);
  return r;
}

/* check says whether n bytes at p lie in one mapping with prot. */
static CUresult check(CUdeviceptr p, size_t n, int prot) {
  pthread_mutex_lock(&mu);
  struct region *g = find_region(p, n);
  CUresult r = !g ? INVALID_VALUE : (g->prot & prot) != prot ? ILLEGAL_ADDRESS : OK;
  pthread_mutex_unlock(&mu);
  return r;
}

/* Memsets are asynchronous on the legacy NULL stream, which streams made
 * with CU_STREAM_NON_BLOCKING do not wait for: they happen at the next
 * cuCtxSynchronize or synchronous call, so code that skips the sync sees
 * its copies zeroed afterwards. */
struct memset_op { CUdeviceptr p; unsigned char c; size_t n; struct memset_op *next; };
static struct memset_op *null_stream;

static void flush_null(void) {
  pthread_mutex_lock(&mu);
  struct memset_op *op = null_stream;
  null_stream = NULL;
  pthread_mutex_unlock(&mu);
  while (op) {
    struct memset_op *next = op->next;
    if (!check(op->p, op->n, PROT_WRITE)) memset((void *)(uintptr_t)op->p, op->c, op->n);
    free(op);
    op = next;
  }
}

CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char c, size_t n) {
  ENTER(1, 1);
  CUresult r = check(p, n, PROT_WRITE);
  struct memset_op *op = r ? NULL : malloc(sizeof *op);
  if (!r && !op) r = OUT_OF_MEMORY;
  if (!r) {
    pthread_mutex_lock(&mu);
    struct memset_op **tail = &null_stream;
    while (*tail) tail = &(*tail)->next;
    *op = (struct memset_op){p, c, n, NULL};
    *tail = op;
    pthread_mutex_unlock(&mu);
  }
  return r;
}

CUresult cuCtxSynchronize(void) { ENTER(1, 1); flush_null(); return OK; }

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
  ENTER(1, 1);
  flush_null();
  CUresult r = check(dst, n, PROT_WRITE);
  if (!r) memcpy((void *)(uintptr_t)dst, src, n);
  return r;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
  ENTER(1, 1);
  flush_null();
  CUresult r = check(src, n, PROT_READ);
  if (!r) memcpy(dst, (void *)(uintptr_t)src, n);
  return r;
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  ENTER(1, 1);
  flush_null();
  CUresult r = check(src, n, PROT_READ);
  if (!r) r = check(dst, n, PROT_WRITE);
  if (!r) memcpy((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
  return r;
}

CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags) {
  ENTER(1, 1);
  if (n == 0) return INVALID_VALUE;
  void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return OUT_OF_MEMORY;
  /* Remember the size in front of nothing: keep a side table instead. */
  pthread_mutex_lock(&mu);
  int i = slot(reserve_live);
  if (i >= 0) reserves[i] = (struct reserve){2, (CUdeviceptr)(uintptr_t)m, n};
  pthread_mutex_unlock(&mu);
  (void)flags;
  *p = m;
  return OK;
}

CUresult cuMemFreeHost(void *p) {
  ENTER(1, 0);
  pthread_mutex_lock(&mu);
  CUresult r = INVALID_VALUE;
  for (int i = 0; i < MAXOBJ; i++)
    if (reserves[i].live == 2 && reserves[i].ptr == (CUdeviceptr)(uintptr_t)p) {
      munmap(p, reserves[i].size);
      reserves[i].live = 0;
      r = OK;
    }
  pthread_mutex_unlock(&mu);
  return r;
}

CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
  ENTER(1, 1);
  (void)flags;
  *s = calloc(1, sizeof(struct stream));
  return *s ? OK : OUT_OF_MEMORY;
}

/* Queued copies happen only when the stream is synchronized. */
static CUresult drain(struct stream *s) {
  CUresult r = OK;
  while (s->head) {
    struct copy *c = s->head;
    CUresult cr = check(c->dst, c->n, PROT_WRITE);
    if (!cr) memcpy((void *)(uintptr_t)c->dst, c->src, c->n);
    if (!r) r = cr;
    s->head = c->next;
    free(c);
  }
  s->tail = NULL;
  return r;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream st) {
  ENTER(1, 1);
  CUresult r = check(dst, n, PROT_WRITE);
  if (r) return r;
  struct stream *s = st;
  struct copy *c = malloc(sizeof *c);
  if (!c) return OUT_OF_MEMORY;
  *c = (struct copy){dst, src, n, NULL};
  if (s->tail) s->tail->next = c; else s->head = c;
  s->tail = c;
  return OK;
}

CUresult cuStreamSynchronize(CUstream st) { ENTER(1, 1); return drain(st); }

CUresult cuStreamDestroy_v2(CUstream st) {
  ENTER(1, 1);
  CUresult r = drain(st);
  free(st);
  return r;
}

/* fakecuda_used lets tests check that everything allocated was freed. */
unsigned long long fakecuda_used(void) { return used; }

/* fakecuda_setenv lets in-process tests change the injected faults even when
 * Go's os.Setenv does not reach the C environment (cgo disabled). */
int fakecuda_setenv(const char *k, const char *v) { return v && *v ? setenv(k, v, 1) : unsetenv(k); }
