//! Merging alone, over the in-process store: what it promises of the
//! statements it sends and the counts it hands back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use futures::future::join_all;

use super::*;
use crate::Memory;

/// `Memory`, counting the statements it is sent, each taking `takes`, and
/// the statements each connection a flight held carried.
#[derive(Default)]
struct Tally {
    store: Memory,
    statements: AtomicUsize,
    takes: Duration,
    given_back: Arc<Mutex<Vec<usize>>>,
}

/// A connection of the tally's: noted in `given_back` once let go.
#[derive(Default)]
struct Conn {
    sent: usize,
    given_back: Option<Arc<Mutex<Vec<usize>>>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(given_back) = &self.given_back {
            given_back.lock().expect("not poisoned").push(self.sent);
        }
    }
}

impl Tally {
    async fn sent(&self) {
        self.statements.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.takes).await;
    }

    async fn sent_on(&self, held: &mut Conn) {
        held.given_back
            .get_or_insert_with(|| Arc::clone(&self.given_back));
        held.sent += 1;
        self.sent().await;
    }
}

impl Sealed for Tally {
    type Held = Conn;
    fn local_now(&self) -> SystemTime {
        self.store.local_now()
    }
    async fn down_before(&self) -> bool {
        self.store.down_before().await
    }
    async fn down_after(&self, error: &Error) -> bool {
        self.store.down_after(error).await
    }
    async fn count(
        &self,
        op: Counting,
        limit: &Limit,
        key: &str,
        n: u64,
        deadline: Instant,
        held: &mut Conn,
    ) -> Result<Counted, Error> {
        self.sent_on(held).await;
        self.store.count(op, limit, key, n, deadline, &mut ()).await
    }
    async fn count_many(
        &self,
        op: Counting,
        asked: &[Asked<'_>],
        deadline: Instant,
        held: &mut Conn,
    ) -> Result<Vec<Counted>, Error> {
        self.sent_on(held).await;
        self.store.count_many(op, asked, deadline, &mut ()).await
    }
    async fn count_all_or_none(
        &self,
        asked: &[Asked<'_>],
        deadline: Instant,
    ) -> Result<(Vec<Counted>, bool), Error> {
        self.sent().await;
        self.store.count_all_or_none(asked, deadline).await
    }
    async fn take_back(
        &self,
        key: &str,
        window_start: SystemTime,
        n: u64,
        deadline: Instant,
    ) -> Result<u64, Error> {
        self.store.take_back(key, window_start, n, deadline).await
    }
    async fn refused(
        &self,
        limit: &Limit,
        prefix: &str,
        at_most: usize,
        deadline: Instant,
    ) -> Result<Vec<(String, Counted)>, Error> {
        self.store.refused(limit, prefix, at_most, deadline).await
    }
    async fn define(&self, limit: &Limit, deadline: Instant) -> Result<(), Error> {
        self.store.define(limit, deadline).await
    }
    async fn limits(&self, deadline: Instant) -> Result<Vec<Limit>, Error> {
        self.store.limits(deadline).await
    }
    async fn operate(
        &self,
        action: crate::AuditAction,
        key: &str,
        block_for: std::time::Duration,
        who: (&str, &str),
        deadline: Instant,
    ) -> Result<(u64, Option<SystemTime>), Error> {
        self.store
            .operate(action, key, block_for, who, deadline)
            .await
    }
    async fn audit(
        &self,
        prefix: &str,
        at_most: usize,
        deadline: Instant,
    ) -> Result<Vec<crate::AuditEntry>, Error> {
        self.store.audit(prefix, at_most, deadline).await
    }
    async fn reset(&self, key: &str, deadline: Instant) -> Result<u64, Error> {
        self.store.reset(key, deadline).await
    }
}

fn limit() -> Limit {
    Limit::new("m", 1_000, Duration::from_secs(60)).expect("a limit")
}

/// A pair of `limit` and `key`, costing 1.
fn one<'a>(limit: &'a Limit, key: &'a str) -> Asked<'a> {
    Asked { limit, key, n: 1 }
}

/// A store whose statements take 1 ms, merging through one place, and a
/// deadline far off.
fn one_place_of_1ms_statements() -> (Arc<Tally>, Merging, Instant) {
    let store = Tally {
        takes: Duration::from_millis(1),
        ..Tally::default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    (Arc::new(store), Merging::new(1, false), deadline)
}

/// Fifty concurrent callers of one key, costs 1 to 3, through one place.
async fn fifty(merging: &Merging, store: &Arc<Tally>, op: Counting) -> Vec<u64> {
    let limit = limit();
    let deadline = Instant::now() + Duration::from_secs(5);
    let pairs: Vec<[Asked<'_>; 1]> = (0..50)
        .map(|i| {
            [Asked {
                limit: &limit,
                key: "m|k",
                n: i % 3 + 1,
            }]
        })
        .collect();
    let answers = join_all(
        pairs
            .iter()
            .map(|pair| merging.count(store, op, pair, deadline)),
    )
    .await;
    answers
        .into_iter()
        .map(|answer| {
            let (counted, added) = answer.expect("counted");
            assert!(added);
            counted[0].count
        })
        .collect()
}

#[tokio::test]
async fn concurrent_writes_of_one_key_share_statements_and_each_caller_reads_its_own_count() {
    let store = Arc::new(Tally::default());
    let merging = Merging::new(1, false);
    let mut counts = fifty(&merging, &store, Counting::HIT).await;
    let total: u64 = (0..50).map(|i| i % 3 + 1).sum();
    // Each caller's count is the count after its own addition: all
    // different, the last the total.
    counts.sort_unstable();
    counts.dedup();
    assert_eq!(counts.len(), 50, "{counts:?}");
    assert_eq!(counts.last(), Some(&total));
    let sent = store.statements.load(Ordering::SeqCst);
    assert!(sent < 50, "{sent} statements for 50 writes of one key");
}

/// Callers that write again as soon as they have their answers go in one
/// statement: the flight waits for the callers it told, so the first one
/// back does not go alone, the rest in the statement after.
#[tokio::test(start_paused = true)]
async fn callers_back_from_a_statement_go_together_in_the_next() {
    const CALLERS: usize = 16;
    const ROUNDS: usize = 20;
    let (store, merging, deadline) = one_place_of_1ms_statements();
    let limit = limit();
    join_all((0..CALLERS).map(|caller| {
        let (merging, store, limit) = (&merging, &store, &limit);
        async move {
            for round in 0..ROUNDS {
                let key = format!("m|{caller}-{round}");
                let pair = [one(limit, &key)];
                let counted = merging.count(store, Counting::HIT, &pair, deadline).await;
                assert_eq!(counted.expect("counted").0[0].count, 1);
            }
        }
    }))
    .await;
    // The first caller's statement goes at once, alone.
    let sent = store.statements.load(Ordering::SeqCst);
    assert!(
        sent <= ROUNDS + 1,
        "{sent} statements for {ROUNDS} rounds of {CALLERS} callers"
    );
}

/// A caller told but then left unpolled holds the flight for at most
/// [`GATHER_AT_MOST`]: the callers behind it still get their statement.
#[tokio::test(start_paused = true)]
async fn a_told_caller_left_unpolled_holds_the_others_up_briefly() {
    let ms = Duration::from_millis;
    let (store, merging, deadline) = one_place_of_1ms_statements();
    let limit = limit();
    let first = [one(&limit, "m|a")];
    let mut left = std::pin::pin!(merging.count(&store, Counting::HIT, &first, deadline));
    assert!(futures::poll!(left.as_mut()).is_pending(), "queued");
    tokio::time::sleep(ms(1)).await;
    let started = Instant::now();
    let second = [one(&limit, "m|b")];
    let behind = merging.count(&store, Counting::HIT, &second, deadline);
    let counted = tokio::time::timeout(ms(100), behind).await;
    assert!(counted.expect("its turn").is_ok());
    assert!(
        started.elapsed() <= GATHER_AT_MOST + ms(1),
        "{:?}",
        started.elapsed()
    );
    assert!(
        left.await.is_ok(),
        "the caller left unpolled has its answer"
    );
}

/// A connection a flight takes after it let go of one before a lone
/// caller heard, for callers who came meanwhile, carries its full
/// [`HOLD_STATEMENTS`] before it goes back, as any other.
#[tokio::test(start_paused = true)]
async fn a_connection_taken_after_a_lone_call_carries_its_full_run() {
    let (store, merging, deadline) = one_place_of_1ms_statements();
    let limit = limit();
    let first = [one(&limit, "m|a")];
    let mut lone = std::pin::pin!(merging.count(&store, Counting::HIT, &first, deadline));
    assert!(futures::poll!(lone.as_mut()).is_pending(), "queued");
    // Its statement answered, the flight let go and waits for it to hear:
    // two callers come meanwhile, and write in a loop.
    tokio::time::sleep(Duration::from_micros(1_500)).await;
    join_all(["m|b", "m|c"].map(|key| {
        let (merging, store, limit) = (&merging, &store, &limit);
        async move {
            for _ in 0..HOLD_STATEMENTS + 8 {
                let pair = [one(limit, key)];
                let counted = merging.count(store, Counting::HIT, &pair, deadline).await;
                assert!(counted.is_ok());
            }
        }
    }))
    .await;
    assert!(lone.await.is_ok());
    let given_back = store.given_back.lock().expect("not poisoned").clone();
    assert_eq!(given_back[..2], [1, HOLD_STATEMENTS], "{given_back:?}");
}

/// A call whose pairs go in different statements takes each answer as it
/// comes: the statement that answered one pair does not wait on the call
/// for the other, which only a later statement sends.
#[tokio::test(start_paused = true)]
async fn a_call_takes_each_pairs_answer_as_it_comes() {
    let ms = Duration::from_millis;
    let (store, merging, deadline) = one_place_of_1ms_statements();
    let limit = limit();
    let started = Instant::now();
    let pair = |key| [one(&limit, key)];
    // "m|first" in flight; then a statement's worth of keys queue, with a
    // call for "m|later" and "m|first": its "m|later" goes in the next
    // statement, its "m|first" in the one after.
    let first = pair("m|first");
    let mut flying = std::pin::pin!(merging.count(&store, Counting::HIT, &first, deadline));
    assert!(futures::poll!(flying.as_mut()).is_pending());
    tokio::task::yield_now().await;
    let keys: Vec<String> = (1..MAX_PAIRS).map(|i| format!("m|{i}")).collect();
    let others: Vec<_> = keys.iter().map(|key| [one(&limit, key)]).collect();
    let both = [one(&limit, "m|first"), one(&limit, "m|later")];
    let (flown, queued, call) = tokio::join!(
        flying,
        join_all(
            others
                .iter()
                .map(|p| merging.count(&store, Counting::HIT, p, deadline))
        ),
        merging.count(&store, Counting::HIT, &both, deadline),
    );
    assert!(flown.is_ok() && queued.iter().all(Result::is_ok));
    assert_eq!(call.expect("counted").0[0].count, 2);
    assert_eq!(store.statements.load(Ordering::SeqCst), 3);
    assert_eq!(
        started.elapsed(),
        ms(3),
        "three statements, no wait between"
    );
}

#[tokio::test]
async fn reads_and_all_or_nothing_writes_are_never_merged() {
    let store = Arc::new(Tally::default());
    let merging = Merging::new(1, false);
    fifty(&merging, &store, Counting::CHECK).await;
    assert_eq!(store.statements.load(Ordering::SeqCst), 50);
    fifty(&merging, &store, Counting::HIT_ALL_OR_NOTHING).await;
    assert_eq!(store.statements.load(Ordering::SeqCst), 100);
}

/// The places follow the commits: one more a statement while writes queue
/// and the commits wait on slow flushes, up to the most; back to one when
/// they wait less than a millisecond or are a small part of the statement;
/// and a commit that another's flush covered (no wait) among slow ones
/// does not take a place away.
#[test]
fn the_places_follow_the_commits() {
    let ms = Duration::from_millis;
    let mut queue = Queue {
        places: 1,
        ..Queue::default()
    };
    let queued = |queue: &mut Queue| queue.ready.push_back("k".to_owned());
    queued(&mut queue);
    for _ in 0..40 {
        queue.note(ms(2), ms(3), 16);
    }
    assert_eq!(
        queue.places, 16,
        "slow flushes, writes queued: up to the most"
    );
    queue.note(ms(0), ms(1), 16);
    assert_eq!(queue.places, 16, "one commit with no wait among slow ones");
    queue.ready.clear();
    queue.note(ms(2), ms(3), 16);
    assert_eq!(queue.places, 16, "nothing queued: the places stay");
    for _ in 0..40 {
        queue.note(Duration::from_micros(200), ms(1), 16);
    }
    assert_eq!(queue.places, 1, "quick commits: back to one");
    queued(&mut queue);
    for _ in 0..40 {
        queue.note(ms(2), ms(20), 16);
    }
    assert_eq!(
        queue.places, 1,
        "slow commits, but a small part of the statement"
    );
}
