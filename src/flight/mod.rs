//! The Arrow Flight SQL front end (arrow-flight + tonic), on its own port, over the same engine,
//! auth, read-only rules and limits as HTTP.
//!
//! Stateless by design: `GetFlightInfo` only plans (to learn the schema), and its ticket carries
//! the SQL, so nothing is executed twice and nothing waits in memory for `DoGet`; prepared
//! statements keep their SQL and bound parameters in the handle (see [`handle`]). `DoGet`
//! streams batches as the query produces them; a client that goes away drops the stream, which
//! cancels the query.

mod handle;
mod metadata;

use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arrow::datatypes::{Schema, SchemaRef};
use arrow::ipc::writer::IpcWriteOptions;
use arrow::record_batch::RecordBatch;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::sql::metadata::SqlInfoData;
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, Any, CommandGetCatalogs, CommandGetDbSchemas, CommandGetSqlInfo,
    CommandGetTableTypes, CommandGetTables, CommandPreparedStatementQuery, CommandPreparedStatementUpdate,
    CommandStatementIngest, CommandStatementQuery, CommandStatementUpdate, DoPutPreparedStatementResult,
    ProstMessageExt, SqlInfo, TicketStatementQuery,
};
use arrow_flight::{
    FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse,
    IpcMessage, SchemaAsIpc, Ticket,
};
use base64::Engine as _;
use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use prost::Message;
use skiff_engine::Described;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::auth::Auth;
use crate::error::SkiffError;
use crate::listen::{Bounds, Connections, Watched};
use crate::observe::{QueryLog, query_span};
use crate::state::AppState;
use handle::Statement;

type DoGetStream = Pin<Box<dyn Stream<Item = Result<FlightData, Status>> + Send + 'static>>;

/// Serves Flight SQL on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    bounds: Bounds,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let auth = state.auth.clone();
    let service = FlightSqlServer { sql_info: Arc::new(metadata::sql_info(state.engine.session())), state };
    // Every call, metadata calls and the handshake included, passes this check first.
    let svc = FlightServiceServer::with_interceptor(service, move |req: Request<()>| {
        presented_token(&auth, req.metadata()).map(|_| req)
    });
    serve_grpc(listener, bounds, svc, shutdown).await
}

/// Serves one gRPC service on `listener`, its connections bounded as the HTTP server's are,
/// until `shutdown` resolves.
pub async fn serve_grpc<S>(
    listener: tokio::net::TcpListener,
    bounds: Bounds,
    svc: S,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    S: tower::Service<tonic::codegen::http::Request<tonic::body::Body>, Error = std::convert::Infallible>
        + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Response: axum::response::IntoResponse,
    S::Future: Send + 'static,
{
    let connections = Connections::new(bounds);
    let incoming = futures::stream::unfold((connections, listener), |(c, l)| async move {
        let conn = c.accept(&l).await;
        Some((Ok::<_, std::io::Error>(Incoming(conn)), (c, l)))
    });
    // HTTP/2 pings keep long, quiet streams (a slow aggregation) alive through proxies, count
    // as activity on a connection (which is closed after `bounds.idle` without any), and
    // notice dead clients, whose queries are then dropped.
    let ping = (bounds.idle / 3).max(Duration::from_millis(100));
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(ping))
        .http2_keepalive_timeout(Some(ping))
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// An accepted Flight connection, for tonic.
struct Incoming(Watched);

impl tonic::transport::server::Connected for Incoming {
    type ConnectInfo = Option<std::net::SocketAddr>;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.peer_addr().ok()
    }
}

