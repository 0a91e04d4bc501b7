import { cloudflareTest } from "@cloudflare/vitest-pool-workers";
import { defineConfig } from "vitest/config";

// Unit tests run in workerd. wrangler.jsonc is not loaded: its container needs Docker and
// Cloudflare's runtime, so SKIFF is bound to a stand-in Durable Object (test/unit/stand-in.ts).
export default defineConfig({
  plugins: [
    cloudflareTest({
      main: "./test/unit/main.ts",
      miniflare: {
        compatibilityDate: "2026-04-20",
        durableObjects: { SKIFF: "StandInContainer" },
        bindings: {
          API_TOKEN: "token-new, token-old",
          SKIFF_INSTANCES: "1",
        },
      },
    }),
  ],
  test: {
    include: ["test/unit/**/*.test.ts"],
  },
});
