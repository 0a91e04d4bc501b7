//! Shared by every test file: runs the real `skiff` binary on a lake and talks to it over
//! HTTP. Lakes come from `skiff demo` (Rust) or from PyIceberg (`shared/bench/gen_lake.py`
//! and `tests/fixtures/*.py`, run with the virtualenv `scripts/test` sets up).
#![allow(dead_code)]

pub mod difftest;

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const TOKEN: &str = "test-token-5f2e";

/// The clone the tests run from. Read at run time: clones that share one target directory
/// (CI's and a developer's) can share a test binary, and the path compiled into it may be
/// the other clone's, since removed.
pub fn repo() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()))
}

/// `../shared`, or `SKIFF_SHARED_DIR`.
pub fn shared() -> PathBuf {
    std::env::var_os("SKIFF_SHARED_DIR").map(PathBuf::from).unwrap_or_else(|| repo().join("../shared"))
}

/// The virtualenv's Python (PyIceberg, DuckDB, moto), or `SKIFF_TEST_PYTHON`.
pub fn python() -> PathBuf {
    let p = std::env::var_os("SKIFF_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".venv/bin/python"));
    assert!(p.exists(), "{} is missing: run ./scripts/test, which creates the virtualenv", p.display());
    p
}

pub fn skiff_bin() -> &'static str {
    env!("CARGO_BIN_EXE_skiff")
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("skiff-test-").tempdir().expect("tempdir")
}

/// Runs a command to success, returning its stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A lake written by `skiff demo`.
pub fn demo_lake(dir: &Path, events: u64) {
    run(Command::new(skiff_bin()).args(["demo", "--out"]).arg(dir).args(["--events", &events.to_string()]));
}

/// A lake written by PyIceberg through `gen_lake.py` (90 days from 2026-08-01, the last 30
/// in `glass.events_v2`).
pub fn py_lake(dir: &Path, events: u64) {
    run(Command::new(python()).arg(shared().join("bench/gen_lake.py")).arg("--out").arg(dir).args([
        "--events",
        &events.to_string(),
        "--small-hours",
        "1",
    ]));
}

/// Runs a fixture script from `tests/fixtures`, returning its last stdout line as JSON.
pub fn fixture(script: &str, args: &[&str]) -> serde_json::Value {
    let out = run(Command::new(python()).arg(repo().join("tests/fixtures").join(script)).args(args));
    let last = out.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("null");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("fixture {script} printed {out:?}: {e}"))
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A running `skiff serve`, killed on drop. Its log goes to a file the test can read.
pub struct Server {
    child: Child,
    pub base: String,
    /// The Flight SQL address (`127.0.0.1:port`), or empty when the test turned Flight off.
    pub flight: String,
    pub token: Option<String>,
    pub log: PathBuf,
    _logdir: tempfile::TempDir,
}

pub struct Opts<'a> {
    pub args: Vec<String>,
    pub env: Vec<(&'a str, String)>,
    pub token: Option<&'a str>,
    pub cwd: Option<&'a Path>,
}

impl Default for Opts<'_> {
    fn default() -> Self {
        Self { args: vec![], env: vec![], token: Some(TOKEN), cwd: None }
    }
}

impl Server {
    /// Serves a lake folder (`catalog.db` + `warehouse/`) with the test token.
    pub fn lake(dir: &Path) -> Server {
        Self::start(Opts { args: lake_args(dir), ..Default::default() })
    }

    /// Starts `skiff serve` on ports picked here. A port found free can be taken by another
    /// test's server before skiff binds it; then skiff exits, and it is started again on others.
    pub fn start(opts: Opts) -> Server {
        Self::start_until(opts, true)
    }

    /// Starts `skiff serve` and returns once it listens, ready or not (`/_health` answers).
    pub fn start_listening(opts: Opts) -> Server {
        Self::start_until(opts, false)
    }

    fn start_until(opts: Opts, ready: bool) -> Server {
        let flight_picked = !opts.args.iter().any(|a| a == "--flight-addr");
        for _ in 0..5 {
            let mut server = Self::spawn(&opts);
            let mut picked = vec![server.base.trim_start_matches("http://").to_string()];
            if flight_picked {
                picked.push(server.flight.clone());
            }
            match server.wait_ready(ready) {
                Ok(()) => return server,
                Err(log) if picked.iter().any(|a| log.contains(&format!("cannot listen on {a}"))) => {}
                Err(log) => panic!("skiff exited before it was ready:\n{log}"),
            }
        }
        panic!("skiff found its ports taken five times over");
    }

