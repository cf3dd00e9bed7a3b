// One sqlx version's driver, included by `mod.rs` with `sqlx` naming that version's crate.

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgRow, Postgres};
use sqlx::{Executor, Row as _};
use tokio_postgres::error::SqlState;

use crate::driver::sqlx::SqlxConn;
use crate::driver::{Columns, Failure, Param, Row, SourceErrors};
use crate::error::{BoxError, Reading, not_an_outage};

/// The connection lent, as sqlx's `PgConnection`.
impl crate::driver::sqlx::lent::Lent for PgConnection {
    async fn send<'a, const N: usize>(
        &'a mut self,
        sql: &'static str,
        params: &'a [Param<'a>; N],
    ) -> Result<Row, Failure> {
        let conn = self;
        settle(conn).await.map_err(failure)?;
        let mut query = sqlx::query(sql);
        for param in params {
            query = match *param {
                Param::Text(text) => query.bind(text),
                Param::Int8(n) => query.bind(n),
                Param::Bool(b) => query.bind(b),
                Param::MaybeInt8(n) => query.bind(n),
                Param::Float8(x) => query.bind(x),
                Param::TextArray(texts) => query.bind(texts),
                Param::Int8Array(ns) => query.bind(ns),
                Param::BoolArray(bs) => query.bind(bs),
            };
        }
        let answer = query.fetch_one(conn).await;
        answer.map_err(failure).map(|row| Row(Box::new(row)))
    }

    async fn script(&mut self, script: &'static str) -> Result<(), Failure> {
        let conn = self;
        settle(conn).await.map_err(failure)?;
        conn.execute(sqlx::raw_sql(script))
            .await
            .map(drop)
            .map_err(failure)
    }

    async fn rollback(&mut self) {
        let _ = self.execute("ROLLBACK").await;
    }
}

/// The connection lent as a pool's `PoolConnection`.
impl crate::driver::sqlx::lent::Lent for PoolConnection<Postgres> {
    fn send<'a, const N: usize>(
        &'a mut self,
        sql: &'static str,
        params: &'a [Param<'a>; N],
    ) -> impl std::future::Future<Output = Result<Row, Failure>> + Send + 'a {
        crate::driver::sqlx::lent::Lent::send(self.as_mut(), sql, params)
    }

    fn script(
        &mut self,
        script: &'static str,
    ) -> impl std::future::Future<Output = Result<(), Failure>> + Send + '_ {
        crate::driver::sqlx::lent::Lent::script(self.as_mut(), script)
    }

    fn rollback(&mut self) -> impl std::future::Future<Output = ()> + Send + '_ {
        crate::driver::sqlx::lent::Lent::rollback(self.as_mut())
    }
}

/// Reads and drops what the connection still owes a statement given up, which sqlx would hand
/// to the next statement. Sends nothing; waits only while something is owed.
async fn settle(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    loop {
        // sqlx's `wait_until_ready`: reads to every Sync's ReadyForQuery, the first error out.
        match sqlx::Connection::flush(&mut *conn).await {
            Err(sqlx::Error::Database(_)) => continue,
            settled => return settled,
        }
    }
}

/// How the SQLSTATE table reads an sqlx error.
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

/// Whether a connection attempt failed for a reason an outage does not explain, and its SQLSTATE.
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
pub(crate) const ERRORS: SourceErrors = |error| {
    error
        .downcast_ref::<sqlx::Error>()
        .and_then(refused_while_up)
};

/// Reads column `index` of `row` as `T`.
fn column<'r, T>(row: &'r PgRow, index: usize) -> Result<T, Failure>
where
    T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    row.try_get::<T, _>(index).map_err(failure)
}

impl Columns for PgRow {
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

// The pool.

use sqlx::Connection as _;
use sqlx::postgres::PgPool;

use crate::LimitConn;

/// Each call borrows one connection from the pool (example: the [`driver`](crate::driver) module).
impl LimitConn for PgPool {
    type Conn = SqlxConn<sqlx::pool::PoolConnection<Postgres>>;
    type Error = sqlx::Error;

    async fn conn(&self) -> Result<Self::Conn, sqlx::Error> {
        // Not `try_acquire`: it skips `test_before_acquire`, and would lend a closed connection.
        self.acquire().await.map(SqlxConn)
    }

    /// A connection made with the pool's options, outside the pool and its silent retries.
    async fn probe(&self) -> Option<Result<(), BoxError>> {
        let started = async {
            let mut conn = PgConnection::connect_with(&self.connect_options()).await?;
            let shown = in_hot_standby(&mut conn).await;
            let _ = conn.close().await;
            if shown? {
                return Err(crate::driver::InRecovery.into());
            }
            Ok::<_, BoxError>(())
        };
        Some(started.await)
    }
}

/// Whether the server of `conn` is a hot standby, as it says.
async fn in_hot_standby(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let shown = conn
        .fetch_all(sqlx::raw_sql(crate::driver::IN_RECOVERY))
        .await?;
    Ok(shown
        .iter()
        .any(|row| row.try_get::<String, _>(0).is_ok_and(|on| on == "on")))
}
