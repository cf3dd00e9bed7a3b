//! The split of a call's budget between the server and the client: what
//! the server is sent as `p_budget_ms`, when the client cancels, and when
//! it gives up.

use std::time::Duration;

use tokio::time::Instant;

/// How a call's budget is split between the server and the client, for a
/// link whose round trip is about `rtt` (what this store measured; zero
/// before its first answer).
///
/// The server's part, sent as `p_budget_ms`, bounds every lock wait of the
/// call together (each of the at most four waits of a row's upsert gets a
/// quarter as `lock_timeout`, as the prologue sets it): a lock held past it is answered with `55P03`,
/// a hard error (the server answered: it is not down), and that answer is
/// back before the deadline. If the `CALL` is still unanswered at the cancel
/// mark, the client sends a cancel request, timed to reach the server after
/// the server's part has ended and to be answered before the deadline; a
/// `57014` that follows it is this call's own: the server is up and too
/// slow, so the call is shed. Then the client gives up.
///
/// ```text
/// |- rtt/2 -|------ server: left - rtt - 2a ------|- rtt/2 -|-- 2a --|
/// sent                                      lock waits end           deadline
///                          cancel mark: deadline - a - 2 rtt
/// ```
///
/// where `a` is a tenth of what is left, at most 100 ms. A connection had
/// too late to send a statement and hear back (past `deadline - a - rtt`)
/// sends nothing. A statement answered otherwise than by the cancel it was
/// sent keeps its connection until that cancel has surely landed, so that
/// it cannot reach the connection's next statement.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    /// The server's part, in whole milliseconds (at least 1).
    pub(crate) server_ms: i64,
    /// When the client sends a cancel request.
    pub(crate) cancel_at: Instant,
    /// The last moment a statement may be sent.
    pub(crate) send_by: Instant,
    /// About the link's round trip, as the split counted it.
    pub(crate) rtt: Duration,
    /// When a cancel request sent at `cancel_at` has surely reached the
    /// server (a connection, the request, the server's signal), so that it
    /// can no longer reach a later statement on the connection.
    pub(crate) cancel_lands: Instant,
}

/// The most a cancel request is sent ahead of the deadline.
const CANCEL_AHEAD: Duration = Duration::from_millis(100);

/// The least a statement is sent with beyond the round trip: less, and it
/// could only run out of budget on its way.
pub(crate) const LEAST_SERVER: Duration = Duration::from_millis(2);

/// What a server takes, beyond the round trips, to act on a cancel request:
/// its new connection's start.
pub(crate) const CANCEL_LANDS: Duration = Duration::from_millis(2);

impl Budget {
    /// The split of what is left until `deadline`, on a link whose round
    /// trip is about `rtt`.
    pub(crate) fn until(deadline: Instant, rtt: Duration) -> Budget {
        let now = Instant::now();
        let left = deadline.saturating_duration_since(now);
        let ahead = CANCEL_AHEAD.min(left / 10);
        let server = left.saturating_sub(rtt + ahead * 2);
        let cancel_at = deadline
            .checked_sub(ahead + rtt * 2)
            .map_or(now, |at| at.max(now));
        Budget {
            server_ms: i64::try_from(server.as_millis().max(1)).unwrap_or(i64::MAX),
            cancel_at,
            send_by: deadline.checked_sub(ahead + rtt).unwrap_or(now),
            cancel_lands: (cancel_at + rtt * 2 + CANCEL_LANDS).min(deadline),
            rtt,
        }
    }
}