    fn spawn(opts: &Opts) -> Server {
        let port = free_port();
        let logdir = tempdir();
        let log = logdir.path().join("skiff.log");
        let mut cmd = Command::new(skiff_bin());
        cmd.arg("serve").arg("--http-addr").arg(format!("127.0.0.1:{port}"));
        // Every server gets its own Flight port, so tests can run side by side.
        let flight = if opts.args.iter().any(|a| a == "--flight-addr") {
            let i = opts.args.iter().position(|a| a == "--flight-addr").unwrap();
            opts.args[i + 1].clone()
        } else {
            let a = format!("127.0.0.1:{}", free_port());
            cmd.arg("--flight-addr").arg(&a);
            a
        };
        cmd.args(&opts.args);
        cmd.env_remove("API_TOKEN").env_remove("SKIFF_API_TOKEN").env_remove("LAKE_VERSIONS");
        cmd.env("RUST_LOG", "info");
        // Tests of faults, limits and costs need every query to execute: the result cache is
        // off unless a test turns it on (tests/result_cache.rs).
        cmd.env("SKIFF_RESULT_CACHE_BYTES", "0");
        // Likewise the data cache for remote files: fault tests need every read to reach the
        // store (tests/faults.rs turns it on where it is under test).
        cmd.env("SKIFF_DATA_CACHE_MEMORY", "0").env("SKIFF_DATA_CACHE_DISK", "0");
        // And tests that count metadata reads need them to come from the queries they send,
        // not from the reads at start (tests/faults.rs turns those on where they are tested).
        cmd.env("SKIFF_WARM_ON_START", "false");
        if let Some(t) = opts.token {
            cmd.env("API_TOKEN", t);
        }
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        if let Some(d) = opts.cwd {
            cmd.current_dir(d);
        }
        cmd.stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap());
        let child = cmd.spawn().expect("spawn skiff");
        running(child.id(), true);
        Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
            flight,
            token: opts.token.map(String::from),
            log,
            _logdir: logdir,
        }
    }

    /// Ready (or only listening), or the log of a skiff that exited first.
    fn wait_ready(&mut self, ready: bool) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let client = reqwest::blocking::Client::new();
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("({status}) {}", self.log_text()));
            }
            if let Ok(r) = client.get(format!("{}/_health", self.base)).send()
                && (r.status().is_success() || !ready)
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("skiff was not ready in time:\n{}", self.log_text());
    }

    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    pub fn post(&self, path: &str, body: impl Into<reqwest::blocking::Body>) -> reqwest::blocking::Response {
        let mut req = client()
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        req.send().expect("request")
    }

    /// One sample of `/metrics`, named as the text shows it (`skiff_cache_hits_total{cache="result"}`).
    pub fn metric(&self, sample: &str) -> f64 {
        let mut req = client().get(format!("{}/metrics", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let text = req.send().expect("request").text().expect("body");
        let value = text.lines().find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '));
        value.unwrap_or_else(|| panic!("{sample} in:\n{text}")).parse().expect("a number")
    }

    /// `POST /query`, returning status and parsed JSON.
    pub fn query(&self, sql: &str) -> (u16, serde_json::Value) {
        let r = self.post("/query", serde_json::json!({ "query": sql }).to_string());
        let status = r.status().as_u16();
        let text = r.text().expect("body");
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        (status, v)
    }

    /// Rows of a query that must succeed.
    pub fn rows(&self, sql: &str) -> Vec<serde_json::Value> {
        let (status, v) = self.query(sql);
        assert_eq!(status, 200, "{sql}: {v}");
        v.as_array().expect("array of rows").clone()
    }

    /// The error of a query that must fail with `status`.
    pub fn error(&self, sql: &str, status: u16) -> (String, String) {
        let (got, v) = self.query(sql);
        assert_eq!(got, status, "{sql}: {v}");
        (
            v["error"]["code"].as_str().expect("error code").to_string(),
            v["error"]["message"].as_str().expect("error message").to_string(),
        )
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal (`TERM`, `INT`) to the process.
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill").arg(format!("-{name}")).arg(self.child.id().to_string()).status();
        assert!(ok.is_ok_and(|s| s.success()), "kill -{name} failed");
    }

    /// Waits up to `within` for the process to exit.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s;
            }
            assert!(Instant::now() < deadline, "skiff did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        running(self.child.id(), false);
    }
}

/// Servers still running. A server shared by a file's tests lives in a `static`, which is
/// never dropped: without this, it outlived the test binary.
static RUNNING: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn running(pid: u32, started: bool) {
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: registers a plain function; libtest's `main` returns through `exit`.
        unsafe { libc::atexit(stop_running) };
    });
    let mut pids = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    if started {
        pids.push(pid);
    } else {
        pids.retain(|&p| p != pid);
    }
}

extern "C" fn stop_running() {
    let pids = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    for &pid in pids.iter() {
        // SAFETY: a signal to a process this binary started and has not waited for.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
}

pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(300)).build().unwrap()
}

/// `serve` flags for a lake folder.
pub fn lake_args(dir: &Path) -> Vec<String> {
    vec![
        "--catalog-uri".into(),
        format!("sqlite://{}", dir.join("catalog.db").display()),
        "--warehouse".into(),
        dir.join("warehouse").display().to_string(),
    ]
}

/// Polls `f` until it returns Some, for at most `secs`.
pub fn eventually<T>(secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "condition not met within {secs}s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A Python fixture server from `tests/fixtures` (it prints `READY <port>`), killed on drop.
pub struct FixtureServer {
    child: Child,
    pub port: u16,
}

impl FixtureServer {
    pub fn start(script: &str, args: &[&str]) -> FixtureServer {
        use std::io::BufRead;
        let mut child = Command::new(python())
            .arg(repo().join("tests/fixtures").join(script))
            .args(args)
            .arg("--exit-with-parent")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {script}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line).unwrap();
        let port = line
            .trim()
            .strip_prefix("READY ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{script} did not start: {line:?}"));
        FixtureServer { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops the server (SIGTERM), as an outage would.
    pub fn stop(&mut self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }
}

impl Drop for FixtureServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
