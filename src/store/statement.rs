//! [`call`], the one place a statement is sent, on any driver; and
//! [`deleted`], the count of a reset, purge or take-back.

use crate::driver::{Row, Session};
use crate::error::AnsweredAfterCancelSnafu;
use crate::operation::Operation;
use crate::store::budget::{self, Budget};
use crate::store::sql::Statement;
use crate::{Error, ErrorKind};

/// Sends one statement on `session`, in autocommit, and returns its one
/// row; the server stops within [`Budget`]
/// ([the budget on the server](crate::guide#the-budget-on-the-server)). An
/// answer after this call's own cancel is the budget running out, never an
/// acknowledgement (a commit waiting for a synchronous standby is answered
/// when cancelled). A connection lent inside the caller's transaction is
/// rolled back, so that it goes back idle.
pub(crate) async fn call<S: Session, const N: usize>(
    session: &mut S,
    operation: Operation,
    statement: Statement<'_, N>,
    budget: Budget,
) -> Result<Row, Error> {
    crate::metric::statement_sent(operation);
    let (answer, cancelled) = session
        .send(statement.sql, &statement.params, budget.cancel_at)
        .await;
    let cancel_sent = cancelled.is_some();
    if let Some(delivered) = cancelled
        && !cancelled_by_it(&answer)
    {
        // Answered before its cancel landed: hold the connection until it
        // lands on an idle backend, not on the next statement.
        let landed = budget
            .cancel_lands
            .max(delivered + budget.rtt / 2 + budget::CANCEL_LANDS);
        tokio::time::sleep_until(landed).await;
    }
    match answer {
        Ok(_) if cancel_sent => AnsweredAfterCancelSnafu { operation }
            .fail()
            .map_err(Error::from),
        Ok(row) => Ok(row),
        Err(e) => {
            let error = e.into_error(operation, cancel_sent);
            if error.kind() == ErrorKind::InTransaction {
                // Best effort: the error says what happened either way.
                session.rollback().await;
            }
            Err(error)
        }
    }
}

/// Whether `answer` is the statement stopped by a cancel (57014).
fn cancelled_by_it(answer: &Result<Row, crate::driver::Failure>) -> bool {
    match answer {
        Ok(_) => false,
        Err(failure) => matches!(
            failure.reading(),
            crate::error::Reading::Answered(code) if *code == tokio_postgres::error::SqlState::QUERY_CANCELED
        ),
    }
}

/// Reads the one count column of a reset, purge or take-back.
pub(crate) fn deleted(row: &Row, operation: Operation) -> Result<u64, Error> {
    let deleted: i64 = row.int8(0).map_err(|e| e.into_error(operation, false))?;
    Ok(u64::try_from(deleted).unwrap_or(0))
}
