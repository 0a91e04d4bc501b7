-- difftest regression: error on one side: with rules: 500 SanityCheckPlan (a window's input "does not satisfy order requirements")
-- hashed_windows gave its output none of what was known of its input: the window above it sorted by (device_type, event_id) because the filter makes timestamp constant, and without that constant the plan's check refused the sort
-- found by: scripts/difftest --seed 4040 (query 44, window_rows) on hurt; oracle b (skiff with all rules vs --disable-rules all)
-- spec: {"order": [[0, false]], "limit": 25, "tol": []}
SELECT t1.event_id AS c0, lead(t1."timestamp") OVER (PARTITION BY t1.user_id ORDER BY t1."timestamp", t1.event_id) AS c7, lead(t1.utm_source) IGNORE NULLS OVER (PARTITION BY t1.device_type ORDER BY t1."timestamp", t1.event_id) AS c8 FROM glass.events_v2 t1 WHERE (t1."timestamp" = TIMESTAMP '2026-08-16 01:58:40.777357') ORDER BY c0 LIMIT 25;
-- duckdb:
SELECT t1.event_id AS c0, lead(t1."timestamp") OVER (PARTITION BY t1.user_id ORDER BY t1."timestamp" NULLS LAST, t1.event_id NULLS LAST) AS c7, lead(t1.utm_source IGNORE NULLS) OVER (PARTITION BY t1.device_type ORDER BY t1."timestamp" NULLS LAST, t1.event_id NULLS LAST) AS c8 FROM glass.events_v2 t1 WHERE (t1."timestamp" = TIMESTAMP '2026-08-16 01:58:40.777357') ORDER BY c0 LIMIT 25;
