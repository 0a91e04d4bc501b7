-- difftest regression: answers differ: a row [525320] vs [524939]
-- PARTITION BY country, country sorts by (country, timestamp, event_id): hashed_windows took the sort's first two keys as the partition keys and ordered each partition by event_id alone
-- found by: scripts/difftest --seed 4040 (query 742, window_agg) on hurt; oracle b (skiff with all rules vs --disable-rules all)
-- spec: {}
SELECT sum(w2.c8) AS c2 FROM (SELECT t1.person_id AS c5, row_number() OVER (PARTITION BY t1.country, t1.country ORDER BY t1."timestamp", t1.event_id) AS c8 FROM glass.events t1) w2 WHERE (w2.c5 IS NOT NULL);