impl tokio::io::AsyncRead for Incoming {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Incoming {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// Basic credentials' base64, padded or not (Go's Flight client leaves the padding off).
const BASIC: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// The token a call presents, if it is a valid one: `Bearer <token>`, or `Basic` with the token
/// as the password (any user name), which is what JDBC and ADBC send to the handshake.
#[allow(clippy::result_large_err)]
fn presented_token(auth: &Auth, md: &MetadataMap) -> Result<String, Status> {
    let header = md.get("authorization").and_then(|v| v.to_str().ok()).map(str::trim);
    let token = match header.and_then(|h| h.split_once(' ')) {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => Some(rest.trim().to_string()),
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("basic") => BASIC
            .decode(rest.trim())
            .ok()
            .and_then(|raw| String::from_utf8(raw).ok())
            .and_then(|up| up.split_once(':').map(|(_, password)| password.to_string())),
        _ => None,
    };
    match token {
        Some(t) if auth.check_token(&t) => Ok(t),
        None if !auth.enabled() => Ok(String::new()),
        _ => Err(SkiffError::Unauthorized.into()),
    }
}

pub struct FlightSqlServer {
    state: Arc<AppState>,
    sql_info: Arc<SqlInfoData>,
}

/// The one encoder configuration for results, so that [`flight_schema`] matches what is sent.
fn encoder(schema: SchemaRef) -> FlightDataEncoderBuilder {
    FlightDataEncoderBuilder::new().with_schema(schema)
}

/// The schema `DoGet` sends for a result planned as `schema`: the encoder hydrates
/// dictionaries and rewrites some nested types (LargeList to List, union members) before its
/// first message, and clients (ADBC) refuse a stream whose schema differs from the one
/// `GetFlightInfo` announced. Asked of an encoder that never sends, so the two cannot drift.
fn flight_schema(schema: SchemaRef) -> SchemaRef {
    encoder(schema.clone()).build(futures::stream::empty()).known_schema().unwrap_or(schema)
}

/// Rows in one Flight message (0 for a schema or dictionary), so the log counts rows sent.
fn rows_in(fd: &FlightData) -> u64 {
    let message = arrow::ipc::root_as_message(&fd.data_header).ok();
    message.and_then(|m| m.header_as_record_batch()).map_or(0, |b| b.length() as u64)
}

/// Logs a failed call that only plans (`GetFlightInfo`, `CreatePreparedStatement`) as a
/// failed query, as HTTP would; a success is logged by the `DoGet` that runs it.
#[allow(clippy::result_large_err)]
fn logged<T>(
    planned: Result<T, SkiffError>,
    sql: &str,
    md: &MetadataMap,
    route: &'static str,
) -> Result<T, Status> {
    planned.map_err(|e| {
        let mut log = QueryLog::new(request_id(md), route);
        log.set_sql(sql);
        log.finish(Err(&e));
        e.into()
    })
}

impl FlightSqlServer {
    /// A `FlightInfo` whose one endpoint's ticket is `ticket`, for a result of `schema`.
    fn info(
        schema: SchemaRef,
        ticket: impl ProstMessageExt,
        descriptor: FlightDescriptor,
    ) -> Result<Response<FlightInfo>, Status> {
        let endpoint =
            FlightEndpoint::new().with_ticket(Ticket { ticket: ticket.as_any().encode_to_vec().into() });
        let info = FlightInfo::new()
            .try_with_schema(&flight_schema(schema))
            .map_err(|e| Status::internal(format!("encoding the schema: {e}")))?
            .with_endpoint(endpoint)
            .with_descriptor(descriptor);
        Ok(Response::new(info))
    }

    /// Runs a statement and streams its batches as Flight data, logging it like every query.
    async fn run(
        &self,
        stmt: Statement,
        md: &MetadataMap,
        route: &'static str,
    ) -> Result<DoGetStream, Status> {
        let mut log = QueryLog::new(request_id(md), route);
        log.set_sql(&stmt.sql);
        let started = match stmt.params() {
            Ok(params) => self
                .state
                .engine
                .execute_with(&stmt.sql, params)
                .instrument(log.span())
                .await
                .map_err(SkiffError::from),
            Err(e) => Err(e),
        };
        let q = match started {
            Ok(q) => q,
            Err(e) => {
                log.finish(Err(&e));
                return Err(e.into());
            }
        };
        log.set_stats(q.stats.clone());
        let cap = self.state.result_cap();
        let counted = Arc::new(AtomicU64::new(0));
        // Caps end the stream with an error, never a silent cut: Flight has no way to mark a
        // result as partial.
        let batches = q.stream.map(move |b| {
            let b = b.map_err(SkiffError::from)?;
            let n = counted.fetch_add(b.num_rows() as u64, Ordering::Relaxed) + b.num_rows() as u64;
            if n > cap.rows {
                return Err(SkiffError::ResultTooLarge(format!(
                    "the result has more than {} rows (--max-result-rows)",
                    cap.rows
                )));
            }
            Ok(b)
        });
        let data = encoder(q.schema).build(batches.map_err(|e| FlightError::ExternalError(Box::new(e))));
        // `log.rows` counts rows as they are handed to the client, so a query that ends early
        // (a cap, a client gone) is logged with the rows it did send.
        let logged = futures::stream::unfold((data, log, cap.bytes), |(mut data, mut log, cap)| async move {
            if log.done() {
                return None;
            }
            let item = match data.next().await {
                Some(Ok(fd)) => {
                    log.bytes += (fd.data_header.len() + fd.data_body.len()) as u64;
                    if log.bytes > cap {
                        let e = SkiffError::ResultTooLarge(format!(
                            "the result is larger than {cap} bytes (--max-result-bytes)"
                        ));
                        log.finish(Err(&e));
                        Err(e.into())
                    } else {
                        log.rows += rows_in(&fd);
                        Ok(fd)
                    }
                }
                Some(Err(e)) => {
                    let e = match e {
                        FlightError::ExternalError(b) => match b.downcast::<SkiffError>() {
                            Ok(s) => *s,
                            Err(b) => SkiffError::Internal(b.to_string()),
                        },
                        other => SkiffError::Internal(format!("encoding the result: {other}")),
                    };
                    log.finish(Err(&e));
                    Err(Status::from(e))
                }
                None => {
                    log.finish(Ok(()));
                    return None;
                }
            };
            Some((item, (data, log, cap)))
        });
        Ok(Box::pin(logged))
    }

