//! [`purge`]: empties windows that closed more than a day ago.

use std::time::Duration;

use postgres_types::{ToSql, Type};
use tokio::time::{Instant, timeout_at};

use crate::postgres::{call, deleted};
use crate::sql::{self, budget_ms};
use crate::{Error, LimitConn, metric};

/// Rows deleted per batch: small enough that no batch holds row locks for
/// long, large enough that a purge of a million rows is a few hundred
/// statements.
pub const PURGE_BATCH_ROWS: i64 = 5_000;

/// The budget of one batch.
pub const PURGE_BATCH_BUDGET: Duration = Duration::from_secs(10);

/// Deletes the rows whose window closed more than 24 hours ago, and returns
/// how many went.
///
/// Run it hourly from the service's sweep job (cron `0 * * * *`). It works in
/// batches of [`PURGE_BATCH_ROWS`], each its own short system transaction on
/// a connection borrowed from `conns` for that batch alone, skipping rows
/// that a limiter call holds at that moment, so it never holds locks for long
/// and never waits on a login. Open windows and windows closed less than a day
/// ago are never touched.
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
    let mut total = 0;
    loop {
        let deleted = purge_batch(conns).await?;
        total += deleted;
        metric::purged(deleted);
        if deleted < PURGE_BATCH_ROWS as u64 {
            return Ok(total);
        }
    }
}

async fn purge_batch<C: LimitConn>(conns: &C) -> Result<u64, Error> {
    let deadline = Instant::now() + PURGE_BATCH_BUDGET;
    let batch = async {
        let conn = conns
            .conn()
            .await
            .map_err(|e| Error::connect("purge", e.into()))?;
        let budget = budget_ms(deadline.saturating_duration_since(Instant::now()));
        let params: [(&(dyn ToSql + Sync), Type); 2] =
            [(&PURGE_BATCH_ROWS, Type::INT8), (&budget, Type::INT8)];
        let row = call(&conn, "purge", sql::PURGE_BATCH, &params).await?;
        deleted(&row, "purge")
    };
    match timeout_at(deadline, batch).await {
        Ok(result) => result,
        Err(_) => Err(Error::timeout("purge", PURGE_BATCH_BUDGET)),
    }
}
