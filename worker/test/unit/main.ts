// The Worker under test, plus the stand-in class its SKIFF binding points at in vitest.config.ts.
export { default } from "../../src/index";
export { StandInContainer } from "./stand-in";