    /// A new statement, planned for its schema without running it; a failure is logged.
    async fn plan_new(
        &self,
        sql: String,
        md: &MetadataMap,
        route: &'static str,
    ) -> Result<(Described, Statement), Status> {
        let planned = async {
            let stmt = Statement::new(sql.clone())?;
            Ok((self.state.engine.describe(&stmt.sql, Vec::new()).await?, stmt))
        };
        logged(planned.instrument(query_span(&request_id(md), route)).await, &sql, md, route)
    }

    /// A one-batch answer (metadata listings), encoded as Flight data.
    fn once(batch: RecordBatch) -> Response<DoGetStream> {
        let data =
            encoder(batch.schema()).build(futures::stream::once(async { Ok(batch) })).map_err(Status::from);
        Response::new(Box::pin(data))
    }
}

/// The caller's `x-request-id` when it is sane, else a new one, as on HTTP.
fn request_id(md: &MetadataMap) -> String {
    crate::observe::request_id(md.get("x-request-id").and_then(|v| v.to_str().ok()))
}

fn schema_ipc(schema: &Schema) -> Result<bytes::Bytes, Status> {
    let IpcMessage(bytes) = SchemaAsIpc::new(schema, &IpcWriteOptions::default())
        .try_into()
        .map_err(|e: arrow::error::ArrowError| Status::internal(format!("encoding a schema: {e}")))?;
    Ok(bytes)
}

fn read_only<T>() -> Result<T, Status> {
    Err(SkiffError::ReadOnly("skiff is read-only: updates and ingestion are not accepted".into()).into())
}

#[tonic::async_trait]
impl FlightSqlService for FlightSqlServer {
    type FlightService = FlightSqlServer;

    /// Basic auth in (any user, the token as password), `Bearer <token>` out, as JDBC and ADBC
    /// expect. The interceptor has already checked the credentials.
    async fn do_handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>>, Status> {
        let token = presented_token(&self.state.auth, request.metadata())?;
        let reply = HandshakeResponse { protocol_version: 0, payload: token.clone().into() };
        let mut res: Response<Pin<Box<dyn Stream<Item = _> + Send>>> =
            Response::new(Box::pin(futures::stream::iter([Ok(reply)])));
        let bearer = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| Status::invalid_argument("the token is not a valid header value"))?;
        res.metadata_mut().insert("authorization", bearer);
        Ok(res)
    }

    async fn get_flight_info_statement(
        &self,
        cmd: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let (described, stmt) = self.plan_new(cmd.query, request.metadata(), "flight:statement").await?;
        let ticket = TicketStatementQuery { statement_handle: stmt.encode()? };
        Self::info(described.schema, ticket, request.into_inner())
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let stmt = Statement::decode(&ticket.statement_handle)?;
        Ok(Response::new(self.run(stmt, request.metadata(), "flight:statement").await?))
    }

