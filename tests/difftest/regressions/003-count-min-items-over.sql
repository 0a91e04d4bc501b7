-- difftest regression: answers differ: a row [0] vs [38]
-- min over a sliding ROWS frame whose rows are all NULL answers a stale value instead of NULL (both rule settings: DataFusion's sliding min/max)
-- found by: reduced by hand from a generated query, checked with scripts/difftest --sql on hurt1; oracle a (skiff vs DuckDB)
-- rules_on: {"rows": [[0]], "row_count": 1}
-- rules_off: {"rows": [[0]], "row_count": 1}
-- duckdb: {"rows": [[38]], "row_count": 1}
-- spec: {}
SELECT count(*) AS n FROM (SELECT min(t.items) OVER (ORDER BY t.timestamp, t.event_id ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING) AS m FROM glass.events_v2 t) w WHERE w.m IS NULL;
