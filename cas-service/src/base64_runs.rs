//! A reversible transform for text that carries base64, as notebooks carry their images
//! inline in JSON: every long run of base64 is replaced by the bytes it encodes, so that the
//! compressor of a pack block sees those bytes (coded about 8 bits each when they are already
//! compressed, like a PNG's) rather than their text (6 bits each, coded in a little more).
//! Packs store an entry this way when it has such a run ([`Encoding::Base64Runs`]); a read
//! expands it and checks the result against the node hash, as every rebuilt content is.
//!
//! The form is a sequence of records `literal length, literal bytes, decoded length, decoded
//! bytes, line width` (numbers as LEB128; a line width other than 0 is followed by the index of
//! its separator in [`SEPARATORS`]), the last record's decoded part possibly empty. A run is
//! base64 of at least [`MIN_RUN`] characters: a maximal stretch of the alphabet taken in whole
//! groups of four (with its `=` padding when that makes it canonical), or lines of one width
//! (a multiple of four) broken by one separator, as MIME and older notebooks write images,
//! the last line possibly shorter. A run is taken only when encoding its decoded bytes again
//! (and breaking them the same way) gives it back exactly.
//!
//! [`Encoding::Base64Runs`]: crate::blob::Encoding::Base64Runs

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// Shorter runs stay text: a record costs a few bytes, and short runs are mostly words.
pub const MIN_RUN: usize = 256;

/// Line separators inside a run: the JSON escape `\n` (notebooks) and a newline (MIME).
pub const SEPARATORS: [&[u8]; 2] = [b"\\n", b"\n"];

/// How a run's lines are broken: every `width` characters (0: not at all) by a separator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wrap {
    width: usize,
    sep: usize,
}

const UNWRAPPED: Wrap = Wrap { width: 0, sep: 0 };

/// The base64 text of `decoded`, broken as `wrap` says.
fn encode_wrapped(decoded: &[u8], wrap: Wrap) -> Vec<u8> {
    let b64 = STANDARD.encode(decoded).into_bytes();
    if wrap.width == 0 {
        return b64;
    }
    let mut out = Vec::with_capacity(b64.len() + b64.len() / wrap.width * 2);
    for (i, line) in b64.chunks(wrap.width).enumerate() {
        if i > 0 {
            out.extend_from_slice(SEPARATORS[wrap.sep]);
        }
        out.extend_from_slice(line);
    }
    out
}

/// How many characters of the base64 alphabet start at `at`.
fn stretch(text: &[u8], at: usize) -> usize {
    text[at..].iter().take_while(|b| is_alphabet(**b)).count()
}

/// Lines of one width broken by one separator, starting at `start`: the run's length in
/// `text`, its bytes and how it is broken; `None` when there are no such lines.
fn wrapped_run(text: &[u8], start: usize) -> Option<(usize, Vec<u8>, Wrap)> {
    let width = stretch(text, start);
    if width < 16 || !width.is_multiple_of(4) {
        return None;
    }
    let sep = SEPARATORS
        .iter()
        .position(|s| text[start + width..].starts_with(s))?;
    let sep_bytes = SEPARATORS[sep];
    let wrap = Wrap { width, sep };
    // Full lines first; then possibly one shorter (or padded) last line.
    let mut full_end = start + width;
    let mut end = full_end;
    while text[full_end..].starts_with(sep_bytes) {
        let line = full_end + sep_bytes.len();
        let n = stretch(text, line);
        if n == width && !text[line + n..].starts_with(b"=") {
            full_end = line + n;
            end = full_end;
            continue;
        }
        if (1..=width).contains(&n) {
            let pad = text[line + n..]
                .iter()
                .take(2)
                .take_while(|b| **b == b'=')
                .count();
            end = line + n + pad;
        }
        break;
    }
    for end in [end, full_end] {
        let span = &text[start..end];
        if span.len() < MIN_RUN {
            return None;
        }
        if let Ok(decoded) = STANDARD.decode(strip_separators(span, sep_bytes))
            && encode_wrapped(&decoded, wrap) == span
        {
            return Some((span.len(), decoded, wrap));
        }
    }
    None
}

