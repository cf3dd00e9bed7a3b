// One sqlx version's test driver, included by `driver.rs` once for each
// sqlx version a feature names, with `sqlx` naming that version's crate.

use std::any::Any;
use std::convert::Infallible;
use std::sync::Arc;

use platformkit_limit::LimitConn;
use platformkit_limit::driver::SqlxConn;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgConnection, PgPool, Row as _};
use tokio::sync::OwnedMutexGuard;
use tokio_postgres::Config;
use tokio_postgres::config::Host;

use super::{Driver, Lend};

/// sqlx: `PgConnection`s in a `SqlxConn`, `PgPool`.
pub struct Sqlx;

/// sqlx's connection options for the same server, user and database.
pub(crate) fn sqlx_options(config: &Config) -> PgConnectOptions {
    let mut options = PgConnectOptions::new_without_pgpass()
        .port(config.get_ports().first().copied().unwrap_or(5432))
        .username(config.get_user().expect("a user"))
        .database(config.get_dbname().expect("a database"));
    options = match config.get_hosts().first().expect("a host") {
        Host::Tcp(host) => options.host(host),
        Host::Unix(path) => options.socket(path),
    };
    if let Some(password) = config.get_password() {
        options = options.password(std::str::from_utf8(password).expect("a UTF-8 password"));
    }
    options.disable_statement_logging()
}

impl Driver for Sqlx {
    const CANCELS: bool = false;
    const PREPARES: bool = true;
    const NAMES_PER_CONNECTION: bool = true;
    type Conn = PgConnection;
    type Pool = PgPool;
    type Source = PgPool;

    async fn connect(config: &Config) -> PgConnection {
        sqlx_options(config)
            .connect()
            .await
            .expect("an sqlx connection")
    }

    async fn pool(config: &Config, size: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(size)
            .connect_lazy_with(sqlx_options(config))
    }

    async fn take(pool: &PgPool) -> Box<dyn Any + Send> {
        Box::new(pool.acquire().await.expect("a pooled connection"))
    }

    fn source(config: &Config) -> PgPool {
        PgPoolOptions::new()
            .max_connections(4)
            .connect_lazy_with(sqlx_options(config))
    }

    async fn simple(conn: &mut PgConnection, sql: &str) -> Result<Option<String>, String> {
        // (sqlx 0.8's `RawSql::fetch_optional` fails on no rows; 0.9 takes
        // only a string that lives for ever, so a test's SQL is leaked.)
        let sql: &'static str = Box::leak(sql.to_owned().into_boxed_str());
        let rows = sqlx::raw_sql(sql)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| format!("{e:?}"))?;
        // The simple protocol answers in text, whatever the column's type.
        Ok(rows.first().and_then(|row| {
            row.try_get_unchecked::<Option<String>, _>(0)
                .expect("a text value")
        }))
    }
}

impl LimitConn for Lend<PgConnection> {
    type Conn = SqlxConn<OwnedMutexGuard<PgConnection>>;
    type Error = Infallible;

    async fn conn(&self) -> Result<Self::Conn, Infallible> {
        Ok(SqlxConn(Arc::clone(&self.0).lock_owned().await))
    }
}

