//! [`Session`](super::Session) for sqlx (feature `sqlx`): [`SqlxConn`] over
//! any sqlx PostgreSQL connection, and [`LimitConn`](crate::LimitConn) for
//! [`PgPool`](sqlx::PgPool) (`pool.rs`).
//!
//! The statement goes through sqlx's ordinary query path, as the service's
//! own queries do: prepared once per connection as a named statement and
//! cached (sqlx's statement cache), then one Bind, Execute and Sync per call:
//! one round trip. sqlx keeps the backend's cancel key private, so no cancel
//! request is ever sent: the server's `lock_timeout` bounds the lock waits
//! and the client gives up at the deadline.

mod pool;
mod timestamptz;

use std::ops::DerefMut;
use std::time::SystemTime;

use sqlx::postgres::{PgConnection, PgRow, Postgres};
use sqlx::{Executor, Row as _};
use tokio::time::Instant;
use tokio_postgres::error::SqlState;

use self::timestamptz::Timestamptz;
use super::record::Fields;
use super::{Columns, Failure, Param, Row, SourceErrors, sealed};
use crate::error::{Reading, not_an_outage};

/// An sqlx PostgreSQL connection lent to the limiter: a
/// `PoolConnection<Postgres>` (what [`PgPool`](sqlx::PgPool) lends), a `PgConnection` held
/// in a mutex, or a `&mut PgConnection`: anything that dereferences to
/// something that gives a `&mut PgConnection`.
///
/// Like every connection, it must be idle when lent; one inside a
/// transaction is an [`ErrorKind::InTransaction`](crate::ErrorKind::InTransaction)
/// error, and that transaction is rolled back. sqlx cannot cancel a
/// statement on the server, and a call given up (at its budget, or dropped)
/// leaves its `CALL`'s answer owed on the connection: the limiter's next
/// call reads it first, the service's own next query would not. See the
/// guide's [drivers](crate::guide#drivers) section.
///
/// Lend a connection the service holds, one call at a time:
///
/// ```no_run
/// use platformkit_limit::driver::SqlxConn;
/// use platformkit_limit::{Limiter, Postgres};
/// use sqlx::{Connection, PgConnection};
/// use std::sync::Arc;
/// use tokio::sync::Mutex;
///
/// # async fn demo() -> Result<(), sqlx::Error> {
/// let held = Arc::new(Mutex::new(PgConnection::connect("postgres://app@db/app").await?));
/// let conns = move || {
///     let held = held.clone();
///     async move { Ok::<_, std::convert::Infallible>(SqlxConn(held.lock_owned().await)) }
/// };
/// let limiter = Limiter::new(Postgres::new(conns));
/// # let _ = limiter;
/// # Ok(())
/// # }
/// ```
///
/// Or lend the `PoolConnection` a request already holds (a transaction's is
/// refused: the connection must be idle) to a limiter for that request, and
/// keep using it through the same lock. The source owns what it lends (a
/// connection source is `'static`: the limiter's shared statements are sent
/// by a task of its own, which may still hold the connection for a moment
/// after a call that ran out of budget). A limiter built per request has
/// its own refusal cache and merging, so those help only across its calls;
/// share one limiter over a pool where you can.
///
/// ```no_run
/// use platformkit_limit::driver::SqlxConn;
/// use platformkit_limit::{Key, Limit, Limiter, Postgres};
/// use sqlx::{pool::PoolConnection, Postgres as Pg};
/// use std::sync::Arc;
/// use tokio::sync::Mutex;
///
/// # async fn demo(conn: PoolConnection<Pg>, login: &Limit) -> Result<(), platformkit_limit::Error> {
/// let held = Arc::new(Mutex::new(conn));
/// let lent = held.clone();
/// let limiter = Limiter::new(Postgres::new(move || {
///     let lent = lent.clone();
///     async move { Ok::<_, std::convert::Infallible>(SqlxConn(lent.lock_owned().await)) }
/// }));
/// let verdict = limiter.check(login, &Key::email("alice@example.com")).await?;
/// // The request's own queries, on the same connection, one at a time.
/// let conn = held.lock().await;
/// # let _ = (verdict, conn);
/// # Ok(())
/// # }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
#[derive(Debug)]
pub struct SqlxConn<C>(pub C);

impl<C> SqlxConn<C> {
    /// The connection given back.
    pub fn into_inner(self) -> C {
        self.0
    }
}

impl<C> sealed::Sealed for SqlxConn<C>
where
    C: DerefMut + Send,
    C::Target: AsMut<PgConnection>,
{
    async fn send<'a, const N: usize>(
        &'a mut self,
        sql: &'static str,
        params: &'a [Param<'a>; N],
        // sqlx keeps the cancel key private: nothing to cancel with.
        _cancel_at: Instant,
    ) -> (Result<Row, Failure>, Option<Instant>) {
        let conn: &mut PgConnection = (*self.0).as_mut();
        if let Err(e) = settle(conn).await {
            return (Err(failure(e)), None);
        }
        let mut query = sqlx::query(sql);
        for param in params {
            query = match *param {
                Param::Text(text) => query.bind(text),
                Param::Int8(n) => query.bind(n),
                Param::Bool(b) => query.bind(b),
                Param::Timestamptz(at) => query.bind(at.map(Timestamptz)),
                Param::Float8(x) => query.bind(x),
                Param::TextArray(texts) => query.bind(texts),
                Param::Int8Array(ns) => query.bind(ns),
                Param::BoolArray(bs) => query.bind(bs),
            };
        }
        let answer = query.fetch_one(conn).await;
        (answer.map_err(failure).and_then(answered), None)
    }

    async fn script(&mut self, script: &'static str) -> Result<(), Failure> {
        let conn: &mut PgConnection = (*self.0).as_mut();
        settle(conn).await.map_err(failure)?;
        conn.execute(sqlx::raw_sql(script))
            .await
            .map(drop)
            .map_err(failure)
    }

    async fn rollback(&mut self) {
        let conn: &mut PgConnection = (*self.0).as_mut();
        let _ = conn.execute("ROLLBACK").await;
    }
}

