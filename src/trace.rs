//! Events through `tracing` (feature `tracing`; no-ops without it): each
//! carries the cause and, where there is one, the limit's name and the
//! operation, never the key.

use crate::Error;
use crate::metric::Operation;

/// What became of an attempt the store could not be asked about.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Decided {
    /// Let through without a count (`WhenUnreachable::Allow`).
    Allowed,
    /// Refused (`WhenUnreachable::Refuse`).
    Refused,
    /// Decided by the local count (`WhenUnreachable::CountLocally`).
    Locally,
    /// A reset or take-back: nothing to allow or refuse.
    Nothing,
}

/// The store was unreachable; `decided` is what became of the attempt.
#[cfg(feature = "tracing")]
pub(crate) fn unreachable(limit: &str, operation: Operation, cause: &Error, decided: Decided) {
    let message = match decided {
        Decided::Allowed => "platformkit-limit: store unreachable, attempt allowed (fail-open)",
        Decided::Refused => {
            "platformkit-limit: store unreachable, attempt refused (WhenUnreachable::Refuse)"
        }
        Decided::Locally => {
            "platformkit-limit: store unreachable, attempt decided by the local count \
             (WhenUnreachable::CountLocally)"
        }
        Decided::Nothing => "platformkit-limit: store unreachable, nothing cleared",
    };
    tracing::warn!(
        limit,
        operation = operation.label(),
        cause = %DisplayChain(cause),
        "{message}"
    );
}

#[cfg(feature = "tracing")]
pub(crate) fn shed(limit: &str, operation: Operation, cause: &Error) {
    tracing::warn!(
        limit,
        operation = operation.label(),
        cause = %DisplayChain(cause),
        "platformkit-limit: store overloaded, attempt refused (shed)"
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
pub(crate) fn unreachable(_limit: &str, _operation: Operation, _cause: &Error, _decided: Decided) {}

#[cfg(not(feature = "tracing"))]
pub(crate) fn shed(_limit: &str, _operation: Operation, _cause: &Error) {}

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
