//! The split of a call's budget between the server and the client.

use std::time::Duration;

use tokio::time::Instant;

/// How a call's budget is split between the server and the client, on a
/// link whose round trip is about `rtt` (zero before the first answer):
/// [the budget on the server](crate::guide#the-budget-on-the-server).
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
    /// When a cancel request sent at `cancel_at` has surely landed, so it
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
    /// The split of what is left until `deadline`.
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
