// Metal backend: implements the native core's hooks (native/core/internal.h) on Apple's Metal.
// Manual retain/release (no ARC): every +1 object from new…/alloc is released explicitly.
//
// Device: MTLCreateSystemDefaultDevice and one command queue. Buffers: MTLStorageModeShared,
// zero-filled, the host address is `contents` (zero copy). Kernels: the MSL sources of
// kernels/metal/, embedded in the dylib (build/mlxn_metal_source.h), compiled at device open with
// newLibraryWithSource; pipelines are cached per kernel and labelled with its name. Execution: on
// the core's queue thread, one MTLCommandBuffer with ONE compute encoder of dispatch type
// Concurrent (Serial under MLXN_CONCURRENCY=0); memoryBarrierWithScope:MTLBarrierScopeBuffers
// between concurrent groups; setBytes for inline constants; setThreadgroupMemoryLength; commit,
// waitUntilCompleted, status and error text, GPUStartTime/GPUEndTime. A command buffer is always
// committed and waited for, never left pending (no pool exhaustion).
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <stdio.h>
#include <string.h>

#include "../native/core/internal.h"
#include "mlxn_metal_source.h" // generated: static const char mlxn_metal_source[]

// Extra argument slots every MSL kernel receives (see kernels/metal/common.metal).
enum { SLOT_GRID = 28, SLOT_TAG = 29, SLOT_FAULT = 30 };

typedef struct metal_state {
  id<MTLDevice> device;
  id<MTLCommandQueue> queue;
  id<MTLLibrary> library;
  NSMutableDictionary *pipelines; // kernel name → id<MTLComputePipelineState>
  NSSet *functions;               // names the library defines
  id<MTLBuffer> fault;            // one u32: tag + 1 of a dispatch that failed at run time
  BOOL dispatch_counters;         // MTLCounterSamplingPointAtDispatchBoundary supported
} metal_state;

// Threadgroup memory a kernel reduces through, at least (its contract's rule): f32s per thread.
static NSUInteger threadgroup_floats_bytes(const mlxn_contract *k, NSUInteger threads) {
  return threads * sizeof(float) * k->tg_floats_per_thread;
}

int mlxn_backend_open(mlxn_device *dev, uint32_t threads) {
  (void)threads;
  @autoreleasepool {
    id<MTLDevice> device = MTLCreateSystemDefaultDevice();
    if (device == nil) {
      mlxn_set_error(MLXN_E_DEVICE, "no Metal device (MTLCreateSystemDefaultDevice returned nil)");
      return -1;
    }
    NSError *error = nil;
    MTLCompileOptions *options = [[MTLCompileOptions alloc] init];
    options.fastMathEnabled = NO; // IEEE arithmetic: results comparable with the other backends
    id<MTLLibrary> library = [device newLibraryWithSource:[NSString stringWithUTF8String:mlxn_metal_source]
                                                  options:options
                                                    error:&error];
    [options release];
    if (library == nil) {
      mlxn_set_error(MLXN_E_DEVICE, "compiling the Metal kernels failed: %s",
                     error ? [[error localizedDescription] UTF8String] : "unknown error");
      [device release];
      return -1;
    }
    metal_state *s = calloc(1, sizeof *s);
    if (!s) {
      [library release];
      [device release];
      mlxn_set_error(MLXN_E_OUT_OF_MEMORY, "out of memory opening the Metal device");
      return -1;
    }
    s->device = device;
    s->queue = [device newCommandQueue];
    s->queue.label = @"mlx-native";
    s->library = library;
    s->pipelines = [[NSMutableDictionary alloc] init];
    s->functions = [[NSSet alloc] initWithArray:library.functionNames];
    s->fault = [device newBufferWithLength:sizeof(uint32_t) options:MTLResourceStorageModeShared];
    memset([s->fault contents], 0, sizeof(uint32_t));
    s->dispatch_counters = [device supportsCounterSampling:MTLCounterSamplingPointAtDispatchBoundary];
    dev->backend = s;
  }
  return 0;
}

void mlxn_backend_close(mlxn_device *dev) {
  metal_state *s = dev->backend;
  if (!s) return;
  [s->fault release];
  [s->functions release];
  [s->pipelines release];
  [s->library release];
  [s->queue release];
  [s->device release];
  free(s);
  dev->backend = NULL;
}

