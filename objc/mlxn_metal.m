// Metal backend: fills in the native core's backend table (native/core/backend.h) on Apple's Metal.
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

#include "../native/core/backend.h"
#include "mlxn_metal_source.h" // generated: static const char mlxn_metal_source[]

// Extra argument slots every MSL kernel receives (see kernels/metal/common.metal).
enum { SLOT_GRID = 28, SLOT_TAG = 29, SLOT_FAULT = 30 };

typedef struct metal_state {
  id<MTLDevice> device;
  id<MTLCommandQueue> queue;
  id<MTLLibrary> library;
  NSMutableDictionary *pipelines; // kernel name → id<MTLComputePipelineState>
  NSSet *functions;               // names the library defines
  NSMutableArray *kernels;        // the name of each kernel handed to the core (mlxn_dispatch.kernel)
  id<MTLBuffer> fault;            // one u32: tag + 1 of a dispatch that failed at run time
  BOOL dispatch_counters;         // MTLCounterSamplingPointAtDispatchBoundary supported
  uint32_t flags;                 // the device's MLXN_FLAG_*
} metal_state;

// Threadgroup memory a kernel reduces through, at least (its contract's rule): f32s per thread.
static NSUInteger threadgroup_floats_bytes(const mlxn_contract *k, NSUInteger threads) {
  return threads * sizeof(float) * k->tg_floats_per_thread;
}

static int32_t metal_open(void **state, uint32_t flags, uint32_t threads, mlxn_backend_config *config, char *err,
                          size_t cap) {
  (void)threads;
  (void)config;
  @autoreleasepool {
    id<MTLDevice> device = MTLCreateSystemDefaultDevice();
    if (device == nil) {
      snprintf(err, cap, "no Metal device (MTLCreateSystemDefaultDevice returned nil)");
      return MLXN_E_DEVICE;
    }
    NSError *error = nil;
    MTLCompileOptions *options = [[MTLCompileOptions alloc] init];
    options.fastMathEnabled = NO; // IEEE arithmetic: results comparable with the other backends
    id<MTLLibrary> library = [device newLibraryWithSource:[NSString stringWithUTF8String:mlxn_metal_source]
                                                  options:options
                                                    error:&error];
    [options release];
    if (library == nil) {
      snprintf(err, cap, "compiling the Metal kernels failed: %s",
               error ? [[error localizedDescription] UTF8String] : "unknown error");
      [device release];
      return MLXN_E_DEVICE;
    }
    metal_state *s = calloc(1, sizeof *s);
    if (!s) {
      [library release];
      [device release];
      snprintf(err, cap, "out of memory opening the Metal device");
      return MLXN_E_OUT_OF_MEMORY;
    }
    s->flags = flags;
    s->device = device;
    s->queue = [device newCommandQueue];
    s->queue.label = @"mlx-native";
    s->library = library;
    s->pipelines = [[NSMutableDictionary alloc] init];
    s->functions = [[NSSet alloc] initWithArray:library.functionNames];
    s->kernels = [[NSMutableArray alloc] init];
    s->fault = [device newBufferWithLength:sizeof(uint32_t) options:MTLResourceStorageModeShared];
    memset([s->fault contents], 0, sizeof(uint32_t));
    s->dispatch_counters = [device supportsCounterSampling:MTLCounterSamplingPointAtDispatchBoundary];
    *state = s;
  }
  return MLXN_OK;
}

static void metal_close(void *state) {
  metal_state *s = state;
  if (!s) return;
  [s->fault release];
  [s->kernels release];
  [s->functions release];
  [s->pipelines release];
  [s->library release];
  [s->queue release];
  [s->device release];
  free(s);
}

static uint32_t metal_info(void *state, char *buf, uint32_t cap) {
  metal_state *s = state;
  @autoreleasepool {
    return (uint32_t)snprintf(buf, cap,
                              "\"name\":\"%s\",\"unifiedMemory\":%s,\"perDispatchTiming\":false,"
                              "\"counterSamplingAtDispatchBoundary\":%s",
                              [s->device.name UTF8String], s->device.hasUnifiedMemory ? "true" : "false",
                              s->dispatch_counters ? "true" : "false");
  }
}

static void *metal_alloc(void *state, uint64_t nbytes, void **object) {
  metal_state *s = state;
  id<MTLBuffer> b = [s->device newBufferWithLength:(NSUInteger)nbytes options:MTLResourceStorageModeShared];
  if (b == nil) return NULL;
  memset([b contents], 0, (size_t)nbytes); // zero-filled, like every backend
  *object = b;                             // +1, released by metal_free
  return [b contents];
}

static void metal_free(void *state, void *mem, void *object) {
  (void)state;
  (void)mem;
  [(id<MTLBuffer>)object release];
}

// This backend's object for a kernel: its name as an NSString (held by s->kernels), when the library
// defines a function of that name.
static const void *metal_kernel(void *state, const mlxn_contract *contract) {
  metal_state *s = state;
  @autoreleasepool { // the host's thread may have no pool; s->kernels keeps the key alive after it
    NSString *key = [NSString stringWithUTF8String:contract->name];
    if (key == nil || ![s->functions containsObject:key]) return NULL;
    [s->kernels addObject:key];
    return key;
  }
}

