//! The encoding of a [`Key`], and decoding it.

use sha2::{Digest, Sha256};

use super::Key;

/// Length of the digest suffix: `~` and 64 hex digits.
pub(super) const DIGEST_SUFFIX_BYTES: usize = 1 + 64;

/// A key being written, and what is left of its input budget.
pub(super) struct Encoder {
    encoded: String,
    pub(super) parts: usize,
    /// Input characters that may still be read.
    left: usize,
    /// Whether input was left unread.
    cut: bool,
}

impl Default for Encoder {
    fn default() -> Self {
        Encoder {
            encoded: String::new(),
            parts: 0,
            left: Key::MAX_INPUT_CHARS,
            cut: false,
        }
    }
}

impl Encoder {
    /// Adds `part`, within the budget (its `|` counts as one); `false` once input is left unread.
    pub(super) fn read(&mut self, part: &str) -> bool {
        if self.cut {
            return false;
        }
        if self.parts > 0 {
            if self.left == 0 {
                self.cut = true;
                return false;
            }
            self.left -= 1;
            self.encoded.push('|');
        }
        self.parts += 1;
        let (head, rest, read) = take_chars(part, self.left);
        self.left -= read;
        escape_into(head, &mut self.encoded);
        self.cut = !rest.is_empty();
        !self.cut
    }

    /// Adds `part` whole: one already bounded.
    pub(super) fn whole(&mut self, part: &str) {
        if self.parts > 0 {
            self.encoded.push('|');
        }
        self.parts += 1;
        escape_into(part, &mut self.encoded);
    }

    /// The key, digested when too long or cut (here, or before, as `cut`).
    pub(super) fn finish(self, cut: bool) -> Key {
        Key {
            encoded: bound(self.encoded, self.cut || cut).into_boxed_str(),
        }
    }
}

/// The first `n` characters of `s` at most, the rest, and how many the first holds.
fn take_chars(s: &str, n: usize) -> (&str, &str, usize) {
    let mut read = 0;
    for (i, _) in s.char_indices() {
        if read == n {
            return (&s[..i], &s[i..], read);
        }
        read += 1;
    }
    (s, "", read)
}

/// Escapes one part onto `out` (the table in [`Key`]'s docs).
pub(super) fn escape_into(part: &str, out: &mut String) {
    for c in part.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '|' => out.push_str("\\|"),
            '~' => out.push_str("\\~"),
            c if c.is_control() => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let b = c as u32;
                out.push_str("\\x");
                out.push(char::from(HEX[(b >> 4) as usize & 0xf]));
                out.push(char::from(HEX[b as usize & 0xf]));
            }
            c => out.push(c),
        }
    }
}

/// Digests an encoding longer than [`Key::MAX_BYTES`], or of a cut input (then with a NUL byte).
pub(super) fn bound(encoded: String, cut: bool) -> String {
    if encoded.len() <= Key::MAX_BYTES && !cut {
        return encoded;
    }
    let mut hasher = Sha256::new();
    hasher.update(encoded.as_bytes());
    if cut {
        hasher.update([0]);
    }
    let digest = hasher.finalize();
    let cut = prefix_end(&encoded, Key::MAX_BYTES - DIGEST_SUFFIX_BYTES);
    let mut out = String::with_capacity(Key::MAX_BYTES);
    out.push_str(&encoded[..cut]);
    out.push('~');
    for byte in digest {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    out
}

/// The largest index `<= max` on a char boundary and not inside a `\…` escape.
pub(super) fn prefix_end(encoded: &str, max: usize) -> usize {
    let mut end = 0;
    let mut chars = encoded.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let unit_len = if c == '\\' {
            match chars.next() {
                Some((_, 'x')) => {
                    chars.next();
                    chars.next();
                    4
                }
                Some(_) => 2,
                None => 1,
            }
        } else {
            c.len_utf8()
        };
        if i + unit_len > max {
            break;
        }
        end = i + unit_len;
    }
    end
}

/// The byte index of the first `~` that is not escaped, if any.
pub(super) fn unescaped_tilde(encoded: &str) -> Option<usize> {
    let mut chars = encoded.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '~' => return Some(i),
            _ => {}
        }
    }
    None
}

/// Splits an undigested encoding back into its parts; `None` for a digested or malformed one.
#[doc(hidden)]
pub fn decode(encoded: &str) -> Option<Vec<String>> {
    let mut parts = vec![String::new()];
    let mut chars = encoded.chars();
    while let Some(c) = chars.next() {
        match c {
            '|' => parts.push(String::new()),
            '~' => return None,
            '\\' => {
                let part = parts.last_mut()?;
                match chars.next()? {
                    'x' => {
                        let hi = lower_hex(chars.next()?)?;
                        let lo = lower_hex(chars.next()?)?;
                        part.push(char::from_u32(hi * 16 + lo)?);
                    }
                    e @ ('\\' | '|' | '~') => part.push(e),
                    _ => return None,
                }
            }
            c => parts.last_mut()?.push(c),
        }
    }
    Some(parts)
}

/// The value of a lowercase hex digit: the encoding writes no other.
pub(super) fn lower_hex(c: char) -> Option<u32> {
    match c {
        '0'..='9' | 'a'..='f' => c.to_digit(16),
        _ => None,
    }
}
