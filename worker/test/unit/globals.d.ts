// Types `exports` from "cloudflare:workers" in the unit tests: the main module is test/unit/main.ts.
declare namespace Cloudflare {
  interface GlobalProps {
    mainModule: typeof import("./main");
  }
}
