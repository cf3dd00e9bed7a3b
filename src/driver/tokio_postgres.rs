//! [`Session`](super::Session) for anything that derefs to a tokio-postgres [`Client`] (one
//! unnamed statement, `query_typed`); [`LimitConn`] for [`Config`] and [`Connect`].

use std::future::Future;
use std::ops::Deref;
use std::time::Duration;

use postgres_types::{FromSql, ToSql, Type};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, Config, NoTls, SimpleQueryMessage, Socket};

use super::{Columns, Failure, Param, Row, SourceErrors, answer_or_cancel, sealed};
use crate::LimitConn;
use crate::error::{BoxError, Reading, not_an_outage};

impl<T: Deref<Target = Client> + Send> sealed::Sealed for T {
    async fn send<'a, const N: usize>(
        &'a mut self,
        sql: &'static str,
        params: &'a [Param<'a>; N],
        cancel_at: Instant,
    ) -> (Result<Row, Failure>, Option<Instant>) {
        let client: &Client = self;
        let typed: [(&(dyn ToSql + Sync), Type); N] = std::array::from_fn(|i| typed(&params[i]));
        cancelling(client, client.query_typed_one(sql, &typed), cancel_at).await
    }

    async fn script(&mut self, script: &'static str) -> Result<(), Failure> {
        let client: &Client = self;
        client.batch_execute(script).await.map_err(failure)
    }

    async fn rollback(&mut self) {
        let client: &Client = self;
        let _ = client.batch_execute("ROLLBACK").await;
    }
}

/// Awaits `answer`, cancelling it if unanswered at `cancel_at`.
pub(super) async fn cancelling(
    client: &Client,
    answer: impl Future<Output = Result<tokio_postgres::Row, tokio_postgres::Error>>,
    cancel_at: Instant,
) -> (Result<Row, Failure>, Option<Instant>) {
    let (answer, cancelled) = answer_or_cancel(answer, cancel_at, || {
        // Sent while this call holds the connection: it can reach only this statement.
        let token = client.cancel_token();
        async move { token.cancel_query(tokio_postgres::NoTls).await.is_ok() }
    })
    .await;
    let answer = answer.map_err(failure).map(|row| Row(Box::new(row)));
    (answer, cancelled)
}

/// The parameter as tokio-postgres sends it: a value and its type.
pub(super) fn typed<'a>(param: &'a Param<'a>) -> (&'a (dyn ToSql + Sync), Type) {
    match param {
        Param::Text(text) => (text, Type::TEXT),
        Param::Int8(n) => (n, Type::INT8),
        Param::Bool(b) => (b, Type::BOOL),
        Param::MaybeInt8(n) => (n, Type::INT8),
        Param::Float8(x) => (x, Type::FLOAT8),
        Param::TextArray(texts) => (texts, Type::TEXT_ARRAY),
        Param::Int8Array(ns) => (ns, Type::INT8_ARRAY),
        Param::BoolArray(bs) => (bs, Type::BOOL_ARRAY),
    }
}

/// A tokio-postgres error, as the stores take it.
pub(super) fn failure(error: tokio_postgres::Error) -> Failure {
    Failure::new(reading(&error), error)
}

/// Reads column `index` of `row` as `T`.
fn column<'a, T: FromSql<'a>>(row: &'a tokio_postgres::Row, index: usize) -> Result<T, Failure> {
    row.try_get(index).map_err(failure)
}

impl Columns for tokio_postgres::Row {
    fn boolean(&self, index: usize) -> Result<bool, Failure> {
        column(self, index)
    }
    fn int8(&self, index: usize) -> Result<i64, Failure> {
        column(self, index)
    }
    fn int8s(&self, index: usize) -> Result<Vec<i64>, Failure> {
        column(self, index)
    }
    fn texts(&self, index: usize) -> Result<Vec<String>, Failure> {
        column(self, index)
    }
    fn maybe_float8(&self, index: usize) -> Result<Option<f64>, Failure> {
        column(self, index)
    }
}

/// How tokio-postgres errors read in a connection source's chain.
pub(super) const ERRORS: SourceErrors = |error| {
    error
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(refused_while_up)
};

/// How the SQLSTATE table reads a tokio-postgres error: by its code, else gone if closed or I/O.
fn reading(error: &tokio_postgres::Error) -> Reading {
    match error.code() {
        Some(code) => Reading::Answered(code.clone()),
        None if error.is_closed() || io_caused(error) => Reading::Lost,
        None => Reading::Refused,
    }
}

