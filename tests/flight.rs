//! Arrow Flight SQL against the real binary: arrow-rs's `FlightSqlServiceClient` here, and the
//! ADBC driver and PyArrow's Flight client through `tests/fixtures/flight_clients.py`. Answers
//! are compared with the same SQL over HTTP `/query`.

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{
    CommandGetDbSchemas, CommandGetSqlInfo, CommandGetTables, CommandStatementQuery, ProstMessageExt, SqlInfo,
};
use arrow_flight::{Action, Criteria, FlightDescriptor, FlightInfo, HandshakeRequest, Ticket};
use common::*;
use futures::TryStreamExt;
use prost::Message;
use std::sync::Arc;
use tonic::Code;
use tonic::transport::Channel;

fn lake() -> &'static (tempfile::TempDir, Server) {
    static LAKE: OnceLock<(tempfile::TempDir, Server)> = OnceLock::new();
    LAKE.get_or_init(|| {
        let dir = tempdir();
        demo_lake(dir.path(), 20_000);
        let server = Server::lake(dir.path());
        (dir, server)
    })
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Runs blocking HTTP calls (the harness's) from inside the async tests.
fn http<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

async fn channel(s: &Server) -> Channel {
    Channel::from_shared(format!("http://{}", s.flight)).unwrap().connect().await.expect("connect to Flight")
}

/// A Flight SQL client that did the Basic handshake (the token as password).
async fn client(s: &Server) -> FlightSqlServiceClient<Channel> {
    let mut c = FlightSqlServiceClient::new(channel(s).await);
    c.handshake("anyone", TOKEN).await.expect("handshake");
    assert_eq!(c.token().map(String::as_str), Some(TOKEN));
    c
}

async fn fetch(c: &mut FlightSqlServiceClient<Channel>, info: FlightInfo) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    for ep in info.endpoint {
        let stream = c.do_get(ep.ticket.expect("ticket")).await.expect("do_get");
        out.extend(stream.try_collect::<Vec<_>>().await.expect("batches"));
    }
    out
}

async fn sql(c: &mut FlightSqlServiceClient<Channel>, q: &str) -> Vec<RecordBatch> {
    let info = c.execute(q.to_string(), None).await.unwrap_or_else(|e| panic!("{q}: {e}"));
    fetch(c, info).await
}

/// `(string, i64)` rows from batches of two such columns.
fn pairs(batches: &[RecordBatch]) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for b in batches {
        let k = b.column(0).as_string::<i32>();
        let v = b.column(1).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            out.push((k.value(i).to_string(), v.value(i)));
        }
    }
    out
}

fn http_pairs(s: &Server, q: &str, k: &str, v: &str) -> Vec<(String, i64)> {
    http(|| s.rows(q)).iter().map(|r| (r[k].as_str().unwrap().to_string(), r[v].as_i64().unwrap())).collect()
}

