/* The core queue's launch/complete mode, driven through the public ABI with a scripted backend:
 * command buffer k+1 is launched while k is still running, at most max_in_flight are in flight,
 * launches follow commit order and completions launch order, a command buffer's status changes only
 * at its completion, a completion's error is sticky on its command buffer, and device close waits
 * for everything in flight. Prints "queue pipeline: ok" and exits 0, or says what failed and exits 1.
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
static uint64_t launched[MAX_EVENTS], completed[MAX_EVENTS]; /* serials, in call order */
static uint32_t n_launched, n_completed, released, in_flight, max_in_flight_seen;
static uint64_t fail_serial; /* complete sets an execution error on this one */
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

static void fake_launch(mlxn_device *dev, mlxn_cmdbuf *cb) {
  (void)dev;
  pthread_mutex_lock(&mu);
  if (n_launched < MAX_EVENTS) launched[n_launched] = cb->serial;
  n_launched++;
  in_flight++;
  if (in_flight > max_in_flight_seen) max_in_flight_seen = in_flight;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

static void fake_complete(mlxn_device *dev, mlxn_cmdbuf *cb) {
  (void)dev;
  pthread_mutex_lock(&mu);
  while (released <= n_completed) pthread_cond_wait(&cv, &mu);
  if (n_completed < MAX_EVENTS) completed[n_completed] = cb->serial;
  n_completed++;
  in_flight--;
  cb->t_start = mlxn_now_ns();
  cb->t_end = cb->t_start + 1;
  if (cb->serial == fail_serial) {
    cb->error_code = MLXN_E_EXECUTION;
    snprintf(cb->error, sizeof cb->error, "scripted failure");
  }
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

int mlxn_backend_open(mlxn_device *dev, uint32_t threads) {
  (void)threads;
  dev->launch = fake_launch;
  dev->complete = fake_complete;
  dev->max_in_flight = DEPTH;
  return 0;
}
void mlxn_backend_close(mlxn_device *dev) { (void)dev; }
uint32_t mlxn_backend_info(mlxn_device *dev, char *buf, uint32_t cap) {
  (void)dev;
  return (uint32_t)snprintf(buf, cap, "{\"backend\":\"scripted\"}");
}
void *mlxn_backend_alloc(mlxn_device *dev, uint64_t nbytes, void **handle) {
  (void)dev;
  (void)handle;
  return calloc(1, nbytes ? nbytes : 1);
}
void mlxn_backend_free(mlxn_device *dev, void *mem, void *handle) {
  (void)dev;
  (void)handle;
  free(mem);
}
int32_t mlxn_backend_copy(mlxn_device *dev, uint8_t *mem, uint8_t *host, uint64_t len, int to_device) {
  (void)dev;
  if (to_device) memcpy(mem, host, len);
  else memcpy(host, mem, len);
  return MLXN_OK;
}
int mlxn_backend_host_visible(mlxn_device *dev) {
  (void)dev;
  return 1;
}
int mlxn_backend_has_kernel(mlxn_device *dev, const mlxn_contract *k) {
  (void)dev;
  (void)k;
  return 1;
}
void mlxn_backend_run(mlxn_device *dev, mlxn_cmdbuf *cb) { /* unused: launch/complete are set */
  fake_launch(dev, cb);
  fake_complete(dev, cb);
}

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

int main(void) {
  mlxn_device *dev = mlxn_device_open(0, 1);
  if (!dev) {
    fprintf(stderr, "FAIL: device open\n");
    return 1;
  }
  mlxn_cmdbuf *cb[6];
  for (int i = 0; i < 6; i++) cb[i] = mlxn_cmdbuf_new(dev);
  fail_serial = cb[1]->serial;

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
    CHECK(launched[i] == cb[i]->serial, "launch %u out of commit order", i);
    CHECK(completed[i] == cb[i]->serial, "completion %u out of launch order", i);
  }
  for (int i = 0; i < 6; i++) mlxn_cmdbuf_free(cb[i]);
  if (failures) return 1;
  printf("queue pipeline: ok\n");
  return 0;
}
