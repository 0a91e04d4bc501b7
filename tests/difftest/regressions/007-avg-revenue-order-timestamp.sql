-- difftest regression: error on one side: error 400 invalid_query: Optimizer rule 'optimize_projections' failed caused by Schema error: No field named "avg(t.revenue) ORDER BY [t.timestamp ASC NULLS LAST]". / [[NaN, 6.715134706295313e+17]]
-- issue 40, item 5: aggregates with ORDER BY (avg, stddev) fail to plan (optimize_projections), with and without skiff's rules; DuckDB answers
-- found by: reduced by hand from a generated query, checked with scripts/difftest --sql on hurt1; oracle a (skiff vs DuckDB)
-- rules_on: {"status": 400, "code": "invalid_query", "message": "Optimizer rule 'optimize_projections' failed\ncaused by\nSchema error: No field named \"avg(t.revenue) ORDER BY [t.timestamp ASC NULLS LAST]\"."}
-- rules_off: {"status": 400, "code": "invalid_query", "message": "Optimizer rule 'optimize_projections' failed\ncaused by\nSchema error: No field named \"avg(t.revenue) ORDER BY [t.timestamp ASC NULLS LAST]\"."}
-- duckdb: {"rows": [[NaN, 6.715134706295313e+17]], "row_count": 1}
-- spec: {}
SELECT avg(t.revenue ORDER BY t.timestamp) AS a, stddev(t.items ORDER BY t.event_id) AS b FROM glass.events_v2 t;
