/**
 * Every op dispatcher, and (by importing each family) every kernel contract.
 *
 * @module
 */

export * from "./common.ts";
export * from "./elementwise.ts";
export * from "./norm.ts";
export * from "./rope.ts";
export * from "./matmul.ts";
export * from "./attention.ts";
export * from "./sample.ts";
