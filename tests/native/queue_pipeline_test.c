/* The core queue's launch/complete mode, driven through the public ABI with a scripted backend:
 * command buffer k+1 is launched while k is still running, at most max_in_flight are in flight,
 * launches follow commit order and completions launch order, a command buffer's status changes only
 * at its completion, a completion's error is sticky on its command buffer, and device close waits
 * for everything in flight. Also what the core supplies to every backend: the defaults of the hooks
 * a backend leaves out (host memory), the device-info members and slot limit every backend shares,
 * and the one message of a failed dispatch. Prints "queue pipeline: ok" and exits 0, or says what
 * failed and exits 1.
 * Built and run by tests/split_queue_test.ts. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../native/core/internal.h"

#define DEPTH 2
#define MAX_EVENTS 64

/* The scripted backend: complete(k) blocks until the test has released k completions. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static const mlxn_command *launched[MAX_EVENTS], *completed[MAX_EVENTS]; /* in call order */
static uint32_t n_launched, n_completed, released, in_flight, max_in_flight_seen;
static const mlxn_command *fail_cmd; /* complete sets an execution error on this one */
static int failures;

#define CHECK(cond, ...)                                                                                    \
  do {                                                                                                   \
    if (!(cond)) {                                                                                       \
      fprintf(stderr, "FAIL line %d: ", __LINE__);                                                       \
      fprintf(stderr, __VA_ARGS__);                                                                      \
      fprintf(stderr, "\n");                                                                             \
      failures++;                                                                                        \
    }                                                                                                    \
  } while (0)

