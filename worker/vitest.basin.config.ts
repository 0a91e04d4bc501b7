import { defineConfig } from "vitest/config";

// The Basin SQL client test (test/basin-client): a production-style client in plain Node (not
// workerd) against a real skiff at SKIFF_URL, with SKIFF_TEST_TOKEN; when missing, the tests fail.
export default defineConfig({
  test: {
    environment: "node",
    include: ["test/basin-client/**/*.test.ts"],
    // One file, run in order: queries go one at a time so skiff is not swamped.
    fileParallelism: false,
    testTimeout: 120_000,
    hookTimeout: 30_000,
  },
});
