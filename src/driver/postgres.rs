//! [`Session`](super::Session) for tokio-postgres: anything that derefs to a
//! [`Client`], and, with the `deadpool` feature, [`Prepared`] over a
//! deadpool connection.
//!
//! By default the statement goes as one unnamed Parse, Bind, Execute and
//! Sync, with the parameter types given (`query_typed`): one message, one
//! round trip, and nothing prepared that outlives the call, so it is safe
//! through PgBouncer in transaction mode. Through [`Prepared`], it is
//! prepared once per connection (a named statement in the connection's
//! deadpool statement cache) and each call sends only Bind, Execute and
//! Sync: still one round trip, after the first on each connection, and the
//! server neither parses nor plans it again. Either way, a statement still
//! unanswered at the cancel mark is sent a cancel request.

use std::ops::Deref;
use std::time::SystemTime;

use postgres_types::{ToSql, Type};
use tokio::time::Instant;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::{Column, Failure, Param, Row, answer_or_cancel, sealed};
use crate::error::{Reading, misconfigured_code};

impl<T: Deref<Target = Client> + Send> sealed::Sealed for T {
    async fn send<'a, const N: usize>(
        &'a mut self,
        sql: &'static str,
        params: &'a [Param<'a>; N],
        cancel_at: Instant,
    ) -> (Result<Row, Failure>, Option<Instant>) {
        send(self, None, sql, params, cancel_at).await
    }

    async fn script(&mut self, script: &'static str) -> Result<(), Failure> {
        let client: &Client = self;
        client
            .batch_execute(script)
            .await
            .map_err(Failure::Postgres)
    }

    async fn rollback(&mut self) {
        let client: &Client = self;
        let _ = client.batch_execute("ROLLBACK").await;
    }
}

#[cfg(feature = "deadpool")]
impl<T> sealed::Sealed for crate::Prepared<T>
where
    T: Deref<Target = deadpool_postgres::ClientWrapper> + Send,
{
    async fn send<'a, const N: usize>(
        &'a mut self,
        sql: &'static str,
        params: &'a [Param<'a>; N],
        cancel_at: Instant,
    ) -> (Result<Row, Failure>, Option<Instant>) {
        let wrapper: &deadpool_postgres::ClientWrapper = &self.0;
        send(
            wrapper,
            Some(&wrapper.statement_cache),
            sql,
            params,
            cancel_at,
        )
        .await
    }

    async fn script(&mut self, script: &'static str) -> Result<(), Failure> {
        self.0
            .batch_execute(script)
            .await
            .map_err(Failure::Postgres)
    }

    async fn rollback(&mut self) {
        let _ = self.0.batch_execute("ROLLBACK").await;
    }
}

/// The statement cache of a connection, where it has one.
#[cfg(feature = "deadpool")]
type Cache = deadpool_postgres::StatementCache;
#[cfg(not(feature = "deadpool"))]
type Cache = std::convert::Infallible;