static void fake_launch(void *state, mlxn_command *cmd) {
  (void)state;
  pthread_mutex_lock(&mu);
  if (n_launched < MAX_EVENTS) launched[n_launched] = cmd;
  n_launched++;
  in_flight++;
  if (in_flight > max_in_flight_seen) max_in_flight_seen = in_flight;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

static void fake_complete(void *state, mlxn_command *cmd) {
  (void)state;
  pthread_mutex_lock(&mu);
  while (released <= n_completed) pthread_cond_wait(&cv, &mu);
  if (n_completed < MAX_EVENTS) completed[n_completed] = cmd;
  n_completed++;
  in_flight--;
  cmd->t_start = mlxn_now_ns();
  cmd->t_end = cmd->t_start + 1;
  if (cmd == fail_cmd) mlxn_command_fail(cmd, MLXN_E_EXECUTION, "scripted failure");
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

static int32_t fake_open(void **state, uint32_t flags, uint32_t threads, mlxn_backend_config *config, char *err,
                         size_t cap) {
  (void)flags, (void)threads, (void)err, (void)cap;
  *state = NULL;
  config->max_in_flight = DEPTH;
  return MLXN_OK;
}
static uint32_t fake_info(void *state, char *buf, uint32_t cap) {
  (void)state;
  return (uint32_t)snprintf(buf, cap, "\"name\":\"scripted\"");
}
static const void *fake_kernel(void *state, const mlxn_contract *contract) {
  (void)state;
  return contract; /* every kernel: any non-NULL object */
}

/* Only the required hooks and launch/complete: memory, copies and close are the core's defaults. */
const mlxn_backend_ops mlxn_backend = {
    .name = "scripted",
    .open = fake_open,
    .info = fake_info,
    .kernel = fake_kernel,
    .launch = fake_launch,
    .complete = fake_complete,
};

/* Waits until at least `n` launches (and `c` completions) happened; 0 after 10 s (a hang, not a
 * speed check). */
static int await_counts(uint32_t n, uint32_t c) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 10;
  pthread_mutex_lock(&mu);
  int ok = 1;
  while (ok && (n_launched < n || n_completed < c)) ok = pthread_cond_timedwait(&cv, &mu, &until) == 0;
  ok = n_launched >= n && n_completed >= c;
  pthread_mutex_unlock(&mu);
  return ok;
}

static void release(uint32_t total) {
  pthread_mutex_lock(&mu);
  released = total;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

static uint32_t launched_now(void) {
  pthread_mutex_lock(&mu);
  uint32_t n = n_launched;
  pthread_mutex_unlock(&mu);
  return n;
}

static void *close_device(void *dev) {
  mlxn_device_close(dev);
  return NULL;
}

/* The scripted backend has no alloc, free or copy hook: buffers are the core's host memory. */
static void check_default_memory(mlxn_device *dev) {
  uint32_t buf = mlxn_buffer_alloc(dev, 64);
  CHECK(buf != 0, "alloc without an alloc hook");
  const uint8_t *host = mlxn_buffer_contents(dev, buf);
  CHECK(host != NULL, "a backend without device memory has host-addressable buffers");
  int zero = 1;
  for (int i = 0; host && i < 64; i++) zero &= host[i] == 0;
  CHECK(zero, "a new buffer is zero-filled");
  uint8_t in[16], out[16] = {0};
  for (int i = 0; i < 16; i++) in[i] = (uint8_t)(3 * i + 1);
  CHECK(mlxn_buffer_write(dev, buf, 8, in, 16) == MLXN_OK && mlxn_buffer_read(dev, buf, 8, out, 16) == MLXN_OK,
        "write and read without a copy hook");
  CHECK(memcmp(in, out, 16) == 0 && host && memcmp(host + 8, in, 16) == 0, "the bytes written are read back");
  CHECK(mlxn_buffer_free(dev, buf) == MLXN_OK, "free without a free hook");
}

/* The core writes the members every backend shares; maxSlots is the one slot limit, and no kernel
 * the device offers declares more slots than that. */
static void check_info_and_slots(mlxn_device *dev) {
  char info[1024];
  mlxn_device_info(dev, (uint8_t *)info, sizeof info);
  char want[64];
  snprintf(want, sizeof want, "\"maxSlots\":%d,", MLXN_KERNEL_SLOTS);
  CHECK(strstr(info, want) != NULL, "device info reports %s: %s", want, info);
  const char *head = "{\"backend\":\"scripted\",\"name\":\"scripted\",";
  CHECK(strncmp(info, head, strlen(head)) == 0, "backend members first: %s", info);
  CHECK(strstr(info, "\"maxThreadsPerGroup\":") && strstr(info, "\"serial\":false}"), "shared members: %s", info);
  uint32_t kernels = 0;
  for (uint32_t p = 1;; p++) {
    char sig[64];
    uint32_t n = mlxn_pipeline_signature(dev, p, (uint8_t *)sig, sizeof sig);
    if (n == 0) break;
    kernels++;
    CHECK(n <= MLXN_KERNEL_SLOTS, "pipeline %u declares %u slots, more than maxSlots", p, n);
  }
  CHECK(kernels > 0 && mlxn_pipeline_get(dev, (const uint8_t *)"debug_fault") != 0, "the scripted backend has every kernel");
}

/* The contract of the kernel called `name` (the test's kernels exist). */
static const mlxn_contract *contract_named(const char *name) {
  const mlxn_contract *c;
  for (uint32_t id = 0; (c = mlxn_contract_at(id)) != NULL; id++)
    if (strcmp(c->name, name) == 0) return c;
  CHECK(0, "no contract named %s", name);
  return NULL;
}

/* A failed dispatch reads the same from every backend, and the first error of a command buffer is
 * the one it reports. */
static void check_failure_messages(void) {
  mlxn_dispatch ds[2];
  memset(ds, 0, sizeof ds);
  ds[0].contract = contract_named("elementwise_add_f32");
  ds[0].tag = 7;
  ds[1].contract = contract_named("rms_norm_f32");
  ds[1].tag = 9;
  mlxn_command cmd;
  memset(&cmd, 0, sizeof cmd);
  cmd.dispatches = ds;
  cmd.n_dispatches = 2;
  mlxn_command_fault(&cmd, 9 + 1);
  CHECK(cmd.error_code == MLXN_E_EXECUTION, "a fault is an execution error");
  CHECK(strcmp(cmd.error, "dispatch 1 (tag 9, kernel rms_norm_f32) failed while executing") == 0, "fault: %s",
        cmd.error);
  mlxn_command_dispatch_failed(&cmd, 0, "later");
  CHECK(strcmp(cmd.error, "dispatch 1 (tag 9, kernel rms_norm_f32) failed while executing") == 0,
        "the first error stays: %s", cmd.error);
  memset(&cmd.error, 0, sizeof cmd.error);
  cmd.error_code = 0;
  mlxn_command_dispatch_failed(&cmd, 0, "a barrier not every thread reaches");
  CHECK(strcmp(cmd.error, "dispatch 0 (tag 7, kernel elementwise_add_f32) failed while executing: a barrier not every thread "
                          "reaches") == 0,
        "detail: %s", cmd.error);
  cmd.error_code = 0;
  mlxn_command_fault(&cmd, 100 + 1);
  CHECK(strcmp(cmd.error, "dispatch 2 (tag 100, kernel ?) failed while executing") == 0, "unknown tag: %s",
        cmd.error);
}

int main(void) {
  mlxn_device *dev = mlxn_device_open(0, 1);
  if (!dev) {
    fprintf(stderr, "FAIL: device open\n");
    return 1;
  }
  check_default_memory(dev);
  check_info_and_slots(dev);
  check_failure_messages();
  mlxn_cmdbuf *cb[6];
  for (int i = 0; i < 6; i++) cb[i] = mlxn_cmdbuf_new(dev);
  fail_cmd = &cb[1]->cmd;

  /* Three committed, none released: two are launched, the first still runs, none completed. */
  for (int i = 0; i < 3; i++) CHECK(mlxn_cmdbuf_commit(cb[i]) == MLXN_OK, "commit %d", i);
  CHECK(await_counts(2, 0), "command buffer 1 was not launched while 0 was in flight");
  CHECK(mlxn_cmdbuf_status(cb[0]) == MLXN_CB_COMMITTED, "status changed before completion");
  CHECK(mlxn_cmdbuf_status(cb[1]) == MLXN_CB_COMMITTED, "status changed before completion");

  /* One completion frees one place: the third is launched next, and only then. */
  release(1);
  CHECK(mlxn_cmdbuf_wait(cb[0]) == MLXN_OK, "wait 0");
  CHECK(await_counts(3, 1), "command buffer 2 was not launched after 0 completed");
  CHECK(mlxn_cmdbuf_status(cb[1]) == MLXN_CB_COMMITTED, "1 completed before it was released");

  /* The completion's error is the command buffer's. */
  release(3);
  CHECK(mlxn_cmdbuf_wait(cb[1]) == MLXN_E_EXECUTION, "wait 1 should report the execution error");
  CHECK(mlxn_cmdbuf_status(cb[1]) == MLXN_CB_ERROR, "status 1");
  CHECK(mlxn_cmdbuf_wait(cb[2]) == MLXN_OK, "wait 2");

  /* Close while two are in flight: it returns only after both completed; they keep their status. */
  CHECK(mlxn_cmdbuf_commit(cb[3]) == MLXN_OK && mlxn_cmdbuf_commit(cb[4]) == MLXN_OK, "commit 3, 4");
  CHECK(await_counts(5, 3), "3 and 4 were not launched");
  pthread_t closer;
  pthread_create(&closer, NULL, close_device, dev);
  release(5);
  pthread_join(closer, NULL);
  CHECK(n_completed == 5, "close returned with %u of 5 completed", n_completed);
  CHECK(mlxn_cmdbuf_status(cb[3]) == MLXN_CB_COMPLETED && mlxn_cmdbuf_status(cb[4]) == MLXN_CB_COMPLETED,
        "3 and 4 after close");
  CHECK(mlxn_cmdbuf_wait(cb[4]) == MLXN_OK, "wait 4 after close");
  CHECK(mlxn_cmdbuf_status(cb[5]) == MLXN_CB_ERROR, "a never-committed command buffer fails at close");
  CHECK(launched_now() == 5, "the uncommitted command buffer was launched");

  CHECK(max_in_flight_seen == DEPTH, "at most %d in flight, saw %u", DEPTH, max_in_flight_seen);
  for (uint32_t i = 0; i < 5; i++) {
    CHECK(launched[i] == &cb[i]->cmd, "launch %u out of commit order", i);
    CHECK(completed[i] == &cb[i]->cmd, "completion %u out of launch order", i);
  }
  for (int i = 0; i < 6; i++) mlxn_cmdbuf_free(cb[i]);
  if (failures) return 1;
  printf("queue pipeline: ok\n");
  return 0;
}
