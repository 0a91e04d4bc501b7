-- difftest regression: error on one side: with rules: error 400 invalid_query: Arrow error: Divide by zero error
-- a CTE read three times computed every column for its copies, a window over a division by zero that no copy selects among them; each copy planned on its own prunes it (shared.rs columns_read)
-- found by: scripts/difftest --seed 8484 (query 839, cte) on hurt; oracle b (skiff with all rules vs --disable-rules all)
-- rules_on: {"status": 400, "code": "invalid_query", "message": "Arrow error: Divide by zero error"}
-- rules_off: {"rows": [["1969-12-31T23:59:59.999999Z", 3766], ["2026-07-26T23:59:59.999999Z", 3766], ["2026-07-27T00:00:00.000000Z", 3766], ["2026-07-27T00:00:00.000000Z", 3766], ["2026-07-27T00:13:14.414907Z", 3766]], "row_count": 5}
-- spec: {"order": [[1, false], [0, false]], "limit": 5, "tol": []}
WITH cte2 AS (SELECT t1."timestamp" AS c1, max((t1."items" / t1."items")) OVER (ORDER BY t1."timestamp") AS c7 FROM glass.events t1) SELECT u6.c1 AS c1, (SELECT count(*) AS v FROM cte2 u4) AS c4 FROM cte2 u6 ORDER BY c4 NULLS FIRST, c1 NULLS FIRST LIMIT 5;
-- duckdb:
WITH cte2 AS (SELECT t1."timestamp" AS c1, max((t1."items" // t1."items")) OVER (ORDER BY t1."timestamp" NULLS LAST) AS c7 FROM glass.events t1) SELECT u6.c1 AS c1, (SELECT count(*) AS v FROM cte2 u4) AS c4 FROM cte2 u6 ORDER BY c4 NULLS FIRST, c1 NULLS FIRST LIMIT 5;
