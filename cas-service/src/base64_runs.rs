//! A reversible transform for text that carries base64, as notebooks carry their images
//! inline in JSON: every long run of base64 is replaced by the bytes it encodes, so that the
//! compressor of a pack block sees those bytes (coded about 8 bits each when they are already
//! compressed, like a PNG's) rather than their text (6 bits each, coded in a little more).
//! Packs store an entry this way when it has such a run ([`Encoding::Base64Runs`]); a read
//! expands it and checks the result against the node hash, as every rebuilt content is.
//!
//! The form is a sequence of records `literal length, literal bytes, decoded length, decoded
//! bytes` (lengths as LEB128), the last record's decoded part possibly empty. A run is a
//! maximal stretch of the base64 alphabet of at least [`MIN_RUN`] characters, taken in whole
//! groups of four (with its `=` padding when that makes it canonical base64), so that encoding
//! the decoded bytes again gives the run back exactly.
//!
//! [`Encoding::Base64Runs`]: crate::blob::Encoding::Base64Runs

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// Shorter runs stay text: a record costs a few bytes, and short runs are mostly words.
pub const MIN_RUN: usize = 256;

fn is_alphabet(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'+' || b == b'/'
}

fn put_len(out: &mut Vec<u8>, mut n: usize) {
    loop {
        let low = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(low);
            return;
        }
        out.push(low | 0x80);
    }
}

fn take_len(input: &[u8], at: &mut usize) -> Result<usize, String> {
    let mut n = 0usize;
    for shift in (0..64).step_by(7) {
        let b = *input.get(*at).ok_or("a length runs past the end")?;
        *at += 1;
        n |= usize::from(b & 0x7f)
            .checked_shl(shift)
            .filter(|v| v >> shift == usize::from(b & 0x7f))
            .ok_or("a length overflows")?;
        if b & 0x80 == 0 {
            return Ok(n);
        }
    }
    Err("a length is too long".into())
}

/// The run of base64 starting at `start` (a maximal stretch of the alphabet), as the bytes it
/// encodes and its length in `text`; `None` when it is shorter than [`MIN_RUN`].
fn run_at(text: &[u8], start: usize) -> (usize, Option<Vec<u8>>) {
    let stretch = text[start..]
        .iter()
        .take_while(|b| is_alphabet(**b))
        .count();
    if stretch < MIN_RUN {
        return (stretch.max(1), None);
    }
    // With its padding, when that completes the last group and the whole is canonical.
    let padding = text[start + stretch..]
        .iter()
        .take(2)
        .take_while(|b| **b == b'=')
        .count();
    if padding > 0 && (stretch + padding).is_multiple_of(4) {
        let run = &text[start..start + stretch + padding];
        if let Ok(decoded) = STANDARD.decode(run)
            && STANDARD.encode(&decoded).as_bytes() == run
        {
            return (run.len(), Some(decoded));
        }
    }
    let whole = stretch - stretch % 4;
    let decoded = STANDARD.decode(&text[start..start + whole]).ok();
    (whole, decoded)
}

/// `text` with its runs of base64 decoded, or `None` when it has none.
pub fn contract(text: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let (mut literal_from, mut at, mut runs) = (0usize, 0usize, 0usize);
    while at < text.len() {
        if !is_alphabet(text[at]) {
            at += 1;
            continue;
        }
        let (len, decoded) = run_at(text, at);
        if let Some(decoded) = decoded {
            put_len(&mut out, at - literal_from);
            out.extend_from_slice(&text[literal_from..at]);
            put_len(&mut out, decoded.len());
            out.extend_from_slice(&decoded);
            runs += 1;
            literal_from = at + len;
        }
        at += len;
    }
    if runs == 0 {
        return None;
    }
    put_len(&mut out, text.len() - literal_from);
    out.extend_from_slice(&text[literal_from..]);
    put_len(&mut out, 0);
    Some(out)
}

/// The text `contracted` was made from, at most `max` bytes of it; an error for anything
/// [`contract`] cannot have made.
pub fn expand(contracted: &[u8], max: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(max.min(contracted.len() * 2));
    let mut at = 0usize;
    let too_long = || format!("expands past its {max} bytes");
    while at < contracted.len() {
        let literal = take_len(contracted, &mut at)?;
        let end = at.checked_add(literal).filter(|e| *e <= contracted.len());
        let end = end.ok_or("a literal runs past the end")?;
        if out.len() + literal > max {
            return Err(too_long());
        }
        out.extend_from_slice(&contracted[at..end]);
        at = end;
        let decoded = take_len(contracted, &mut at)?;
        let end = at.checked_add(decoded).filter(|e| *e <= contracted.len());
        let end = end.ok_or("a decoded run runs past the end")?;
        if out.len() + decoded.div_ceil(3) * 4 > max {
            return Err(too_long());
        }
        STANDARD
            .encode_slice(
                &contracted[at..end],
                grow(&mut out, decoded.div_ceil(3) * 4),
            )
            .map_err(|e| e.to_string())?;
        at = end;
    }
    Ok(out)
}

/// `out` grown by `n` zero bytes; answers the new tail.
fn grow(out: &mut Vec<u8>, n: usize) -> &mut [u8] {
    let from = out.len();
    out.resize(from + n, 0);
    &mut out[from..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn image(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7919 % 251) as u8).collect()
    }

    #[test]
    fn notebook_images_are_decoded_and_given_back() {
        for n in [300, 301, 302] {
            let b64 = STANDARD.encode(image(n));
            let text = format!("{{\"image/png\": \"{b64}\\n\", \"text\": [\"ok\"]}}\n");
            let c = contract(text.as_bytes()).expect("one run");
            assert!(
                c.len() < text.len() - b64.len() / 5,
                "{} vs {}",
                c.len(),
                text.len()
            );
            assert_eq!(expand(&c, text.len()).unwrap(), text.as_bytes());
            assert!(expand(&c, text.len() - 1).is_err(), "bounded by the size");
        }
        // Short runs and other text stay as they are.
        assert_eq!(contract(b"import marimo as mo\nx = 1\n"), None);
        assert_eq!(contract(&[b'a'; MIN_RUN - 1]), None);
    }

    #[test]
    fn malformed_forms_are_errors() {
        let c = contract(format!("x{}y", "QUJD".repeat(100)).as_bytes()).unwrap();
        for cut in 0..c.len() {
            let _ = expand(&c[..cut], 10_000);
        }
        assert!(expand(&[0xff; 12], 10_000).is_err());
        assert!(expand(&[5, b'a'], 10_000).is_err());
    }

    proptest! {
        #[test]
        fn contracting_is_reversible(
            parts in proptest::collection::vec(
                prop_oneof![
                    proptest::collection::vec(any::<u8>(), 0..40),
                    proptest::collection::vec(any::<u8>(), 150..400)
                        .prop_map(|b| STANDARD.encode(b).into_bytes()),
                    "[A-Za-z0-9+/=]{250,300}".prop_map(String::into_bytes),
                ],
                0..6,
            )
        ) {
            let text: Vec<u8> = parts.concat();
            match contract(&text) {
                None => {}
                Some(c) => {
                    prop_assert!(c.len() <= text.len() + 8);
                    prop_assert_eq!(expand(&c, text.len()).unwrap(), text);
                }
            }
        }
    }
}
