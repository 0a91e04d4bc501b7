-- difftest regression: answers differ: rows 0..0 (equal order keys): a row ['a-000000', None] vs ['a-000000', 6]
-- lead(x) IGNORE NULLS over partitions: NULL on every row with skiff's rules, the values without them
-- found by: reduced by hand from a generated query, checked with scripts/difftest --sql on hurt1; oracle b (skiff with all rules vs --disable-rules all)
-- rules_on: {"rows": [["a-000000", null], ["a-000001", null], ["a-000002", null], ["a-000003", null], ["a-000004", null], ["a-000005", null], ["a-000006", null], ["a-000007", null], ["a-000008", null], ["a-000009", null], ["a-000010", null], ["a-000011", null], ["a-000012", null], ["a-000013", null], ["a-000014", null], ["a-000015", null], ["a-000016", null], ["a-000017", null], ["a-000018", null], ["a-000019", null], ["a-000020", null], ["a-000021", null], ["a-000022", null], ["a-000023", null], ["a-000024", null]], "row_count": 25}
-- rules_off: {"rows": [["a-000000", 6], ["a-000001", 7], ["a-000002", 7], ["a-000003", 7], ["a-000004", 7], ["a-000005", 7], ["a-000006", 0], ["a-000007", 7], ["a-000008", 7], ["a-000009", 7], ["a-000010", 7], ["a-000011", 7], ["a-000012", 7], ["a-000013", 7], ["a-000014", 7], ["a-000015", 7], ["a-000016", 7], ["a-000017", 7], ["a-000018", 7], ["a-000019", 0], ["a-000020", 0], ["a-000021", 7], ["a-000022", 7], ["a-000023", 7], ["a-000024", 7]], "row_count": 25}
-- spec: {"order": [[0, false]], "limit": 25}
SELECT t.event_id AS c0, lead(char_length(t.user_id)) IGNORE NULLS OVER (PARTITION BY t.utm_source ORDER BY t.timestamp, t.event_id) AS c1 FROM glass.events t ORDER BY c0 LIMIT 25;
-- duckdb:
SELECT t.event_id AS c0, lead(length(t.user_id) IGNORE NULLS) OVER (PARTITION BY t.utm_source ORDER BY t.timestamp, t.event_id) AS c1 FROM glass.events t ORDER BY c0 LIMIT 25;
