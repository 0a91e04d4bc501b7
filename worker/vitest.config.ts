import { cloudflareTest } from "@cloudflare/vitest-pool-workers";
import { readFileSync } from "node:fs";
import { defineConfig } from "vitest/config";

// Every environment variable skiff's configuration reads (src/config.rs), for the test that
// each can be set from wrangler.jsonc.
const settings = [...readFileSync(new URL("../src/config.rs", import.meta.url), "utf8").matchAll(/env = "([A-Z_]+)"/g)].map((m) => m[1]);

// Unit tests run in workerd. wrangler.jsonc is not loaded: its containers need Docker and
// Cloudflare's runtime, so SKIFF and SKIFF_WORKER are bound to a stand-in Durable Object
// (test/unit/stand-in.ts). No worker pool here (SKIFF_WORKER_POOL unset): tests set one per call.
export default defineConfig({
  plugins: [
    cloudflareTest({
      main: "./test/unit/main.ts",
      miniflare: {
        compatibilityDate: "2026-04-20",
        durableObjects: { SKIFF: "StandInContainer", SKIFF_WORKER: "StandInContainer" },
        bindings: {
          API_TOKEN: "token-new, token-old",
          SKIFF_INSTANCES: "1",
          SKIFF_CATALOG_URI: "https://catalog.example/acc123/my-bucket",
          SKIFF_WAREHOUSE: "acc123_my-bucket",
          CF_API_TOKEN: "cf-token",
          TEST_CONFIG_SETTINGS: JSON.stringify(settings),
        },
      },
    }),
  ],
  test: {
    include: ["test/unit/**/*.test.ts"],
  },
});
