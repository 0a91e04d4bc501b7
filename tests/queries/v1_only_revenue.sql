-- A column only a later version has, over a range only the first version covers: NULL.
SELECT count(*) AS n, sum(revenue) AS revenue, max(utm_campaign) AS campaign
FROM glass.events
WHERE timestamp < TIMESTAMP '2026-09-01 00:00:00'
