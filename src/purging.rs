//! [`purge`] and [`PurgeTask`].

use std::time::Duration;

use snafu::ensure;

use crate::driver::Row;
use crate::error::InvalidOptionSnafu;
use crate::limiter::run::Call;
use crate::metric::Operation;
use crate::store::postgres::{Budget, call, deleted};
use crate::store::sql::{self, PurgePlace};
use crate::{Error, LimitConn, metric};

/// Deletes the rows whose window closed more than a day and more than a
/// window length ago, in batches that skip rows a call holds; how many
/// went. Run it hourly ([purge](crate::guide#purge)).
///
/// # Errors
///
/// Any failure, unreachable included; the rows deleted by earlier batches
/// stay deleted (run it again).
///
/// ```no_run
/// # async fn demo(config: tokio_postgres::Config) -> Result<(), platformkit_limit::Error> {
/// let deleted = platformkit_limit::purge(&config).await?;
/// println!("purged {deleted} closed windows");
/// # Ok(())
/// # }
/// ```
pub async fn purge<C: LimitConn>(conns: &C) -> Result<u64, Error> {
    metric::purge_started();
    let mut total = 0;
    let mut from = None;
    loop {
        let deleted = match purge_batch(conns, from).await {
            Ok((deleted, stopped)) => {
                from = stopped;
                deleted
            }
            Err(e) => {
                metric::purge_failed();
                crate::trace::purge_failed(total, &e);
                return Err(e);
            }
        };
        total += deleted;
        metric::purged(deleted);
        if deleted < u64::from(PurgeTask::BATCH_ROWS) {
            crate::trace::purged(total);
            return Ok(total);
        }
    }
}

/// One batch from `from`: how many rows went, and where it stopped.
async fn purge_batch<C: LimitConn>(
    conns: &C,
    from: Option<PurgePlace>,
) -> Result<(u64, Option<PurgePlace>), Error> {
    let purge = Call::start(Operation::Purge, PurgeTask::BATCH_BUDGET);
    purge
        .within(async {
            let mut conn = conns
                .conn()
                .await
                .map_err(|e| crate::driver::connect_error(Operation::Purge, e.into()))?;
            let budget = Budget::until(purge.deadline(), Duration::ZERO);
            let batch = sql::PurgeBatch {
                batch: i64::from(PurgeTask::BATCH_ROWS),
                budget_ms: budget.server_ms,
                from,
            };
            let row = call(&mut conn, Operation::Purge, batch.statement(), budget).await?;
            Ok((deleted(&row, Operation::Purge)?, stopped(&row)?))
        })
        .await
}

/// Where the batch that answered `row` stopped (`NULL`s: nowhere yet).
fn stopped(row: &Row) -> Result<Option<PurgePlace>, Error> {
    let read = |index| {
        row.maybe_float8(index)
            .map_err(|e| e.into_error(Operation::Purge, false))
    };
    Ok(match (read(1)?, read(2)?) {
        (Some(after), Some(created)) => Some(PurgePlace { after, created }),
        _ => None,
    })
}

/// A tokio task that runs [`purge`] on a schedule until it is stopped.
///
/// ```no_run
/// use platformkit_limit::PurgeTask;
///
/// # async fn demo(pool: tokio_postgres::Config) {
/// let purging = PurgeTask::hourly(pool);
/// // ... serve ...
/// purging.stop().await;
/// # }
/// ```
#[derive(Debug)]
pub struct PurgeTask {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl PurgeTask {
    /// Rows [`purge`] deletes per batch.
    pub const BATCH_ROWS: u32 = 5_000;

    /// The budget of one batch.
    pub const BATCH_BUDGET: Duration = Duration::from_secs(10);

    /// The shortest interval [`PurgeTask::every`] accepts: a minute.
    pub const MIN_INTERVAL: Duration = Duration::from_secs(60);

    /// Purges once now and then every hour.
    pub fn hourly<C: LimitConn + 'static>(conns: C) -> Self {
        Self::spawn(conns, Duration::from_secs(3600))
    }

    /// Purges once now and then every `interval`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption) when the
    /// interval is shorter than [`PurgeTask::MIN_INTERVAL`].
    pub fn every<C: LimitConn + 'static>(conns: C, interval: Duration) -> Result<Self, Error> {
        ensure!(
            interval >= PurgeTask::MIN_INTERVAL,
            InvalidOptionSnafu {
                option: "purge interval",
                reason: format!(
                    "purge at most once every {} s: windows close a day before they go",
                    PurgeTask::MIN_INTERVAL.as_secs()
                ),
            }
        );
        Ok(Self::spawn(conns, interval))
    }

    fn spawn<C: LimitConn + 'static>(conns: C, interval: Duration) -> Self {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stopped.changed() => return,
                    _ = ticks.tick() => {
                        // The outcome is in the metrics and events.
                        let _ = purge(&conns).await;
                    }
                }
            }
        });
        PurgeTask { stop, task }
    }

    /// Stops the schedule, waiting for a purge in progress to finish its
    /// current batch.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