// The cached pipeline of a kernel (built on first use; labelled with the kernel's name).
static id<MTLComputePipelineState> pipeline_for(metal_state *s, NSString *key, const char *name, char *err,
                                                size_t cap) {
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

// Encodes one dispatch; NO with the error recorded in cmd.
static BOOL encode_dispatch(metal_state *s, id<MTLComputeCommandEncoder> enc, const mlxn_dispatch *d,
                            mlxn_command *cmd) {
  char err[256];
  id<MTLComputePipelineState> p = pipeline_for(s, (NSString *)d->kernel, d->contract->name, err, sizeof err);
  if (p == nil) {
    mlxn_command_fail(cmd, MLXN_E_EXECUTION, "%s", err);
    return NO;
  }
  NSUInteger threads = (NSUInteger)d->args.tg[0] * d->args.tg[1] * d->args.tg[2];
  if (threads > p.maxTotalThreadsPerThreadgroup) {
    mlxn_command_fail(cmd, MLXN_E_EXECUTION, "kernel %s: %lu threads per threadgroup exceed this pipeline's %lu",
                      d->contract->name, (unsigned long)threads, (unsigned long)p.maxTotalThreadsPerThreadgroup);
    return NO;
  }
  [enc setComputePipelineState:p];
  const char *sig = d->contract->signature;
  for (uint32_t slot = 0; sig[slot] && slot < MLXN_KERNEL_SLOTS; slot++) {
    if (sig[slot] == 'c') {
      [enc setBytes:d->args.ptr[slot] length:(NSUInteger)d->args.len[slot] atIndex:slot];
    } else if (d->args.ptr[slot]) { // a bound buffer: its MTLBuffer, at the view's offset in it
      id<MTLBuffer> b = (id<MTLBuffer>)d->object[slot];
      [enc setBuffer:b offset:(NSUInteger)(d->args.ptr[slot] - (uint8_t *)[b contents]) atIndex:slot];
    } else {
      [enc setBuffer:s->fault offset:0 atIndex:slot]; // an unbound optional slot: never read
    }
  }
  uint32_t grid[4] = {d->args.grid[0], d->args.grid[1], d->args.grid[2], 0};
  [enc setBytes:grid length:sizeof grid atIndex:SLOT_GRID];
  [enc setBytes:&d->tag length:sizeof d->tag atIndex:SLOT_TAG];
  [enc setBuffer:s->fault offset:0 atIndex:SLOT_FAULT];
  NSUInteger tgmem = d->args.tg_memory;
  if (tgmem < threadgroup_floats_bytes(d->contract, threads)) tgmem = threadgroup_floats_bytes(d->contract, threads);
  if (tgmem > 0) [enc setThreadgroupMemoryLength:(tgmem + 15) & ~(NSUInteger)15 atIndex:0];
  // The decoder normalised both dispatch kinds to whole threadgroups plus the exact thread grid,
  // which each kernel receives and checks: dispatchThreadgroups covers both.
  [enc dispatchThreadgroups:MTLSizeMake(d->args.groups[0], d->args.groups[1], d->args.groups[2])
      threadsPerThreadgroup:MTLSizeMake(d->args.tg[0], d->args.tg[1], d->args.tg[2])];
  return YES;
}

// One MTLCommandBuffer, one compute encoder; a buffer barrier where the group index changes.
static void metal_run(void *state, mlxn_command *cmd) {
  metal_state *s = state;
  cmd->t_start = mlxn_now_ns();
  @autoreleasepool {
    id<MTLCommandBuffer> cb = [s->queue commandBuffer];
    cb.label = @"mlx-native command buffer";
    MTLDispatchType type = (s->flags & MLXN_FLAG_SERIAL) ? MTLDispatchTypeSerial : MTLDispatchTypeConcurrent;
    id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:type];
    BOOL ok = YES;
    for (uint32_t i = 0; ok && i < cmd->n_dispatches; i++) {
      if (i > 0 && cmd->dispatches[i].group != cmd->dispatches[i - 1].group)
        [enc memoryBarrierWithScope:MTLBarrierScopeBuffers];
      ok = encode_dispatch(s, enc, &cmd->dispatches[i], cmd);
    }
    [enc endEncoding];
    // Committed even after an encoding failure: a command buffer is never left pending.
    [cb commit];
    [cb waitUntilCompleted];
    if (cb.status == MTLCommandBufferStatusError)
      mlxn_command_fail(cmd, MLXN_E_EXECUTION, "Metal command buffer failed: %s",
                        cb.error ? [[cb.error localizedDescription] UTF8String] : "unknown error");
    CFTimeInterval gpu = cb.GPUEndTime - cb.GPUStartTime;
    cmd->t_end = cmd->t_start + (uint64_t)(gpu > 0 ? gpu * 1e9 : 0);
    uint32_t *fault = (uint32_t *)[s->fault contents];
    if (*fault != 0) {
      mlxn_command_fault(cmd, *fault);
      *fault = 0;
    }
  }
}

// Shared storage mode: host-addressable memory, copied with the core's default (memcpy).
const mlxn_backend_ops mlxn_backend = {
    .name = "metal",
    .open = metal_open,
    .close = metal_close,
    .info = metal_info,
    .kernel = metal_kernel,
    .run = metal_run,
    .alloc = metal_alloc,
    .free = metal_free,
};