/// Sends `sql` on `client`, prepared through `cache` if there is one, and
/// sends a cancel request if it is unanswered at `cancel_at`.
async fn send<const N: usize>(
    client: &Client,
    cache: Option<&Cache>,
    sql: &'static str,
    params: &[Param<'_>; N],
    cancel_at: Instant,
) -> (Result<Row, Failure>, Option<Instant>) {
    let typed: [(&(dyn ToSql + Sync), Type); N] = std::array::from_fn(|i| typed(&params[i]));
    let (answer, cancelled) =
        answer_or_cancel(one_row(client, cache, sql, &typed), cancel_at, || {
            // What psql's Ctrl-C sends, over a new connection without TLS; sent
            // while this call still holds the connection, so it can only reach
            // this statement (or, on a connection's first call through
            // `Prepared`, its Parse), and finished before the connection is
            // handed back.
            let token = client.cancel_token();
            async move { token.cancel_query(tokio_postgres::NoTls).await.is_ok() }
        })
        .await;
    (
        answer.map(Row::Postgres).map_err(Failure::Postgres),
        cancelled,
    )
}

/// The statement's one row: sent as one unnamed statement, or, with a
/// cache, as the connection's prepared statement.
async fn one_row<const N: usize>(
    client: &Client,
    cache: Option<&Cache>,
    sql: &'static str,
    typed: &[(&(dyn ToSql + Sync), Type); N],
) -> Result<tokio_postgres::Row, tokio_postgres::Error> {
    #[cfg(feature = "deadpool")]
    if let Some(cache) = cache {
        let types: [Type; N] = std::array::from_fn(|i| typed[i].1.clone());
        let values: [&(dyn ToSql + Sync); N] = std::array::from_fn(|i| typed[i].0);
        let statement = cache.prepare_typed(client, sql, &types).await?;
        let answer = client.query_one(&statement, &values).await;
        if let Err(e) = &answer {
            // The statement is gone from the connection (`DEALLOCATE ALL`,
            // `DISCARD ALL`, a PgBouncer that cannot carry it), or the
            // schema changed its result type under it ("cached plan must
            // not change result type"): the Bind ran nothing and the error
            // stands, loud; the next call on this connection prepares it
            // again.
            if [
                SqlState::INVALID_SQL_STATEMENT_NAME,
                SqlState::FEATURE_NOT_SUPPORTED,
            ]
            .iter()
            .any(|code| e.code() == Some(code))
            {
                cache.remove(sql, &types);
            }
        }
        return answer;
    }
    #[cfg(not(feature = "deadpool"))]
    let _ = cache;
    client.query_typed_one(sql, typed).await
}

/// The parameter as tokio-postgres sends it: a value and its type.
fn typed<'a>(param: &'a Param<'a>) -> (&'a (dyn ToSql + Sync), Type) {
    match param {
        Param::Text(text) => (text, Type::TEXT),
        Param::Int8(n) => (n, Type::INT8),
        Param::Bool(b) => (b, Type::BOOL),
        Param::Timestamptz(at) => (at, Type::TIMESTAMPTZ),
        Param::TextArray(texts) => (texts, Type::TEXT_ARRAY),
        Param::Int8Array(ns) => (ns, Type::INT8_ARRAY),
    }
}

macro_rules! column {
    ($($t:ty),*) => {$(
        impl Column for $t {
            fn from_postgres(
                row: &tokio_postgres::Row,
                index: usize,
            ) -> Result<Self, tokio_postgres::Error> {
                row.try_get(index)
            }

            #[cfg(feature = "sqlx")]
            fn from_sqlx(row: &::sqlx::postgres::PgRow, index: usize) -> Result<Self, ::sqlx::Error> {
                super::sqlx::column(row, index)
            }
        }
    )*};
}

column!(
    i64,
    Vec<String>,
    Vec<i64>,
    SystemTime,
    Option<SystemTime>,
    Vec<SystemTime>,
    Vec<Option<SystemTime>>
);

/// How the SQLSTATE table reads a tokio-postgres error: by its code; without
/// one, the connection is gone when it is closed or an I/O error caused it.
pub(super) fn reading(error: &tokio_postgres::Error) -> Reading {
    match error.code() {
        Some(code) => Reading::Answered(code.clone()),
        None if error.is_closed() || io_caused(error) => Reading::Lost,
        None => Reading::Refused,
    }
}

fn io_caused(error: &tokio_postgres::Error) -> bool {
    std::error::Error::source(error).is_some_and(|s| s.is::<std::io::Error>())
}

/// Whether a connection attempt failed for a reason an outage does not
/// explain, and its SQLSTATE. tokio-postgres does not expose its error
/// kinds; its messages for them are stable and are matched here.
pub(super) fn misconfigured(error: &tokio_postgres::Error) -> Option<Option<SqlState>> {
    match error.code() {
        Some(code) => misconfigured_code(code).then(|| Some(code.clone())),
        None => {
            let message = error.to_string();
            [
                "invalid configuration",
                "invalid connection string",
                "authentication error",
            ]
            .iter()
            .any(|kind| message.starts_with(kind))
            .then_some(None)
        }
    }
}
