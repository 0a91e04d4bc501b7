import { defineConfig } from "vitest/config";

// Tests of the Worker's Node tools (tools/check-config.mjs), in Node.
export default defineConfig({
  test: {
    environment: "node",
    include: ["test/tools/**/*.test.ts"],
    testTimeout: 120_000,
  },
});
