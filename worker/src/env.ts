import type { SkiffContainer } from "./container";
import type { SkiffWorkerContainer } from "./worker-container";

/** The Worker's bindings: `vars` and secrets from wrangler.jsonc, plus the containers' Durable Objects. */
export interface Env {
  SKIFF: DurableObjectNamespace<SkiffContainer>;
  /** The worker pool's containers (`skiff worker`), used when SKIFF_WORKER_POOL > 0. */
  SKIFF_WORKER?: DurableObjectNamespace<SkiffWorkerContainer>;
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
  /** Number of worker containers queries are spread over; "0" or unset: none, each query runs in its coordinator. */
  SKIFF_WORKER_POOL?: string;
  /** The Worker's own origin (`https://skiff.<subdomain>.workers.dev`): coordinators reach the workers through it. Required with a pool. */
  SKIFF_PUBLIC_URL?: string;
  /**
   * Secret: the token coordinators and workers share on `/_worker/<n>` and in the tunnel. Required
   * with a pool. Comma-separated to rotate: every one is accepted, the first is the one sent.
   */
  SKIFF_WORKER_TOKEN?: string;
  /** Every other `SKIFF_*` setting (and RUST_LOG) reaches the container as is (see containerEnvVars). */
  [setting: string]: unknown;
}
