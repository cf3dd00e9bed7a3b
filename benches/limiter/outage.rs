//! A real outage, answered at once: on a server of its own, stopped, how
//! long a call takes once the first probe found it down (p99 over 16
//! callers, each call on a fresh key, for a few seconds: a million calls
//! would cost a probe a second, never one a call), and how soon calls
//! count again once the server is back, on each driver built in.
//!
//! Skipped when `DATABASE_URL` names the server: the run does not stop a
//! server it did not start.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use platformkit_limit::{BoxError, Key, Limit, LimitConn, Limiter, Postgres, SCHEMA};
use platformkit_limit_testdb::{Options, Server};
use serde::Serialize;
use tokio::task::block_in_place;
use tokio::time::Instant;

use crate::Mode;

/// The callers while the server is down.
const CALLERS: usize = 16;

/// What one driver did through an outage.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Outage {
    pub(crate) driver: &'static str,
    /// The first call after the stop: its budget, then the probe.
    pub(crate) first_ms: f64,
    /// The calls after it, while the server stayed down.
    pub(crate) calls: u64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    /// Calls the store answered otherwise than unreachable while down.
    pub(crate) not_unreachable: u64,
    /// Probes while down, and the seconds it stayed down.
    pub(crate) probes: u64,
    pub(crate) down_secs: f64,
    /// From the server's start to the first call counted again.
    pub(crate) back_ms: f64,
}

/// Each driver through an outage of its own, or nothing when the server is
/// `DATABASE_URL`'s.
pub(crate) async fn run(mode: Mode) -> Vec<Outage> {
    if std::env::var_os("DATABASE_URL").is_some() {
        eprintln!("outage: skipped (DATABASE_URL names the server)");
        return Vec::new();
    }
    let server = block_in_place(|| Server::start(Options::default()));
    let db = server.database(SCHEMA).await;
    let down_for = if mode.quick {
        Duration::from_millis(2_500)
    } else {
        Duration::from_secs(5)
    };
    let mut outages =
        vec![through("tokio-postgres, per call", &server, down_for, db.config()).await];
    #[cfg(feature = "deadpool")]
    {
        let manager = deadpool_postgres::Manager::new(db.config(), tokio_postgres::NoTls);
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(CALLERS)
            .build()
            .expect("a deadpool pool");
        outages.push(through("deadpool", &server, down_for, pool).await);
    }
    #[cfg(feature = "bb8")]
    {
        let manager =
            bb8_postgres::PostgresConnectionManager::new(db.config(), tokio_postgres::NoTls);
        let pool = bb8::Pool::builder()
            .max_size(CALLERS as u32)
            .build_unchecked(manager);
        outages.push(through("bb8", &server, down_for, pool).await);
    }
    #[cfg(feature = "sqlx")]
    {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(CALLERS as u32)
            .connect_lazy(&db.url())
            .expect("an sqlx pool");
        outages.push(through("sqlx PgPool", &server, down_for, pool).await);
    }
    drop(db);
    block_in_place(|| drop(server));
    outages
}

/// One outage of `down_for` through `conns`, with the defaults.
async fn through<C: LimitConn>(
    driver: &'static str,
    server: &Server,
    down_for: Duration,
    conns: C,
) -> Outage {
    let probes = Arc::new(AtomicU64::new(0));
    let limiter = Arc::new(Limiter::new(Postgres::new(Probes {
        conns,
        probes: probes.clone(),
    })));
    let limit = Limit::new("outage", 1_000_000, Duration::from_secs(3600)).expect("a limit");
    let counted = limiter
        .failed(&limit, &Key::opaque("before"))
        .await
        .expect("a verdict");
    assert!(!counted.is_unreachable(), "{driver}: the server is up");

    block_in_place(|| server.pg_ctl(&["stop", "-m", "fast", "-w"]));
    let stopped = Instant::now();
    let first = Instant::now();
    let _ = limiter.failed(&limit, &Key::opaque("first")).await;
    let first_ms = ms(first.elapsed());
    let probes_before = probes.load(Ordering::Relaxed);

    let until = Instant::now() + down_for;
    let callers = (0..CALLERS).map(|caller| {
        let (limiter, limit) = (limiter.clone(), limit.clone());
        tokio::spawn(async move {
            let mut took = Vec::new();
            let mut not_unreachable = 0u64;
            let mut n = 0u64;
            while Instant::now() < until {
                let key = Key::opaque(&format!("{caller}-{n}"));
                n += 1;
                let call = Instant::now();
                let verdict = limiter.failed(&limit, &key).await;
                took.push(call.elapsed());
                if !verdict.is_ok_and(|v| v.is_unreachable()) {
                    not_unreachable += 1;
                }
                // A call answered at once never waits on anything: let the
                // other callers (and a probe in flight) run, as a service's
                // requests would.
                tokio::task::yield_now().await;
            }
            (took, not_unreachable)
        })
    });
    let mut took = Vec::new();
    let mut not_unreachable = 0;
    for caller in futures::future::join_all(callers).await {
        let (mine, wrong) = caller.expect("a caller");
        took.extend(mine);
        not_unreachable += wrong;
    }
    let probes_down = probes.load(Ordering::Relaxed) - probes_before;
    let down_secs = stopped.elapsed().as_secs_f64();
    took.sort_unstable();
    let at = |q: f64| ms(took[((took.len() - 1) as f64 * q) as usize]);

    block_in_place(|| server.pg_ctl(&["start", "-w"]));
    let started = Instant::now();
    let back_ms = loop {
        let verdict = limiter.failed(&limit, &Key::opaque("back")).await;
        if verdict.is_ok_and(|v| v.count().is_some()) {
            break ms(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(30) {
            break f64::NAN;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    Outage {
        driver,
        first_ms,
        calls: took.len() as u64,
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        not_unreachable,
        probes: probes_down,
        down_secs,
        back_ms,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A source that counts the probes it is asked for.
struct Probes<C> {
    conns: C,
    probes: Arc<AtomicU64>,
}

impl<C: LimitConn> LimitConn for Probes<C> {
    type Conn = C::Conn;
    type Error = C::Error;

    fn conn(&self) -> impl Future<Output = Result<C::Conn, C::Error>> + Send {
        self.conns.conn()
    }

    async fn probe(&self) -> Option<Result<(), BoxError>> {
        self.probes.fetch_add(1, Ordering::Relaxed);
        self.conns.probe().await
    }
}

/// The outages as a table.
pub(crate) fn print(outages: &[Outage]) {
    if outages.is_empty() {
        return;
    }
    println!(
        "\nA real outage (the server stopped; {CALLERS} callers, each call a fresh key, the defaults):"
    );
    println!(
        "| driver | first call | calls while down | p50 | p99 | not unreachable | probes while down | back, counting |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for o in outages {
        println!(
            "| {} | {:.0} ms | {} | {:.3} ms | {:.3} ms | {} | {} in {:.1} s | {:.0} ms |",
            o.driver,
            o.first_ms,
            o.calls,
            o.p50_ms,
            o.p99_ms,
            o.not_unreachable,
            o.probes,
            o.down_secs,
            o.back_ms
        );
    }
}
