import { cloudflareTest } from "@cloudflare/vitest-pool-workers";
import { defineConfig } from "vitest/config";
import { launcher } from "./test/e2e/launcher";

// End-to-end, in workerd, against the real skiff binary:
//  - SKIFF: the test-only LocalSkiff Durable Object (test/e2e/local-skiff.ts) forwards to a skiff
//    already running at SKIFF_URL, instead of a container;
//  - SKIFF_CT and SKIFF_WORKER: the production SkiffContainer and SkiffWorkerContainer classes over
//    a stand-in for the container runtime (test/e2e/fake-container.ts) whose processes the
//    LAUNCHER service starts (test/e2e/launcher.ts): SKIFF_BIN serving the lake at SKIFF_E2E_LAKE,
//    or `skiff worker` with its tunnel.
// SKIFF_URL, SKIFF_TEST_TOKEN, SKIFF_BIN and SKIFF_E2E_LAKE come from the environment
// (scripts/test sets them); when missing, the tests fail.
const lake = process.env.SKIFF_E2E_LAKE ?? "";
export default defineConfig({
  plugins: [
    cloudflareTest({
      main: "./test/e2e/main.ts",
      miniflare: {
        compatibilityDate: "2026-04-20",
        durableObjects: {
          SKIFF: "LocalSkiff",
          SKIFF_CT: { className: "TestSkiffContainer", useSQLite: true },
          SKIFF_WORKER: { className: "TestSkiffWorkerContainer", useSQLite: true },
        },
        serviceBindings: { LAUNCHER: launcher },
        bindings: {
          SKIFF_URL: process.env.SKIFF_URL ?? "",
          SKIFF_TEST_TOKEN: process.env.SKIFF_TEST_TOKEN ?? "",
          SKIFF_E2E_LAKE: lake,
          // The Worker accepts exactly the token skiff accepts.
          API_TOKEN: process.env.SKIFF_TEST_TOKEN ?? "",
          SKIFF_CATALOG_URI: lake ? `sqlite://${lake}/catalog.db` : "",
          SKIFF_WAREHOUSE: lake ? `${lake}/warehouse` : "",
          // Reach skiff through the container class (SKIFF_CT): passed as is, as any SKIFF_* setting.
          SKIFF_QUERY_HISTORY: "77",
          SKIFF_WARM_ON_START: "false",
          CF_API_TOKEN: "cf-token-1",
          // The worker pool's token, for the worker containers; no pool here (SKIFF_WORKER_POOL
          // unset, so the coordinator tests run as before): test/e2e/pool.e2e.test.ts sets one per call.
          SKIFF_WORKER_TOKEN: "e2e-worker-token-0123456789abcdef0123456789abcdef",
        },
      },
    }),
  ],
  test: {
    include: ["test/e2e/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // The container tests start processes: one file at a time.
    fileParallelism: false,
  },
});