#[test]
fn statements_match_http_over_the_versioned_union() {
    let (_, s) = lake();
    rt().block_on(async {
        let mut c = client(s).await;
        let q = "SELECT event, count(*) AS n FROM glass.events GROUP BY event ORDER BY event";
        c.set_header("x-request-id", "flight-once-7f3a");
        let got = pairs(&sql(&mut c, q).await);
        assert!(got.len() > 3, "{got:?}");
        assert_eq!(got, http_pairs(s, q, "event", "n"));
        // GetFlightInfo only planned: the query ran once, in DoGet.
        let lines = eventually(10, || {
            let log = s.log_text();
            let lines: Vec<String> =
                log.lines().filter(|l| l.contains("flight-once-7f3a")).map(String::from).collect();
            (!lines.is_empty()).then_some(lines)
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("route=\"flight:statement\"") && lines[0].contains("outcome=\"ok\""),
            "{lines:?}"
        );
        c.set_header("x-request-id", "");
        // The union's newer-version column and a Basin JSON function, as over HTTP.
        let q = "SELECT coalesce(json_get_str(props, 'plan'), '-') AS plan, count(utm_source) AS n \
                 FROM glass.events GROUP BY 1 ORDER BY 1";
        assert_eq!(pairs(&sql(&mut c, q).await), http_pairs(s, q, "plan", "n"));
        // A large result arrives whole, in many messages.
        let batches = sql(&mut c, "SELECT event_id, event FROM glass.events").await;
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert_eq!(
            rows as i64,
            http(|| s.rows("SELECT count(*) AS n FROM glass.events"))[0]["n"].as_i64().unwrap()
        );
    });
}

#[test]
fn prepared_statements_bind_parameters_statelessly() {
    let (_, s) = lake();
    rt().block_on(async {
        let mut c = client(s).await;
        let mut p = c
            .prepare("SELECT count(*) AS n FROM glass.events WHERE event = $1 AND device_type <> $2".into(), None)
            .await
            .expect("prepare");
        let params = p.parameter_schema().unwrap().clone();
        assert_eq!(params.fields().len(), 2, "{params:?}");
        assert_eq!(params.field(0).name(), "$1");
        assert_eq!(params.field(0).data_type(), &DataType::Utf8);
        assert_eq!(p.dataset_schema().unwrap().field(0).name(), "n");
        for event in ["$pageview", "signup"] {
            let schema = Arc::new(Schema::new(vec![
                Field::new("$1", DataType::Utf8, true),
                Field::new("$2", DataType::Utf8, true),
            ]));
            let batch = RecordBatch::try_new(
                schema,
                vec![Arc::new(StringArray::from(vec![event])), Arc::new(StringArray::from(vec!["tablet"]))],
            )
            .unwrap();
            p.set_parameters(batch).unwrap();
            let info = p.execute().await.expect("execute prepared");
            let got = fetch(&mut c, info).await;
            let n = got[0].column(0).as_any().downcast_ref::<Int64Array>().unwrap().value(0);
            let want = http(|| {
                s.rows(&format!(
                    "SELECT count(*) AS n FROM glass.events WHERE event = '{event}' AND device_type <> 'tablet'"
                ))
            })[0]["n"]
                .as_i64()
                .unwrap();
            assert_eq!(n, want, "{event}");
            assert!(n > 0);
        }
        p.close().await.expect("close");
        // Unbound parameters are the client's error, not a crash.
        let mut p = c.prepare("SELECT $1 AS x".into(), None).await.expect("prepare");
        let err = p.execute().await.map(|_| ()).and(Ok(()));
        let err = match err {
            Ok(()) => {
                let info = p.execute().await.unwrap();
                let t = info.endpoint[0].ticket.clone().unwrap();
                c.do_get(t).await.map(|_| ()).unwrap_err().to_string()
            }
            Err(e) => e.to_string(),
        };
        assert!(err.contains("InvalidArgument") || err.contains("No value found for placeholder"), "{err}");
    });
}

#[test]
fn metadata_calls_list_what_sql_sees() {
    let (_, s) = lake();
    rt().block_on(async {
        let mut c = client(s).await;
        let info = c.get_catalogs().await.unwrap();
        let cats = fetch(&mut c, info).await;
        assert_eq!(cats[0].column(0).as_string::<i32>().value(0), "lake");

        let info =
            c.get_db_schemas(CommandGetDbSchemas { catalog: None, db_schema_filter_pattern: None }).await;
        let schemas: Vec<String> = fetch(&mut c, info.unwrap())
            .await
            .iter()
            .flat_map(|b| {
                b.column(1).as_string::<i32>().iter().flatten().map(String::from).collect::<Vec<_>>()
            })
            .collect();
        assert!(schemas.contains(&"glass".to_string()), "{schemas:?}");

        // With a name pattern, a type filter and schemas: each schema equals the table's columns.
        let cmd = CommandGetTables {
            catalog: None,
            db_schema_filter_pattern: Some("gla%".into()),
            table_name_filter_pattern: Some("events%".into()),
            table_types: vec!["TABLE".into()],
            include_schema: true,
        };
        let info = c.get_tables(cmd).await.unwrap();
        let tables = fetch(&mut c, info).await;
        let b = &tables[0];
        let names: Vec<&str> = b.column(2).as_string::<i32>().iter().flatten().collect();
        assert_eq!(names, ["events", "events_v2"], "{names:?}");
        let schema_bytes = b.column(4).as_binary::<i32>().value(0);
        let schema = arrow::ipc::convert::try_schema_from_ipc_buffer(schema_bytes).unwrap();
        let http_cols: Vec<String> = http(|| {
            s.rows(
                "SELECT column_name FROM information_schema.columns \
                 WHERE table_schema = 'glass' AND table_name = 'events' ORDER BY ordinal_position",
            )
        })
        .iter()
        .map(|r| r["column_name"].as_str().unwrap().to_string())
        .collect();
        let flight_cols: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        assert_eq!(flight_cols, http_cols);

        // The type filter: the lake's tables are TABLEs, skiff's own `system.queries` a VIEW.
        let cmd = CommandGetTables { table_types: vec!["VIEW".into()], ..Default::default() };
        let info = c.get_tables(cmd).await.unwrap();
        let views: Vec<String> = fetch(&mut c, info)
            .await
            .iter()
            .flat_map(|b| {
                let (s, t) = (b.column(1).as_string::<i32>(), b.column(2).as_string::<i32>());
                (0..b.num_rows()).map(|i| format!("{}.{}", s.value(i), t.value(i))).collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(views, ["system.queries"]);

        let info = c.get_table_types().await.unwrap();
        let types: Vec<String> = fetch(&mut c, info)
            .await
            .iter()
            .flat_map(|b| {
                b.column(0).as_string::<i32>().iter().flatten().map(String::from).collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(types, ["TABLE", "VIEW"]);

        let info = c.get_sql_info(vec![SqlInfo::FlightSqlServerName, SqlInfo::FlightSqlServerReadOnly]).await;
        let batches = fetch(&mut c, info.unwrap()).await;
        let b = &batches[0];
        assert_eq!(b.num_rows(), 2);
        let text = arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string();
        assert!(text.contains("skiff"), "{text}");
        assert!(text.contains("true"), "{text}");
    });
}

/// A raw Flight client, to see gRPC status codes as they are.
async fn raw(s: &Server, token: Option<&str>) -> (FlightServiceClient<Channel>, Option<String>) {
    (FlightServiceClient::new(channel(s).await), token.map(|t| format!("Bearer {t}")))
}

fn req<T>(msg: T, auth: &Option<String>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(a) = auth {
        r.metadata_mut().insert("authorization", a.parse().unwrap());
    }
    r
}

fn statement(q: &str) -> FlightDescriptor {
    FlightDescriptor::new_cmd(
        CommandStatementQuery { query: q.into(), transaction_id: None }.as_any().encode_to_vec(),
    )
}

async fn info_code(c: &mut FlightServiceClient<Channel>, auth: &Option<String>, d: FlightDescriptor) -> Code {
    match c.get_flight_info(req(d, auth)).await {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

#[test]
fn every_call_needs_the_token() {
    let (_, s) = lake();
    rt().block_on(async {
        // A valid ticket, obtained with the token, is no use without it.
        let (mut good, auth) = raw(s, Some(TOKEN)).await;
        let info = good.get_flight_info(req(statement("SELECT 1 AS x"), &auth)).await.unwrap().into_inner();
        let ticket = info.endpoint[0].ticket.clone().unwrap();
        assert!(good.do_get(req(ticket.clone(), &auth)).await.is_ok());

        for bad in [None, Some("wrong-token".to_string()), Some(format!("{TOKEN}x"))] {
            let (mut c, auth) = raw(s, bad.as_deref()).await;
            let metadata_cmds = [
                CommandGetTables::default().as_any().encode_to_vec(),
                CommandGetSqlInfo { info: vec![] }.as_any().encode_to_vec(),
                CommandGetDbSchemas::default().as_any().encode_to_vec(),
                arrow_flight::sql::CommandGetCatalogs {}.as_any().encode_to_vec(),
                arrow_flight::sql::CommandGetTableTypes {}.as_any().encode_to_vec(),
            ];
            for cmd in metadata_cmds {
                assert_eq!(
                    info_code(&mut c, &auth, FlightDescriptor::new_cmd(cmd)).await,
                    Code::Unauthenticated
                );
            }
            assert_eq!(info_code(&mut c, &auth, statement("SELECT 1")).await, Code::Unauthenticated);
            let code = c.do_get(req(ticket.clone(), &auth)).await.map(|_| ()).unwrap_err().code();
            assert_eq!(code, Code::Unauthenticated);
            let action = Action { r#type: "CreatePreparedStatement".into(), body: Default::default() };
            assert_eq!(
                c.do_action(req(action, &auth)).await.map(|_| ()).unwrap_err().code(),
                Code::Unauthenticated
            );
            let code =
                c.list_actions(req(arrow_flight::Empty {}, &auth)).await.map(|_| ()).unwrap_err().code();
            assert_eq!(code, Code::Unauthenticated);
            let code = c.list_flights(req(Criteria::default(), &auth)).await.map(|_| ()).unwrap_err().code();
            assert_eq!(code, Code::Unauthenticated);
        }
        // The handshake refuses a wrong password and answers the right one with the bearer token.
        let mut c = FlightSqlServiceClient::new(channel(s).await);
        let e = c.handshake("anyone", "nope").await.unwrap_err().to_string();
        assert!(e.contains("missing or invalid bearer token"), "{e}");
        let hs = futures::stream::iter([HandshakeRequest::default()]);
        let (mut rc, _) = raw(s, None).await;
        let code = rc.handshake(req(hs, &None)).await.map(|_| ()).unwrap_err().code();
        assert_eq!(code, Code::Unauthenticated);
        // No token value in the server's log.
        assert!(!s.log_text().contains(TOKEN));
    });
}

#[test]
fn errors_carry_grpc_codes() {
    let (_, s) = lake();
    rt().block_on(async {
        let (mut c, auth) = raw(s, Some(TOKEN)).await;
        assert_eq!(info_code(&mut c, &auth, statement("SELEC 1")).await, Code::InvalidArgument);
        assert_eq!(
            info_code(&mut c, &auth, statement("SELECT nope FROM glass.events")).await,
            Code::InvalidArgument
        );
        assert_eq!(info_code(&mut c, &auth, statement("SELECT * FROM glass.nope")).await, Code::NotFound);
        for write in ["CREATE TABLE t AS SELECT 1", "INSERT INTO glass.events SELECT * FROM glass.events"] {
            assert_eq!(info_code(&mut c, &auth, statement(write)).await, Code::PermissionDenied, "{write}");
        }
        let garbage = Ticket { ticket: b"not a ticket".to_vec().into() };
        let code = c.do_get(req(garbage, &auth)).await.map(|_| ()).unwrap_err().code();
        assert!(matches!(code, Code::InvalidArgument | Code::Internal), "{code:?}");
        let forged =
            arrow_flight::sql::TicketStatementQuery { statement_handle: b"SELECT 1".to_vec().into() };
        let t = Ticket { ticket: forged.as_any().encode_to_vec().into() };
        assert_eq!(c.do_get(req(t, &auth)).await.map(|_| ()).unwrap_err().code(), Code::InvalidArgument);
    });
}

#[test]
fn limits_apply_as_over_http() {
    let dir = tempdir();
    demo_lake(dir.path(), 100_000);
    let s = Server::start(Opts {
        args: [
            lake_args(dir.path()),
            vec!["--max-concurrent-queries".into(), "1".into(), "--max-queued-queries".into(), "0".into()],
        ]
        .concat(),
        ..Default::default()
    });
    rt().block_on(async {
        let (mut c, auth) = raw(&s, Some(TOKEN)).await;
        // A big result left unread keeps its slot (HTTP/2 flow control stops the server).
        let info = c
            .get_flight_info(req(statement("SELECT * FROM glass.events, (SELECT 1) t"), &auth))
            .await
            .unwrap()
            .into_inner();
        let ticket = info.endpoint[0].ticket.clone().unwrap();
        let mut held = c.do_get(req(ticket.clone(), &auth)).await.unwrap().into_inner();
        let _first = held.message().await.unwrap();
        let (mut c2, _) = raw(&s, Some(TOKEN)).await;
        assert_eq!(do_get_code(&mut c2, &auth, ticket.clone()).await, Code::ResourceExhausted);
        // The client goes away: its query is cancelled and the slot frees.
        drop(held);
        drop(c);
        let mut ok = false;
        for _ in 0..100 {
            let t = ticket_for("SELECT 1 AS x", &mut c2, &auth).await;
            if c2.do_get(req(t, &auth)).await.is_ok() {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(ok, "the slot was not freed:\n{}", s.log_text());
        eventually(10, || {
            s.log_text()
                .lines()
                .any(|l| l.contains("flight:statement") && l.contains("cancelled"))
                .then_some(())
        });
    });

    // A timeout is DeadlineExceeded.
    let s = Server::start(Opts {
        args: [lake_args(dir.path()), vec!["--query-timeout".into(), "1ms".into()]].concat(),
        ..Default::default()
    });
    rt().block_on(async {
        let (mut c, auth) = raw(&s, Some(TOKEN)).await;
        // Planning alone may beat 1 ms; then the execution cannot.
        let q = "SELECT count(DISTINCT event_id) FROM glass.events";
        let code = match c.get_flight_info(req(statement(q), &auth)).await {
            Ok(info) => {
                do_get_code(&mut c, &auth, info.into_inner().endpoint[0].ticket.clone().unwrap()).await
            }
            Err(e) => e.code(),
        };
        assert_eq!(code, Code::DeadlineExceeded);
    });
    drop(s);

    // Storage that fails mid-query is Unavailable (a data file gone from under the table).
    let s = Server::lake(dir.path());
    let file = walk(&dir.path().join("warehouse"))
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "parquet") && p.to_string_lossy().contains("/events/"));
    std::fs::remove_file(file.expect("a data file")).unwrap();
    rt().block_on(async {
        let (mut c, auth) = raw(&s, Some(TOKEN)).await;
        let t = ticket_for("SELECT max(event_id) FROM glass.events", &mut c, &auth).await;
        assert_eq!(do_get_code(&mut c, &auth, t).await, Code::Unavailable);
    });
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

/// The status a whole `DoGet` ends with, whether it fails at once or mid-stream.
async fn do_get_code(c: &mut FlightServiceClient<Channel>, auth: &Option<String>, t: Ticket) -> Code {
    let mut stream = match c.do_get(req(t, auth)).await {
        Ok(r) => r.into_inner(),
        Err(e) => return e.code(),
    };
    loop {
        match stream.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => return Code::Ok,
            Err(e) => return e.code(),
        }
    }
}

async fn ticket_for(q: &str, c: &mut FlightServiceClient<Channel>, auth: &Option<String>) -> Ticket {
    let info = c.get_flight_info(req(statement(q), auth)).await.unwrap().into_inner();
    info.endpoint[0].ticket.clone().unwrap()
}

#[test]
fn an_empty_flight_addr_turns_flight_off() {
    let dir = tempdir();
    demo_lake(dir.path(), 1000);
    let s = Server::start(Opts {
        args: [lake_args(dir.path()), vec!["--flight-addr".into(), "".into()]].concat(),
        ..Default::default()
    });
    assert!(s.log_text().contains("flight=off"), "{}", s.log_text());
    assert_eq!(s.rows("SELECT 1 AS x").len(), 1);
}

#[test]
fn adbc_and_pyarrow_clients_agree_with_http() {
    let (_, s) = lake();
    let out = fixture("flight_clients.py", &["--flight", &s.flight, "--http", &s.base, "--token", TOKEN]);
    assert_eq!(out["pyarrow_queries"], 5, "{out}");
    assert_eq!(out["adbc_queries"], 5, "{out}");
    assert_eq!(out["adbc_prepared"], 3, "{out}");
    assert_eq!(out["adbc_vendor"], "skiff", "{out}");
    assert!(out["adbc_tables"].as_u64().unwrap() >= 3, "{out}");
}
