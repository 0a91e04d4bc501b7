-- difftest regression: error on one side: error 400 invalid_query: Schema contains duplicate unqualified field name "sum(s.n)" / [[10958, 10958.0, 10958]]
-- sum(x) and sum(CAST(x AS DOUBLE)) in one SELECT: 400 'duplicate unqualified field name sum(s.n)' (a cast does not show in the aggregate's name); a valid query
-- found by: reduced by hand from a generated query, checked with scripts/difftest --sql on gl30k; oracle a (skiff vs DuckDB)
-- rules_on: {"status": 400, "code": "invalid_query", "message": "Schema contains duplicate unqualified field name \"sum(s.n)\""}
-- rules_off: {"status": 400, "code": "invalid_query", "message": "Schema contains duplicate unqualified field name \"sum(s.n)\""}
-- duckdb: {"rows": [[10958, 10958.0, 10958]], "row_count": 1}
-- spec: {}
SELECT sum(s.n) AS a, sum(CAST(s.n AS DOUBLE)) AS b, sum(s.n) AS c FROM (SELECT t.os AS o, count(*) AS n FROM glass.events_v2 t GROUP BY t.os) s;
