-- The latest events of one project, newest first (the event list page).
SELECT timestamp, event, device_id, url
FROM glass.events
WHERE project_id = 'proj_beta'
ORDER BY timestamp DESC, event_id
LIMIT 50
