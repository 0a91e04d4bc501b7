-- difftest regression: answers differ: row 0: order key [''] vs [None]
-- GROUP BY k ORDER BY k NULLS FIRST LIMIT n loses the NULL group (the limit pushed into the grouping keeps the first n non-NULL keys)
-- found by: reduced by hand from a generated query, checked with scripts/difftest --sql on hurt1; oracle a (skiff vs DuckDB)
-- rules_on: {"rows": [[""], ["BR"]], "row_count": 2}
-- rules_off: {"rows": [[""], ["BR"]], "row_count": 2}
-- duckdb: {"rows": [[null], [""]], "row_count": 2}
-- spec: {"order": [[0, false]], "limit": 2}
SELECT t1.country AS x FROM glass.events t1 GROUP BY t1.country ORDER BY x NULLS FIRST LIMIT 2;