uint32_t mlxn_backend_info(mlxn_device *dev, char *buf, uint32_t cap) {
  metal_state *s = dev->backend;
  @autoreleasepool {
    return (uint32_t)snprintf(
        buf, cap,
        "{\"backend\":\"metal\",\"name\":\"%s\",\"maxThreadsPerGroup\":%d,\"maxThreadgroupMemory\":%d,"
        "\"maxInlineBytes\":%d,\"maxSlots\":%d,\"unifiedMemory\":%s,\"serial\":%s,\"perDispatchTiming\":false,"
        "\"counterSamplingAtDispatchBoundary\":%s}",
        [s->device.name UTF8String], MLXN_MAX_THREADS_PER_GROUP, MLXN_MAX_TG_MEMORY, MLXN_MAX_INLINE_BYTES,
        SLOT_GRID, s->device.hasUnifiedMemory ? "true" : "false", (dev->flags & MLXN_FLAG_SERIAL) ? "true" : "false",
        s->dispatch_counters ? "true" : "false");
  }
}

void *mlxn_backend_alloc(mlxn_device *dev, uint64_t nbytes, void **handle) {
  metal_state *s = dev->backend;
  id<MTLBuffer> b = [s->device newBufferWithLength:(NSUInteger)nbytes options:MTLResourceStorageModeShared];
  if (b == nil) return NULL;
  memset([b contents], 0, (size_t)nbytes); // zero-filled, like every backend
  *handle = b;                             // +1, released by mlxn_backend_free
  return [b contents];
}

void mlxn_backend_free(mlxn_device *dev, void *mem, void *handle) {
  (void)dev;
  (void)mem;
  [(id<MTLBuffer>)handle release];
}

int32_t mlxn_backend_copy(mlxn_device *dev, uint8_t *mem, uint8_t *host, uint64_t len, int to_device) {
  (void)dev;
  if (to_device) memcpy(mem, host, (size_t)len);
  else memcpy(host, mem, (size_t)len);
  return MLXN_OK;
}

int mlxn_backend_host_visible(mlxn_device *dev) {
  (void)dev;
  return 1;
}

int mlxn_backend_has_kernel(mlxn_device *dev, const mlxn_contract *k) {
  metal_state *s = dev->backend;
  @autoreleasepool {
    return [s->functions containsObject:[NSString stringWithUTF8String:k->name]] ? 1 : 0;
  }
}

// The cached pipeline of a kernel (built on first use; labelled with the kernel's name).
static id<MTLComputePipelineState> pipeline_for(metal_state *s, const char *name, char *err, size_t cap) {
  NSString *key = [NSString stringWithUTF8String:name];
  id<MTLComputePipelineState> p = [s->pipelines objectForKey:key];
  if (p != nil) return p;
  id<MTLFunction> fn = [s->library newFunctionWithName:key];
  if (fn == nil) {
    snprintf(err, cap, "kernel %s is missing from the Metal library", name);
    return nil;
  }
  MTLComputePipelineDescriptor *desc = [[MTLComputePipelineDescriptor alloc] init];
  desc.computeFunction = fn;
  desc.label = key;
  NSError *error = nil;
  p = [s->device newComputePipelineStateWithDescriptor:desc options:MTLPipelineOptionNone reflection:nil error:&error];
  [desc release];
  [fn release];
  if (p == nil) {
    snprintf(err, cap, "building the pipeline of %s failed: %s", name,
             error ? [[error localizedDescription] UTF8String] : "unknown error");
    return nil;
  }
  [s->pipelines setObject:p forKey:key];
  [p release]; // the dictionary holds it
  return p;
}

