//! The drivers the suite runs each body on, and what a body does on a
//! connection it holds: lend it to a limiter, and read it with the simple
//! query protocol, which works on either driver and through PgBouncer in
//! transaction mode.

use std::any::Any;
use std::convert::Infallible;
use std::sync::Arc;

use deadpool_postgres::ClientWrapper;
use platformkit_limit::LimitConn;
use platformkit_limit::driver::Prepared;
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio_postgres::{Client, Config, SimpleQueryMessage};

/// What a test needs of a driver: its connections, a pool of them, and plain
/// SQL on a held one.
pub trait Driver: 'static {
    /// Whether a call still unanswered near its deadline is cancelled on
    /// the server.
    const CANCELS: bool;

    /// Whether its statements are named prepared statements, which only a
    /// PgBouncer that carries them (1.21 or newer) can pass on.
    const PREPARES: bool;

    /// Whether it names its prepared statements per connection (so two of
    /// its clients collide on one server connection), rather than uniquely
    /// within the process.
    const NAMES_PER_CONNECTION: bool;

    /// One connection of the driver.
    type Conn: Send + 'static;

    /// The driver's pool (deadpool for tokio-postgres, `PgPool` for sqlx).
    type Pool: LimitConn + Clone + 'static;

    /// A source that makes its own connections: a `Config` (a connection per
    /// call) for tokio-postgres, a `PgPool` for sqlx.
    type Source: LimitConn + 'static;

    async fn connect(config: &Config) -> Self::Conn;

    async fn pool(config: &Config, size: u32) -> Self::Pool;

    /// Takes one connection out of `pool` and keeps it until dropped.
    async fn take(pool: &Self::Pool) -> Box<dyn Any + Send>;

    fn source(config: &Config) -> Self::Source;

    /// Runs `sql` (one or more statements) with the simple query protocol
    /// and returns the first column of its first row, as text.
    async fn simple(conn: &mut Self::Conn, sql: &str) -> Result<Option<String>, String>;
}

/// tokio-postgres: `Client`s, deadpool, `Config`.
pub struct TokioPostgres;

impl Driver for TokioPostgres {
    const CANCELS: bool = true;
    const PREPARES: bool = false;
    const NAMES_PER_CONNECTION: bool = false;
    type Conn = Client;
    type Pool = deadpool_postgres::Pool;
    type Source = Config;

    async fn connect(config: &Config) -> Client {
        platformkit_limit_testdb::connect(config).await
    }

    async fn pool(config: &Config, size: u32) -> deadpool_postgres::Pool {
        let manager = deadpool_postgres::Manager::new(config.clone(), tokio_postgres::NoTls);
        deadpool_postgres::Pool::builder(manager)
            .max_size(size as usize)
            .build()
            .expect("a deadpool pool")
    }

    async fn take(pool: &deadpool_postgres::Pool) -> Box<dyn Any + Send> {
        Box::new(pool.get().await.expect("a pooled connection"))
    }

    fn source(config: &Config) -> Config {
        config.clone()
    }

    async fn simple(conn: &mut Client, sql: &str) -> Result<Option<String>, String> {
        let messages = conn.simple_query(sql).await.map_err(|e| format!("{e:?}"))?;
        Ok(messages
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(row) => Some(row.get(0).map(str::to_owned)),
                _ => None,
            })
            .flatten())
    }
}

/// tokio-postgres through `Prepared`: deadpool's `ClientWrapper`s, each
/// statement prepared once per connection in its statement cache.
pub struct TokioPostgresPrepared;

impl Driver for TokioPostgresPrepared {
    const CANCELS: bool = true;
    const PREPARES: bool = true;
    const NAMES_PER_CONNECTION: bool = false;
    type Conn = ClientWrapper;
    type Pool = Prepared<deadpool_postgres::Pool>;
    type Source = Prepared<deadpool_postgres::Pool>;

