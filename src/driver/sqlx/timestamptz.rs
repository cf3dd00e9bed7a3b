//! `timestamptz` is read and written here (microseconds since 2000-01-01,
//! as PostgreSQL's binary format has it, converted exactly as tokio-postgres
//! converts a [`SystemTime`]), so the feature needs neither sqlx's `chrono`
//! nor its `time` feature. The conversion is here; each sqlx version's
//! `Type`, `Encode` and `Decode` are in `version.rs`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A `timestamptz`, in PostgreSQL's binary format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timestamptz(pub(crate) SystemTime);

/// `timestamptz`'s OID, and its array's: fixed for every server.
pub(super) const TIMESTAMPTZ_OID: u32 = 1184;
pub(super) const TIMESTAMPTZ_ARRAY_OID: u32 = 1185;

/// 2000-01-01 00:00:00 UTC, PostgreSQL's epoch, in seconds since the Unix
/// epoch.
const POSTGRES_EPOCH_SECS: u64 = 946_684_800;
const USEC_PER_SEC: u64 = 1_000_000;
const NSEC_PER_USEC: u64 = 1_000;

impl Timestamptz {
    /// Microseconds since PostgreSQL's epoch, truncated toward it, as
    /// tokio-postgres writes a `SystemTime`.
    pub(super) fn micros(self) -> i64 {
        let epoch = UNIX_EPOCH + Duration::from_secs(POSTGRES_EPOCH_SECS);
        let to_usec =
            |d: Duration| d.as_secs() * USEC_PER_SEC + u64::from(d.subsec_nanos()) / NSEC_PER_USEC;
        #[allow(
            clippy::cast_possible_wrap,
            reason = "the same conversion as tokio-postgres; the procedures bound every time"
        )]
        match self.0.duration_since(epoch) {
            Ok(after) => to_usec(after) as i64,
            Err(before) => -(to_usec(before.duration()) as i64),
        }
    }

    /// The time `micros` after PostgreSQL's epoch, as tokio-postgres reads
    /// it.
    pub(super) fn from_micros(micros: i64) -> Timestamptz {
        let epoch = UNIX_EPOCH + Duration::from_secs(POSTGRES_EPOCH_SECS);
        let magnitude = micros.unsigned_abs();
        let offset = Duration::new(
            magnitude / USEC_PER_SEC,
            u32::try_from((magnitude % USEC_PER_SEC) * NSEC_PER_USEC).expect("under a second"),
        );
        Timestamptz(if micros < 0 {
            epoch - offset
        } else {
            epoch + offset
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use postgres_types::{FromSql, ToSql, Type as PgType};

    /// The times the tests compare: each side of PostgreSQL's epoch and of
    /// the Unix epoch, with and without a fraction of a microsecond, and the
    /// ends of what a clock may be pinned to.
    fn times() -> Vec<SystemTime> {
        let y2k = UNIX_EPOCH + Duration::from_secs(POSTGRES_EPOCH_SECS);
        vec![
            y2k,
            y2k + Duration::from_nanos(1),
            y2k + Duration::from_nanos(1_999),
            y2k - Duration::from_nanos(1),
            y2k - Duration::from_nanos(1_001),
            y2k + Duration::from_secs(800_000_000) + Duration::from_micros(123_456),
            UNIX_EPOCH,
            UNIX_EPOCH - Duration::from_nanos(1_500),
            UNIX_EPOCH - Duration::from_secs(2_208_988_800),
            UNIX_EPOCH + Duration::from_secs(7_258_118_399) + Duration::from_nanos(999_999_999),
        ]
    }

    /// sqlx's `timestamptz` is byte for byte tokio-postgres's: both drivers
    /// send the same pinned time and read back the same `SystemTime`.
    #[test]
    fn timestamptz_is_written_and_read_as_tokio_postgres_does() {
        for time in times() {
            let mut theirs = BytesMut::new();
            time.to_sql(&PgType::TIMESTAMPTZ, &mut theirs).unwrap();
            let ours = Timestamptz(time).micros().to_be_bytes();
            assert_eq!(&theirs[..], &ours[..], "{time:?} written");

            let read = Timestamptz::from_micros(i64::from_be_bytes(ours)).0;
            let expected = SystemTime::from_sql(&PgType::TIMESTAMPTZ, &ours).unwrap();
            assert_eq!(read, expected, "{time:?} read");
        }
    }
}
