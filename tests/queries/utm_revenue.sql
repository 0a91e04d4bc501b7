-- Revenue by campaign source: columns only events_v2 has, NULL in older rows.
SELECT utm_source, count(*) AS purchases, round(sum(revenue), 2) AS revenue
FROM glass.events
WHERE project_id = 'proj_alpha' AND event = 'purchase'
GROUP BY utm_source
ORDER BY revenue DESC NULLS LAST, utm_source NULLS LAST
