//! Default-ignorable code points, which the email and username keys drop.

use std::cmp::Ordering;

/// `Default_Ignorable_Code_Point` of Unicode 16.0 (`DerivedCoreProperties.txt`; the same since
/// 14.0): sorted, disjoint, inclusive ranges.
const DEFAULT_IGNORABLE: [(char, char); 17] = [
    ('\u{00AD}', '\u{00AD}'),   // soft hyphen
    ('\u{034F}', '\u{034F}'),   // combining grapheme joiner
    ('\u{061C}', '\u{061C}'),   // Arabic letter mark
    ('\u{115F}', '\u{1160}'),   // Hangul choseong and jungseong fillers
    ('\u{17B4}', '\u{17B5}'),   // Khmer inherent vowels
    ('\u{180B}', '\u{180F}'),   // Mongolian variation selectors, vowel separator
    ('\u{200B}', '\u{200F}'),   // zero-width space, non-joiner, joiner; LRM, RLM
    ('\u{202A}', '\u{202E}'),   // bidirectional embeddings and overrides
    ('\u{2060}', '\u{206F}'),   // word joiner, invisible operators, isolates
    ('\u{3164}', '\u{3164}'),   // Hangul filler
    ('\u{FE00}', '\u{FE0F}'),   // variation selectors
    ('\u{FEFF}', '\u{FEFF}'),   // zero-width no-break space (byte order mark)
    ('\u{FFA0}', '\u{FFA0}'),   // half-width Hangul filler
    ('\u{FFF0}', '\u{FFF8}'),   // reserved
    ('\u{1BCA0}', '\u{1BCA3}'), // shorthand format controls
    ('\u{1D173}', '\u{1D17A}'), // musical symbol format controls
    ('\u{E0000}', '\u{E0FFF}'), // tags, variation selectors supplement, reserved
];

/// Whether `c` is a `Default_Ignorable_Code_Point` (ASCII costs one comparison).
#[doc(hidden)]
pub fn is_default_ignorable(c: char) -> bool {
    c >= '\u{00AD}'
        && DEFAULT_IGNORABLE
            .binary_search_by(|&(first, last)| {
                if last < c {
                    Ordering::Less
                } else if first > c {
                    Ordering::Greater
                } else {
                    Ordering::Equal
                }
            })
            .is_ok()
}
