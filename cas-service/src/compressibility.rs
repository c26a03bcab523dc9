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

/// Whether compressing `content` at `level` is worth trying: the sample must shrink by at
/// least a sixteenth (compression is kept only when the whole shrinks by an eighth).
pub(crate) fn worth_compressing(content: &[u8], level: i32) -> bool {
    let len = content.len();
    if len <= SAMPLED_ABOVE {
        return true;
    }
    let step = len / PIECES;
    let mut sample = Vec::with_capacity(PIECES * PIECE);
    for k in 0..PIECES {
        let at = k * step;
        sample.extend_from_slice(&content[at..(at + PIECE).min(len)]);
    }
    match zstd::bulk::compress(&sample, level) {
        Ok(c) => c.len() < sample.len() - sample.len() / 16,
        // Let the real attempt decide.
        Err(_) => true,
    }
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
}
