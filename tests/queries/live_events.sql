-- Live events: the last events ingested, across every version.
SELECT __ingest_ts, event, person_id, device_id
FROM glass.events
ORDER BY __ingest_ts DESC, event_id
LIMIT 50
