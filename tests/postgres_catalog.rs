//! A SQL catalog in PostgreSQL (PyIceberg's `SqlCatalog` layout), written by PyIceberg
//! through SQLAlchemy/psycopg2, served by skiff through sqlx. The server is a throwaway
//! cluster (`tests/fixtures/postgres.py`: initdb in a temp folder, a free port on
//! 127.0.0.1, password auth), the warehouse a local folder.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Needs percent-encoding in a URL (`/`), so the test also covers decoding it.
const PASSWORD: &str = "pg-Secret-9Qx/7w";
/// A part of the password that survives any encoding, for "never in the output" checks.
const PASSWORD_CORE: &str = "pg-Secret-9Qx";

/// A running `tests/fixtures/postgres.py`, stopped (SIGTERM: fast shutdown, folder removed)
/// on drop.
struct Postgres {
    child: Child,
    /// `postgres://skiff:<password>@127.0.0.1:<port>/catalog`
    uri: String,
    log: PathBuf,
    _logdir: tempfile::TempDir,
}

impl Postgres {
    fn start() -> Postgres {
        let logdir = tempdir();
        let log = logdir.path().join("postgres.log");
        let mut child = Command::new(python())
            .arg(repo().join("tests/fixtures/postgres.py"))
            .args(["--user", "skiff", "--db", "catalog", "--password", PASSWORD])
            .arg("--log")
            .arg(&log)
            .arg("--exit-with-parent")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting tests/fixtures/postgres.py");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = lines.next().and_then(Result::ok).unwrap_or_default();
        let uri = lines.next().and_then(Result::ok).and_then(|l| l.strip_prefix("URI ").map(String::from));
        let pg_log = std::fs::read_to_string(&log).unwrap_or_default();
        let Some(uri) = uri.filter(|_| ready.starts_with("READY ")) else {
            let _ = child.kill();
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            let _ = child.wait();
            panic!(
                "PostgreSQL did not start (is the Debian package `postgresql` installed? \
                 ./scripts/test installs it): stdout {ready:?}\nstderr: {err}\nlog:\n{pg_log}"
            );
        };
        // Nothing more comes on stderr unless it fails; don't keep a pipe nobody reads.
        drop(child.stderr.take());
        Postgres { child, uri, log, _logdir: logdir }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(40);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The fixture gives the postmaster SIGINT when it dies, even by SIGKILL.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn count(s: &Server, table: &str) -> u64 {
    let rows = s.rows(&format!("SELECT count(*) AS n FROM {table}"));
    rows[0]["n"].as_u64().unwrap_or_else(|| panic!("count of {table}: {rows:?}"))
}

fn writer(pg: &Postgres, warehouse: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec![args[0], "--uri", &pg.uri, "--warehouse", warehouse];
    all.extend(&args[1..]);
    fixture("write_pg_lake.py", &all)
}

fn n(v: &serde_json::Value, table: &str) -> u64 {
    v["counts"][table].as_u64().unwrap_or_else(|| panic!("no count for {table} in {v}"))
}

fn serve(pg: &Postgres, warehouse: &str) -> Server {
    Server::start(Opts {
        args: vec!["--catalog-uri".into(), pg.uri.clone(), "--warehouse".into(), warehouse.into()],
        ..Default::default()
    })
}

#[test]
fn a_pyiceberg_lake_in_postgres_is_served_and_stays_fresh() {
    let pg = Postgres::start();
    assert!(pg.uri.starts_with("postgres://skiff:"), "{}", pg.uri);
    assert!(pg.uri.contains("%2F"), "the password is percent-encoded: {}", pg.uri);
    let dir = tempdir();
    let warehouse = dir.path().join("warehouse").display().to_string();

    let lake = writer(&pg, &warehouse, &["init", "--events", "300", "--v2-rows", "200"]);
    let (v1, v2) = (n(&lake, "glass.events"), n(&lake, "glass.events_v2"));
    assert_eq!((v1, v2), (300, 200), "{lake}");

    // No --catalog-name: skiff finds PyIceberg's only catalog name in the Postgres tables.
    let s = serve(&pg, &warehouse);
    assert_eq!(count(&s, "glass.events"), v1 + v2, "v1 and v2 together");
    assert_eq!(count(&s, "glass.events_v2"), v2);
    assert_eq!(count(&s, "glass.events_v1"), v1);
    let rows = s.rows(
        "SELECT count(DISTINCT event_id) AS ids, count(utm_source) AS utm, \
         min(__ingest_ts) <= max(__ingest_ts) AS ordered FROM glass.events",
    );
    assert_eq!(rows[0]["ids"], v1 + v2, "{rows:?}");
    assert!(rows[0]["utm"].as_u64().unwrap() > 0, "{rows:?}");
    assert!(rows[0]["utm"].as_u64().unwrap() <= v2, "{rows:?}");
    assert_eq!(rows[0]["ordered"], true, "{rows:?}");

    // Freshness: a commit PyIceberg makes while skiff runs shows in the next query.
    let after =
        writer(&pg, &warehouse, &["append", "--table", "glass.events_v2", "--rows", "37", "--seed", "11"]);
    assert_eq!(n(&after, "glass.events_v2"), v2 + 37, "{after}");
    assert_eq!(count(&s, "glass.events_v2"), v2 + 37);
    assert_eq!(count(&s, "glass.events"), v1 + v2 + 37);

    // GET / names the catalog kind and lists the tables, without the password.
    let r = client().get(format!("{}/", s.base)).bearer_auth(TOKEN).send().unwrap();
    assert_eq!(r.status(), 200);
    let body = r.text().unwrap();
    assert!(!body.contains(PASSWORD_CORE), "GET / shows the password: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["catalog"], "postgres", "{v}");
    let tables: Vec<&str> = v["tables"].as_array().unwrap().iter().filter_map(|t| t.as_str()).collect();
    for t in ["glass.events", "glass.events_v2"] {
        assert!(tables.contains(&t), "{tables:?}");
    }

    // The startup line says which catalog it is; the password is never logged.
    let log = s.log_text();
    let ready =
        log.lines().find(|l| l.contains(" ready")).unwrap_or_else(|| panic!("no ready line in:\n{log}"));
    assert!(ready.contains("catalog=\"postgres\""), "{ready}");
    assert!(ready.contains("catalog pg_lake"), "{ready}");
    assert!(ready.contains("127.0.0.1"), "{ready}");
    assert!(
        !log.contains(PASSWORD_CORE),
        "the password is in the log:\n{log}\npostgres log:\n{}",
        pg.log_text()
    );

    // The catalog database goes away: a query fails within seconds with a 503 naming the
    // catalog and the table, never the password, and the server stays up.
    drop(pg);
    let started = Instant::now();
    let (status, v) = s.query("SELECT count(*) AS n FROM glass.events_v2");
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}: {v}", started.elapsed());
    assert_eq!(status, 503, "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("catalog") && msg.contains("glass.events_v2"), "{v}");
    assert!(!v.to_string().contains(PASSWORD_CORE), "{v}");
    assert_eq!(client().get(format!("{}/_health", s.base)).send().unwrap().status(), 200);
}

#[test]
fn a_wrong_password_stops_startup_without_showing_it() {
    let pg = Postgres::start();
    let dir = tempdir();
    let warehouse = dir.path().join("warehouse").display().to_string();
    writer(&pg, &warehouse, &["init", "--events", "20", "--v2-rows", "10"]);
    let wrong = "not-the-Pw-4417";
    let uri = pg.uri.replace(&PASSWORD.replace('/', "%2F"), wrong);
    assert!(uri.contains(wrong), "{uri}");
    for extra in [vec![], vec!["--catalog-name", "pg_lake"]] {
        let out = Command::new(skiff_bin())
            .args(["serve", "--http-addr"])
            .arg(format!("127.0.0.1:{}", free_port()))
            .args(["--catalog-uri", &uri, "--warehouse", &warehouse, "--catalog-wait", "0s"])
            .args(&extra)
            .env("API_TOKEN", TOKEN)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .output()
            .expect("running skiff");
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success(), "{extra:?}: {text}");
        assert!(text.contains("password authentication failed"), "{extra:?}: the error says why: {text}");
        assert!(!text.contains(wrong), "{extra:?}: the password is shown: {text}");
    }
}
