-- difftest regression: answers differ: rows 3..3 (equal order keys): a row ['d-000813', None] vs ['d-000813', 68.75]
-- a sliding window frame's sum of doubles kept one running sum: once an infinity or NaN had entered it stayed NaN (shown as NULL), and large values that left took the small ones beside them (fixes/sliding_sums.rs)
-- found by: scripts/difftest --seed 8484 (query 414, window_rows) on hurt; oracle a (skiff vs DuckDB)
-- rules_on: {"rows": [["d-000817", null], ["d-000815", null], ["d-000814", null], ["d-000813", null], ["d-000812", null]], "row_count": 5}
-- rules_off: {"rows": [["d-000817", null], ["d-000815", null], ["d-000814", null], ["d-000813", null], ["d-000812", null]], "row_count": 5}
-- duckdb: {"rows": [["d-000817", null], ["d-000815", null], ["d-000814", null], ["d-000813", 68.75], ["d-000812", 21.09]], "row_count": 5}
-- spec: {"order": [[0, true]], "limit": 5, "tol": [1]}
SELECT t1.event_id AS c0, avg(t1.revenue) OVER (ORDER BY t1."timestamp", t1.event_id ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING) AS c8 FROM glass.events t1 ORDER BY c0 DESC LIMIT 5;
-- duckdb:
SELECT t1.event_id AS c0, avg(t1.revenue) OVER (ORDER BY t1."timestamp" NULLS LAST, t1.event_id NULLS LAST ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING) AS c8 FROM glass.events t1 ORDER BY c0 DESC NULLS FIRST LIMIT 5;