/// `span` without its separators.
fn strip_separators(span: &[u8], sep: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(span.len());
    let mut at = 0;
    while at < span.len() {
        if span[at..].starts_with(sep) {
            at += sep.len();
        } else {
            out.push(span[at]);
            at += 1;
        }
    }
    out
}

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

/// The run of base64 starting at `start`, as the bytes it encodes with how its lines are
/// broken, and its length in `text`; `None` when there is none that long.
fn run_at(text: &[u8], start: usize) -> (usize, Option<(Vec<u8>, Wrap)>) {
    if let Some((len, decoded, wrap)) = wrapped_run(text, start) {
        return (len, Some((decoded, wrap)));
    }
    let stretch = stretch(text, start);
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
            return (run.len(), Some((decoded, UNWRAPPED)));
        }
    }
    let whole = stretch - stretch % 4;
    let decoded = STANDARD.decode(&text[start..start + whole]).ok();
    (whole, decoded.map(|d| (d, UNWRAPPED)))
}

/// A pack entry's content as it is stored: with its runs of base64 decoded when it has any.
pub fn contract_entry(content: bytes::Bytes) -> (bytes::Bytes, crate::blob::Encoding) {
    match contract(&content) {
        Some(contracted) => (contracted.into(), crate::blob::Encoding::Base64Runs),
        None => (content, crate::blob::Encoding::Identity),
    }
}

/// `text` with its runs of base64 decoded, or `None` when it has none.
pub fn contract(text: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let (mut literal_from, mut at, mut runs) = (0usize, 0usize, 0usize);
    while at < text.len() {
        // Not base64: other bytes, and the letter of an escape (`\n` ends a line of a run).
        if !is_alphabet(text[at]) || (at > 0 && text[at - 1] == b'\\') {
            at += 1;
            continue;
        }
        let (len, decoded) = run_at(text, at);
        if let Some((decoded, wrap)) = decoded {
            put_len(&mut out, at - literal_from);
            out.extend_from_slice(&text[literal_from..at]);
            put_len(&mut out, decoded.len());
            out.extend_from_slice(&decoded);
            put_len(&mut out, wrap.width);
            if wrap.width > 0 {
                out.push(wrap.sep as u8);
            }
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
        let bytes = &contracted[at..end];
        at = end;
        let width = take_len(contracted, &mut at)?;
        let sep = match width {
            0 => 0,
            _ => {
                let sep = usize::from(*contracted.get(at).ok_or("a separator is missing")?);
                at += 1;
                if sep >= SEPARATORS.len() || width % 4 != 0 {
                    return Err("an unknown line layout".into());
                }
                sep
            }
        };
        let text_len = decoded.div_ceil(3) * 4;
        let breaks = text_len.saturating_sub(1).checked_div(width).unwrap_or(0);
        if out.len() + text_len + breaks * SEPARATORS[sep].len() > max {
            return Err(too_long());
        }
        out.extend_from_slice(&encode_wrapped(bytes, Wrap { width, sep }));
    }
    Ok(out)
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
        // Broken into lines, as older notebooks (the JSON escape) and MIME (newlines) do.
        for sep in SEPARATORS {
            let b64 = STANDARD.encode(image(1_000));
            let lines: Vec<&[u8]> = b64.as_bytes().chunks(76).collect();
            let body = lines.join(sep);
            let text = [&b"\"image/png\": \""[..], &body, sep, b"\""].concat();
            let c = contract(&text).expect("one wrapped run");
            assert!(c.len() < 1_000 + 60, "{} bytes", c.len());
            assert_eq!(expand(&c, text.len()).unwrap(), text);
            // Cut in the middle of a line (a chunk of a large cell): the lines after it.
            let cut = &text[100..];
            let c = contract(cut).expect("the whole lines");
            assert!(c.len() < 1_000, "{} bytes", c.len());
            assert_eq!(expand(&c, cut.len()).unwrap(), cut);
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
                    (proptest::collection::vec(any::<u8>(), 150..400), 1usize..30, 0usize..2)
                        .prop_map(|(b, quads, sep)| {
                            let b64 = STANDARD.encode(b);
                            let lines: Vec<&[u8]> = b64.as_bytes().chunks(quads * 4).collect();
                            lines.join(SEPARATORS[sep])
                        }),
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
