-- Values of one JSON property, for a filter drop-down.
SELECT json_get_str(props, '$title') AS title, count(*) AS n
FROM glass.events
WHERE project_id = 'proj_alpha' AND event = '$pageview'
GROUP BY 1
ORDER BY n DESC, title
LIMIT 30