    async fn connect(config: &Config) -> ClientWrapper {
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .expect("a tokio-postgres connection");
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        ClientWrapper::new(client, task)
    }

    async fn pool(config: &Config, size: u32) -> Self::Pool {
        Prepared(TokioPostgres::pool(config, size).await)
    }

    async fn take(pool: &Self::Pool) -> Box<dyn Any + Send> {
        TokioPostgres::take(&pool.0).await
    }

    fn source(config: &Config) -> Self::Source {
        let manager = deadpool_postgres::Manager::new(config.clone(), tokio_postgres::NoTls);
        Prepared(
            deadpool_postgres::Pool::builder(manager)
                .max_size(4)
                .build()
                .expect("a deadpool pool"),
        )
    }

    async fn simple(conn: &mut ClientWrapper, sql: &str) -> Result<Option<String>, String> {
        TokioPostgres::simple(conn, sql).await
    }
}

// sqlx, once for each version a feature names, with `sqlx` naming that
// version's crate.
pub mod sqlx08 {
    use ::sqlx;
    include!("sqlx_driver.rs");
}
#[cfg(feature = "sqlx-09")]
pub mod sqlx09 {
    use ::sqlx_09 as sqlx;
    include!("sqlx_driver.rs");
}
pub use sqlx08::Sqlx;

/// One connection the test holds, lent to one call at a time, as a
/// framework holds the connection of a request.
pub type Held<D> = Arc<Mutex<<D as Driver>::Conn>>;

pub async fn hold<D: Driver>(config: &Config) -> Held<D> {
    Arc::new(Mutex::new(D::connect(config).await))
}

/// A connection source that lends one held connection.
pub struct Lend<T>(pub(super) Arc<Mutex<T>>);

impl LimitConn for Lend<Client> {
    type Conn = OwnedMutexGuard<Client>;
    type Error = Infallible;

    async fn conn(&self) -> Result<Self::Conn, Infallible> {
        Ok(Arc::clone(&self.0).lock_owned().await)
    }
}

impl LimitConn for Lend<ClientWrapper> {
    type Conn = Prepared<OwnedMutexGuard<ClientWrapper>>;
    type Error = Infallible;

    async fn conn(&self) -> Result<Self::Conn, Infallible> {
        Ok(Prepared(Arc::clone(&self.0).lock_owned().await))
    }
}

pub fn lend<D: Driver>(held: &Held<D>) -> Lend<D::Conn>
where
    Lend<D::Conn>: LimitConn,
{
    Lend(Arc::clone(held))
}

/// `sql`'s one text value on the held connection.
pub async fn text<D: Driver>(held: &Held<D>, sql: &str) -> Option<String> {
    D::simple(&mut *held.lock().await, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The one integer `sql` (a query of one value) answers on the held
/// connection.
pub async fn int<D: Driver>(held: &Held<D>, sql: &str) -> i64 {
    text::<D>(held, &format!("SELECT ({sql})::text"))
        .await
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{sql}: no integer"))
}

pub async fn backend_pid<D: Driver>(held: &Held<D>) -> i32 {
    let pid = int::<D>(held, "SELECT pg_catalog.pg_backend_pid()::int8").await;
    i32::try_from(pid).expect("a pid")
}

/// The held connection answers, outside any transaction (each statement
/// then starts its own), and the system switch is off on it.
pub async fn assert_idle_and_switch_off<D: Driver>(held: &Held<D>, what: &str) {
    let idle = text::<D>(
        held,
        "SELECT (pg_catalog.transaction_timestamp() = pg_catalog.statement_timestamp())::text",
    )
    .await;
    assert_eq!(
        idle.as_deref(),
        Some("true"),
        "{what}: left inside a transaction"
    );
    let switch = text::<D>(
        held,
        "SELECT pg_catalog.current_setting('platformkit.system', true)",
    )
    .await;
    assert!(
        matches!(switch.as_deref(), None | Some("")),
        "{what}: the system switch outlived the limiter's transaction: {switch:?}"
    );
}