fn io_caused(error: &tokio_postgres::Error) -> bool {
    std::error::Error::source(error).is_some_and(|s| s.is::<std::io::Error>())
}

/// Whether a connection attempt failed for a reason an outage does not explain, and its
/// SQLSTATE. tokio-postgres does not expose its error kinds; their stable messages are matched.
fn refused_while_up(error: &tokio_postgres::Error) -> Option<Option<SqlState>> {
    match error.code() {
        Some(code) => not_an_outage(code).then(|| Some(code.clone())),
        None => {
            let message = error.to_string();
            [
                "invalid configuration",
                "invalid connection string",
                "authentication error",
                // The server answered, with a certificate refused (or refusing).
                "error performing TLS handshake",
            ]
            .iter()
            .any(|kind| message.starts_with(kind))
            .then_some(None)
        }
    }
}

/// Connects for each call, without TLS: in a service, pass your pool.
impl LimitConn for Config {
    type Conn = Connected;
    type Error = tokio_postgres::Error;

    fn conn(&self) -> impl Future<Output = Result<Connected, tokio_postgres::Error>> + Send {
        connect(self, NoTls)
    }

    async fn probe(&self) -> Option<Result<(), BoxError>> {
        Some(async { started(&*connect(self, NoTls).await?).await }.await)
    }
}

/// Connects for each call with a TLS connector.
///
/// ```
/// use platformkit_limit::driver::Connect;
/// use platformkit_limit::Postgres;
///
/// let config: tokio_postgres::Config = "host=db user=app dbname=app".parse().unwrap();
/// let store = Postgres::new(Connect::new(config, tokio_postgres::NoTls));
/// # let _ = store;
/// ```
#[derive(Clone, Debug)]
pub struct Connect<T> {
    config: Config,
    tls: T,
}

impl<T> Connect<T> {
    /// A source that connects with `config` and `tls` for each call.
    pub fn new(config: Config, tls: T) -> Self {
        Connect { config, tls }
    }
}

impl<T> LimitConn for Connect<T>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    type Conn = Connected;
    type Error = tokio_postgres::Error;

    fn conn(&self) -> impl Future<Output = Result<Connected, tokio_postgres::Error>> + Send {
        connect(&self.config, self.tls.clone())
    }

    async fn probe(&self) -> Option<Result<(), BoxError>> {
        let connected = async { started(&*connect(&self.config, self.tls.clone()).await?).await };
        Some(connected.await)
    }
}

/// The end of a probe's startup: the server's `in_hot_standby`, by a `SHOW` (no snapshot).
pub(super) async fn started(client: &Client) -> Result<(), BoxError> {
    let shown = client.simple_query(super::IN_RECOVERY).await?;
    let on = shown
        .iter()
        .any(|m| matches!(m, SimpleQueryMessage::Row(row) if row.get(0) == Some("on")));
    if on {
        return Err(super::InRecovery.into());
    }
    Ok(())
}

async fn connect<T>(config: &Config, tls: T) -> Result<Connected, tokio_postgres::Error>
where
    T: MakeTlsConnect<Socket> + Send + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let (client, connection) = config.connect(tls).await?;
    let task = tokio::spawn(async move {
        // A connection error here is seen by the call through the client.
        let _ = connection.await;
    });
    Ok(Connected {
        client: Some(client),
        task: Some(task),
    })
}

/// A connection made for one call: closed when dropped.
#[derive(Debug)]
pub struct Connected {
    client: Option<Client>,
    task: Option<JoinHandle<()>>,
}

/// How long a dropped [`Connected`] may take to close politely.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

impl Deref for Connected {
    type Target = Client;

    fn deref(&self) -> &Client {
        self.client.as_ref().expect("the client lives until drop")
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        // It sends Terminate once its answers are in; a silent server must not keep the task.
        drop(self.client.take());
        if let Some(task) = self.task.take() {
            if task.is_finished() {
                return;
            }
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let abort = task.abort_handle();
                runtime.spawn(async move {
                    if tokio::time::timeout(CLOSE_GRACE, task).await.is_err() {
                        abort.abort();
                    }
                });
            } else {
                task.abort();
            }
        }
    }
}
