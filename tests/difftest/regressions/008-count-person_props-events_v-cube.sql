-- difftest regression: answers differ: row 0: order key [None, 3047, 10958] vs [-3, 3047, 10958]
-- a constant grouping key under CUBE: its NULL rows sort first under ORDER BY ... NULLS LAST (the sort treats the key as the constant it is outside grouping sets)
-- found by: reduced by hand from a generated query, checked with scripts/difftest --sql on gl30k; oracle a (skiff vs DuckDB)
-- rules_on: {"rows": [[null, 3047, 10958], [-3, 3047, 10958]], "row_count": 2}
-- rules_off: {"rows": [[null, 3047, 10958], [-3, 3047, 10958]], "row_count": 2}
-- duckdb: {"rows": [[-3, 3047, 10958], [null, 3047, 10958]], "row_count": 2}
-- spec: {"order": [[0, false], [1, true], [2, false]], "limit": 5}
SELECT (1 - 4) AS c2, count(t1.person_props) AS c4, count(*) AS c6 FROM glass.events_v2 t1 GROUP BY CUBE ((1 - 4)) ORDER BY c2 NULLS LAST, c4 DESC, c6 NULLS LAST LIMIT 5;
-- duckdb:
SELECT (1 - 4) AS c2, count(t1.person_props) AS c4, count(*) AS c6 FROM glass.events_v2 t1 GROUP BY CUBE ((1 - 4)) ORDER BY c2 NULLS LAST, c4 DESC NULLS FIRST, c6 NULLS LAST LIMIT 5;
