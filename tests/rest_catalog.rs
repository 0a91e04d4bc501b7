//! A REST catalog as Basin Catalog is one: bearer token, no OAuth, S3 credentials vended in
//! `loadTable`'s config, tables on an S3-compatible store. The catalog here is the test
//! fixture `tests/fixtures/rest_catalog.py` (no REST catalog server installs on this
//! machine) over moto's S3 server; PyIceberg writes the lake through it.

mod common;

use std::process::Command;

use common::*;

const CATALOG_TOKEN: &str = "cf-api-token-7d41";

struct RestLake {
    dir: tempfile::TempDir,
    s3: FixtureServer,
    catalog: FixtureServer,
}

impl RestLake {
    fn db(&self) -> String {
        self.dir.path().join("rest.db").display().to_string()
    }

    /// The catalog's request log: `METHOD path -> status` per request.
    fn log(&self) -> std::path::PathBuf {
        self.dir.path().join("catalog.log")
    }

    fn catalog_args(&self, port: u16) -> Vec<String> {
        let log = self.log().display().to_string();
        let mut a: Vec<String> = [
            "--port",
            &port.to_string(),
            "--db",
            &self.db(),
            "--warehouse",
            "s3://lakebucket/wh",
            "--log",
            &log,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(["--token".into(), CATALOG_TOKEN.into(), "--s3-endpoint".into(), self.s3.url()]);
        a
    }
}

fn rest_lake(prefix: Option<&str>) -> RestLake {
    rest_lake_with(prefix, &[])
}

/// A lake behind the REST fixture started with `extra` arguments.
fn rest_lake_with(prefix: Option<&str>, extra: &[&str]) -> RestLake {
    let dir = tempdir();
    let s3 = FixtureServer::start("s3_server.py", &["--bucket", "lakebucket"]);
    let db = dir.path().join("rest.db").display().to_string();
    let log = dir.path().join("catalog.log").display().to_string();
    let mut args =
        vec!["--db", &db, "--warehouse", "s3://lakebucket/wh", "--token", CATALOG_TOKEN, "--log", &log];
    let s3_url = s3.url();
    args.extend(["--s3-endpoint", &s3_url]);
    if let Some(p) = prefix {
        args.extend(["--prefix", p]);
    }
    args.extend(extra);
    let catalog = FixtureServer::start("rest_catalog.py", &args);
    fixture(
        "write_rest_lake.py",
        &["init", "--uri", &catalog.url(), "--token", CATALOG_TOKEN, "--events", "2000"],
    );
    RestLake { dir, s3, catalog }
}

fn serve_rest(lake: &RestLake, token: &str) -> Server {
    Server::start(Opts {
        args: vec!["--catalog-uri".into(), lake.catalog.url(), "--warehouse".into(), "wh_name".into()],
        env: vec![("CF_API_TOKEN", token.to_string())],
        ..Default::default()
    })
}

/// One more PyIceberg commit to glass.events, of `rows` rows.
fn append(lake: &RestLake, rows: u32, seed: u32) {
    let (rows, seed) = (rows.to_string(), seed.to_string());
    fixture(
        "write_rest_lake.py",
        &["append", "--uri", &lake.catalog.url(), "--token", CATALOG_TOKEN, "--rows", &rows, "--seed", &seed],
    );
}

fn counts(lake: &RestLake) -> serde_json::Value {
    fixture(
        "write_rest_lake.py",
        &[
            "counts",
            "--uri",
            &lake.catalog.url(),
            "--token",
            CATALOG_TOKEN,
        ],
    )["counts"]
        .clone()
}

#[test]
fn reads_a_rest_catalog_with_vended_credentials() {
    let lake = rest_lake(Some("accounts/acc/buckets/b"));
    let s = serve_rest(&lake, CATALOG_TOKEN);
    let expected = counts(&lake);
    for table in ["glass.events", "glass.identities"] {
        let n = s.rows(&format!("SELECT count(*) AS n FROM {table}"))[0]["n"].clone();
        assert_eq!(n, expected[table], "{table}");
    }
    let rows = s.rows("SELECT event, count(*) AS n FROM glass.events GROUP BY event ORDER BY n DESC LIMIT 1");
    assert_eq!(rows.len(), 1);
    // Reads went to the S3 server and were counted.
    let r = s.post(
        "/api/v1/accounts/a/basin-sql/query/b",
        r#"{"query": "SELECT count(DISTINCT device_id) FROM glass.events"}"#,
    );
    let v: serde_json::Value = r.json().unwrap();
    assert!(v["result"]["metrics"]["r2_requests_count"].as_u64().unwrap() > 0, "{v}");
    assert!(!s.log_text().contains(CATALOG_TOKEN), "the catalog token reached the log");

    // Names from SQL text never become catalog paths: tables the catalog does not list are
    // not found without a request, whatever their names hold.
    let from = log_lines(&lake);
    for name in [
        r#""x/../../../../admin/secret?a=".t"#,
        r#""..".t"#,
        r#"glass."../../v1/config""#,
        r#""glass%2F..".events"#,
        r#"".".".""#,
    ] {
        let (status, v) = s.query(&format!("SELECT * FROM {name}"));
        // 404 (no such table), 400 (not a name), 403 (a path, which is never read as a table)
        assert!(matches!(status, 400 | 403 | 404), "{name}: {status} {v}");
    }
    let log = std::fs::read_to_string(lake.log()).unwrap();
    let requests: Vec<&str> = log.lines().skip(from).collect();
    for line in &requests {
        let path = line.split_whitespace().nth(1).unwrap_or_default();
        assert!(
            !path.contains("admin")
                && !path.contains("..")
                && !path.contains("%2E%2E")
                && path != "/v1/tables",
            "a catalog request built from SQL text: {line}"
        );
    }
}

#[test]
fn new_snapshots_and_versions_through_rest_are_seen() {
    let lake = rest_lake(None);
    let s = Server::start(Opts {
        args: vec![
            "--catalog-uri".into(),
            lake.catalog.url(),
            "--catalog-token".into(),
            CATALOG_TOKEN.into(),
            "--refresh-interval".into(),
            "1s".into(),
        ],
        ..Default::default()
    });
    let before = s.rows("SELECT count(*) AS n FROM glass.events")[0]["n"].as_u64().unwrap();
    append(&lake, 77, 99);
    assert_eq!(s.rows("SELECT count(*) AS n FROM glass.events")[0]["n"].as_u64().unwrap(), before + 77);
    fixture(
        "write_rest_lake.py",
        &["create-v2", "--uri", &lake.catalog.url(), "--token", CATALOG_TOKEN, "--rows", "200"],
    );
    eventually(15, || {
        (s.rows("SELECT count(*) AS n FROM glass.events")[0]["n"].as_u64().unwrap() == before + 277)
            .then_some(())
    });
    let rows = s.rows("SELECT count(*) AS n FROM glass.events WHERE utm_source IS NULL AND revenue IS NULL");
    assert!(rows[0]["n"].as_u64().unwrap() >= before + 77);
}

/// The catalog's answers to GET of `glass.<table>` since line `from` of its log: whether the
/// request asked for `snapshots=refs`, and the status.
fn table_loads(lake: &RestLake, table: &str, from: usize) -> Vec<(bool, u16)> {
    let route = format!("/namespaces/glass/tables/{table}");
    std::fs::read_to_string(lake.log())
        .unwrap()
        .lines()
        .skip(from)
        .filter_map(|l| l.strip_prefix("GET "))
        .filter_map(|l| {
            let (path, status) = l.split_once(" -> ")?;
            let (path, query) = path.split_once('?').unwrap_or((path, ""));
            path.ends_with(&route).then(|| (query == "snapshots=refs", status.parse().unwrap()))
        })
        .collect()
}

fn log_lines(lake: &RestLake) -> usize {
    std::fs::read_to_string(lake.log()).unwrap().lines().count()
}

/// A query re-checks each table with one `loadTable` for the snapshots the refs name:
/// conditional where the catalog sends ETags (answered 304 while nothing changed), read only
/// for its metadata location where it does not; the table is loaded in full again (by
/// iceberg-rust, every snapshot) only after a commit, and the commit is seen. A catalog that
/// refuses `snapshots=refs` is asked without it.
#[test]
fn a_repeated_query_rechecks_each_table_with_one_conditional_load() {
    for fixture_args in [&[][..], &["--no-etag"], &["--reject-snapshots-param"]] {
        let lake = rest_lake_with(Some("accounts/acc/buckets/b"), fixture_args);
        let s = Server::start(Opts {
            args: vec![
                "--catalog-uri".into(),
                lake.catalog.url(),
                "--warm-on-start".into(),
                "false".into(),
                "--result-cache-bytes".into(),
                "0".into(),
            ],
            env: vec![("CF_API_TOKEN", CATALOG_TOKEN.to_string())],
            ..Default::default()
        });
        let etags = fixture_args != ["--no-etag"];
        let refs = fixture_args != ["--reject-snapshots-param"];
        let unchanged = (refs, if etags { 304 } else { 200 });
        let sql = "SELECT count(*) AS n, count(DISTINCT device_id) AS d FROM glass.events";
        let before = s.rows(sql)[0]["n"].as_u64().unwrap();
        let from = log_lines(&lake);
        for _ in 0..3 {
            assert_eq!(s.rows(sql)[0]["n"].as_u64().unwrap(), before);
        }
        assert_eq!(table_loads(&lake, "events", from), vec![unchanged; 3], "{fixture_args:?}");

        append(&lake, 25, 7);
        let from = log_lines(&lake);
        assert_eq!(s.rows(sql)[0]["n"].as_u64().unwrap(), before + 25, "{fixture_args:?}");
        // The check finds the new metadata location, then the table is loaded in full.
        assert_eq!(table_loads(&lake, "events", from), vec![(refs, 200), (false, 200)], "{fixture_args:?}");
        let from = log_lines(&lake);
        assert_eq!(s.rows(sql)[0]["n"].as_u64().unwrap(), before + 25);
        assert_eq!(table_loads(&lake, "events", from), vec![unchanged], "{fixture_args:?}");
        if !refs {
            // Refused once, at the first check of any table.
            let refused =
                table_loads(&lake, "events", 0).into_iter().chain(table_loads(&lake, "identities", 0));
            assert_eq!(refused.filter(|&l| l == (true, 400)).count(), 1);
        }
        assert!(!s.log_text().contains(CATALOG_TOKEN), "the catalog token reached the log");
    }
}

#[test]
fn a_wrong_catalog_token_is_a_clear_startup_error() {
    let lake = rest_lake(None);
    let out = Command::new(skiff_bin())
        .args([
            "serve",
            "--http-addr",
            &format!("127.0.0.1:{}", free_port()),
            "--catalog-uri",
            &lake.catalog.url(),
            "--catalog-wait",
            "0s",
        ])
        .env("CF_API_TOKEN", "not-the-token-31337")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("catalog"), "{stderr}");
    assert!(!stderr.contains("not-the-token-31337"), "the token was printed: {stderr}");
}

