-- difftest regression: answers differ: 1 rows vs 0 rows
-- GROUP BY a constant over no rows gives one row (the constant key is dropped and the aggregate becomes a global one); no groups means no rows
-- found by: reduced by hand from a generated query, checked with scripts/difftest --sql on gl30k; oracle a (skiff vs DuckDB)
-- rules_on: {"rows": [[10, 0]], "row_count": 1}
-- rules_off: {"rows": [[10, 0]], "row_count": 1}
-- duckdb: {"rows": [], "row_count": 0}
-- spec: {}
SELECT coalesce(10, 0) AS k, count(*) AS n FROM glass.events t WHERE t.event = 'no such event' GROUP BY coalesce(10, 0);
