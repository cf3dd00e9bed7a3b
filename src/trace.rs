//! Events through `tracing`, with the `tracing` feature: a warning on every
//! unreachable outcome (the limiter failed open) and on a failed purge, and
//! an info event on a purge that succeeded. They carry the limit's name, the
//! operation and the cause, never the key.
//! Without the feature these are no-ops.

use crate::Error;
use crate::operation::Operation;

#[cfg(feature = "tracing")]
pub(crate) fn unreachable(limit: &str, operation: Operation, cause: &Error) {
    tracing::warn!(
        limit,
        operation = operation.label(),
        cause = %DisplayChain(cause),
        "platformkit-limit: store unreachable, attempt allowed (fail-open)"
    );
}

#[cfg(feature = "tracing")]
pub(crate) fn purged(rows: u64) {
    tracing::info!(rows, "platformkit-limit: purged closed windows");
}

#[cfg(feature = "tracing")]
pub(crate) fn purge_failed(rows: u64, cause: &Error) {
    tracing::warn!(
        rows,
        cause = %DisplayChain(cause),
        "platformkit-limit: purge failed"
    );
}

#[cfg(not(feature = "tracing"))]
pub(crate) fn unreachable(_limit: &str, _operation: Operation, _cause: &Error) {}

#[cfg(not(feature = "tracing"))]
pub(crate) fn purged(_rows: u64) {}

#[cfg(not(feature = "tracing"))]
pub(crate) fn purge_failed(_rows: u64, _cause: &Error) {}

/// An error and its sources, joined by ": ".
#[cfg(feature = "tracing")]
struct DisplayChain<'a>(&'a Error);

#[cfg(feature = "tracing")]
impl std::fmt::Display for DisplayChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = std::error::Error::source(self.0);
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}
