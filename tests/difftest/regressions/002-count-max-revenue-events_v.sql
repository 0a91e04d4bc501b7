-- difftest regression: answers differ: a row [65] vs [66]
-- ORDER BY an aggregate LIMIT n (DataFusion's top-k aggregation) loses the groups whose max is NULL: 65 of 66 devices under LIMIT 1000
-- found by: reduced by hand from a generated query, checked with scripts/difftest --sql on hurt1; oracle a (skiff vs DuckDB)
-- rules_on: {"rows": [[65]], "row_count": 1}
-- rules_off: {"rows": [[65]], "row_count": 1}
-- duckdb: {"rows": [[66]], "row_count": 1}
-- spec: {}
SELECT count(*) AS n FROM (SELECT max(t.revenue) AS m FROM glass.events_v2 t GROUP BY t.device_id ORDER BY m DESC LIMIT 1000) x;
