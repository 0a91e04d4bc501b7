-- count(*), min and max over the whole versioned table: answered from Iceberg manifests.
SELECT count(*) AS n, min(timestamp) AS first, max(timestamp) AS last,
       min(__ingest_ts) AS first_ingest, max(__ingest_ts) AS last_ingest
FROM glass.events
