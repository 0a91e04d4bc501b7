-- difftest regression: answers differ: 6 rows vs 7 rows
-- a grouping set named twice: DataFusion merges the copies into one group and counts every row twice (2774 for 1387 rows); DuckDB and PostgreSQL give one row per copy
-- found by: reduced by hand from a generated query, checked with scripts/difftest --sql on hurt1; oracle a (skiff vs DuckDB)
-- rules_on: {"rows": [[null, 2774], ["proj_alpha", 829], ["proj_\u00fcn\u00ef", 81], ["proj_beta", 277], ["proj_gamma", 131], ["", 69]], "row_count": 6}
-- rules_off: {"rows": [[null, 2774], ["proj_alpha", 829], ["proj_\u00fcn\u00ef", 81], ["proj_beta", 277], ["proj_gamma", 131], ["", 69]], "row_count": 6}
-- duckdb: {"rows": [[null, 1387], [null, 1387], ["proj_alpha", 829], ["", 69], ["proj_gamma", 131], ["proj_beta", 277], ["proj_\u00fcn\u00ef", 81]], "row_count": 7}
-- spec: {}
SELECT t.project_id AS k, count(*) AS n FROM glass.events_v2 t GROUP BY GROUPING SETS ((), (), (t.project_id));
