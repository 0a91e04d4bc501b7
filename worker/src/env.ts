import type { SkiffContainer } from "./container";

/** The Worker's bindings: `vars` and secrets from wrangler.jsonc, plus the container's Durable Object. */
export interface Env {
  SKIFF: DurableObjectNamespace<SkiffContainer>;
  /** Secret: client token(s), comma-separated so a new one can be added before the old is removed. */
  API_TOKEN?: string;
  /** Secret: Cloudflare API token skiff sends to Basin Catalog. */
  CF_API_TOKEN?: string;
  SKIFF_CATALOG_URI?: string;
  SKIFF_WAREHOUSE?: string;
  LAKE_VERSIONS?: string;
  SKIFF_QUERY_TIMEOUT?: string;
  SKIFF_MEMORY_LIMIT?: string;
  /** Number of container instances; "1" (default) means one named instance. */
  SKIFF_INSTANCES?: string;
  /** Header whose value picks the instance when SKIFF_INSTANCES > 1 (default x-project-id). */
  SKIFF_SHARD_HEADER?: string;
}
