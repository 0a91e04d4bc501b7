-- difftest regression: error on one side: error 400 invalid_query: Physical plan does not support logical expression ScalarSubquery(<subquery>) / [[341]]
-- a scalar subquery inside FILTER (WHERE ...): 400 'Physical plan does not support logical expression ScalarSubquery'; a valid query
-- found by: reduced by hand from a generated query, checked with scripts/difftest --sql on hurt1; oracle a (skiff vs DuckDB)
-- rules_on: {"status": 400, "code": "invalid_query", "message": "Physical plan does not support logical expression ScalarSubquery(<subquery>)"}
-- rules_off: {"status": 400, "code": "invalid_query", "message": "Physical plan does not support logical expression ScalarSubquery(<subquery>)"}
-- duckdb: {"rows": [[341]], "row_count": 1}
-- spec: {}
SELECT count(*) FILTER (WHERE t1.revenue > (SELECT avg(t2.revenue) FROM glass.events_v2 t2 WHERE t2.revenue < 1000)) AS n FROM glass.events_v2 t1;
