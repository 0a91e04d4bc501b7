// Basin-dialect analytics queries, as a product-analytics Worker sends them, over the demo lake
// (`skiff demo`: 90 days from 2026-08-01; glass.events is v1 plus events_v2, which covers the
// last 30 days and adds utm_* and revenue; glass.identities links devices to people).
// Every query has a total ORDER BY (ties broken down to a unique key or every output column),
// so two runs, or two routes, must give the same rows in the same order.

export interface AnalyticsQuery {
  /** Short id, used as the test name. */
  name: string;
  /** The product feature it serves. */
  kind:
    | "trends"
    | "funnel"
    | "retention"
    | "paths"
    | "person timeline"
    | "live events"
    | "top events"
    | "property values"
    | "breakdown"
    | "people"
    | "catalog";
  sql: string;
  /** Fewest rows a healthy demo lake gives (5,000 events or more). */
  minRows: number;
  /** For a query whose row count is fixed (one row per funnel step): what makes the answer non-trivial. */
  nonTrivial?: (rows: Record<string, unknown>[]) => boolean;
}

const positive = (v: unknown) => typeof v === "number" && v > 0;

export const QUERIES: AnalyticsQuery[] = [
  {
    name: "trends_daily_pageviews",
    kind: "trends",
    // 45 days across the v1/v2 boundary: unique devices exact and approximate, people approximate.
    sql: `
SELECT date_trunc('day', timestamp) AS day,
       count(*) AS pageviews,
       count(DISTINCT device_id) AS devices,
       approx_distinct(coalesce(person_id, device_id)) AS actors
FROM glass.events
WHERE project_id = 'proj_alpha' AND event = '$pageview'
  AND timestamp >= TIMESTAMP '2026-09-14 00:00:00' AND timestamp < TIMESTAMP '2026-10-29 00:00:00'
GROUP BY 1
ORDER BY 1`,
    minRows: 40,
  },
  {
    name: "trends_weekly_by_device_type",
    kind: "trends",
    sql: `
SELECT date_trunc('week', timestamp) AS week, device_type, count(*) AS events
FROM glass.events
WHERE project_id = 'proj_alpha'
  AND timestamp >= TIMESTAMP '2026-08-03 00:00:00' AND timestamp < TIMESTAMP '2026-10-26 00:00:00'
GROUP BY 1, 2
ORDER BY 1, 2`,
    minRows: 12,
  },
  {
    name: "trends_six_hour_bins",
    kind: "trends",
    sql: `
SELECT date_bin(INTERVAL '6 hours', timestamp, TIMESTAMP '2026-08-01 00:00:00') AS bucket,
       to_char(date_bin(INTERVAL '6 hours', timestamp, TIMESTAMP '2026-08-01 00:00:00'), '%Y-%m-%d %H:00') AS label,
       count(*) AS events
FROM glass.events
WHERE timestamp >= TIMESTAMP '2026-10-20 00:00:00' AND timestamp < TIMESTAMP '2026-10-27 00:00:00'
GROUP BY 1, 2
ORDER BY 1`,
    minRows: 20,
  },
  {
    name: "funnel_pageview_cart_purchase",
    kind: "funnel",
    // Ordered three-step funnel per person (or device while anonymous), 30-day conversion window.
    sql: `
WITH e AS (
  SELECT coalesce(person_id, device_id) AS actor, event, timestamp
  FROM glass.events
  WHERE project_id = 'proj_alpha' AND event IN ('$pageview', 'add_to_cart', 'purchase')
    AND timestamp >= TIMESTAMP '2026-08-15 00:00:00' AND timestamp < TIMESTAMP '2026-10-30 00:00:00'
),
s1 AS (SELECT actor, min(timestamp) AS t1 FROM e WHERE event = '$pageview' GROUP BY actor),
s2 AS (
  SELECT s1.actor, s1.t1, min(e.timestamp) AS t2
  FROM s1 JOIN e ON e.actor = s1.actor
  WHERE e.event = 'add_to_cart' AND e.timestamp > s1.t1 AND e.timestamp < s1.t1 + INTERVAL '30 days'
  GROUP BY s1.actor, s1.t1
),
s3 AS (
  SELECT s2.actor, min(e.timestamp) AS t3
  FROM s2 JOIN e ON e.actor = s2.actor
  WHERE e.event = 'purchase' AND e.timestamp > s2.t2 AND e.timestamp < s2.t1 + INTERVAL '30 days'
  GROUP BY s2.actor
)
SELECT 1 AS step, '$pageview' AS event, count(*) AS actors FROM s1
UNION ALL SELECT 2, 'add_to_cart', count(*) FROM s2
UNION ALL SELECT 3, 'purchase', count(*) FROM s3
ORDER BY step`,
    minRows: 3,
    // The 5,000-event lake has no 30-day purchase after a cart: only the first two steps must count.
    nonTrivial: (rows) => positive(rows[0]?.actors) && positive(rows[1]?.actors),
  },
  {
    name: "funnel_signup_to_purchase_conversion",
    kind: "funnel",
    // Devices that both signed up and purchased, with INTERSECT, against all that signed up.
    sql: `
WITH signed AS (SELECT DISTINCT device_id FROM glass.events WHERE project_id = 'proj_alpha' AND event = 'signup'),
both_steps AS (
  SELECT device_id FROM glass.events WHERE project_id = 'proj_alpha' AND event = 'signup'
  INTERSECT
  SELECT device_id FROM glass.events WHERE project_id = 'proj_alpha' AND event = 'purchase'
)
SELECT (SELECT count(*) FROM signed) AS signed_up,
       (SELECT count(*) FROM both_steps) AS purchased,
       round(CAST((SELECT count(*) FROM both_steps) AS DOUBLE) / CAST((SELECT count(*) FROM signed) AS DOUBLE), 4) AS rate`,
    minRows: 1,
    nonTrivial: (rows) => positive(rows[0]?.signed_up) && positive(rows[0]?.purchased),
  },
  {
    name: "retention_weekly_cohorts",
    kind: "retention",
    // Devices by the week they were first seen; how many come back 0..4 weeks later.
    sql: `
WITH a AS (
  SELECT DISTINCT device_id, date_trunc('week', timestamp) AS week
  FROM glass.events
  WHERE project_id = 'proj_beta'
    AND timestamp >= TIMESTAMP '2026-08-03 00:00:00' AND timestamp < TIMESTAMP '2026-10-26 00:00:00'
),
c AS (SELECT device_id, min(week) AS cohort FROM a GROUP BY device_id),
r AS (
  SELECT c.cohort,
         CAST((date_part('epoch', a.week) - date_part('epoch', c.cohort)) / 604800 AS BIGINT) AS weeks_later,
         a.device_id
  FROM a JOIN c ON a.device_id = c.device_id
)
SELECT cohort, weeks_later, count(*) AS devices
FROM r
WHERE weeks_later <= 4
GROUP BY cohort, weeks_later
ORDER BY cohort, weeks_later`,
    minRows: 10,
  },
  {
    name: "paths_next_page",
    kind: "paths",
    // Page-to-next-page transitions per device (next view within 14 days).
    sql: `
WITH p AS (
  SELECT url, timestamp,
         lead(url) OVER (PARTITION BY device_id ORDER BY timestamp, event_id) AS next_url,
         lead(timestamp) OVER (PARTITION BY device_id ORDER BY timestamp, event_id) AS next_ts
  FROM glass.events
  WHERE project_id = 'proj_alpha' AND event = '$pageview'
)
SELECT url, next_url, count(*) AS n
FROM p
WHERE next_url IS NOT NULL AND next_ts < timestamp + INTERVAL '14 days'
GROUP BY url, next_url
ORDER BY n DESC, url, next_url
LIMIT 25`,
    minRows: 10,
  },
  {
    name: "paths_first_page_after_landing",
    kind: "paths",
    // Each device's landing page (first event, via QUALIFY) and the page viewed right after it.
    sql: `
WITH v AS (
  SELECT device_id, url, timestamp, event_id,
         lead(url) OVER (PARTITION BY device_id ORDER BY timestamp, event_id) AS next_url
  FROM glass.events
  WHERE project_id = 'proj_alpha' AND event = '$pageview'
  QUALIFY row_number() OVER (PARTITION BY device_id ORDER BY timestamp, event_id) = 1
)
SELECT url AS landing, coalesce(next_url, '(exit)') AS next_url, count(*) AS devices
FROM v
GROUP BY 1, 2
ORDER BY devices DESC, landing, next_url
LIMIT 20`,
    minRows: 10,
  },
  {
    name: "person_timeline",
    kind: "person timeline",
    // One person's events, newest first, including the devices glass.identities links to them.
    // p_45 is device d_90 (proj_alpha), which every demo lake has.
    sql: `
SELECT timestamp, event, device_id, person_id, url,
       json_get_str(props, '$title') AS title, props
FROM glass.events
WHERE project_id = 'proj_alpha'
  AND (person_id = 'p_45'
       OR device_id IN (SELECT device_id FROM glass.identities WHERE project_id = 'proj_alpha' AND person_id = 'p_45'))
ORDER BY timestamp DESC, event_id
LIMIT 100`,
    minRows: 1,
  },
  {
    name: "person_latest_event_per_device",
    kind: "person timeline",
    // The latest event of each device of a project (DISTINCT ON), for a people list.
    sql: `
SELECT DISTINCT ON (device_id) device_id, person_id, event, timestamp, country
FROM glass.events
WHERE project_id = 'proj_gamma'
ORDER BY device_id, timestamp DESC, event_id
LIMIT 50`,
    minRows: 10,
  },
  {
    name: "live_events",
    kind: "live events",
    // The events ingested in the last day of the lake, newest first, across both versions.
    sql: `
SELECT __ingest_ts, timestamp, project_id, event, person_id, device_id, url,
       json_get_str(props, '$title') AS title, utm_source
FROM glass.events
WHERE __ingest_ts >= (SELECT max(__ingest_ts) FROM glass.events) - INTERVAL '1 day'
ORDER BY __ingest_ts DESC, event_id
LIMIT 50`,
    minRows: 20,
  },
  {
    name: "top_events",
    kind: "top events",
    sql: `
SELECT event, count(*) AS n, count(DISTINCT device_id) AS devices, approx_distinct(person_id) AS people
FROM glass.events
WHERE project_id = 'proj_alpha'
  AND timestamp >= TIMESTAMP '2026-09-15 00:00:00' AND timestamp < TIMESTAMP '2026-10-15 00:00:00'
GROUP BY event
ORDER BY n DESC, event`,
    minRows: 10,
  },
  {
    name: "top_events_approx_top_k",
    kind: "top events",
    sql: `
SELECT project_id, approx_top_k(event, 3) AS top
FROM glass.events
GROUP BY project_id
ORDER BY project_id`,
    minRows: 3,
  },
  {
    name: "property_values_page_title",
    kind: "property values",
    sql: `
SELECT json_get_str(props, '$title') AS title, count(*) AS n
FROM glass.events
WHERE project_id = 'proj_alpha' AND event = '$pageview'
GROUP BY 1
ORDER BY n DESC, title
LIMIT 30`,
    minRows: 30,
  },
  {
    name: "property_values_purchase_plan",
    kind: "property values",
    // Typed JSON accessors: plan (string), amount (float), items (int).
    sql: `
SELECT json_get_str(props, 'plan') AS plan,
       count(*) AS purchases,
       round(sum(json_get_float(props, 'amount')), 2) AS amount,
       sum(json_get_int(props, 'items')) AS items,
       count(*) FILTER (WHERE json_contains(props, 'currency')) AS with_currency
FROM glass.events
WHERE event = 'purchase'
GROUP BY 1
ORDER BY purchases DESC, plan`,
    minRows: 4,
  },
  {
    name: "breakdown_country_rollup",
    kind: "breakdown",
    // Purchases and amounts by project and country, with per-project and grand totals.
    sql: `
SELECT project_id, country, count(*) AS purchases,
       round(sum(json_get_float(props, 'amount')), 2) AS amount,
       grouping(country) AS is_total
FROM glass.events
WHERE event = 'purchase'
GROUP BY ROLLUP (project_id, country)
ORDER BY project_id NULLS LAST, country NULLS LAST`,
    minRows: 10,
  },
  {
    name: "breakdown_utm_revenue",
    kind: "breakdown",
    // Columns only events_v2 has (NULL in older rows).
    sql: `
SELECT utm_source, utm_medium, count(*) AS purchases, round(sum(revenue), 2) AS revenue
FROM glass.events
WHERE project_id = 'proj_alpha' AND event = 'purchase'
GROUP BY utm_source, utm_medium
ORDER BY revenue DESC NULLS LAST, utm_source NULLS LAST, utm_medium NULLS LAST`,
    minRows: 2,
  },
  {
    name: "breakdown_purchase_amount_percentiles",
    kind: "breakdown",
    sql: `
SELECT plan, count(*) AS purchases,
       round(approx_percentile_cont(amount, 0.5), 2) AS p50,
       round(approx_percentile_cont(amount, 0.9), 2) AS p90,
       round(approx_median(amount), 2) AS median
FROM (SELECT json_get_str(props, 'plan') AS plan, json_get_float(props, 'amount') AS amount
      FROM glass.events WHERE event = 'purchase') p
GROUP BY plan
ORDER BY plan`,
    minRows: 4,
  },
  {
    name: "unique_people_weekly",
    kind: "people",
    // Anonymous devices resolved to people through glass.identities.
    sql: `
SELECT date_trunc('week', e.timestamp) AS week,
       count(DISTINCT coalesce(e.person_id, i.person_id, e.device_id)) AS people
FROM glass.events e
LEFT JOIN glass.identities i ON i.device_id = e.device_id AND i.project_id = e.project_id
WHERE e.project_id = 'proj_alpha'
  AND e.timestamp >= TIMESTAMP '2026-09-07 00:00:00' AND e.timestamp < TIMESTAMP '2026-10-26 00:00:00'
GROUP BY 1
ORDER BY 1`,
    minRows: 7,
  },
  {
    name: "show_tables",
    kind: "catalog",
    sql: "SHOW TABLES IN glass",
    minRows: 3,
  },
  {
    // A physical table: the same on both routes (`DESCRIBE glass.events` is the first version
    // alone on the Basin route, the union of the versions on /query).
    name: "describe_events_v2",
    kind: "catalog",
    sql: "DESCRIBE glass.events_v2",
    minRows: 21,
  },
];