/// Reads what the connection still owes a statement given up before its
/// answer came (a call dropped at its budget, or by its caller), so that
/// the answer is not taken for the next statement's: sqlx hands a late
/// error to whichever statement reads next. An error read here is the
/// given-up statement's and is dropped; reading goes on to its
/// ReadyForQuery. Nothing is sent, and nothing waits when nothing is owed.
/// The call's deadline bounds the wait. See the guide's
/// [drivers](crate::guide#drivers) section.
async fn settle(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    loop {
        // `flush` is sqlx's `wait_until_ready`: it reads up to the
        // ReadyForQuery of every Sync sent, returning the first error it
        // reads; each round reads at least one message.
        match sqlx::Connection::flush(&mut *conn).await {
            Err(sqlx::Error::Database(_)) => continue,
            settled => return settled,
        }
    }
}

/// How the SQLSTATE table reads an sqlx error: a database error by its
/// code; an I/O or TLS error, or a pool that is closed or timed out, as the
/// connection gone; a refused configuration as a misconfiguration; anything
/// else (a protocol error, a value that does not decode) as a hard error.
fn reading(error: &sqlx::Error) -> Reading {
    match error {
        sqlx::Error::Database(e) => match e.code() {
            Some(code) => Reading::Answered(SqlState::from_code(&code)),
            None => Reading::Refused,
        },
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Reading::Lost,
        sqlx::Error::Configuration(_) => Reading::Misconfigured,
        _ => Reading::Refused,
    }
}

/// Whether a connection attempt failed for a reason an outage does not
/// explain (a refused configuration, or the server refusing with a SQLSTATE
/// that is not it going away: a misconfiguration, or it out of a resource),
/// and its SQLSTATE.
fn refused_while_up(error: &sqlx::Error) -> Option<Option<SqlState>> {
    match reading(error) {
        Reading::Answered(code) => not_an_outage(&code).then_some(Some(code)),
        Reading::Misconfigured => Some(None),
        Reading::Lost | Reading::Refused => None,
    }
}

/// An sqlx error, as the stores take it.
fn failure(error: sqlx::Error) -> Failure {
    Failure::new(reading(&error), error)
}

/// How sqlx errors read in a connection source's chain.
pub(super) const ERRORS: SourceErrors = |error| {
    error
        .downcast_ref::<sqlx::Error>()
        .and_then(refused_while_up)
};

/// The statement's one row as the stores read it: a row whose one column is
/// a `record` (the readers' answer) reads as that record's fields, from its
/// bytes in binary form, which sqlx asks results in.
fn answered(row: PgRow) -> Result<Row, Failure> {
    use sqlx::postgres::PgValueFormat;
    use sqlx::{Column as _, ValueRef as _};
    let record = row.columns().len() == 1
        && row.column(0).type_info().oid()
            == Some(sqlx::postgres::types::Oid(
                postgres_types::Type::RECORD.oid(),
            ));
    if !record {
        return Ok(Row(Box::new(row)));
    }
    let value = row.try_get_raw(0).map_err(failure)?;
    if value.is_null() || value.format() != PgValueFormat::Binary {
        return Err(Failure::new(
            Reading::Refused,
            "the answer's record was NULL or not in binary form",
        ));
    }
    let raw = value
        .as_bytes()
        .map_err(|e| Failure::new(Reading::Refused, e))?
        .to_vec();
    Ok(Row(Box::new(Fields::parse(raw)?)))
}

/// Reads column `index` of `row` as `T`, through `F`, the type sqlx decodes
/// (`Timestamptz` for a time).
fn column<'r, F, T>(row: &'r PgRow, index: usize, into: impl FnOnce(F) -> T) -> Result<T, Failure>
where
    F: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    row.try_get::<F, _>(index).map(into).map_err(failure)
}

impl Columns for PgRow {
    fn boolean(&self, index: usize) -> Result<bool, Failure> {
        column(self, index, |b: bool| b)
    }
    fn int8(&self, index: usize) -> Result<i64, Failure> {
        column(self, index, |n: i64| n)
    }
    fn int8s(&self, index: usize) -> Result<Vec<i64>, Failure> {
        column(self, index, |ns: Vec<i64>| ns)
    }
    fn texts(&self, index: usize) -> Result<Vec<String>, Failure> {
        column(self, index, |texts: Vec<String>| texts)
    }
    fn time(&self, index: usize) -> Result<SystemTime, Failure> {
        column(self, index, |t: Timestamptz| t.0)
    }
    fn maybe_time(&self, index: usize) -> Result<Option<SystemTime>, Failure> {
        column(self, index, |t: Option<Timestamptz>| t.map(|t| t.0))
    }
    fn times(&self, index: usize) -> Result<Vec<SystemTime>, Failure> {
        column(self, index, |ts: Vec<Timestamptz>| {
            ts.into_iter().map(|t| t.0).collect()
        })
    }
    fn maybe_times(&self, index: usize) -> Result<Vec<Option<SystemTime>>, Failure> {
        column(self, index, |ts: Vec<Option<Timestamptz>>| {
            ts.into_iter().map(|t| t.map(|t| t.0)).collect()
        })
    }
    fn maybe_float8(&self, index: usize) -> Result<Option<f64>, Failure> {
        column(self, index, |x: Option<f64>| x)
    }
}
