// The production Worker, plus the test-only classes vitest.e2e.config.ts binds: LocalSkiff (SKIFF:
// forwards to a running skiff), TestSkiffContainer (SKIFF_CT) and TestSkiffWorkerContainer
// (SKIFF_WORKER): the real container classes over a stand-in container runtime that starts the
// skiff binary.
export { default } from "../../src/index";
export { LocalSkiff } from "./local-skiff";
export { TestSkiffContainer, TestSkiffWorkerContainer } from "./fake-container";