#[test]
fn catalog_and_storage_outages_are_503_and_skiff_recovers() {
    let mut lake = rest_lake(None);
    let s = serve_rest(&lake, CATALOG_TOKEN);
    let sql = "SELECT count(*) AS n FROM glass.events";
    let n = s.rows(sql)[0]["n"].clone();

    // The catalog goes away: queries fail fast with 503 naming it, and the Basin route says 80001.
    let port = lake.catalog.port;
    lake.catalog.stop();
    let t = std::time::Instant::now();
    let (status, v) = s.query(sql);
    assert_eq!(status, 503, "{v}");
    assert!(t.elapsed() < std::time::Duration::from_secs(15), "failed fast: {:?}", t.elapsed());
    assert_eq!(v["error"]["code"], "unavailable");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("catalog"), "{msg}");
    assert!(!msg.contains(CATALOG_TOKEN));
    let r = s.post("/api/v1/accounts/a/basin-sql/query/b", serde_json::json!({ "query": sql }).to_string());
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.json::<serde_json::Value>().unwrap()["errors"][0]["code"], 80001);

    // It comes back on the same address: skiff serves again without a restart.
    let args = lake.catalog_args(port);
    lake.catalog =
        FixtureServer::start("rest_catalog.py", &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(
        eventually(20, || {
            let (st, v) = s.query(sql);
            (st == 200).then(|| v[0]["n"].clone())
        }),
        n
    );

    // The object store goes away: 503 naming the dependency that failed (this catalog keeps
    // its metadata on the same store, so loading the table is what fails first).
    lake.s3.stop();
    let t = std::time::Instant::now();
    let (status, v) = s.query("SELECT count(DISTINCT device_id) FROM glass.events");
    assert_eq!(status, 503, "{v}");
    assert!(t.elapsed() < std::time::Duration::from_secs(30), "failed fast: {:?}", t.elapsed());
    assert_eq!(v["error"]["code"], "unavailable");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("catalog") || msg.contains("object store"), "{msg}");
}

