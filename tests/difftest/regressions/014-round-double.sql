-- difftest regression: answers differ: a row [None, None] vs [1e+308, 2.5e+307]
-- round(x, d) of a double near the top of its range answers inf (x * 10^d overflows before the division); DuckDB answers x
-- found by: reduced by hand from a generated query, checked with scripts/difftest --sql on hurt1; oracle a (skiff vs DuckDB)
-- rules_on: {"rows": [[null, null]], "row_count": 1}
-- rules_off: {"rows": [[null, null]], "row_count": 1}
-- duckdb: {"rows": [[1e+308, 2.5e+307]], "row_count": 1}
-- spec: {}
SELECT round(CAST(1e308 AS DOUBLE), 1) AS a, round(CAST(2.5e307 AS DOUBLE), 2) AS b;
