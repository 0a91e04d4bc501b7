//! Arrow Flight SQL against the real binary: arrow-rs's `FlightSqlServiceClient` here, and the
//! ADBC driver and PyArrow's Flight client through `tests/fixtures/flight_clients.py`. Answers
//! are compared with the same SQL over HTTP `/query`.

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use arrow::ipc::CompressionType;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{
    ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult, CommandGetDbSchemas,
    CommandGetSqlInfo, CommandGetTables, CommandPreparedStatementQuery, CommandStatementQuery,
    DoPutPreparedStatementResult, ProstMessageExt, SqlInfo,
};
use arrow_flight::{Action, Criteria, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, Ticket};
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
            ["--max-concurrent-queries", "1", "--max-queued-queries", "0", "--write-timeout", "3s"]
                .map(String::from)
                .to_vec(),
        ]
        .concat(),
        ..Default::default()
    });
    rt().block_on(async {
        let (mut c, auth) = raw(&s, Some(TOKEN)).await;
        let (mut c2, _) = raw(&s, Some(TOKEN)).await;
        let frees = |c2: &FlightServiceClient<Channel>, within: Duration| {
            let mut c2 = c2.clone();
            let auth = auth.clone();
            async move {
                let t = std::time::Instant::now();
                while t.elapsed() < within {
                    // Planning takes a slot too: GetFlightInfo is refused while it is held.
                    if let Ok(info) = c2.get_flight_info(req(statement("SELECT 1 AS x"), &auth)).await {
                        let ticket = info.into_inner().endpoint[0].ticket.clone().unwrap();
                        if do_get_code(&mut c2, &auth, ticket).await == Code::Ok {
                            return true;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                false
            }
        };
        // A big result left unread holds its slot (HTTP/2 flow control stops the server) until
        // its writes have waited --write-timeout: then the query is cancelled and the slot
        // frees, while the client still holds the stream open.
        let big = "SELECT * FROM glass.events, (SELECT 1) t";
        let ticket = ticket_for(big, &mut c, &auth).await;
        let mut stalled = c.do_get(req(ticket.clone(), &auth)).await.unwrap().into_inner();
        let _first = stalled.message().await.unwrap();
        assert_eq!(do_get_code(&mut c2, &auth, ticket.clone()).await, Code::ResourceExhausted);
        assert!(frees(&c2, Duration::from_secs(20)).await, "the slot was not freed:\n{}", s.log_text());
        // Its log line, written when the stream goes, says why it ended.
        drop(stalled);
        eventually(10, || {
            let log = s.log_text();
            log.lines().any(|l| l.contains("flight:statement") && l.contains("client_stalled")).then_some(())
        });

        let ticket = ticket_for(big, &mut c, &auth).await;
        let mut held = c.do_get(req(ticket.clone(), &auth)).await.unwrap().into_inner();
        let _first = held.message().await.unwrap();
        assert_eq!(do_get_code(&mut c2, &auth, ticket.clone()).await, Code::ResourceExhausted);
        // The client goes away: its query is cancelled and the slot frees.
        drop(held);
        drop(c);
        assert!(frees(&c2, Duration::from_secs(5)).await, "the slot was not freed:\n{}", s.log_text());
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

/// The status a call ended with, as `(code, message)`.
fn status<T>(r: Result<T, tonic::Status>) -> (Code, String) {
    match r {
        Ok(_) => (Code::Ok, String::new()),
        Err(s) => (s.code(), s.message().to_string()),
    }
}

/// `CreatePreparedStatement`: the handle, or the status.
async fn prepare_raw(
    c: &mut FlightServiceClient<Channel>,
    auth: &Option<String>,
    sql: &str,
) -> Result<bytes::Bytes, tonic::Status> {
    let body = ActionCreatePreparedStatementRequest { query: sql.into(), transaction_id: None };
    let action =
        Action { r#type: "CreatePreparedStatement".into(), body: body.as_any().encode_to_vec().into() };
    let mut results = c.do_action(req(action, auth)).await?.into_inner();
    let any = arrow_flight::sql::Any::decode(results.message().await?.expect("a result").body).unwrap();
    Ok(any.unpack::<ActionCreatePreparedStatementResult>().unwrap().unwrap().prepared_statement_handle)
}

/// Flight messages binding `batch` to `handle` (the first carries the command).
async fn bind_messages(handle: &bytes::Bytes, batch: RecordBatch) -> Vec<FlightData> {
    let cmd = CommandPreparedStatementQuery { prepared_statement_handle: handle.clone() };
    FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(FlightDescriptor::new_cmd(cmd.as_any().encode_to_vec())))
        .with_schema(batch.schema())
        .build(futures::stream::iter([Ok(batch)]))
        .try_collect()
        .await
        .unwrap()
}

/// `DoPut` of parameter messages: the handle holding them, or the status.
async fn bind_raw(
    c: &mut FlightServiceClient<Channel>,
    auth: &Option<String>,
    data: Vec<FlightData>,
) -> Result<bytes::Bytes, tonic::Status> {
    let mut results = c.do_put(req(futures::stream::iter(data), auth)).await?.into_inner();
    let put = results.message().await?.expect("a result");
    Ok(DoPutPreparedStatementResult::decode(put.app_metadata).unwrap().prepared_statement_handle.unwrap())
}

/// The ticket that runs a prepared statement's handle.
fn prepared_ticket(handle: &[u8]) -> Ticket {
    let cmd = CommandPreparedStatementQuery { prepared_statement_handle: handle.to_vec().into() };
    Ticket { ticket: cmd.as_any().encode_to_vec().into() }
}

/// A one-row batch of `Int64` parameters `$1`, `$2`, ...
fn int_params(values: &[i64]) -> RecordBatch {
    let fields: Vec<Field> =
        (1..=values.len()).map(|i| Field::new(format!("${i}"), DataType::Int64, true)).collect();
    let columns = values.iter().map(|v| Arc::new(Int64Array::from(vec![*v])) as _).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

/// `bytes` with every 8-byte window equal to `from` set, one at a time, to `to`.
fn patched(bytes: &[u8], from: i64, to: i64) -> Vec<Vec<u8>> {
    (0..bytes.len().saturating_sub(7))
        .filter(|&i| bytes[i..i + 8] == from.to_le_bytes())
        .map(|i| [&bytes[..i], &to.to_le_bytes()[..], &bytes[i + 8..]].concat())
        .collect()
}

const TIB: i64 = 1 << 40;

/// Handles come back from clients and may be forged. A size or offset in the parameters' IPC
/// data claiming a terabyte once aborted the process (the reader allocated what the message
/// claimed) or panicked the handler; now each is a bad handle, and the server carries on.
#[test]
fn forged_statement_handles_are_refused() {
    let (_, s) = lake();
    rt().block_on(async {
        let (mut c, auth) = raw(s, Some(TOKEN)).await;
        let handle = prepare_raw(&mut c, &auth, "SELECT $1 AS a").await.unwrap();
        let bound = bind_raw(&mut c, &auth, bind_messages(&handle, int_params(&[7])).await).await.unwrap();
        assert_eq!(do_get_code(&mut c, &auth, prepared_ticket(&bound)).await, Code::Ok);
        // The parameters travel as an IPC stream after the SQL; its first bytes are the
        // continuation marker. Every 8-byte 8 in it (the body's length, the value buffer's
        // length) and every 0 (offsets) becomes a terabyte in turn.
        let ipc = bound.windows(4).position(|w| w == [0xff; 4]).expect("an IPC stream");
        let (prefix, stream) = bound.split_at(ipc);
        let mut forged: Vec<Vec<u8>> = [patched(stream, 8, TIB), patched(stream, 0, TIB)].concat();
        // A compressed stream whose buffer claims a terabyte once decompressed (`-1` marks a
        // buffer stored as is; skiff never compresses its own).
        let opts = IpcWriteOptions::default().try_with_compression(Some(CompressionType::LZ4_FRAME)).unwrap();
        let mut lz4 = Vec::new();
        let mut w = StreamWriter::try_new_with_options(&mut lz4, &int_params(&[7]).schema(), opts).unwrap();
        w.write(&int_params(&[7])).unwrap();
        w.finish().unwrap();
        drop(w);
        let compressed = patched(&lz4, -1, TIB);
        assert!(!compressed.is_empty());
        forged.extend(compressed);
        let mut refused = 0;
        for f in &forged {
            let h = [prefix, f].concat();
            let (code, message) = status(c.do_get(req(prepared_ticket(&h), &auth)).await);
            // A patch may land where it changes nothing (padding, a count already checked).
            if code != Code::Ok {
                assert_eq!(
                    (code, message.as_str()),
                    (Code::InvalidArgument, "not a statement handle issued by skiff")
                );
                refused += 1;
            }
            let cmd = CommandPreparedStatementQuery { prepared_statement_handle: h.into() };
            let d = FlightDescriptor::new_cmd(cmd.as_any().encode_to_vec());
            assert_eq!(info_code(&mut c, &auth, d).await, code);
        }
        assert!(refused >= 3, "{refused} of {} forged handles refused", forged.len());
        // Still serving, on the same connection.
        assert_eq!(do_get_code(&mut c, &auth, prepared_ticket(&bound)).await, Code::Ok);
    });
}

/// Parameter data a client sends that arrow cannot read is the client's error
/// (InvalidArgument), never an internal one, a reset stream, or an aborted process.
#[test]
fn malformed_parameter_data_is_invalid_argument() {
    let (_, s) = lake();
    rt().block_on(async {
        let (mut c, auth) = raw(s, Some(TOKEN)).await;
        let handle = prepare_raw(&mut c, &auth, "SELECT $1 AS a").await.unwrap();
        let good = bind_messages(&handle, int_params(&[7])).await;
        assert_eq!(good.len(), 2, "a schema and a batch");

        let mut garbage = good.clone();
        garbage[1].data_header = b"not an IPC message at all".to_vec().into();
        let (code, message) = status(bind_raw(&mut c, &auth, garbage).await);
        assert_eq!(code, Code::InvalidArgument, "{message}");
        assert!(message.starts_with("unreadable parameter data: "), "{message}");

        // The value buffer's offset (0, before its length 8) pointing a terabyte away.
        let header = &good[1].data_header;
        let at = header.windows(16).position(|w| w[..8] == [0; 8] && w[8..] == 8i64.to_le_bytes()).unwrap();
        let mut far = good.clone();
        far[1].data_header = [&header[..at], &TIB.to_le_bytes()[..], &header[at + 8..]].concat().into();
        let (code, message) = status(bind_raw(&mut c, &auth, far).await);
        assert_eq!(
            (code, message.as_str()),
            (
                Code::InvalidArgument,
                "unreadable parameter data: Protocol error: a buffer lies outside the message body"
            )
        );

        // Compressed, claiming a terabyte once decompressed.
        let opts = IpcWriteOptions::default().try_with_compression(Some(CompressionType::LZ4_FRAME)).unwrap();
        let cmd = CommandPreparedStatementQuery { prepared_statement_handle: handle.clone() };
        let mut lz4: Vec<FlightData> = FlightDataEncoderBuilder::new()
            .with_options(opts)
            .with_flight_descriptor(Some(FlightDescriptor::new_cmd(cmd.as_any().encode_to_vec())))
            .build(futures::stream::iter([Ok(int_params(&[7]))]))
            .try_collect()
            .await
            .unwrap();
        let body = patched(&lz4[1].data_body, -1, TIB).pop().expect("a buffer stored as is");
        lz4[1].data_body = body.into();
        let (code, message) = status(bind_raw(&mut c, &auth, lz4).await);
        assert_eq!(
            (code, message.as_str()),
            (
                Code::InvalidArgument,
                "unreadable parameter data: Protocol error: compressed buffers are not accepted"
            )
        );

        // Still serving: the good binding runs.
        let bound = bind_raw(&mut c, &auth, good).await.unwrap();
        assert_eq!(do_get_code(&mut c, &auth, prepared_ticket(&bound)).await, Code::Ok);
    });
}

/// The schema `GetFlightInfo` (and a prepared statement) announces is the one `DoGet` sends,
/// for the types the Flight encoder rewrites: a union (`json_get`), a dictionary, a LargeList,
/// and a dictionary-encoded parameter. ADBC refuses a stream that differs ("inconsistent
/// schema"); the fixture checks it through ADBC and PyArrow.
#[test]
fn announced_schemas_are_the_ones_sent() {
    let (_, s) = lake();
    rt().block_on(async {
        let mut c = client(s).await;
        for q in SCHEMA_QUERIES {
            let info = c.execute(q.to_string(), None).await.unwrap_or_else(|e| panic!("{q}: {e}"));
            let announced = info.clone().try_decode_schema().unwrap();
            let got = fetch(&mut c, info).await;
            assert_eq!(&announced, got[0].schema().as_ref(), "{q}");
            let p = c.prepare(q.to_string(), None).await.unwrap();
            assert_eq!(p.dataset_schema().unwrap(), &announced, "{q}");
        }
    });
    let out = fixture(
        "flight_clients.py",
        &["--flight", &s.flight, "--http", &s.base, "--token", TOKEN, "--schemas"],
    );
    assert_eq!(out["adbc_schemas"], SCHEMA_QUERIES.len() + 1, "{out}");
    assert_eq!(out["pyarrow_schemas"], SCHEMA_QUERIES.len(), "{out}");
}

/// Kept in step with `SCHEMA_QUERIES` in `tests/fixtures/flight_clients.py`.
const SCHEMA_QUERIES: [&str; 3] = [
    "SELECT json_get(props, 'q') AS j FROM glass.events WHERE props IS NOT NULL LIMIT 2",
    "SELECT arrow_cast('a', 'Dictionary(Int32, Utf8)') AS d",
    "SELECT arrow_cast([1, 2], 'LargeList(Int64)') AS l",
];

/// A `x-request-id` header on a raw request.
fn with_id<T>(msg: T, auth: &Option<String>, id: &str) -> tonic::Request<T> {
    let mut r = req(msg, auth);
    r.metadata_mut().insert("x-request-id", id.parse().unwrap());
    r
}

/// Queries that fail while planning (`GetFlightInfo`, `CreatePreparedStatement`) are logged
/// and listed in `system.queries` like failed HTTP queries, with the same error code.
#[test]
fn planning_failures_are_logged() {
    let (_, s) = lake();
    rt().block_on(async {
        let (mut c, auth) = raw(s, Some(TOKEN)).await;
        let bad_column = "SELECT nope FROM glass.events";
        let r = c.get_flight_info(with_id(statement(bad_column), &auth, "flight-plan-fail-1")).await;
        assert_eq!(status(r).0, Code::InvalidArgument);
        let body = ActionCreatePreparedStatementRequest {
            query: "SELECT * FROM glass.nope".into(),
            transaction_id: None,
        };
        let action =
            Action { r#type: "CreatePreparedStatement".into(), body: body.as_any().encode_to_vec().into() };
        assert_eq!(status(c.do_action(with_id(action, &auth, "flight-plan-fail-2")).await).0, Code::NotFound);
        let handle = prepare_raw(&mut c, &auth, "SELECT $1 + 1 AS n").await.unwrap();
        let words = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("$1", DataType::Utf8, true)])),
            vec![Arc::new(StringArray::from(vec!["not a number"]))],
        )
        .unwrap();
        let bound = bind_raw(&mut c, &auth, bind_messages(&handle, words).await).await.unwrap();
        let cmd = CommandPreparedStatementQuery { prepared_statement_handle: bound };
        let d = FlightDescriptor::new_cmd(cmd.as_any().encode_to_vec());
        let (code, message) = status(c.get_flight_info(with_id(d, &auth, "flight-plan-fail-3")).await);
        assert_ne!(code, Code::Ok);
        let http_code = |q: &str| http(|| s.query(q)).1["error"]["code"].as_str().unwrap().to_string();
        let want = [
            ("flight-plan-fail-1", "flight:statement", http_code(bad_column)),
            ("flight-plan-fail-2", "flight:prepared", http_code("SELECT * FROM glass.nope")),
        ];
        let listed = |id: &str| {
            http(|| {
                s.rows(&format!("SELECT route, state, error FROM system.queries WHERE request_id = '{id}'"))
            })
        };
        for (id, route, state) in want {
            let rows = listed(id);
            assert_eq!(rows.len(), 1, "{id}: {rows:?}");
            assert_eq!(
                (rows[0]["route"].as_str(), rows[0]["state"].as_str()),
                (Some(route), Some(state.as_str()))
            );
            let line = s.log_text().lines().find(|l| l.contains(id)).map(String::from);
            let line = line.unwrap_or_else(|| panic!("no log line for {id}"));
            assert!(line.contains(&format!("outcome=\"{state}\"")), "{line}");
        }
        let rows = listed("flight-plan-fail-3");
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0]["route"], "flight:prepared");
        // Every client may read system.queries: error texts (which quote literals) are listed
        // only with --log-sql; the log line has the outcome.
        assert!(!message.is_empty());
        assert_eq!(rows[0]["error"], serde_json::Value::Null);
        let line = s.log_text().lines().find(|l| l.contains("flight-plan-fail-3")).map(String::from);
        assert!(line.is_some_and(|l| l.contains("outcome=")), "no log line for flight-plan-fail-3");
    });
}

/// The `rows=` of the one query log line carrying `id`, once written.
fn logged_rows(s: &Server, id: &str, outcome: &str) -> u64 {
    eventually(10, || {
        let log = s.log_text();
        let line = log.lines().find(|l| l.contains(id) && l.contains(&format!("outcome=\"{outcome}\"")))?;
        let rows = line.split_once(" rows=")?.1.split(' ').next()?;
        Some(rows.parse().unwrap())
    })
}

/// A query that ends early is logged with the rows it did send: at a client gone away, at
/// least those the client read; at the byte cap, exactly those the client received.
#[test]
fn early_ends_log_the_rows_sent() {
    let (dir, s) = lake();
    rt().block_on(async {
        let (mut c, auth) = raw(s, Some(TOKEN)).await;
        let t = ticket_for("SELECT e.* FROM glass.events e, generate_series(1, 20) g", &mut c, &auth).await;
        let mut stream = c.do_get(with_id(t, &auth, "flight-rows-cancel")).await.unwrap().into_inner();
        let mut read = 0;
        while read == 0 {
            read += rows_of(&stream.message().await.unwrap().unwrap());
        }
        drop(stream);
        drop(c);
        let logged = logged_rows(s, "flight-rows-cancel", "cancelled");
        assert!(logged >= read && read > 0, "logged {logged}, read {read}");
    });

    let s = Server::start(Opts {
        args: [lake_args(dir.path()), vec!["--max-result-bytes".into(), "100000".into()]].concat(),
        ..Default::default()
    });
    rt().block_on(async {
        let (mut c, auth) = raw(&s, Some(TOKEN)).await;
        let t = ticket_for("SELECT event_id FROM glass.events", &mut c, &auth).await;
        let mut stream = c.do_get(with_id(t, &auth, "flight-rows-cap")).await.unwrap().into_inner();
        let mut read = 0;
        let end = loop {
            match stream.message().await {
                Ok(Some(fd)) => read += rows_of(&fd),
                Ok(None) => panic!("the cap was not reached"),
                Err(e) => break e,
            }
        };
        assert_eq!(end.code(), Code::ResourceExhausted, "{end}");
        assert!(read > 0, "the cap cut the first batch; raise --max-result-bytes");
        assert_eq!(logged_rows(&s, "flight-rows-cap", "result_too_large"), read);
    });
}

/// Rows in a Flight message (0 for a schema).
fn rows_of(fd: &FlightData) -> u64 {
    let m = arrow::ipc::root_as_message(&fd.data_header).unwrap();
    m.header_as_record_batch().map_or(0, |b| b.length() as u64)
}

/// `?` and `$n` in one statement are refused (the engine numbers `?` from 1, so
/// `SELECT $1, ?` bound the first value twice), and a binding must have one value per
/// placeholder (extra values were silently ignored).
#[test]
fn parameters_must_match_their_placeholders() {
    let (_, s) = lake();
    rt().block_on(async {
        let (mut c, auth) = raw(s, Some(TOKEN)).await;
        let mixed = "SELECT $1 AS a, ? AS b";
        let refused = "the statement mixes `?` and `$n` placeholders; use one style or the other";
        assert_eq!(status(prepare_raw(&mut c, &auth, mixed).await), (Code::InvalidArgument, refused.into()));
        let r = c.get_flight_info(req(statement(mixed), &auth)).await;
        assert_eq!(status(r), (Code::InvalidArgument, refused.into()));

        let handle = prepare_raw(&mut c, &auth, "SELECT ? AS a").await.unwrap();
        let (code, message) =
            status(bind_raw(&mut c, &auth, bind_messages(&handle, int_params(&[1, 2])).await).await);
        assert_eq!(
            (code, message.as_str()),
            (Code::InvalidArgument, "2 parameter value(s) bound to a statement that takes 1")
        );
        let handle = prepare_raw(&mut c, &auth, "SELECT ? AS a, ? AS b").await.unwrap();
        let (code, message) =
            status(bind_raw(&mut c, &auth, bind_messages(&handle, int_params(&[1])).await).await);
        assert_eq!(
            (code, message.as_str()),
            (Code::InvalidArgument, "1 parameter value(s) bound to a statement that takes 2")
        );

        // Matching bindings run, `$n` by number.
        let mut fc = client(s).await;
        for (q, want) in [("SELECT ? AS a, ? AS b", [1, 2]), ("SELECT $2 AS a, $1 AS b", [2, 1])] {
            let handle = prepare_raw(&mut c, &auth, q).await.unwrap();
            let bound =
                bind_raw(&mut c, &auth, bind_messages(&handle, int_params(&[1, 2])).await).await.unwrap();
            let stream = fc.do_get(prepared_ticket(&bound)).await.unwrap();
            let b = &stream.try_collect::<Vec<_>>().await.unwrap()[0];
            let got = [0, 1].map(|i| b.column(i).as_primitive::<Int64Type>().value(0));
            assert_eq!(got, want, "{q}");
        }
    });
}

/// What would take the server down over HTTP is refused over Flight too, and the server lives:
/// statements over their bounds fail (planning goes through the same checks and admission;
/// a value's bound when it is computed), parameter data over `--max-body-bytes` is cut before it is decoded, and a
/// table pattern that does not compile is the client's mistake.
#[test]
fn flight_refuses_what_would_take_the_server_down() {
    let (_, s) = lake();
    rt().block_on(async {
        let (mut c, auth) = raw(s, Some(TOKEN)).await;
        let doubling: String = (1..=22)
            .map(|i| format!(", c{i} AS (SELECT x FROM c{} UNION ALL SELECT x FROM c{})", i - 1, i - 1))
            .collect();
        for q in [
            format!("WITH c0 AS (SELECT 1 AS x){doubling} SELECT count(*) FROM c22"),
            "SELECT cardinality(array_repeat(1, 1000000000000))".to_string(),
            "SELECT length(repeat('x', 2000000000))".to_string(),
        ] {
            let started = std::time::Instant::now();
            // Refused when planned, or (a constant folded at execution) when the ticket runs.
            let code = match c.get_flight_info(req(statement(&q), &auth)).await {
                Ok(info) => {
                    do_get_code(&mut c, &auth, info.into_inner().endpoint[0].ticket.clone().unwrap()).await
                }
                Err(e) => e.code(),
            };
            assert_eq!(code, Code::InvalidArgument, "{}", &q[..q.len().min(60)]);
            assert!(started.elapsed() < Duration::from_secs(10));
        }

        // 2 MiB of parameter rows (16 of 128 KiB): refused as it arrives, not held.
        let handle = prepare_raw(&mut c, &auth, "SELECT $1 AS p").await.unwrap();
        let big = StringArray::from(vec!["x".repeat(128 << 10); 16]);
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("$1", DataType::Utf8, false)])),
            vec![Arc::new(big)],
        )
        .unwrap();
        let (code, message) = status(bind_raw(&mut c, &auth, bind_messages(&handle, batch).await).await);
        assert_eq!(code, Code::ResourceExhausted, "{message}");
        assert!(message.contains("--max-body-bytes"), "{message}");

        // The pattern is compiled when the listing is built, at DoGet.
        let tables =
            CommandGetTables { table_name_filter_pattern: Some("_".repeat(2_000_000)), ..Default::default() };
        let code = match c
            .get_flight_info(req(FlightDescriptor::new_cmd(tables.as_any().encode_to_vec()), &auth))
            .await
        {
            Ok(info) => {
                do_get_code(&mut c, &auth, info.into_inner().endpoint[0].ticket.clone().unwrap()).await
            }
            Err(e) => e.code(),
        };
        assert_eq!(code, Code::InvalidArgument);

        // Still answering.
        let mut fc = client(s).await;
        assert_eq!(
            pairs(&sql(&mut fc, "SELECT 'a' AS k, CAST(1 AS BIGINT) AS v").await),
            [("a".to_string(), 1)]
        );
    });
}
