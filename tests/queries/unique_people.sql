-- Unique people per week, resolving anonymous devices through glass.identities.
SELECT date_trunc('week', e.timestamp) AS week,
       count(DISTINCT coalesce(e.person_id, i.person_id, e.device_id)) AS people
FROM glass.events e
LEFT JOIN glass.identities i ON i.device_id = e.device_id AND i.project_id = e.project_id
WHERE e.project_id = 'proj_alpha'
  AND e.timestamp >= TIMESTAMP '2026-09-07 00:00:00' AND e.timestamp < TIMESTAMP '2026-10-26 00:00:00'
GROUP BY 1
ORDER BY 1
