/* The native decoder alone, without Deno: replays streams written by
 * `DUMP=<dir> deno run -A bench/native_decode_harness.ts` (each with the sizes of the buffers and the
 * names of the pipelines it names) into fresh command buffers of one or more builds of the library,
 * loaded side by side, and prints each build's best time per dispatch. Builds and streams are
 * interleaved round by round, so load on the machine hits every build alike. Nothing runs.
 *
 *   cc -O2 -o build/decode_replay bench/decode_replay.c -ldl
 *   build/decode_replay [-r rounds] [-n reps per round] LIB[,LIB…] DUMP.bin…
 *
 * With REPLAY=1 in the environment it times mlxn_cmdbuf_replay instead: each stream is decoded once
 * into a template (a command buffer never committed) and copied into the fresh command buffers.
 *
 * Under `valgrind --tool=callgrind --toggle-collect=mlxn_cmdbuf_encode` (-r 1 -n 10) it counts the
 * decoder's instructions, which do not depend on the machine's load. */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct lib {
  const char *path;
  void *(*device_open)(uint32_t, uint32_t);
  uint32_t (*buffer_alloc)(void *, uint64_t);
  uint32_t (*pipeline_get)(void *, const uint8_t *);
  void *(*cmdbuf_new)(void *);
  int32_t (*cmdbuf_encode)(void *, const uint8_t *, uint32_t);
  uint32_t (*cmdbuf_dispatch_count)(void *);
  void (*cmdbuf_free)(void *);
  int32_t (*cmdbuf_replay)(void *, void *);
  uint32_t (*last_error)(uint8_t *, uint32_t);
  void *dev;
} lib;

typedef struct stream {
  const char *path;
  uint32_t dispatches, n_chunks;
  uint32_t *chunk_len;    /* bytes */
  uint32_t **chunk;       /* per build: the words with its handles */
  double *best;           /* per build, ns per dispatch */
} stream;

static void *sym(void *h, const char *name) {
  void *p = dlsym(h, name);
  if (!p) {
    fprintf(stderr, "%s\n", dlerror());
    exit(1);
  }
  return p;
}

static uint32_t *read_file(const char *path, size_t *words) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    exit(1);
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint32_t *w = malloc((size_t)n);
  if (!w || fread(w, 1, (size_t)n, f) != (size_t)n) exit(1);
  fclose(f);
  *words = (size_t)n / 4;
  return w;
}