#[test]
fn a_sql_catalog_on_s3_with_static_credentials() {
    // The REST fixture keeps its tables in a PyIceberg SqlCatalog (SQLite, catalog name
    // `rest`) over the S3 server: skiff can read that catalog directly, with S3 settings.
    let lake = rest_lake(None);
    let expected = counts(&lake);
    let s = Server::start(Opts {
        args: [
            "--catalog-uri",
            &format!("sqlite://{}", lake.db()),
            "--warehouse",
            "s3://lakebucket/wh",
            "--s3-endpoint",
            &lake.s3.url(),
            "--s3-region",
            "us-east-1",
            "--s3-access-key-id",
            "testing",
            "--s3-secret-access-key",
            "testing",
            "--s3-path-style",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect(),
        ..Default::default()
    });
    assert_eq!(s.rows("SELECT count(*) AS n FROM glass.events")[0]["n"], expected["glass.events"]);
    assert_eq!(s.rows("SELECT count(*) AS n FROM glass.identities")[0]["n"], expected["glass.identities"]);
}

/// A rotated Cloudflare API token takes effect without a restart: the catalog revokes the old
/// one, skiff says so (503, the catalog's refusal), the new one is pushed through the admin
/// route, and the same process answers again. At start, a refused token is a 503 `starting`
/// with the cause until the right one arrives the same way.
#[test]
fn a_rotated_catalog_token_takes_effect_without_a_restart() {
    let mut lake = rest_lake(None);
    let admin = "admin-6c2f";
    let s = Server::start(Opts {
        args: vec!["--catalog-uri".into(), lake.catalog.url(), "--warehouse".into(), "wh_name".into()],
        env: vec![("CF_API_TOKEN", CATALOG_TOKEN.to_string()), ("SKIFF_ADMIN_TOKEN", admin.to_string())],
        ..Default::default()
    });
    let pid = s.pid();
    let sql = "SELECT count(*) AS n FROM glass.events";
    let n = s.rows(sql)[0]["n"].clone();
    // The catalog now accepts only the new token (same address, same tables).
    let rotated = "cf-api-token-rotated-0e9a";
    let port = lake.catalog.port;
    lake.catalog.stop();
    let args: Vec<String> = lake
        .catalog_args(port)
        .into_iter()
        .map(|a| if a == CATALOG_TOKEN { rotated.to_string() } else { a })
        .collect();
    lake.catalog =
        FixtureServer::start("rest_catalog.py", &args.iter().map(String::as_str).collect::<Vec<_>>());
    let (status, v) = s.query(sql);
    assert_eq!(status, 503, "the old token is refused: {v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("catalog"), "{v}");
    let push = |token: &str| {
        client()
            .post(format!("{}/_admin/credentials", s.base))
            .bearer_auth(admin)
            .body(serde_json::json!({ "catalog_token": token }).to_string())
            .send()
            .unwrap()
            .status()
    };
    assert_eq!(push(rotated), 200);
    assert_eq!(s.rows(sql)[0]["n"], n);
    assert_eq!(s.pid(), pid, "no restart");
    let log = s.log_text();
    assert!(!log.contains(rotated) && !log.contains(CATALOG_TOKEN), "a token in the log: {log}");

    // A skiff started with the revoked token: 503 starting, saying why, until it gets the new one.
    let s2 = Server::start_listening(Opts {
        args: vec!["--catalog-uri".into(), lake.catalog.url(), "--warehouse".into(), "wh_name".into()],
        env: vec![("CF_API_TOKEN", CATALOG_TOKEN.to_string()), ("SKIFF_ADMIN_TOKEN", admin.to_string())],
        ..Default::default()
    });
    let cause = eventually(20, || {
        let v: serde_json::Value = client().get(format!("{}/_health", s2.base)).send().ok()?.json().ok()?;
        v["cause"].as_str().map(String::from)
    });
    assert!(cause.contains("refused the credentials (401"), "{cause}");
    assert!(!cause.contains(CATALOG_TOKEN));
    let (status, v) = s2.query(sql);
    assert_eq!((status, v["error"]["code"].clone()), (503, serde_json::json!("starting")), "{v}");
    let r = client()
        .post(format!("{}/_admin/credentials", s2.base))
        .bearer_auth(admin)
        .body(serde_json::json!({ "catalog_token": rotated }).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let got = eventually(20, || {
        let (status, v) = s2.query(sql);
        (status == 200).then(|| v[0]["n"].clone())
    });
    assert_eq!(got, n);
}
