/**
 * Running model files: {@link loadLlama} builds a llama-architecture model from a GGUF file or an
 * MLX checkpoint directory on a device, {@link generate} runs a prompt and decodes.
 *
 * @module
 */

export { generate, type GenerateOptions, type GenerateResult } from "./generate.ts";
export { LlamaModel, loadLlama, type LoadLlamaOptions, type TokenSelection } from "./llama.ts";
export type { Linear } from "./linear.ts";
export type { RopeMode } from "./weights.ts";
