//! What a limiter reads back of the pairs a test counted under.

use platformkit_limit::{Key, Limit, Limiter, Store};

/// The count of each pair, read with one `check_all`.
pub async fn counts_of<S: Store>(
    limiter: &Limiter<S>,
    pairs: &[(&Limit, &Key)],
) -> Vec<Option<u64>> {
    let verdicts = limiter.check_all(pairs).await.expect("verdicts");
    verdicts.iter().map(|v| v.count()).collect()
}
