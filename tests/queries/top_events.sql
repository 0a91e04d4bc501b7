-- Top events of a project over a month.
SELECT event, count(*) AS n, count(DISTINCT device_id) AS devices
FROM glass.events
WHERE project_id = 'proj_alpha'
  AND timestamp >= TIMESTAMP '2026-09-15 00:00:00' AND timestamp < TIMESTAMP '2026-10-15 00:00:00'
GROUP BY event
ORDER BY n DESC, event
