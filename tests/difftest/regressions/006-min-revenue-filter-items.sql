-- difftest regression: error on one side: error 400 invalid_query: Optimizer rule 'optimize_projections' failed caused by Schema error: No field named "min(t.revenue) FILTER (WHERE t.items != Int64(2))". Valid fields  / [[-Infinity, 2542]]
-- an aggregate with FILTER on a predicate that can be NULL fails to plan (optimize_projections: no field named ...FILTER (WHERE ...)), with and without skiff's rules
-- found by: reduced by hand from a generated query, checked with scripts/difftest --sql on hurt1; oracle a (skiff vs DuckDB)
-- rules_on: {"status": 400, "code": "invalid_query", "message": "Optimizer rule 'optimize_projections' failed\ncaused by\nSchema error: No field named \"min(t.revenue) FILTER (WHERE t.items != Int64(2))\". Valid fields are \"count(Int64(1)) FILTER (WHERE t.referrer != Utf8(\"\"https://www.google.com/\"\"))\"."}
-- rules_off: {"status": 400, "code": "invalid_query", "message": "Optimizer rule 'optimize_projections' failed\ncaused by\nSchema error: No field named \"min(t.revenue) FILTER (WHERE t.items != Int64(2))\". Valid fields are \"count(Int64(1)) FILTER (WHERE t.referrer != Utf8(\"\"https://www.google.com/\"\"))\"."}
-- duckdb: {"rows": [[-Infinity, 2542]], "row_count": 1}
-- spec: {}
SELECT min(t.revenue) FILTER (WHERE t.items <> 2) AS m, count(*) FILTER (WHERE t.referrer <> 'https://www.google.com/') AS n FROM glass.events t;
