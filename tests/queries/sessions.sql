-- Sessions per day with their average length in events.
SELECT date_trunc('day', min_ts) AS day, count(*) AS sessions, round(avg(events), 3) AS avg_events
FROM (
  SELECT session_id, min(timestamp) AS min_ts, count(*) AS events
  FROM glass.events
  WHERE project_id = 'proj_alpha'
    AND timestamp >= TIMESTAMP '2026-10-01 00:00:00' AND timestamp < TIMESTAMP '2026-10-08 00:00:00'
  GROUP BY session_id
) s
GROUP BY 1
ORDER BY 1
