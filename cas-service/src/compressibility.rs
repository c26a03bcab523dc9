//! Whether a node's content is worth compressing at all, and compressing it: content larger
//! than [`SAMPLED_ABOVE`] is compressed only when a sample spread over it compresses, so that
//! content that does not (already compressed media and archives, encrypted or random bytes)
//! costs a sample's compression (an eighth of it, at most [`PIECES`] × [`MAX_PIECE`]), not
//! its whole size's. Compression contexts are kept for reuse: setting one up costs about as
//! much as compressing a small node.

use std::sync::Mutex;

/// Content up to this size is simply compressed (a sample would cost about as much). Above
/// it, the sample is 8 pieces of at least 256 bytes: enough for text, code and JSON to show
/// that they compress, while a small node that does not (an image, random bytes) costs an
/// eighth of its compression; with the contexts kept, that saving is no longer eaten by
/// setting a context up.
const SAMPLED_ABOVE: usize = 16 << 10;
/// Pieces of the sample, spread evenly over the content.
const PIECES: usize = 8;
/// Most bytes of each piece: a sample is an eighth of its content, up to eight of these.
const MAX_PIECE: usize = 16 << 10;
/// Compression contexts kept for reuse, at most (each holds its tables, a few MiB at most).
const KEPT_CONTEXTS: usize = 8;

/// Where the sample of content `len` bytes long lies: [`PIECES`] ranges spread evenly over
/// it, together an eighth of it (at most [`MAX_PIECE`] each); `None` when such content is
/// simply compressed.
fn sample_ranges(len: usize) -> Option<impl Iterator<Item = std::ops::Range<usize>>> {
    (len > SAMPLED_ABOVE).then(|| {
        let step = len / PIECES;
        let piece = (step / PIECES).min(MAX_PIECE);
        (0..PIECES).map(move |k| k * step..(k * step + piece).min(len))
    })
}

/// Compression contexts not in use, with their levels.
static CONTEXTS: Mutex<Vec<(i32, zstd::bulk::Compressor<'static>)>> = Mutex::new(Vec::new());

/// `bytes` compressed alone at `level`, as `zstd::bulk::compress` would, in a context kept
/// from an earlier call when one is free.
pub(crate) fn compress(bytes: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    let kept = {
        let mut free = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
        let at = free.iter().position(|(l, _)| *l == level);
        at.map(|at| free.swap_remove(at).1)
    };
    let mut context = match kept {
        Some(c) => c,
        None => zstd::bulk::Compressor::new(level)?,
    };
    let compressed = context.compress(bytes);
    let mut free = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    if compressed.is_ok() && free.len() < KEPT_CONTEXTS {
        free.push((level, context));
    }
    compressed
}

/// Whether `sample` shrinks by at least a sixteenth at `level` (compression is kept only when
/// the whole shrinks by an eighth).
fn sample_compresses(sample: &[u8], level: i32) -> bool {
    match compress(sample, level) {
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
    let mut sample = Vec::with_capacity(PIECES * MAX_PIECE);
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
    let mut sample = Vec::with_capacity(PIECES * MAX_PIECE);
    for r in ranges {
        let at = sample.len();
        sample.resize(at + r.len(), 0);
        file.read_exact_at(&mut sample[at..], r.start as u64)?;
    }
    Ok(sample_compresses(&sample, level))
}

/// [`file_worth_compressing`] for a handle of `file`, on a blocking thread.
pub(crate) async fn file_worth_compressing_async(
    file: &std::fs::File,
    len: u64,
    level: i32,
) -> std::io::Result<bool> {
    let file = file.try_clone()?;
    tokio::task::spawn_blocking(move || file_worth_compressing(&file, len, level))
        .await
        .map_err(std::io::Error::other)?
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
        // Just above the threshold the sample is an eighth of the content, in small pieces,
        // and still tells text from noise.
        let small = SAMPLED_ABOVE + 1;
        assert!(!worth_compressing(&random(small), 3));
        assert!(worth_compressing(&text[..small], 3));
        let ranges: Vec<_> = sample_ranges(small).unwrap().collect();
        assert_eq!(ranges.len(), PIECES);
        assert_eq!(
            ranges.iter().map(|r| r.len()).sum::<usize>(),
            small / 64 * 8
        );
        // Cells of a notebook, each line different: a sample of 256-byte pieces still shows
        // that they compress (to about a third, as a whole).
        let cells: Vec<u8> = (0..2000)
            .flat_map(|i| {
                format!(
                    "@app.cell\ndef _(mo):\n    s{i} = mo.ui.slider(0, {})\n    return (s{i},)\n\n",
                    i * 37 % 1009
                )
                .into_bytes()
            })
            .collect();
        for len in [small, 40 << 10, 64 << 10] {
            assert!(worth_compressing(&cells[..len], 3), "{len}");
            assert!(compress(&cells[..len], 3).unwrap().len() < len / 3);
        }
        let large: Vec<_> = sample_ranges(64 << 20).unwrap().collect();
        assert!(large.iter().all(|r| r.len() == MAX_PIECE));
    }

    /// A kept context compresses as a new one does, whatever it compressed before and at
    /// whichever level; what it gives decodes to what went in.
    #[test]
    fn kept_contexts_compress_as_new_ones() {
        let text: Vec<u8> = (0..(300 << 10))
            .map(|i: usize| b"import marimo as mo\nmo.md('cell')\n"[i % 34])
            .collect();
        for bytes in [
            random(200 << 10),
            text.clone(),
            Vec::new(),
            random(10),
            text,
        ] {
            for level in [1, 3, 9] {
                let kept = compress(&bytes, level).unwrap();
                assert_eq!(kept, zstd::bulk::compress(&bytes, level).unwrap());
                assert_eq!(zstd::bulk::decompress(&kept, bytes.len()).unwrap(), bytes);
            }
        }
        assert!(CONTEXTS.lock().unwrap().len() <= KEPT_CONTEXTS);
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
