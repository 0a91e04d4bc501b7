//! Starting up as an operator needs it: no catalog is a startup error unless the demo is asked
//! for; skiff listens at once and answers 503 `starting` with the cause until its catalog is
//! reached; the admin route replaces client tokens (and the catalog token, see rest_catalog.rs)
//! without a restart.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

const BASIN: &str = "/api/v1/accounts/a/basin-sql/query/b";
const ADMIN: &str = "admin-token-9b1c";

#[test]
fn no_catalog_is_a_startup_error_unless_the_demo_is_asked_for() {
    let cwd = tempdir();
    let out = Command::new(skiff_bin())
        .args(["serve", "--http-addr", &format!("127.0.0.1:{}", free_port()), "--flight-addr", "off"])
        .current_dir(cwd.path())
        .env_remove("SKIFF_CATALOG_URI")
        .env_remove("SKIFF_DEMO")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no catalog configured") && stderr.contains("--demo"), "{stderr}");
    assert!(!cwd.path().join("lake").exists(), "no demo lake is written");
    // An empty SKIFF_CATALOG_URI (a var left blank) is no catalog either.
    let out = Command::new(skiff_bin())
        .args(["serve", "--http-addr", &format!("127.0.0.1:{}", free_port())])
        .current_dir(cwd.path())
        .env("SKIFF_CATALOG_URI", "")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no catalog configured"));
    // --demo and a catalog contradict each other.
    let out = Command::new(skiff_bin())
        .args(["serve", "--demo", "--catalog-uri", "sqlite://x.db", "--warehouse", "w"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--demo"));
    // Asked for: the demo lake, written where skiff runs.
    let s = Server::start(Opts { args: vec!["--demo".into()], cwd: Some(cwd.path()), ..Default::default() });
    assert!(s.rows("SELECT count(*) AS n FROM glass.events")[0]["n"].as_u64().unwrap() > 0);
    assert!(cwd.path().join("lake/catalog.db").exists());
}

/// Starts skiff on a catalog that is not there yet; returns it once it listens.
fn serve_unready(db: &std::path::Path, warehouse: &std::path::Path, extra: &[&str]) -> Server {
    let mut args = vec![
        "--catalog-uri".to_string(),
        format!("sqlite://{}", db.display()),
        "--warehouse".to_string(),
        warehouse.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    Server::start_listening(Opts { args, ..Default::default() })
}

#[test]
fn listens_at_once_and_says_why_until_the_catalog_is_reached() {
    let dir = tempdir();
    let lake = dir.path().join("lake");
    let t = Instant::now();
    let s = serve_unready(&lake.join("catalog.db"), &lake.join("warehouse"), &[]);
    assert!(t.elapsed() < Duration::from_secs(10), "listening took {:?}", t.elapsed());
    // /_health: 503 starting, with the cause once the first attempt failed.
    let health = eventually(10, || {
        let r = client().get(format!("{}/_health", s.base)).send().ok()?;
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "1");
        let v: Value = r.json().ok()?;
        assert_eq!(v["status"], "starting");
        v.get("cause").is_some().then_some(v)
    });
    let cause = health["cause"].as_str().unwrap();
    assert!(cause.contains("catalog.db"), "the cause names the missing catalog: {cause}");
    // Queries: 503 `starting` with the cause and Retry-After; Basin's envelope says 80001.
    let (status, v) = s.query("SELECT 1 AS one");
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "starting");
    assert!(v["error"]["message"].as_str().unwrap().contains("catalog.db"), "{v}");
    let r = s.post(BASIN, json!({"query": "SELECT 1"}).to_string());
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after") && r.headers().contains_key("x-request-id"));
    let v: Value = r.json().unwrap();
    assert_eq!((v["success"].clone(), v["errors"][0]["code"].clone()), (json!(false), json!(80001)), "{v}");
    // The catalog appears: skiff gets there by itself, without a restart.
    demo_lake(&lake, 2_000);
    let n = eventually(40, || {
        let (status, v) = s.query("SELECT count(*) AS n FROM glass.events");
        (status == 200).then(|| v[0]["n"].as_u64().unwrap())
    });
    assert_eq!(n, 2_000);
    let r = client().get(format!("{}/_health", s.base)).send().unwrap();
    assert_eq!(r.status(), 200);
    assert!(s.log_text().contains("the catalog is not reached yet"), "{}", s.log_text());
}

#[test]
fn catalog_wait_bounds_the_wait() {
    let dir = tempdir();
    let t = Instant::now();
    let out = Command::new(skiff_bin())
        .args(["serve", "--http-addr", &format!("127.0.0.1:{}", free_port()), "--flight-addr", "off"])
        .args(["--catalog-uri", &format!("sqlite://{}/nope.db", dir.path().display())])
        .args(["--warehouse", &dir.path().display().to_string(), "--catalog-wait", "0s"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nope.db"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn json_logs() {
    let dir = tempdir();
    demo_lake(dir.path(), 500);
    let mut opts = Opts { args: lake_args(dir.path()), ..Default::default() };
    opts.args.extend(["--log-format".into(), "json".into()]);
    let s = Server::start(opts);
    s.rows("SELECT 1 AS one");
    let log = s.log_text();
    let lines: Vec<Value> =
        log.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    assert!(
        lines.iter().any(|l| l["fields"]["message"].as_str().is_some_and(|m| m.contains("ready"))),
        "{log}"
    );
}

#[test]
fn the_admin_route_replaces_client_tokens_without_a_restart() {
    let dir = tempdir();
    demo_lake(dir.path(), 500);
    let mut opts = Opts { args: lake_args(dir.path()), ..Default::default() };
    opts.env.push(("SKIFF_ADMIN_TOKEN", ADMIN.into()));
    let s = Server::start(opts);
    let pid = s.pid();
    let admin = |method: &str, token: &str, body: Option<Value>| {
        let url = format!("{}/_admin/credentials", s.base);
        let req = if method == "GET" { client().get(url) } else { client().post(url) };
        let req = req.bearer_auth(token);
        let req = match body {
            Some(b) => req.header("content-type", "application/json").body(b.to_string()),
            None => req,
        };
        let r = req.send().unwrap();
        (r.status().as_u16(), r.json::<Value>().unwrap())
    };
    let query = |token: &str| {
        client()
            .post(format!("{}/query", s.base))
            .bearer_auth(token)
            .body(r#"{"query": "SELECT 1 AS one"}"#)
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    // The admin token is not a client token, and client tokens are not the admin token.
    assert_eq!(admin("GET", TOKEN, None).0, 401);
    assert_eq!(admin("POST", "wrong", Some(json!({"api_token": "x"}))).0, 401);
    assert_eq!(query(ADMIN), 401);
    let (status, held) = admin("GET", ADMIN, None);
    assert_eq!(
        (status, held["api_tokens"].clone(), held["catalog_token_sha256"].clone()),
        (200, json!(1), Value::Null)
    );
    // Rotation: new and next accepted, the old one refused, on every route; same process.
    let (status, held) = admin("POST", ADMIN, Some(json!({"api_token": "new-1, next-2"})));
    assert_eq!((status, held["api_tokens"].clone()), (200, json!(2)), "{held}");
    assert_eq!(query(TOKEN), 401);
    assert_eq!((query("new-1"), query("next-2")), (200, 200));
    let basin = client()
        .post(format!("{}{BASIN}", s.base))
        .bearer_auth("next-2")
        .body(r#"{"query": "SELECT 1 AS one"}"#)
        .send()
        .unwrap();
    assert_eq!(basin.status(), 200);
    // Bad bodies change nothing.
    for bad in [json!({"api_token": " , "}), json!({"api_tokens": "x"}), json!(["x"])] {
        assert_eq!(admin("POST", ADMIN, Some(bad.clone())).0, 400, "{bad}");
    }
    assert_eq!(query("new-1"), 200);
    // The catalog token is shown by its hash only.
    let (_, held) = admin("POST", ADMIN, Some(json!({"catalog_token": "cat-secret"})));
    let hash = held["catalog_token_sha256"].as_str().unwrap();
    assert_eq!(hash.len(), 64);
    assert!(!held.to_string().contains("cat-secret") && !s.log_text().contains("cat-secret"));
    assert!(!s.log_text().contains("new-1") && !s.log_text().contains(ADMIN));
    assert_eq!(s.pid(), pid);
}

#[test]
fn no_admin_token_no_admin_route() {
    let dir = tempdir();
    demo_lake(dir.path(), 500);
    let s = Server::lake(dir.path());
    let r = client()
        .post(format!("{}/_admin/credentials", s.base))
        .bearer_auth(TOKEN)
        .body(r#"{"api_token": "mine"}"#)
        .send()
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(s.rows("SELECT 1 AS one")[0]["one"], 1);
}
