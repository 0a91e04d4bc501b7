// The production Worker, plus the test-only LocalSkiff class that vitest.e2e.config.ts binds
// SKIFF to.
export { default } from "../../src/index";
export { LocalSkiff } from "./local-skiff";