/* Handle words of every record (buffers, pipelines) mapped from the dump's to the build's. */
static void remap(uint32_t *w, uint32_t n, const uint32_t *from, const uint32_t *to, uint32_t nmap,
                  const uint32_t *pfrom, const uint32_t *pto, uint32_t npipe) {
  for (uint32_t i = 0; i < n;) {
    uint32_t op = w[i] & 0xff, len = w[i] >> 16;
    if (len == 0) break;
    uint32_t *h = NULL;
    if (op == 2 || op == 8 || op == 9) h = &w[i + 1];
    if (op == 1) {
      for (uint32_t k = 0; k < npipe; k++)
        if (w[i + 1] == pfrom[k]) {
          w[i + 1] = pto[k];
          break;
        }
    }
    if (op == 11)
      for (uint32_t e = i + 1; e + 6 <= i + len; e += 6) {
        for (uint32_t k = 0; k < nmap; k++)
          if (w[e] == from[k]) {
            w[e] = to[k];
            break;
          }
      }
    if (h)
      for (uint32_t k = 0; k < nmap; k++)
        if (*h == from[k]) {
          *h = to[k];
          break;
        }
    i += len;
  }
}

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
  int rounds = 200, reps = 20, a = 1;
  for (; a < argc && argv[a][0] == '-'; a += 2) {
    if (a + 1 >= argc) return 2;
    if (!strcmp(argv[a], "-r")) rounds = atoi(argv[a + 1]);
    else if (!strcmp(argv[a], "-n")) reps = atoi(argv[a + 1]);
    else return 2;
  }
  if (argc - a < 2) {
    fprintf(stderr, "usage: %s [-r rounds] [-n reps] LIB[,LIB...] DUMP.bin...\n", argv[0]);
    return 2;
  }
  lib libs[8];
  int nlib = 0;
  for (char *p = strtok(argv[a++], ","); p && nlib < 8; p = strtok(NULL, ",")) {
    void *h = dlopen(p, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      fprintf(stderr, "%s\n", dlerror());
      return 1;
    }
    lib *l = &libs[nlib++];
    l->path = p;
    l->device_open = sym(h, "mlxn_device_open");
    l->buffer_alloc = sym(h, "mlxn_buffer_alloc");
    l->pipeline_get = sym(h, "mlxn_pipeline_get");
    l->cmdbuf_new = sym(h, "mlxn_cmdbuf_new");
    l->cmdbuf_encode = sym(h, "mlxn_cmdbuf_encode");
    l->cmdbuf_dispatch_count = sym(h, "mlxn_cmdbuf_dispatch_count");
    l->cmdbuf_free = sym(h, "mlxn_cmdbuf_free");
    l->cmdbuf_replay = getenv("REPLAY") ? sym(h, "mlxn_cmdbuf_replay") : NULL;
    l->last_error = sym(h, "mlxn_last_error");
    l->dev = l->device_open(0, 1);
    if (!l->dev) return 1;
  }
  int ns = argc - a;
  stream *ss = calloc((size_t)ns, sizeof *ss);
  for (int s = 0; s < ns; s++) {
    stream *st = &ss[s];
    st->path = argv[a + s];
    size_t nw;
    uint32_t *w = read_file(st->path, &nw), i = 0;
    if (nw < 4 || w[0] != 0x44584c4d || w[1] != 1) {
      fprintf(stderr, "%s: not a dump\n", st->path);
      return 1;
    }
    st->dispatches = w[2];
    uint32_t nalloc = w[3];
    i = 4;
    uint32_t *from = malloc(nalloc * 4 + 4), *sizes = &w[i];
    i += 3 * nalloc;
    uint32_t npipe = w[i++];
    uint32_t *pfrom = malloc(npipe * 4 + 4), *pname = malloc(npipe * 4 + 4);
    for (uint32_t k = 0; k < npipe; k++) {
      pfrom[k] = w[i];
      pname[k] = i + 2;
      i += 2 + w[i + 1] / 4;
    }
    st->n_chunks = w[i++];
    st->chunk_len = malloc(st->n_chunks * 4);
    st->chunk = calloc((size_t)st->n_chunks * nlib, sizeof(uint32_t *));
    st->best = malloc(sizeof(double) * nlib);
    uint32_t first = i;
    for (int L = 0; L < nlib; L++) {
      lib *l = &libs[L];
      st->best[L] = 1e30;
      uint32_t *to = malloc(nalloc * 4 + 4), *pto = malloc(npipe * 4 + 4);
      for (uint32_t k = 0; k < nalloc; k++) {
        from[k] = sizes[3 * k];
        to[k] = l->buffer_alloc(l->dev, sizes[3 * k + 1] | (uint64_t)sizes[3 * k + 2] << 32);
      }
      for (uint32_t k = 0; k < npipe; k++) pto[k] = l->pipeline_get(l->dev, (const uint8_t *)&w[pname[k]]);
      i = first;
      for (uint32_t c = 0; c < st->n_chunks; c++) {
        uint32_t bytes = w[i++];
        st->chunk_len[c] = bytes;
        uint32_t *copy = malloc(bytes + 4);
        memcpy(copy, &w[i], bytes);
        remap(copy, bytes / 4, from, to, nalloc, pfrom, pto, npipe);
        st->chunk[(size_t)c * nlib + L] = copy;
        i += bytes / 4;
      }
      free(to);
      free(pto);
    }
  }
  for (int r = 0; r < rounds; r++)
    for (int s = 0; s < ns; s++)
      for (int L = 0; L < nlib; L++) {
        stream *st = &ss[s];
        lib *l = &libs[L];
        void *tmpl = NULL; /* REPLAY: the stream decoded once */
        if (l->cmdbuf_replay) {
          tmpl = l->cmdbuf_new(l->dev);
          for (uint32_t c = 0; c < st->n_chunks; c++)
            l->cmdbuf_encode(tmpl, (const uint8_t *)st->chunk[(size_t)c * nlib + L], st->chunk_len[c]);
        }
        for (int k = 0; k < reps; k++) {
          void *cb = l->cmdbuf_new(l->dev);
          double t0 = now_ns();
          int32_t rc = 0;
          if (tmpl) rc = l->cmdbuf_replay(cb, tmpl);
          else
            for (uint32_t c = 0; c < st->n_chunks; c++)
              rc |= l->cmdbuf_encode(cb, (const uint8_t *)st->chunk[(size_t)c * nlib + L], st->chunk_len[c]);
          double t = now_ns() - t0;
          if (rc != 0 || l->cmdbuf_dispatch_count(cb) != st->dispatches) {
            char msg[600] = {0};
            l->last_error((uint8_t *)msg, sizeof msg);
            fprintf(stderr, "%s on %s: rc %d, %u of %u dispatches: %s\n", st->path, l->path, rc,
                    l->cmdbuf_dispatch_count(cb), st->dispatches, msg);
            return 1;
          }
          l->cmdbuf_free(cb);
          if (t / st->dispatches < st->best[L]) st->best[L] = t / st->dispatches;
        }
        if (tmpl) l->cmdbuf_free(tmpl);
      }
  for (int s = 0; s < ns; s++)
    for (int L = 0; L < nlib; L++)
      printf("%-28s %-40s %6.1f ns/dispatch (%u dispatches, %.1f us)\n", ss[s].path, libs[L].path, ss[s].best[L],
             ss[s].dispatches, ss[s].best[L] * ss[s].dispatches / 1e3);
  return 0;
}
