// The production Worker, plus the test-only classes vitest.e2e.config.ts binds: LocalSkiff (SKIFF:
// forwards to a running skiff) and TestSkiffContainer (SKIFF_CT: the real SkiffContainer class over
// a stand-in container runtime that starts the skiff binary).
export { default } from "../../src/index";
export { LocalSkiff } from "./local-skiff";
export { TestSkiffContainer } from "./fake-container";
