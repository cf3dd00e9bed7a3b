//! [`LimitConn`] for sqlx's [`PgPool`], and what the pool does not say.
//!
//! sqlx's pool retries, silently and until its acquire timeout, a
//! connection the server refuses because every slot is taken (`53300`):
//! a flood that takes every connection slot, or the service's own load
//! filling `max_connections`, would look to the limiter like a server that
//! never answers, so down, and fail open. While a call waits on the pool to
//! open a connection, one probe at a time per pool asks the server itself
//! (a connection of its own, made with the pool's options and closed at
//! once), and a refusal it hears stands for every call of that pool for
//! [`HEARD_STANDS`]: those calls fail at once with the server's SQLSTATE,
//! which the SQLSTATE table reads as overloaded (shed), never as down.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, Postgres};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_postgres::error::SqlState;

use super::SqlxConn;
use crate::LimitConn;
use crate::error::{BoxError, not_an_outage};

/// How long a call waits on the pool opening a connection before a probe
/// asks the server: longer than a connection takes on a healthy link, so
/// that a pool growing under ordinary load is not probed.
const PROBE_AFTER: Duration = Duration::from_millis(10);

/// How long what a probe heard stands before another probe asks again: at
/// most one probe per pool per this much time.
const HEARD_STANDS: Duration = Duration::from_secs(1);

/// Each call borrows one connection from the pool and gives it back idle.
/// The pool's wait counts against the call's budget. A connection the pool
/// cannot open because the server refuses it for lack of slots is load:
/// the call is shed (the guide's
/// [down or overloaded](crate::guide#down-or-overloaded)).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use platformkit_limit::{Limiter, Postgres};
///
/// let pool = sqlx::PgPool::connect("postgres://app@db/app").await?;
/// // The service's own pool: no second one for the limiter.
/// let limiter = Limiter::new(Postgres::new(pool.clone()));
/// # let _ = limiter;
/// # Ok(())
/// # }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
impl LimitConn for PgPool {
    type Conn = SqlxConn<sqlx::pool::PoolConnection<Postgres>>;
    /// The pool's [`sqlx::Error`], or the server's refusal a probe heard.
    type Error = BoxError;

    async fn conn(&self) -> Result<Self::Conn, BoxError> {
        // Not `try_acquire`: it skips the pool's check of an idle connection
        // (`test_before_acquire`), and would lend one the server closed.
        let acquire = self.acquire();
        tokio::pin!(acquire);
        if self.num_idle() == 0 && self.saturated() == Some(false) {
            // The pool would open a connection: hear why the server refuses
            // it, if it does.
            let refused = async {
                sleep(PROBE_AFTER).await;
                refusal(self).await
            };
            tokio::select! {
                biased;
                conn = &mut acquire => return conn.map(SqlxConn).map_err(Into::into),
                refused = refused => return Err(refused.into()),
            }
        }
        acquire.await.map(SqlxConn).map_err(Into::into)
    }

    fn saturated(&self) -> Option<bool> {
        Some(self.size() >= self.options().get_max_connections() && self.num_idle() == 0)
    }
}

/// A connection the server refused while it was up, heard by a probe: the
/// error a call of the pool fails with while the refusal stands.
#[derive(Debug)]
pub(super) struct Refused(pub(super) SqlState);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PostgreSQL refused a new connection of the pool with SQLSTATE {} \
             (the pool would have retried it until its acquire timeout)",
            self.0.code()
        )
    }
}

impl std::error::Error for Refused {}

/// One pool's probe: what it heard last, and whether one is asking now.
#[derive(Default)]
struct Probe {
    state: Mutex<State>,
    asked: Notify,
}

#[derive(Default)]
struct State {
    asking: bool,
    heard: Option<(Instant, Option<SqlState>)>,
}

/// The server's refusal of a new connection of `pool`, as a probe hears it:
/// resolves only when the server refuses while up; a server that accepts,
/// or that cannot be reached (an outage, which the pool's wait running out
/// says), leaves the call waiting on the pool.
async fn refusal(pool: &PgPool) -> Refused {
    let options = pool.connect_options();
    let probe = probe_of(&options);
    loop {
        let asked = probe.asked.notified();
        tokio::pin!(asked);
        asked.as_mut().enable();
        let ask = {
            let mut state = probe.state.lock().unwrap_or_else(|e| e.into_inner());
            match &state.heard {
                Some((at, heard)) if at.elapsed() < HEARD_STANDS => match heard {
                    Some(code) => return Refused(code.clone()),
                    None => Some(*at + HEARD_STANDS),
                },
                _ if state.asking => None,
                _ => {
                    state.asking = true;
                    Some(Instant::now())
                }
            }
        };
        match ask {
            // Another call asks: its answer wakes this one.
            None => asked.await,
            // Nothing refused lately: ask again once that has aged.
            Some(again) if again > Instant::now() => sleep_until(again).await,
            Some(_) => {
                let asking = Asking(&probe);
                let heard = ask_server(&options).await;
                asking.heard(heard);
            }
        }
    }
}

/// Opens one connection with the pool's options and closes it: the
/// SQLSTATE of a refusal by a server that is up, or `None`.
async fn ask_server(options: &PgConnectOptions) -> Option<SqlState> {
    match PgConnection::connect_with(options).await {
        Ok(conn) => {
            let _ = conn.close().await;
            None
        }
        Err(sqlx::Error::Database(e)) => e
            .code()
            .map(|code| SqlState::from_code(&code))
            .filter(not_an_outage),
        Err(_) => None,
    }
}

/// A probe asking: what it heard is recorded, and whoever waits is woken,
/// also when the call that asks is dropped before the answer.
struct Asking<'a>(&'a Probe);

impl Asking<'_> {
    fn heard(self, heard: Option<SqlState>) {
        let mut state = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        state.heard = Some((Instant::now(), heard));
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.0
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .asking = false;
        self.0.asked.notify_waiters();
    }
}

/// The probe of the pool whose options are `options`: one per pool, found
/// by the address of the options the pool holds.
fn probe_of(options: &Arc<PgConnectOptions>) -> Arc<Probe> {
    type Probes = Mutex<HashMap<usize, (Weak<PgConnectOptions>, Arc<Probe>)>>;
    static PROBES: OnceLock<Probes> = OnceLock::new();
    let mut probes = PROBES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    probes.retain(|_, (pool, _)| pool.strong_count() > 0);
    let (_, probe) = probes
        .entry(Arc::as_ptr(options) as usize)
        .or_insert_with(|| (Arc::downgrade(options), Arc::default()));
    Arc::clone(probe)
}
