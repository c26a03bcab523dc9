//! Whether a node's content is worth compressing at all: content larger than
//! [`SAMPLED_ABOVE`] is compressed only when a sample spread over it compresses, so that
//! content that does not (already compressed media and archives, encrypted or random bytes)
//! costs a sample's compression, not its whole size's.

/// Content up to this size is simply compressed (a sample would cost about as much).
const SAMPLED_ABOVE: usize = 256 << 10;
/// Pieces of the sample, spread evenly over the content.
const PIECES: usize = 8;
/// Bytes of each piece.
const PIECE: usize = 16 << 10;

/// Where the sample of content `len` bytes long lies: [`PIECES`] ranges spread evenly over
/// it; `None` when such content is simply compressed.
fn sample_ranges(len: usize) -> Option<impl Iterator<Item = std::ops::Range<usize>>> {
    (len > SAMPLED_ABOVE).then(|| {
        let step = len / PIECES;
        (0..PIECES).map(move |k| k * step..(k * step + PIECE).min(len))
    })
}

/// Whether `sample` shrinks by at least a sixteenth at `level` (compression is kept only when
/// the whole shrinks by an eighth).
fn sample_compresses(sample: &[u8], level: i32) -> bool {
    match zstd::bulk::compress(sample, level) {
        Ok(c) => c.len() < sample.len() - sample.len() / 16,
        // Let the real attempt decide.
        Err(_) => true,
    }
}

/// Whether compressing `content` at `level` is worth trying.
pub(crate) fn worth_compressing(content: &[u8], level: i32) -> bool {
    let Some(ranges) = sample_ranges(content.len()) else {
        return true;
    };
    let mut sample = Vec::with_capacity(PIECES * PIECE);
    for r in ranges {
        sample.extend_from_slice(&content[r]);
    }
    sample_compresses(&sample, level)
}

/// As [`worth_compressing`], for the first `len` bytes of `file`, of which only the sample is
/// read (a content that does not compress is then written as it is, never read whole).
pub(crate) fn file_worth_compressing(
    file: &std::fs::File,
    len: u64,
    level: i32,
) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let Some(ranges) = usize::try_from(len).ok().and_then(sample_ranges) else {
        return Ok(true);
    };
    let mut sample = Vec::with_capacity(PIECES * PIECE);
    for r in ranges {
        let at = sample.len();
        sample.resize(at + r.len(), 0);
        file.read_exact_at(&mut sample[at..], r.start as u64)?;
    }
    Ok(sample_compresses(&sample, level))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(len: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; len];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
        bytes
    }

    /// Random bytes are not worth it; text is; so is content only part of which compresses
    /// (the sample is spread over all of it); small content is always tried.
    #[test]
    fn samples_decide_for_large_content() {
        assert!(!worth_compressing(&random(4 << 20), 3));
        let text: Vec<u8> = (0..(4 << 20))
            .map(|i: usize| b"import marimo as mo\nmo.md('cell')\n"[i % 34])
            .collect();
        assert!(worth_compressing(&text, 3));
        let mut half = random(2 << 20);
        half.extend(std::iter::repeat_n(b'x', 2 << 20));
        assert!(worth_compressing(&half, 3));
        assert!(worth_compressing(&random(SAMPLED_ABOVE), 3));
    }

    /// Reading the sample from a file decides as the sample of the same bytes in memory.
    #[test]
    fn a_file_is_sampled_as_its_bytes_are() {
        let text: Vec<u8> = (0..(1 << 20))
            .map(|i: usize| b"import marimo as mo\nmo.md('cell')\n"[i % 34])
            .collect();
        let mut half = random(2 << 20);
        half.extend(std::iter::repeat_n(b'x', 2 << 20));
        for (bytes, worth) in [
            (random(3 << 20), false),
            (text, true),
            (half, true),
            (random(SAMPLED_ABOVE), true),
        ] {
            let mut file = tempfile::tempfile().unwrap();
            std::io::Write::write_all(&mut file, &bytes).unwrap();
            // Bytes after the content (a spool file longer than its content) are not sampled.
            std::io::Write::write_all(&mut file, &[b'x'; 1 << 20]).unwrap();
            let len = bytes.len() as u64;
            assert_eq!(file_worth_compressing(&file, len, 3).unwrap(), worth);
            assert_eq!(worth_compressing(&bytes, 3), worth);
        }
    }
}
