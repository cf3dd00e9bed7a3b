//! A row whose one column is a `record`, read as the row of that record's
//! fields.
//!
//! The readers answer with their function's record,
//! `SELECT platformkit.platformkit_limit_read(…)`, rather than
//! `SELECT * FROM platformkit.platformkit_limit_read(…)`: the server then
//! plans and runs a plain expression instead of a table-function scan,
//! which fills a tuplestore for its one row (docs/PERFORMANCE.md, "The
//! readers answer with their record"). Both drivers hand over the record's
//! bytes in PostgreSQL's binary form, and each field is read by
//! postgres-types, as tokio-postgres reads a column.

use std::ops::Range;
use std::time::SystemTime;

use postgres_types::{FromSql, Kind, Type};

use super::{Columns, Failure};
use crate::error::Reading;

/// The fields of one `record` value, each by its type and its bytes (`None`
/// for `NULL`).
#[derive(Debug)]
pub(crate) struct Fields {
    raw: Vec<u8>,
    fields: Vec<(Type, Option<Range<usize>>)>,
}

/// Why a record's bytes could not be read.
#[derive(Debug)]
struct Malformed(&'static str);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the answer's record could not be read: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

fn malformed(why: &'static str) -> Failure {
    Failure::new(Reading::Refused, Malformed(why))
}

impl Fields {
    /// Reads `raw`, a record in binary form: the number of fields, then for
    /// each its type's oid, its length (−1 for `NULL`) and its bytes. Any
    /// other bytes (short, a negative length, bytes left over, a type this
    /// crate does not know) are a hard error.
    pub(crate) fn parse(raw: Vec<u8>) -> Result<Fields, Failure> {
        let mut at: usize = 0;
        let mut next = |n: usize| -> Result<Range<usize>, Failure> {
            let end = at
                .checked_add(n)
                .filter(|&end| end <= raw.len())
                .ok_or_else(|| malformed("it ends early"))?;
            let range = at..end;
            at = end;
            Ok(range)
        };
        let four = |range: Range<usize>| -> [u8; 4] {
            let mut bytes = [0; 4];
            bytes.copy_from_slice(&raw[range]);
            bytes
        };
        let count = i32::from_be_bytes(four(next(4)?));
        let count = usize::try_from(count).map_err(|_| malformed("a negative field count"))?;
        // Each field takes eight bytes at least: a count past what the bytes
        // can hold is not believed (nor allocated for).
        if count > raw.len() / 8 {
            return Err(malformed("more fields than bytes"));
        }
        let mut fields = Vec::with_capacity(count);
        for _ in 0..count {
            let oid = u32::from_be_bytes(four(next(4)?));
            let ty = Type::from_oid(oid).ok_or_else(|| malformed("a field of an unknown type"))?;
            let len = i32::from_be_bytes(four(next(4)?));
            let value = match len {
                -1 => None,
                len => {
                    let len = usize::try_from(len).map_err(|_| malformed("a negative length"))?;
                    Some(next(len)?)
                }
            };
            fields.push((ty, value));
        }
        if at != raw.len() {
            return Err(malformed("bytes after the last field"));
        }
        Ok(Fields { raw, fields })
    }

    /// Field `index` as `T`, when the field is of type `ty` exactly: a
    /// `timestamp` never reads as a `timestamptz`, nor a `varchar[]` as a
    /// `text[]`.
    fn field<'a, T: FromSql<'a>>(&'a self, index: usize, ty: &Type) -> Result<T, Failure> {
        let (field_ty, value) = self
            .fields
            .get(index)
            .ok_or_else(|| malformed("fewer fields than the limiter reads"))?;
        if field_ty != ty {
            return Err(malformed("a field of another type than the limiter reads"));
        }
        let value = value.clone().map(|range| &self.raw[range]);
        if let (Kind::Array(_), Some(bytes)) = (ty.kind(), value)
            && !elements_fit(bytes)
        {
            return Err(malformed("an array of more elements than its bytes hold"));
        }
        T::from_sql_nullable(ty, value).map_err(|e| Failure::new(Reading::Refused, e))
    }
}

/// Whether the array in binary form `bytes` (dimensions, flags, the
/// element type, then each dimension's length and lower bound) has no more
/// elements than its bytes can hold, four (a length) each at least: the
/// decoder sizes its vector by the element count the bytes claim, and a
/// claim of two billion would abort the process for want of memory.
fn elements_fit(bytes: &[u8]) -> bool {
    let word = |at: usize| -> Option<i32> {
        let word: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(i32::from_be_bytes(word))
    };
    let Some(dimensions) = word(0).and_then(|n| usize::try_from(n).ok()) else {
        return false;
    };
    let Some(header) = dimensions.checked_mul(8).and_then(|n| n.checked_add(12)) else {
        return false;
    };
    let Some(rest) = bytes.len().checked_sub(header) else {
        return false;
    };
    let mut elements: usize = 1;
    for dimension in 0..dimensions {
        let Some(len) = word(12 + 8 * dimension).and_then(|n| usize::try_from(n).ok()) else {
            return false;
        };
        let Some(product) = elements.checked_mul(len) else {
            return false;
        };
        elements = product;
    }
    dimensions == 0 || elements <= rest / 4
}

impl Columns for Fields {
    fn boolean(&self, index: usize) -> Result<bool, Failure> {
        self.field(index, &Type::BOOL)
    }
    fn int8(&self, index: usize) -> Result<i64, Failure> {
        self.field(index, &Type::INT8)
    }
    fn int8s(&self, index: usize) -> Result<Vec<i64>, Failure> {
        self.field(index, &Type::INT8_ARRAY)
    }
    fn texts(&self, index: usize) -> Result<Vec<String>, Failure> {
        self.field(index, &Type::TEXT_ARRAY)
    }
    fn time(&self, index: usize) -> Result<SystemTime, Failure> {
        self.field(index, &Type::TIMESTAMPTZ)
    }
    fn maybe_time(&self, index: usize) -> Result<Option<SystemTime>, Failure> {
        self.field(index, &Type::TIMESTAMPTZ)
    }
    fn times(&self, index: usize) -> Result<Vec<SystemTime>, Failure> {
        self.field(index, &Type::TIMESTAMPTZ_ARRAY)
    }
    fn maybe_times(&self, index: usize) -> Result<Vec<Option<SystemTime>>, Failure> {
        self.field(index, &Type::TIMESTAMPTZ_ARRAY)
    }
    fn maybe_float8(&self, index: usize) -> Result<Option<f64>, Failure> {
        self.field(index, &Type::FLOAT8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record in binary form of `fields`: each a type and its bytes.
    fn record(fields: &[(Type, Option<&[u8]>)]) -> Vec<u8> {
        let mut raw = i32::try_from(fields.len()).unwrap().to_be_bytes().to_vec();
        for (ty, value) in fields {
            raw.extend(ty.oid().to_be_bytes());
            match value {
                None => raw.extend((-1i32).to_be_bytes()),
                Some(bytes) => {
                    raw.extend(i32::try_from(bytes.len()).unwrap().to_be_bytes());
                    raw.extend(*bytes);
                }
            }
        }
        raw
    }

    #[test]
    fn each_field_reads_as_its_column_would() {
        // 2000-01-01 00:00:01 UTC: PostgreSQL's epoch and a second.
        let second = 1_000_000i64.to_be_bytes();
        let raw = record(&[
            (Type::INT8, Some(&7i64.to_be_bytes())),
            (Type::TIMESTAMPTZ, Some(&second)),
            (Type::TIMESTAMPTZ, None),
            (Type::BOOL, Some(&[1])),
        ]);
        let fields = Fields::parse(raw).unwrap();
        assert_eq!(fields.int8(0).unwrap(), 7);
        assert_eq!(
            fields.time(1).unwrap(),
            SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(946_684_801)
        );
        assert_eq!(fields.maybe_time(2).unwrap(), None);
        assert!(fields.boolean(3).unwrap());
    }

    #[test]
    fn a_field_of_another_type_or_past_the_last_is_an_error() {
        let fields = Fields::parse(record(&[(Type::INT8, Some(&7i64.to_be_bytes()))])).unwrap();
        assert!(fields.time(0).is_err(), "an int8 read as a time");
        assert!(fields.int8(1).is_err(), "a field past the last");
        let null = Fields::parse(record(&[(Type::INT8, None)])).unwrap();
        assert!(null.int8(0).is_err(), "a NULL read as a number");
    }

    #[test]
    fn a_timestamp_without_time_zone_is_not_read_as_a_time() {
        let second = 1_000_000i64.to_be_bytes();
        let fields = Fields::parse(record(&[(Type::TIMESTAMP, Some(&second))])).unwrap();
        assert!(fields.time(0).is_err());
        assert!(fields.maybe_time(0).is_err());
    }

    /// An `int8[]` of one dimension: its length as given, its elements as
    /// given (each a length and eight bytes).
    fn int8_array(len: i32, elements: &[i64]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend(1i32.to_be_bytes()); // dimensions
        bytes.extend(0i32.to_be_bytes()); // no NULLs
        bytes.extend(Type::INT8.oid().to_be_bytes());
        bytes.extend(len.to_be_bytes());
        bytes.extend(1i32.to_be_bytes()); // lower bound
        for element in elements {
            bytes.extend(8i32.to_be_bytes());
            bytes.extend(element.to_be_bytes());
        }
        bytes
    }

    #[test]
    fn an_array_that_claims_more_elements_than_its_bytes_is_an_error() {
        let two = int8_array(2, &[4, 5]);
        let fields = Fields::parse(record(&[(Type::INT8_ARRAY, Some(&two))])).unwrap();
        assert_eq!(fields.int8s(0).unwrap(), [4, 5]);
        let claims = int8_array(i32::MAX, &[4, 5]);
        let fields = Fields::parse(record(&[(Type::INT8_ARRAY, Some(&claims))])).unwrap();
        assert!(fields.int8s(0).is_err(), "two billion elements in 24 bytes");
        let negative = int8_array(-1, &[]);
        let fields = Fields::parse(record(&[(Type::INT8_ARRAY, Some(&negative))])).unwrap();
        assert!(fields.int8s(0).is_err(), "a negative length");
    }

    #[test]
    fn malformed_bytes_are_an_error_never_a_panic() {
        let good = record(&[
            (Type::INT8, Some(&7i64.to_be_bytes())),
            (Type::TIMESTAMPTZ, None),
        ]);
        for end in 0..good.len() {
            assert!(Fields::parse(good[..end].to_vec()).is_err(), "cut at {end}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(Fields::parse(longer).is_err(), "a byte left over");
        assert!(Fields::parse((-1i32).to_be_bytes().to_vec()).is_err());
        assert!(Fields::parse(i32::MAX.to_be_bytes().to_vec()).is_err());
        let mut negative = record(&[(Type::INT8, Some(&[0; 8]))]);
        negative[8..12].copy_from_slice(&(-2i32).to_be_bytes());
        assert!(Fields::parse(negative).is_err(), "a length of -2");
        let mut unknown = record(&[(Type::INT8, None)]);
        unknown[4..8].copy_from_slice(&999_999u32.to_be_bytes());
        assert!(Fields::parse(unknown).is_err(), "an oid no type has");
    }

    proptest::proptest! {
        /// Fields of the types the limiter reads and of others, with lengths
        /// that fit their bytes or not, and bytes cut or added at the end.
        #[test]
        fn any_bytes_read_or_fail_without_a_panic(
            fields in proptest::collection::vec(
                (
                    proptest::sample::select(vec![16u32, 20, 25, 1009, 1016, 1184, 1185, 0, 2249]),
                    -2i32..24,
                    proptest::collection::vec(proptest::num::u8::ANY, 0..24),
                ),
                0..6,
            ),
            cut in 0usize..8,
            extra in proptest::collection::vec(proptest::num::u8::ANY, 0..3),
        ) {
            let mut raw = i32::try_from(fields.len()).unwrap().to_be_bytes().to_vec();
            for (oid, len, bytes) in &fields {
                raw.extend(oid.to_be_bytes());
                raw.extend(len.to_be_bytes());
                raw.extend(bytes);
            }
            raw.truncate(raw.len().saturating_sub(cut));
            raw.extend(extra);
            if let Ok(fields) = Fields::parse(raw) {
                for index in 0..7 {
                    let _ = fields.boolean(index);
                    let _ = fields.int8(index);
                    let _ = fields.int8s(index);
                    let _ = fields.texts(index);
                    let _ = fields.time(index);
                    let _ = fields.maybe_time(index);
                    let _ = fields.times(index);
                    let _ = fields.maybe_times(index);
                }
            }
        }
    }
}
