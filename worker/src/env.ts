import type { SkiffContainer } from "./container";

/** The Worker's bindings: `vars` and secrets from wrangler.jsonc, plus the container's Durable Object. */
export interface Env {
  SKIFF: DurableObjectNamespace<SkiffContainer>;
  /** Secret: client token(s), comma-separated so a new one can be added before the old is removed. Checked by the Worker only. */
  API_TOKEN?: string;
  /** Secret: Cloudflare API token skiff sends to Basin Catalog (or SKIFF_CATALOG_TOKEN, which wins). */
  CF_API_TOKEN?: string;
  SKIFF_CATALOG_TOKEN?: string;
  SKIFF_CATALOG_URI?: string;
  SKIFF_WAREHOUSE?: string;
  LAKE_VERSIONS?: string;
  /** Number of container instances; "1" (default) means one named instance. */
  SKIFF_INSTANCES?: string;
  /** Header whose value picks the instance when SKIFF_INSTANCES > 1 (default x-project-id). */
  SKIFF_SHARD_HEADER?: string;
  /** Durable Object location hint (`wnam`, `enam`, `weur`, `eeur`, `apac`, `oc`): put the container near the bucket. */
  SKIFF_LOCATION_HINT?: string;
  /** How long a request waits for a starting skiff to be ready before it is answered 503 (`30s`). */
  SKIFF_READY_TIMEOUT?: string;
  /** Every other `SKIFF_*` setting (and RUST_LOG) reaches the container as is (see containerEnvVars). */
  [setting: string]: unknown;
}
