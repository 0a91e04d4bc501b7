-- difftest regression: answers differ: a row [4, 3] vs [4, 2]
-- ntile(4) over 6 rows gives buckets of 2, 1, 2, 1 rows; the standard (DuckDB, PostgreSQL) gives 2, 2, 1, 1
-- found by: reduced by hand from a generated query, checked with scripts/difftest --sql on gl30k; oracle a (skiff vs DuckDB)
-- rules_on: {"rows": [[1, 1], [2, 1], [3, 2], [4, 3], [5, 3], [6, 4]], "row_count": 6}
-- rules_off: {"rows": [[1, 1], [2, 1], [3, 2], [4, 3], [5, 3], [6, 4]], "row_count": 6}
-- duckdb: {"rows": [[1, 1], [2, 1], [3, 2], [4, 2], [5, 3], [6, 4]], "row_count": 6}
-- spec: {}
SELECT x AS x, ntile(4) OVER (ORDER BY x) AS b FROM (VALUES (1), (2), (3), (4), (5), (6)) AS v(x);