// Encodes one dispatch. Caller holds dev->mu (buffer entries are read).
static BOOL encode_dispatch(mlxn_device *dev, metal_state *s, id<MTLComputeCommandEncoder> enc,
                            const decoded_dispatch *d, mlxn_cmdbuf *cb) {
  id<MTLComputePipelineState> p = pipeline_for(s, d->kernel->name, cb->error, sizeof cb->error);
  if (p == nil) {
    cb->error_code = MLXN_E_EXECUTION;
    return NO;
  }
  NSUInteger threads = (NSUInteger)d->args.tg[0] * d->args.tg[1] * d->args.tg[2];
  if (threads > p.maxTotalThreadsPerThreadgroup) {
    cb->error_code = MLXN_E_EXECUTION;
    snprintf(cb->error, sizeof cb->error, "kernel %s: %lu threads per threadgroup exceed this pipeline's %lu",
             d->kernel->name, (unsigned long)threads, (unsigned long)p.maxTotalThreadsPerThreadgroup);
    return NO;
  }
  [enc setComputePipelineState:p];
  const char *sig = d->kernel->signature;
  for (uint32_t slot = 0; sig[slot] && slot < MLXN_CPU_KERNEL_SLOTS; slot++) {
    if (sig[slot] == 'c') {
      [enc setBytes:d->args.ptr[slot] length:(NSUInteger)d->args.len[slot] atIndex:slot];
    } else if (d->entry[slot] != 0) {
      const buffer_entry *e = &dev->buffers[d->entry[slot] - 1];
      [enc setBuffer:(id<MTLBuffer>)e->handle offset:(NSUInteger)(d->args.ptr[slot] - e->data) atIndex:slot];
    } else {
      [enc setBuffer:s->fault offset:0 atIndex:slot]; // an unbound optional slot: never read
    }
  }
  uint32_t grid[4] = {d->args.grid[0], d->args.grid[1], d->args.grid[2], 0};
  [enc setBytes:grid length:sizeof grid atIndex:SLOT_GRID];
  [enc setBytes:&d->tag length:sizeof d->tag atIndex:SLOT_TAG];
  [enc setBuffer:s->fault offset:0 atIndex:SLOT_FAULT];
  NSUInteger tgmem = d->args.tg_memory;
  if (tgmem < threadgroup_floats_bytes(d->kernel, threads)) tgmem = threadgroup_floats_bytes(d->kernel, threads);
  if (tgmem > 0) [enc setThreadgroupMemoryLength:(tgmem + 15) & ~(NSUInteger)15 atIndex:0];
  // The decoder normalised both dispatch kinds to whole threadgroups plus the exact thread grid,
  // which each kernel receives and checks: dispatchThreadgroups covers both.
  [enc dispatchThreadgroups:MTLSizeMake(d->args.groups[0], d->args.groups[1], d->args.groups[2])
      threadsPerThreadgroup:MTLSizeMake(d->args.tg[0], d->args.tg[1], d->args.tg[2])];
  return YES;
}

void mlxn_backend_run(mlxn_device *dev, mlxn_cmdbuf *cb) {
  metal_state *s = dev->backend;
  cb->t_start = mlxn_now_ns();
  @autoreleasepool {
    id<MTLCommandBuffer> cmd = [s->queue commandBuffer];
    cmd.label = @"mlx-native command buffer";
    MTLDispatchType type = (dev->flags & MLXN_FLAG_SERIAL) ? MTLDispatchTypeSerial : MTLDispatchTypeConcurrent;
    id<MTLComputeCommandEncoder> enc = [cmd computeCommandEncoderWithDispatchType:type];
    BOOL ok = YES;
    pthread_mutex_lock(&dev->mu);
    for (uint32_t g = 0, i = 0; ok && g < cb->n_groups; g++) {
      if (g > 0) [enc memoryBarrierWithScope:MTLBarrierScopeBuffers];
      uint32_t end = g + 1 < cb->n_groups ? cb->group_starts[g + 1] : cb->n_dispatches;
      for (; ok && i < end; i++) ok = encode_dispatch(dev, s, enc, &cb->dispatches[i], cb);
    }
    pthread_mutex_unlock(&dev->mu);
    [enc endEncoding];
    // Committed even after an encoding failure: a command buffer is never left pending.
    [cmd commit];
    [cmd waitUntilCompleted];
    if (cmd.status == MTLCommandBufferStatusError && cb->error_code == 0) {
      cb->error_code = MLXN_E_EXECUTION;
      snprintf(cb->error, sizeof cb->error, "Metal command buffer failed: %s",
               cmd.error ? [[cmd.error localizedDescription] UTF8String] : "unknown error");
    }
    CFTimeInterval gpu = cmd.GPUEndTime - cmd.GPUStartTime;
    cb->t_end = cb->t_start + (uint64_t)(gpu > 0 ? gpu * 1e9 : 0);
    uint32_t *fault = (uint32_t *)[s->fault contents];
    if (*fault != 0) {
      uint32_t tag = *fault - 1, index = 0;
      *fault = 0;
      while (index < cb->n_dispatches && cb->dispatches[index].tag != tag) index++;
      if (cb->error_code == 0) {
        cb->error_code = MLXN_E_EXECUTION;
        snprintf(cb->error, sizeof cb->error, "dispatch %u (tag %u, kernel %s) failed while executing", index, tag,
                 index < cb->n_dispatches ? cb->dispatches[index].kernel->name : "?");
      }
    }
  }
}
