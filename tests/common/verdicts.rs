//! What a limiter reads back of the pairs a test counted under.

use platformkit_limit::{Key, Limit, Limiter, Store, Verdicts};

/// Asserts that a `check` of `key` under `limit` is refused, whoever
/// answers it (the store or the refusal cache).
pub async fn assert_refused<S: Store>(limiter: &Limiter<S>, limit: &Limit, key: &Key) {
    let verdict = limiter.check(limit, key).await.expect("a verdict");
    assert!(verdict.is_refused(), "expected refused, got {verdict:?}");
}

/// The count of each pair, read with one `check_all`.
pub async fn counts_of<S: Store>(
    limiter: &Limiter<S>,
    pairs: &[(&Limit, &Key)],
) -> Vec<Option<u64>> {
    counts(&limiter.check_all(pairs).await.expect("verdicts"))
}

/// The count of each verdict, in order.
pub fn counts(verdicts: &Verdicts) -> Vec<Option<u64>> {
    verdicts.iter().map(|v| v.count()).collect()
}
