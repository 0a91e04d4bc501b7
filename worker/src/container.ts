import { Container } from "@cloudflare/containers";
import type { StopParams } from "@cloudflare/containers";
import type { Env } from "./env";

/** The port skiff listens on inside the container (SKIFF_HTTP_ADDR below). */
export const SKIFF_PORT = 8080;

/** Settings and secrets handed to skiff as environment variables when the container starts. */
export function containerEnvVars(env: Env): Record<string, string> {
  const vars: Record<string, string> = {
    // Listen on all interfaces: the Durable Object reaches the container over its network.
    SKIFF_HTTP_ADDR: `0.0.0.0:${SKIFF_PORT}`,
    // Only HTTP reaches a container, so Arrow Flight (gRPC) stays off.
    SKIFF_FLIGHT_ADDR: "",
  };
  const passed = [
    "SKIFF_CATALOG_URI",
    "SKIFF_WAREHOUSE",
    "LAKE_VERSIONS",
    "API_TOKEN",
    "CF_API_TOKEN",
    "SKIFF_QUERY_TIMEOUT",
    "SKIFF_MEMORY_LIMIT",
  ] as const;
  for (const key of passed) {
    const value = env[key];
    // Unset secrets are left out, so skiff's own defaults and fallbacks apply.
    if (typeof value === "string" && value !== "") vars[key] = value;
  }
  return vars;
}

/** Only the message: errors from the runtime never need the env (which holds secrets) to be useful. */
function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/**
 * One skiff process. The Durable Object (one per instance name) starts the container on the
 * first request, proxies HTTP to port 8080, and stops it after `sleepAfter` without requests.
 */
export class SkiffContainer extends Container<Env> {
  override defaultPort = SKIFF_PORT;
  // Long enough that the catalog and footer caches outlive a quiet spell between dashboard loads.
  override sleepAfter = "10m";

  // Read at every container start; `this.env` is set by the time fields initialise.
  override envVars = containerEnvVars(this.env);

  override onStart(): void {
    console.log(JSON.stringify({ event: "skiff_container_started", instance: this.ctx.id.toString() }));
  }

  override onStop(params: StopParams): void {
    // A non-zero exit code here is most often an OOM kill: consider a bigger instance_type.
    console.log(
      JSON.stringify({
        event: "skiff_container_stopped",
        instance: this.ctx.id.toString(),
        exitCode: params.exitCode,
        reason: params.reason,
      }),
    );
  }

  // Called when the container fails to start or crashes. The library already turns the failure
  // into an error response (which the Worker maps to 503), so log and don't rethrow.
  override onError(error: unknown): void {
    console.error(
      JSON.stringify({ event: "skiff_container_error", instance: this.ctx.id.toString(), error: describe(error) }),
    );
  }
}
