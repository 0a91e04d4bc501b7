import { cloudflareTest } from "@cloudflare/vitest-pool-workers";
import { defineConfig } from "vitest/config";

// End-to-end: the Worker runs in workerd and forwards to a real skiff at SKIFF_URL through the
// test-only LocalSkiff Durable Object (test/e2e/local-skiff.ts) instead of a container.
// SKIFF_URL and SKIFF_TEST_TOKEN come from the environment; when missing, the tests fail.
export default defineConfig({
  plugins: [
    cloudflareTest({
      main: "./test/e2e/main.ts",
      miniflare: {
        compatibilityDate: "2026-04-20",
        durableObjects: { SKIFF: "LocalSkiff" },
        bindings: {
          SKIFF_URL: process.env.SKIFF_URL ?? "",
          SKIFF_TEST_TOKEN: process.env.SKIFF_TEST_TOKEN ?? "",
          // The Worker accepts exactly the token skiff accepts.
          API_TOKEN: process.env.SKIFF_TEST_TOKEN ?? "",
        },
      },
    }),
  ],
  test: {
    include: ["test/e2e/**/*.test.ts"],
    testTimeout: 60_000,
  },
});