    async fn do_action_create_prepared_statement(
        &self,
        cmd: ActionCreatePreparedStatementRequest,
        request: Request<arrow_flight::Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let (described, stmt) = self.plan_new(cmd.query, request.metadata(), "flight:prepared").await?;
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: stmt.encode()?,
            dataset_schema: schema_ipc(&flight_schema(described.schema))?,
            parameter_schema: schema_ipc(&described.parameters)?,
        })
    }

    /// Binding parameters answers a new handle holding them: the server keeps nothing.
    async fn do_put_prepared_statement_query(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let stmt = Statement::decode(&cmd.prepared_statement_handle)?;
        // Parameters are a few values: their data may take what an HTTP body may, and the
        // stream is cut as soon as it goes over, before anything is decoded.
        let limit = self.state.max_body_bytes;
        let mut received = 0usize;
        // `into_peekable` keeps the message the dispatcher peeked at: the parameters' schema.
        let data = request.into_inner().into_peekable().map_err(FlightError::from).and_then(move |fd| {
            received += fd.data_header.len() + fd.data_body.len();
            let checked = if received > limit {
                Err(FlightError::Tonic(Box::new(Status::resource_exhausted(format!(
                    "parameter data over {limit} bytes (--max-body-bytes)"
                )))))
            } else {
                match arrow::ipc::root_as_message(&fd.data_header) {
                    Ok(m) => handle::check_message(&m, fd.data_body.len()).map_err(FlightError::protocol),
                    Err(_) => Ok(()), // the decoder names what is wrong
                }
            };
            futures::future::ready(checked.map(|()| fd))
        });
        // The data is the client's: arrow's decoder panics on buffers that point outside the
        // message, which must end this call, not the connection.
        let decoding =
            arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(data).try_collect();
        let batches: Vec<RecordBatch> = match AssertUnwindSafe(decoding).catch_unwind().await {
            Ok(Ok(batches)) => batches,
            Ok(Err(FlightError::Tonic(status))) => return Err(*status),
            Ok(Err(e)) => return Err(Status::invalid_argument(format!("unreadable parameter data: {e}"))),
            Err(_) => return Err(Status::invalid_argument("unreadable parameter data: malformed buffers")),
        };
        let batch = match batches.len() {
            0 => return Ok(DoPutPreparedStatementResult { prepared_statement_handle: Some(stmt.encode()?) }),
            1 => batches.into_iter().next().expect("one batch"),
            _ => arrow::compute::concat_batches(&batches[0].schema(), &batches)
                .map_err(|e| Status::invalid_argument(format!("parameter batches disagree: {e}")))?,
        };
        Ok(DoPutPreparedStatementResult { prepared_statement_handle: Some(stmt.bind(batch)?.encode()?) })
    }

    async fn get_flight_info_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let stmt = Statement::decode(&cmd.prepared_statement_handle)?;
        let planned =
            async { self.state.engine.describe(&stmt.sql, stmt.params()?).await.map_err(SkiffError::from) };
        let span = query_span(&request_id(request.metadata()), "flight:prepared");
        let described =
            logged(planned.instrument(span).await, &stmt.sql, request.metadata(), "flight:prepared")?;
        Self::info(described.schema, cmd, request.into_inner())
    }

    async fn do_get_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let stmt = Statement::decode(&cmd.prepared_statement_handle)?;
        Ok(Response::new(self.run(stmt, request.metadata(), "flight:prepared").await?))
    }

    /// Nothing to free: the handle was the whole statement.
    async fn do_action_close_prepared_statement(
        &self,
        _cmd: ActionClosePreparedStatementRequest,
        _request: Request<arrow_flight::Action>,
    ) -> Result<(), Status> {
        Ok(())
    }

    async fn get_flight_info_catalogs(
        &self,
        cmd: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = cmd.into_builder().schema();
        Self::info(schema, cmd, request.into_inner())
    }

    async fn do_get_catalogs(
        &self,
        cmd: CommandGetCatalogs,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(Self::once(metadata::catalogs(cmd)?))
    }

    async fn get_flight_info_schemas(
        &self,
        cmd: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = cmd.clone().into_builder().schema();
        Self::info(schema, cmd, request.into_inner())
    }

    async fn do_get_schemas(
        &self,
        cmd: CommandGetDbSchemas,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(Self::once(metadata::schemas(&self.state.engine, cmd)?))
    }

    async fn get_flight_info_tables(
        &self,
        cmd: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = cmd.clone().into_builder().schema();
        Self::info(schema, cmd, request.into_inner())
    }

    async fn do_get_tables(
        &self,
        cmd: CommandGetTables,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(Self::once(metadata::tables(&self.state.engine, cmd).await?))
    }

    async fn get_flight_info_table_types(
        &self,
        cmd: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = cmd.into_builder().schema();
        Self::info(schema, cmd, request.into_inner())
    }

    async fn do_get_table_types(
        &self,
        cmd: CommandGetTableTypes,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(Self::once(metadata::table_types(cmd)?))
    }

    async fn get_flight_info_sql_info(
        &self,
        cmd: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = cmd.clone().into_builder(&self.sql_info).schema();
        Self::info(schema, cmd, request.into_inner())
    }

    async fn do_get_sql_info(
        &self,
        cmd: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let batch = cmd.into_builder(&self.sql_info).build().map_err(SkiffError::from)?;
        Ok(Self::once(batch))
    }

    async fn do_put_statement_update(
        &self,
        _cmd: CommandStatementUpdate,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        read_only()
    }

    async fn do_put_statement_ingest(
        &self,
        _cmd: CommandStatementIngest,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        read_only()
    }

    async fn do_put_prepared_statement_update(
        &self,
        _cmd: CommandPreparedStatementUpdate,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        read_only()
    }

    async fn do_get_fallback(
        &self,
        _request: Request<Ticket>,
        message: Any,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        Err(Status::invalid_argument(format!("unknown ticket type {}", message.type_url)))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}
